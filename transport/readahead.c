/* transport/readahead.c: read-ahead for sequential readers (see readahead.h).
 *
 * THREAD MODEL
 * The FUSE receiver thread (fs/fuseloop.c) calls ra_invalidate() for the
 * writes it serves, ra_try_spans() (never waits) for the reads whose
 * chunks have arrived, ra_put() and ra_stream_close() (a release);
 * worker threads call ra_read(), ra_read_spans(), ra_invalidate() (a
 * truncate, a durable write) and the stream calls; the status thread
 * ra_get_stats(); nbdx I/O threads call chunk_landed() when a read
 * arrives.
 * Everything is protected by ra->lock; ra->cond is broadcast whenever a
 * chunk lands or is given up.  ra->lock is never held across a pool call
 * (pool_read_start() and pool_read() take the pool's lock) nor across a
 * copy out of a chunk: a reader copying marks the chunk (users) so that
 * it is not freed meanwhile.
 *
 * HOLES
 * Chunks cover only the ranges the pool does not know to read as zero
 * (pool_data_ranges()), and the holes shorter than RA_MERGE_HOLE between
 * them: a longer hole is never read from the server nor copied into a
 * chunk; a reader reading it gets zeros from pool_read() without a server
 * read.  A reader that jumps over a hole it knows of (cp's
 * SEEK_DATA loop) is still sequential, however long the hole: the window
 * goes on at the next data instead of starting again.
 *
 * CHUNKS
 * A live chunk is in its stream's list, sorted by offset, LOADING until
 * its read lands, then READY.  Dropping a chunk (invalidated, passed by
 * the reader, the stream reset or closed) unlinks it and marks it stale;
 * its memory is freed once it has landed and no reader is copying from
 * it.  A stale chunk is never served.  Every chunk, live or stale, counts
 * against the budget until it is freed.
 */
#include "transport/readahead.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/bigbuf.h"
#include "common/cleanup.h"
#include "common/list.h"
#include "transport/pool.h"

#define SEQ_MIN 1                 /* sequential reads before read-ahead */
/* A hole shorter than this between two data ranges is read with them (a
 * request more costs about what reading it does): a disk whose data is
 * scattered in small pieces is still read in large chunks. */
#define RA_MERGE_HOLE (64u << 10)
/* The window is depth x chunk bytes of data ahead of the reader, not
 * depth chunks: data in pieces smaller than a chunk (a disk 25% full in 1
 * MiB extents) still has as many bytes in flight as a dense disk, which
 * is what hides the server's latency.  At most twice depth chunks,
 * however small (each holds a whole chunk's buffer of the budget). */
#define RA_STREAM_CHUNKS(ra) \
    ((ra)->depth * 2 < RA_MAX_DEPTH ? (ra)->depth * 2 : RA_MAX_DEPTH)
/* The window opens gradually: 1 chunk at the first sequential read, then
 * 2, 4, ... up to depth, so that a reader that happens to read twice in a
 * row costs a chunk, not a full window. */

enum chunk_state { CHUNK_LOADING, CHUNK_READY, CHUNK_FAILED };

struct ra_chunk {
    struct pool_aread a;          /* a.opaque: this chunk */
    struct readahead *ra;
    uint64_t off;
    size_t len;
    char *buf;                    /* ra->chunk bytes */
    enum chunk_state state;
    bool landed;                  /* no done() to come */
    bool stale;                   /* dropped: in no list, never served */
    unsigned users;               /* readers copying out of buf */
    struct ra_chunk *next;        /* the stream's list */
    struct ra_chunk *start_next;  /* planned, to be started */
};

struct ra_stream {
    struct readahead *ra;
    uint64_t next;                /* where the last read ended */
    unsigned seq;                 /* sequential reads in a row */
    unsigned nchunks;
    uint64_t nbytes;              /* of the live chunks */
    struct ra_chunk *chunks;      /* live chunks, by offset */
    struct ra_stream *prev, *next_s;  /* ra->streams */
};

struct readahead {
    struct pool *pool;
    size_t budget, chunk;
    unsigned depth;

    pthread_mutex_t lock;
    pthread_cond_t cond;          /* a chunk landed or was given up */
    size_t used;                  /* bytes of chunks not freed */
    char **free_bufs;             /* cached chunk buffers */
    unsigned nfree, max_free;
    struct ra_stream *streams;
    struct ra_stats st;
};

