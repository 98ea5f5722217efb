/* vhdx/stream-internal.h: the stream decoder's state, shared by its
 * files, top to bottom: vhdx/stream.c (the entry points and the header
 * section), vhdx/stream-log.c (the log: collected, then its writes made
 * on the bytes that follow), vhdx/stream-bat.c (the metadata and the BAT
 * collected, the BAT turned into the block map, begin()),
 * vhdx/stream-place.c (bytes landed in their blocks, sector bitmaps, the
 * spool replayed) and vhdx/stream-spool.c (bytes kept until what places
 * them has arrived).  Each calls only those below it.  Private to those
 * files. */
#ifndef NBDFERRY_VHDX_STREAM_INTERNAL_H
#define NBDFERRY_VHDX_STREAM_INTERNAL_H

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileorder.h"
#include "common/vector.h"
#include "vhdx/vhdx-internal.h"

#define FIRST_BYTES 512

#define HEAD_BYTES (VHDX_REGION2_OFF + VHDX_REGION_BYTES)     /* 320 KiB */
#define META_MAX   (32ull << 20)        /* metadata region we collect */
#define REPLAY_BUF (1u << 20)
#define NO_CHUNK   UINT64_MAX

enum blk_kind { BLK_FULL, BLK_PARTIAL, BLK_BITMAP };

struct blk {                            /* a present block in the file */
    uint64_t file_off;
    uint64_t len;                       /* bytes of the file it spans */
    uint64_t index;                     /* payload block, or chunk */
    enum blk_kind kind;
};

struct spooled {                        /* a range handed to the spool */
    uint64_t file_off, len;
    uint64_t chunk;                     /* waiting for this bitmap, or
                                         * NO_CHUNK: for the BAT/metadata */
    bool zero;                          /* file zeros: nothing was put */
    bool done;
};
DEFINE_VECTOR_TYPE(blk_vector, struct blk, 256);
DEFINE_VECTOR_TYPE(spooled_vector, struct spooled, 64);

struct bitmap {                         /* a sector bitmap being collected */
    uint8_t *bits;                      /* VHDX_BITMAP_BYTES */
    uint64_t got;
    bool complete;
};

struct vhdx_stream {
    const struct nbdf_sink *sink;
    void *opaque;
    struct vhdx_stream_config cfg;
    int err;                            /* sticky, negative */
    struct nbdf_err e;
    uint64_t pos;                       /* next file byte expected */
    uint64_t end;                       /* the furthest byte fed or punched */
    struct fileorder order;             /* recent gaps and holes */
    uint8_t first[FIRST_BYTES];         /* to name another format */
    size_t nfirst;

    uint8_t *head;                      /* HEAD_BYTES, freed after */
    bool id_checked, head_done;
    struct vhdx_info info;
    uint64_t log_off, log_len;
    uint8_t *log;                       /* the log, while collected */
    bool log_done;
    struct vhdx_log_plan plan;          /* its writes, once log_done */

    uint8_t *meta;                      /* the metadata region */
    uint64_t meta_len, meta_got;
    uint8_t *bat;                       /* the BAT's first bat_need bytes */
    uint64_t bat_need, bat_got;
    bool ready;                         /* begin() called */

    struct blk_vector blks;             /* sorted by file_off */
    size_t cur;                         /* search hint */
    struct bitmap *bitmaps;             /* per chunk, differencing only */
    uint64_t nchunks;

    struct spooled_vector sp;
    uint64_t spool_held;                /* bytes in the spool and bitmaps */
    struct vhdx_stream_stats stats;
};

/* The first error (sticky) with its message; returns it. */
#define fail(s, ...) nbdf_latchf(&(s)->err, &(s)->e, __VA_ARGS__)

static inline int sink_fail(struct vhdx_stream *s, int r, const char *what)
{
    return fail(s, r, "%s: the sink failed: %s", what, strerror(-r));
}

static inline bool overlaps(uint64_t a, uint64_t alen, uint64_t b,
                            uint64_t blen)
{
    return blen && alen && a < b + blen && b < a + alen;
}

/* ---- stream-log.c -------------------------------------------------------- */

/* A header with a log GUID: check where the log lies, make its buffer. */
int vhdx_log_prepare(struct vhdx_stream *s);
/* Bytes at s->pos past the header section. */
int vhdx_feed_log(struct vhdx_stream *s, const uint8_t *buf, uint64_t len);

/* ---- stream-bat.c -------------------------------------------------------- */

/* The bytes at s->pos past the header section, the log's writes made. */
int vhdx_feed_body(struct vhdx_stream *s, const uint8_t *buf, uint64_t len);
/* Copy the part of [off, off+len) inside region [roff, roff+rlen) into
 * dst; returns how many bytes that is. */
uint64_t vhdx_region_copy(uint64_t off, const uint8_t *buf, uint64_t len,
                          uint64_t roff, uint64_t rlen, uint8_t *dst);

/* ---- stream-place.c ------------------------------------------------------ */

/* Place disk bytes (buf NULL: zeros), clipped to the disk size. */
int vhdx_emit(struct vhdx_stream *s, uint64_t disk_off, const uint8_t *buf,
              uint64_t len);
/* Hand the spooled ranges waiting for 'chunk' (NO_CHUNK: the BAT and the
 * metadata) back to vhdx_body_bytes(). */
int vhdx_replay(struct vhdx_stream *s, uint64_t chunk);
/* Bytes past the header section, after begin(). */
int vhdx_body_bytes(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
                    uint64_t len);

/* ---- stream-spool.c ------------------------------------------------------ */

/* Count n more bytes held; refuses past the configured bound. */
int vhdx_spool_hold(struct vhdx_stream *s, uint64_t n);
/* Keep [off, off+len) of the file (buf NULL or all zeros: only
 * remembered) until 'chunk''s bitmap, or the BAT, arrives. */
int vhdx_spool(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
               uint64_t len, uint64_t chunk);

#endif /* NBDFERRY_VHDX_STREAM_INTERNAL_H */
