/* digest/verify-reader.c: the pipelined reader (verify-reader.h).
 *
 * OWNERSHIP
 * A buffer belongs to the backend from read() until vr_done(); it
 * returns to the free stack only after the sink took it.  If the run
 * stops with reads still in flight (error, abort, non-zero tail), the
 * caller drains them (vreader_drain) and, if some never answer, closes
 * the backend before vreader_free() frees their buffers.
 */
#include "digest/verify-reader.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/vector.h"

struct extent {
    uint64_t off, len;
    bool zero;
};

struct vreader {
    struct vr_config c;
    const struct vr_backend *b;
    void *ctx;                          /* the backend's */
    struct sink *k;                     /* borrowed */
    struct vr_ent *ring;                /* owned: cap entries */
    size_t cap, head, count;
    unsigned char **free_bufs;          /* owned stack of owned buffers */
    size_t nfree, nbufs;
    uint64_t sched;                     /* next offset to schedule */
    struct extent *ext;                 /* owned: known extents from sched */
    size_t ext_cap, ext_head, ext_count;
    uint64_t ext_end;                   /* extents known up to here */
    uint64_t bs_off, bs_len;            /* the block status request */
    bool use_bs;                        /* false: everything is data */
    bool bs_inflight;
};

/* ---- extent queue ---- */

static int ext_append(struct vreader *r, uint64_t len, bool zero)
{
    if (r->ext_count) {
        struct extent *last = &r->ext[r->ext_head + r->ext_count - 1];
        if (last->zero == zero) {
            last->len += len;
            r->ext_end += len;
            return 0;
        }
    }
    if (r->ext_head + r->ext_count == r->ext_cap) {
        if (r->ext_head > 0) {
            memmove(r->ext, r->ext + r->ext_head, r->ext_count * sizeof *r->ext);
            r->ext_head = 0;
        } else {
            void *e = r->ext;
            if (vector_grow(&e, &r->ext_cap, r->ext_count, 1, sizeof *r->ext,
                            256) < 0)
                return -ENOMEM;
            r->ext = e;
        }
    }
    r->ext[r->ext_head + r->ext_count++] =
        (struct extent) { .off = r->ext_end, .len = len, .zero = zero };
    r->ext_end += len;
    return 0;
}

/* Only extents that continue the known ones count (a reply says each
 * once). */
int vr_extent(struct vreader *r, uint64_t off, uint64_t len, bool zero)
{
    uint64_t end = r->k->end;

    if (off != r->ext_end || r->ext_end >= end || len == 0)
        return 0;
    if (len > end - r->ext_end)
        len = end - r->ext_end;
    return ext_append(r, len, zero && len >= r->c.zero_skip_min);
}

/* A failed or empty answer: its window is data (bs_retry), or block
 * status is off and the rest is read. */
void vr_extents_done(struct vreader *r, int err)
{
    r->bs_inflight = false;
    if (!err && r->ext_end != r->bs_off)
        return;
    if (!r->c.bs_retry || ext_append(r, r->bs_off + r->bs_len - r->ext_end,
                                     false) < 0)
        r->use_bs = false;
}

static uint64_t lookahead(const struct vreader *r)
{
    uint64_t window = (uint64_t) r->nbufs * r->c.request_size * 4;
    return window > r->c.bs_span / 2 ? window : r->c.bs_span / 2;
}

static int request_extents(struct vreader *r)
{
    if (!r->use_bs || r->bs_inflight || r->ext_end >= r->k->end ||
        r->ext_end - r->sched >= lookahead(r))
        return 0;
    r->bs_off = r->ext_end;
    r->bs_len = r->k->end - r->ext_end;
    if (r->bs_len > r->c.bs_span)
        r->bs_len = r->c.bs_span;
    r->bs_inflight = true;
    int e = r->b->extents(r->ctx, r, r->bs_off, r->bs_len);
    if (e < 0)
        r->bs_inflight = false;
    return e;
}

/* The extent at r->sched, if known yet.  Returns false: wait for block
 * status. */
static bool next_extent(struct vreader *r, uint64_t *len, bool *zero)
{
    if (r->ext_count) {
        *len = r->ext[r->ext_head].len;
        *zero = r->ext[r->ext_head].zero;
        return true;
    }
    if (r->use_bs)
        return false;
    *len = r->k->end - r->sched;
    *zero = false;
    return true;
}

static void consume(struct vreader *r, uint64_t n)
{
    r->sched += n;
    if (!r->ext_count)
        return;                         /* block status is off */
    struct extent *e = &r->ext[r->ext_head];
    e->off += n;
    e->len -= n;
    if (e->len == 0) {
        r->ext_head++;
        r->ext_count--;
    }
    if (!r->ext_count) {
        r->ext_head = 0;
        if (!r->use_bs)
            r->ext_end = r->sched;
    }
}

/* ---- reads ---- */

void vr_done(struct vr_ent *e, int err)
{
    e->err = err;
    atomic_store_explicit(&e->done, true, memory_order_release);
}

static bool ent_done(struct vr_ent *e)
{
    return atomic_load_explicit(&e->done, memory_order_acquire);
}