/* ---- chunk memory ---------------------------------------------------- */

static char *get_buf_locked(struct readahead *ra)
{
    if (ra->nfree > 0)
        return ra->free_bufs[--ra->nfree];
    return bigbuf_alloc(ra->chunk);   /* huge pages: a fresh mount's first
                                       * chunks fault 2 MiB at a time */
}

static void free_chunk_locked(struct readahead *ra, struct ra_chunk *c)
{
    assert(c->stale && c->landed && c->users == 0);
    if (ra->nfree < ra->max_free)
        ra->free_bufs[ra->nfree++] = c->buf;
    else
        free(c->buf);
    assert(ra->used >= ra->chunk);
    ra->used -= ra->chunk;
    free(c);
}

static void maybe_free_locked(struct readahead *ra, struct ra_chunk *c)
{
    if (c->stale && c->landed && c->users == 0)
        free_chunk_locked(ra, c);
}

/* Unlink *pp (a live chunk of s) and drop it. */
static void drop_locked(struct ra_stream *s, struct ra_chunk **pp)
{
    struct ra_chunk *c = *pp;

    *pp = c->next;
    s->nchunks--;
    s->nbytes -= c->len;
    c->next = NULL;
    c->stale = true;
    maybe_free_locked(s->ra, c);
}

static void drop_all_locked(struct ra_stream *s)
{
    while (s->chunks) {
        s->ra->st.dropped++;
        drop_locked(s, &s->chunks);
    }
}

/* ---- starting reads -------------------------------------------------- */

/* nbdx I/O thread, through the pool. */
static void chunk_landed(struct pool_aread *a, int err)
{
    struct ra_chunk *c = a->opaque;
    struct readahead *ra = c->ra;

    LOCK_FOR_SCOPE(&ra->lock);
    c->state = err ? CHUNK_FAILED : CHUNK_READY;
    c->landed = true;
    maybe_free_locked(ra, c);
    pthread_cond_broadcast(&ra->cond);
}

static struct ra_chunk *new_chunk_locked(struct ra_stream *s, uint64_t off,
                                         size_t len)
{
    struct readahead *ra = s->ra;

    if (ra->used + ra->chunk > ra->budget)
        return NULL;                  /* every chunk has a whole buffer */
    struct ra_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->buf = get_buf_locked(ra);
    if (!c->buf) {
        free(c);
        return NULL;
    }
    c->ra = ra;
    c->off = off;
    c->len = len;
    c->state = CHUNK_LOADING;
    c->a = (struct pool_aread) { .off = off, .len = len, .buf = c->buf,
                                 .done = chunk_landed, .opaque = c };
    ra->used += ra->chunk;
    ra->st.chunks++;
    return c;
}

/* Create the chunks missing over the data ranges d[0..nd) (ascending),
 * up to the stream's window, as LOADING; link them into s and onto *start
 * (to be started without the lock). */
static void plan_locked(struct ra_stream *s, const struct pool_range *d,
                        unsigned nd, struct ra_chunk **start)
{
    struct readahead *ra = s->ra;
    struct ra_chunk **pp = &s->chunks;

    unsigned window = s->seq >= 8 ? ra->depth : 1u << (s->seq - 1);
    if (window > ra->depth)
        window = ra->depth;
    uint64_t bytes = (uint64_t) window * ra->chunk;
    for (unsigned i = 0; i < nd; i++) {
        uint64_t pos = d[i].start, limit = d[i].end;
        while (pos < limit) {
            if (s->nbytes >= bytes || s->nchunks >= RA_STREAM_CHUNKS(ra))
                return;
            while (*pp && (*pp)->off + (*pp)->len <= pos)
                pp = &(*pp)->next;
            if (*pp && (*pp)->off <= pos) {
                pos = (*pp)->off + (*pp)->len;   /* already covered */
                continue;
            }
            uint64_t end = limit - pos < ra->chunk ? limit : pos + ra->chunk;
            if (*pp && (*pp)->off < end)
                end = (*pp)->off;                /* fill the gap only */
            struct ra_chunk *c = new_chunk_locked(s, pos,
                                                  (size_t) (end - pos));
            if (!c)
                return;                          /* budget spent */
            c->next = *pp;
            *pp = c;
            s->nchunks++;
            s->nbytes += c->len;
            c->start_next = *start;
            *start = c;
            pos = end;
        }
    }
}

