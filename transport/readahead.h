/* transport/readahead.h: read-ahead for sequential readers of the disk.
 *
 * Each open handle that reads the disk (the raw file, the VHD view's
 * block data) gets a stream.  A stream that reads sequentially (each read
 * starting where the last ended, or skipping forward) keeps NBD reads of
 * up to a chunk each ahead of the reader, through pool_read_start():
 * depth x chunk bytes of data, in at most 2 x depth requests (data in
 * smaller pieces makes smaller requests); reads are served from the
 * arrived chunks.  A read elsewhere drops the stream's chunks and reads
 * on demand until the reader is sequential again.  Ranges the pool knows read as zero are
 * zero-filled without a request.
 *
 * Memory: every chunk, in flight or arrived, holds a buffer of chunk
 * bytes (however short its request) from one budget shared by all
 * streams (--readahead SIZE); a stream that finds it spent reads on
 * demand.  Chunks are freed as the reader passes them.
 *
 * Coherence: every change to the disk (write, zeroing, truncate, the VHD
 * view's writes) calls ra_invalidate() after the pool accepted it and
 * before the change is acknowledged.  That drops every chunk overlapping
 * the range, arrived or in flight (an in-flight one is discarded when it
 * lands).  A chunk started after the change sees it through the pool's
 * ordering (pool_read_start() refuses ranges with changes not yet
 * answered).  So a read never returns bytes older than a change that was
 * acknowledged before the read began.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct pool;
struct readahead;
struct ra_stream;

/* budget: bytes of chunks at once, all streams; 0 turns read-ahead off
 * (ra_read() then is pool_read()).  chunk: bytes per request (clamped to
 * pool_read_max()); depth: chunks ahead of one reader. */
#define RA_MAX_DEPTH 64u          /* depth is capped to this */
int  ra_create(struct pool *p, size_t budget, size_t chunk, unsigned depth,
               struct readahead **out);
/* After pool_destroy() (which waits for the reads in flight). */
void ra_destroy(struct readahead *ra);

/* A stream for one open handle; NULL when read-ahead is off or memory is
 * short (ra_read() then reads on demand). */
struct ra_stream *ra_stream_open(struct readahead *ra);
/* Any thread; chunks still in flight are freed when they land. */
void ra_stream_close(struct ra_stream *s);

/* Read [off, off+len) of the disk, like pool_read().  limit: no chunk is
 * read past it (the file's end).  0 or -errno. */
int ra_read(struct readahead *ra, struct ra_stream *s, uint64_t off,
            void *buf, size_t len, uint64_t limit);

/* ra_read() without the copy, for replying straight from the chunks:
 * span[0..*nspan) holds the bytes of [off, off+len) in order.  Where the
 * whole range lies in at most RA_SPANS arrived chunks the spans point
 * into them (held: not freed, though maybe dropped, until ra_put());
 * otherwise span[0] is a malloc'd copy.  0 or -errno (no spans then).
 * Every span must be given back with ra_put(). */
#define RA_SPANS 2
struct ra_span {
    const void *mem;
    size_t len;
    void *ref;                /* the chunk, or NULL: mem is malloc'd */
};
int ra_read_spans(struct readahead *ra, struct ra_stream *s, uint64_t off,
                  size_t len, uint64_t limit, struct ra_span *span,
                  unsigned *nspan);
/* ra_read_spans() only if the chunks holding the whole range have all
 * arrived (nothing waits): 1 and the spans (held, to ra_put()), the stream
 * followed and the next chunks started as ra_read_spans() would; 0 and
 * nothing changed otherwise.  For the receiving thread, which must not
 * wait. */
int ra_try_spans(struct readahead *ra, struct ra_stream *s, uint64_t off,
                 size_t len, uint64_t limit, struct ra_span *span,
                 unsigned *nspan);
void ra_put(struct readahead *ra, struct ra_span *span, unsigned nspan);

/* [off, off+len) changed: drop every chunk overlapping it. */
void ra_invalidate(struct readahead *ra, uint64_t off, uint64_t len);

struct ra_stats {
    uint64_t hits, misses;    /* bytes served from chunks / on demand */
    uint64_t chunks, dropped; /* chunks started / dropped unread */
    uint64_t waits;           /* reads that waited for a chunk in flight */
    size_t budget, in_use;    /* bytes */
};
void ra_get_stats(struct readahead *ra, struct ra_stats *out);