static struct vr_ent *ring_push(struct vreader *r, uint64_t len,
                                unsigned char *buf)
{
    struct vr_ent *e = &r->ring[(r->head + r->count++) % r->cap];

    e->off = r->sched;
    e->len = len;
    e->buf = buf;
    e->err = 0;
    atomic_store_explicit(&e->done, buf == NULL, memory_order_relaxed);
    return e;
}

/* Returns 1 if an entry was scheduled, 0 if nothing can be now, -errno. */
static int schedule_one(struct vreader *r)
{
    uint64_t len;
    bool zero;

    if (r->sched >= r->k->end || r->count == r->cap ||
        !next_extent(r, &len, &zero))
        return 0;
    if (zero && r->b->must_read && r->b->must_read(r->ctx, r->sched, &len))
        zero = false;
    if (zero) {
        len = len < r->c.zero_piece ? len : r->c.zero_piece;
        ring_push(r, len, NULL);
        consume(r, len);
        return 1;
    }
    if (!r->nfree)
        return 0;
    len = len < r->c.request_size ? len : r->c.request_size;
    struct vr_ent *e = ring_push(r, len, r->free_bufs[--r->nfree]);
    consume(r, len);
    int err = r->b->read(r->ctx, e);
    if (err < 0)
        vr_done(e, -err);               /* not sent: nothing in flight */
    return err < 0 ? err : 1;
}

static int schedule(struct vreader *r)
{
    int e;

    do {
        if ((e = request_extents(r)) < 0)
            return e;
    } while ((e = schedule_one(r)) > 0);
    return e;
}

static int feed_head(struct vreader *r)
{
    struct vr_ent *e = &r->ring[r->head];
    int s;

    if (e->err) {
        if (r->b->read_failed)
            r->b->read_failed(r->ctx, e);
        else
            verify_err("%s: read %zu bytes at %llu: %s", r->c.name, e->len,
                       (unsigned long long) e->off, strerror(e->err));
        return -e->err;
    }
    s = e->buf ? sink_data(r->k, e->buf, e->len) : sink_zero(r->k, e->len);
    if (s >= 0 && r->b->consumed)
        r->b->consumed(r->ctx, e);
    if (e->buf)
        r->free_bufs[r->nfree++] = e->buf;
    r->head = (r->head + 1) % r->cap;
    r->count--;
    return s;
}

int vreader_run(struct vreader *r)
{
    while (r->k->pos < r->k->end) {
        int e;

        if (sink_aborted(r->k))
            return -ECANCELED;
        if ((e = schedule(r)) < 0)
            return e;
        if (r->count && ent_done(&r->ring[r->head])) {
            bool was_read = r->ring[r->head].buf != NULL;
            if ((e = feed_head(r)) != 0)
                return e;               /* error or SINK_STOP */
            /* Collect replies that arrived while we hashed. */
            if (was_read && (e = r->b->wait(r->ctx, 0)) < 0)
                return e;
            continue;
        }
        if (!r->count && !r->bs_inflight) {
            verify_err("%s: internal error: pipeline stalled at %llu",
                       r->c.name, (unsigned long long) r->sched);
            return -EIO;
        }
        if ((e = r->b->wait(r->ctx, -1)) < 0)
            return e;
    }
    return 0;
}

/* ---- setup and teardown ---- */

int vreader_create(const struct vr_config *c, const struct vr_backend *b,
                   void *ctx, struct sink *k, struct vreader **out)
{
    struct vreader *r = calloc(1, sizeof *r);

    *out = r;
    if (!r)
        goto oom;
    r->c = *c;
    r->b = b;
    r->ctx = ctx;
    r->k = k;
    r->use_bs = c->block_status;
    r->nbufs = c->requests;
    r->cap = r->nbufs * 4 + 64;
    r->ring = calloc(r->cap, sizeof *r->ring);
    r->free_bufs = calloc(r->nbufs, sizeof *r->free_bufs);
    if (!r->ring || !r->free_bufs)
        goto oom;
    for (; r->nfree < r->nbufs; r->nfree++)
        if (!(r->free_bufs[r->nfree] = malloc(c->request_size)))
            goto oom;
    return 0;
oom:
    verify_err("out of memory");
    return -ENOMEM;
}

static int64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t) t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

bool vreader_drain(struct vreader *r, int timeout_ms)
{
    int64_t due = mono_ms() + timeout_ms;
    unsigned n;

    /* Only the backend's count: an entry marked done may still be inside
     * its completion, which touches the backend's state (its lock) after
     * marking it; the backend counts a request out only once that is
     * over. */
    while ((n = r->b->in_flight(r->ctx)) > 0) {
        int64_t left = timeout_ms < 0 ? -1 : due - mono_ms();
        if (timeout_ms >= 0 && left <= 0) {
            verify_err("%s: abandoning %u request(s): no reply within %d s",
                       r->c.name, n, timeout_ms / 1000);
            return false;
        }
        if (r->b->wait(r->ctx, (int) left) < 0)
            break;                      /* the connection is gone */
    }
    return r->b->in_flight(r->ctx) == 0;
}

void vreader_free(struct vreader *r)
{
    if (!r)
        return;
    if (r->ring)
        for (size_t i = 0; i < r->count; i++)
            free(r->ring[(r->head + i) % r->cap].buf);
    for (size_t i = 0; i < r->nfree; i++)
        free(r->free_bufs[i]);
    free(r->free_bufs);
    free(r->ring);
    free(r->ext);
    free(r);
}