/* Start the planned chunks (in offset order).  Without the lock. */
static void start_chunks(struct readahead *ra, struct ra_chunk *list)
{
    struct ra_chunk *rev = NULL;
    while (list) {                           /* planned newest first */
        struct ra_chunk *next = list->start_next;
        list->start_next = rev;
        rev = list;
        list = next;
    }
    while (rev) {
        struct ra_chunk *c = rev;
        rev = c->start_next;
        int r = pool_read_start(ra->pool, &c->a);
        if (r == 0)
            continue;                        /* chunk_landed() follows */
        LOCK_FOR_SCOPE(&ra->lock);
        c->landed = true;
        c->state = r == 1 ? CHUNK_READY : CHUNK_FAILED;
        maybe_free_locked(ra, c);            /* dropped meanwhile */
        pthread_cond_broadcast(&ra->cond);
    }
}

/* ---- reading --------------------------------------------------------- */

/* Classify a read at off and move the stream: chunks the reader passed
 * go, a jump backwards or far ahead drops all and restarts detection.
 * Skipping a hole is no jump: zero_from, if not UINT64_MAX, is a position
 * from which everything up to off is known to read as zero. */
static void follow_locked(struct ra_stream *s, uint64_t off, size_t len,
                          uint64_t zero_from)
{
    uint64_t reach = (uint64_t) s->ra->depth * s->ra->chunk;

    if (off >= s->next &&
        (off - s->next <= reach || zero_from == s->next)) {
        if (s->seq < 64)
            s->seq++;
        while (s->chunks && s->chunks->off + s->chunks->len <= off)
            drop_locked(s, &s->chunks);      /* passed (or skipped) */
    } else {
        s->seq = 0;
        drop_all_locked(s);
    }
    s->next = off + len;
}

/* Find the live chunk holding pos. */
static struct ra_chunk **find_locked(struct ra_stream *s, uint64_t pos)
{
    for (struct ra_chunk **pp = &s->chunks; *pp; pp = &(*pp)->next)
        if ((*pp)->off <= pos && pos < (*pp)->off + (*pp)->len)
            return pp;
    return NULL;
}

/* A reader is about to wait for a chunk in flight: counted once per
 * read (*waited). */
static void count_wait_locked(struct readahead *ra, bool *waited)
{
    if (!*waited) {
        *waited = true;
        ra->st.waits++;
    }
}

/* Serve [*pos, end) from chunks as far as they reach; *pos advances.
 * *waited: set (and counted) the first time it waits for a chunk. */
static void serve_locked(struct ra_stream *s, uint64_t base, char *buf,
                         uint64_t *pos, uint64_t end, bool *waited)
{
    struct readahead *ra = s->ra;

    while (*pos < end) {
        struct ra_chunk **pp = find_locked(s, *pos);
        if (!pp)
            return;
        struct ra_chunk *c = *pp;
        if (c->state == CHUNK_LOADING) {
            count_wait_locked(ra, waited);
            pthread_cond_wait(&ra->cond, &ra->lock);
            continue;                        /* it may be gone now */
        }
        if (c->state == CHUNK_FAILED) {
            drop_locked(s, pp);              /* read it on demand */
            return;
        }
        uint64_t n = c->off + c->len - *pos;
        if (n > end - *pos)
            n = end - *pos;
        c->users++;
        pthread_mutex_unlock(&ra->lock);
        memcpy(buf + (*pos - base), c->buf + (*pos - c->off), (size_t) n);
        pthread_mutex_lock(&ra->lock);
        c->users--;
        maybe_free_locked(ra, c);
        ra->st.hits += n;
        *pos += n;
    }
}

/* Follow the reader to [off, off+len) and start the chunks ahead. */
static void prepare(struct readahead *ra, struct ra_stream *s, uint64_t off,
                    size_t len, uint64_t limit)
{
    struct ra_chunk *start = NULL;
    struct pool_range d[RA_MAX_DEPTH + 1];

    uint64_t next;
    {
        LOCK_FOR_SCOPE(&ra->lock);
        next = s->next;
    }
    /* Outside ra->lock (the pool's lock is taken): the maps may change
     * meanwhile, which only makes the plan less useful, never wrong (a
     * chunk is checked against the pool when it starts, and dropped by
     * ra_invalidate() when the range changes). */
    uint64_t zero_from = UINT64_MAX;
    if (off > next &&
        pool_data_ranges(ra->pool, next, off, 0, 1, d, 1) == 0)
        zero_from = next;                 /* the reader skipped a hole */
    unsigned nd = pool_data_ranges(ra->pool, off, limit, RA_MERGE_HOLE,
                                   (uint64_t) ra->depth * ra->chunk, d,
                                   RA_STREAM_CHUNKS(ra) + 1);
    {
        LOCK_FOR_SCOPE(&ra->lock);
        follow_locked(s, off, len, zero_from);
        if (s->seq >= SEQ_MIN)
            plan_locked(s, d, nd, &start);
    }
    start_chunks(ra, start);
}

/* Where the first live chunk after pos begins, or end. */
static uint64_t next_chunk_locked(const struct ra_stream *s, uint64_t pos,
                                  uint64_t end)
{
    for (const struct ra_chunk *c = s->chunks; c; c = c->next)
        if (c->off > pos)
            return c->off < end ? c->off : end;
    return end;
}

/* Copy [off, off+len) from the chunks, the gaps between them from the
 * pool (a hole, which no chunk covers, reads as zeros there without a
 * server read; the data after it still comes from its chunk). */
static int copy_out(struct readahead *ra, struct ra_stream *s, uint64_t off,
                    void *buf, size_t len)
{
    uint64_t pos = off, end = off + len;
    bool waited = false;

    for (;;) {
        uint64_t gap;
        {
            LOCK_FOR_SCOPE(&ra->lock);
            serve_locked(s, off, buf, &pos, end, &waited);
            gap = pos < end ? next_chunk_locked(s, pos, end) : end;
            ra->st.misses += gap - pos;
        }
        if (pos >= end)
            return 0;
        int r = pool_read(ra->pool, pos, (char *) buf + (pos - off),
                          (size_t) (gap - pos));
        if (r < 0)
            return r;
        pos = gap;
    }
}

int ra_read(struct readahead *ra, struct ra_stream *s, uint64_t off,
            void *buf, size_t len, uint64_t limit)
{
    if (!s)
        return pool_read(ra->pool, off, buf, len);
    prepare(ra, s, off, len, limit);
    return copy_out(ra, s, off, buf, len);
}

static void put_locked(struct readahead *ra, struct ra_span *span,
                       unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        struct ra_chunk *c = span[i].ref;
        assert(c && c->users > 0);
        c->users--;
        maybe_free_locked(ra, c);
    }
}

/* Hold the arrived chunks that cover [off, end) entirely, if at most
 * RA_SPANS do.  Waits for chunks in flight, or with !wait gives up. */
static bool hold_locked(struct ra_stream *s, uint64_t off, uint64_t end,
                        struct ra_span *span, unsigned *nspan, bool wait)
{
    struct readahead *ra = s->ra;
    uint64_t pos = off;
    unsigned n = 0;
    bool waited = false;

    while (pos < end && n < RA_SPANS) {
        struct ra_chunk **pp = find_locked(s, pos);
        if (!pp)
            break;
        struct ra_chunk *c = *pp;
        if (c->state == CHUNK_LOADING && wait) {
            count_wait_locked(ra, &waited);
            pthread_cond_wait(&ra->cond, &ra->lock);
            continue;
        }
        if (c->state != CHUNK_READY)
            break;                           /* copy_out() drops it */
        uint64_t k = c->off + c->len - pos;
        if (k > end - pos)
            k = end - pos;
        c->users++;
        span[n++] = (struct ra_span) { .mem = c->buf + (pos - c->off),
                                       .len = (size_t) k, .ref = c };
        pos += k;
    }
    if (pos < end) {
        put_locked(ra, span, n);
        return false;
    }
    ra->st.hits += end - off;
    *nspan = n;
    return true;
}

static bool hold(struct readahead *ra, struct ra_stream *s, uint64_t off,
                 size_t len, struct ra_span *span, unsigned *nspan, bool wait)
{
    LOCK_FOR_SCOPE(&ra->lock);
    return hold_locked(s, off, off + len, span, nspan, wait);
}

int ra_read_spans(struct readahead *ra, struct ra_stream *s, uint64_t off,
                  size_t len, uint64_t limit, struct ra_span *span,
                  unsigned *nspan)
{
    if (s && len > 0) {
        prepare(ra, s, off, len, limit);
        if (hold(ra, s, off, len, span, nspan, true))
            return 0;
    }
    void *buf = malloc(len ? len : 1);
    if (!buf)
        return -ENOMEM;
    int r = s ? copy_out(ra, s, off, buf, len)
              : pool_read(ra->pool, off, buf, len);
    if (r < 0) {
        free(buf);
        return r;
    }
    span[0] = (struct ra_span) { .mem = buf, .len = len, .ref = NULL };
    *nspan = 1;
    return 0;
}

int ra_try_spans(struct readahead *ra, struct ra_stream *s, uint64_t off,
                 size_t len, uint64_t limit, struct ra_span *span,
                 unsigned *nspan)
{
    if (!s || len == 0)
        return 0;
    if (!hold(ra, s, off, len, span, nspan, false))
        return 0;                 /* nothing changed: the usual way */
    prepare(ra, s, off, len, limit);  /* follow it, start what is next */
    return 1;
}

void ra_put(struct readahead *ra, struct ra_span *span, unsigned nspan)
{
    if (nspan == 1 && !span[0].ref) {
        free((void *) span[0].mem);
        return;
    }
    LOCK_FOR_SCOPE(&ra->lock);
    put_locked(ra, span, nspan);
}

void ra_invalidate(struct readahead *ra, uint64_t off, uint64_t len)
{
    if (!ra || len == 0)
        return;
    LOCK_FOR_SCOPE(&ra->lock);
    for (struct ra_stream *s = ra->streams; s; s = s->next_s) {
        struct ra_chunk **pp = &s->chunks;
        while (*pp) {
            struct ra_chunk *c = *pp;
            if (c->off < off + len && off < c->off + c->len) {
                ra->st.dropped++;
                drop_locked(s, pp);
            } else {
                pp = &c->next;
            }
        }
    }
}

/* ---- streams and setup ----------------------------------------------- */

struct ra_stream *ra_stream_open(struct readahead *ra)
{
    if (!ra || ra->budget == 0)
        return NULL;
    struct ra_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ra = ra;
    LOCK_FOR_SCOPE(&ra->lock);
    s->next_s = ra->streams;
    if (s->next_s)
        s->next_s->prev = s;
    ra->streams = s;
    return s;
}

void ra_stream_close(struct ra_stream *s)
{
    if (!s)
        return;
    struct readahead *ra = s->ra;
    {
        LOCK_FOR_SCOPE(&ra->lock);
        drop_all_locked(s);
        DLIST_UNLINK(ra->streams, s, prev, next_s);
    }
    free(s);
}

int ra_create(struct pool *p, size_t budget, size_t chunk, unsigned depth,
              struct readahead **out)
{
    struct readahead *ra = calloc(1, sizeof *ra);
    if (!ra)
        return -ENOMEM;
    size_t max = pool_read_max(p);
    ra->pool = p;
    ra->chunk = chunk < max ? chunk : max;
    if (ra->chunk < 4096)
        ra->chunk = 4096;
    ra->depth = depth ? depth < RA_MAX_DEPTH ? depth : RA_MAX_DEPTH : 1;
    ra->budget = budget;
    if (budget > 0 && budget < ra->chunk)
        ra->budget = ra->chunk;              /* at least one chunk */
    ra->max_free = (unsigned) (ra->budget / ra->chunk);
    ra->free_bufs = calloc(ra->max_free + 1, sizeof *ra->free_bufs);
    if (!ra->free_bufs) {
        free(ra);
        return -ENOMEM;
    }
    pthread_mutex_init(&ra->lock, NULL);
    pthread_cond_init(&ra->cond, NULL);
    *out = ra;
    return 0;
}

void ra_destroy(struct readahead *ra)
{
    if (!ra)
        return;
    while (ra->streams)
        ra_stream_close(ra->streams);
    assert(ra->used == 0);
    while (ra->nfree > 0)
        free(ra->free_bufs[--ra->nfree]);
    free(ra->free_bufs);
    pthread_mutex_destroy(&ra->lock);
    pthread_cond_destroy(&ra->cond);
    free(ra);
}

void ra_get_stats(struct readahead *ra, struct ra_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!ra)
        return;
    LOCK_FOR_SCOPE(&ra->lock);
    *out = ra->st;
    out->budget = ra->budget;
    out->in_use = ra->used;
}
