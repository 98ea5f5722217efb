/* transport/pool-read.c: reads (waiting and asynchronous), seek, the
 * data ranges the read-ahead asks for, and the touched ranges.
 *
 * THREAD MODEL
 * pool_read() runs on worker threads (and on the digest thread and the
 * main thread for the read-back) and drops pool->lock around the server
 * read; pool_read_start() on readers' threads (transport/readahead.c,
 * workers and the receiver), its completion aread_done() on an nbdx I/O
 * thread; seek and data ranges on workers and readers' threads.  Every
 * one takes pool->lock to decide.
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>             /* SEEK_DATA */

#include "common/log.h"

/* ---- reading --------------------------------------------------------- */

static bool queue_overlaps(struct pool *p, uint64_t off, uint64_t len)
{
    for (struct pool_req *r = p->queue.head; r; r = r->next)
        if (pool_overlaps(r->off, r->len, off, len))
            return true;
    return false;
}

/* The pending zeroes in [off, off+len), clipped, as they are now. */
struct zero_snapshot {
    struct ext small[8], *v;
    size_t n;
};

static int snapshot_pending_locked(struct pool *p, uint64_t off, size_t len,
                                   struct zero_snapshot *s)
{
    size_t n = extmap_count_in(&p->pending_zero, off, off + len);
    struct ext e;

    s->v = s->small;
    s->n = 0;
    if (n > sizeof s->small / sizeof s->small[0] &&
        !(s->v = malloc(n * sizeof *s->v)))
        return -ENOMEM;
    for (uint64_t pos = off;
         extmap_next(&p->pending_zero, pos, &e) && e.start < off + len;
         pos = e.end) {
        assert(s->n < n);
        s->v[s->n++] = (struct ext){ e.start > off ? e.start : off,
                                     e.end < off + len ? e.end : off + len };
    }
    return 0;
}

static void overlay_snapshot(const struct zero_snapshot *s, uint64_t off,
                             char *buf)
{
    for (size_t i = 0; i < s->n; i++)
        memset(buf + (s->v[i].start - off), 0, s->v[i].end - s->v[i].start);
    if (s->v != s->small)
        free(s->v);
}

static int read_server(struct pool *p, uint64_t off, char *buf, size_t len)
{
    size_t max = (size_t) pool_max_request(p, READ_MAX_LEN);

    while (len > 0) {
        size_t n = len < max ? len : max;
        struct nbdx_op op = { .kind = NBDX_OP_READ, .off = off, .len = n,
                              .buf = buf };
        int r = nbdx_run(p->x, &op);
        if (r < 0)
            return r;
        off += n;
        buf += n;
        len -= n;
    }
    return 0;
}

/* Everything is decided at one moment, under the lock, after the last
 * wait: the read then holds what the disk held at that moment.  The
 * server read runs unlocked; the pending zeroes are overlaid from the
 * snapshot taken at that moment, not from pending_zero as it is when the
 * reply comes (a drain meanwhile may have turned them into zero requests
 * the server read raced with, returning the bytes from before the
 * truncate).  A write landing meanwhile is concurrent with this read, so
 * either of its results is correct. */
/* The moment the read is decided (see pool_read()): -EIO if the lost
 * connection does not heal, else 0 or -ENOMEM (the snapshot). */
static int read_decide(struct pool *p, uint64_t off, size_t len,
                       struct zero_snapshot *snap, bool *all_zero,
                       uint64_t *seen)
{
    LOCK_FOR_SCOPE(&p->lock);
    if (pool_heal_locked(p) < 0)
        return -EIO;
    /* A reconnect's resends are writes like any other: waited for. */
    pool_check_reconnect_locked(p);
    *seen = p->reconnects_seen;
    pool_seal_overlapping_locked(p, off, len, NULL);
    pool_dispatch_locked(p);
    while (queue_overlaps(p, off, len))
        pool_cond_wait_locked(p, "read");
    *all_zero = extmap_covered(&p->known_zero, off, off + len) +
                    extmap_covered(&p->pending_zero, off, off + len) ==
                len;
    return *all_zero ? 0 : snapshot_pending_locked(p, off, len, snap);
}

static void read_count(struct pool *p, uint64_t off, size_t len, int r)
{
    LOCK_FOR_SCOPE(&p->lock);
    if (r < 0) {
        /* The reader gets this error itself: not part of the errseq. */
        p->st.errors++;
        log_err("read of %zu bytes at offset %" PRIu64 " failed: %s", len,
                off, strerror(-r));
    } else {
        p->st.bytes_read += len;
        p->st.requests[POOL_READ]++;
    }
}

/* A reconnect since the read was decided: a restarted server may have
 * answered it before the retained writes were sent again (with retention
 * only: without, they are damage and the reader is not told). */
static bool read_crossed(struct pool *p, uint64_t seen)
{
    return p->retain && nbdx_reconnects(p->x) != seen;
}

int pool_read(struct pool *p, uint64_t off, void *buf, size_t len)
{
    struct zero_snapshot snap;
    bool all_zero = false;
    uint64_t seen;
    int r;

again:
    r = read_decide(p, off, len, &snap, &all_zero, &seen);
    if (r == -EIO)                /* not healed: nothing read or counted */
        return r;
    if (all_zero)
        memset(buf, 0, len);
    else if (r == 0) {
        r = read_server(p, off, buf, len);
        if (r < 0)
            r = -pool_tool_errno(-r);  /* a lost connection reads as EIO */
        overlay_snapshot(&snap, off, buf);
        if (r == 0 && read_crossed(p, seen))
            goto again;           /* after the resends, read again */
    }
    read_count(p, off, len, r);
    return r;
}

/* ---- asynchronous reads ---------------------------------------------- */

struct aread_op {
    struct nbdx_op op;
    struct pool_aread *a;
    uint64_t seen;                /* p->reconnects_seen when started */
};

size_t pool_read_max(struct pool *p)
{
    return (size_t) pool_max_request(p, READ_MAX_LEN);
}

/* nbdx completion.  done() runs before the count drops, so once
 * pool_destroy() sees no read outstanding no done() is running. */
static void aread_done(struct nbdx_op *op, int err)
{
    struct aread_op *ao = (struct aread_op *) op;
    struct pool_aread *a = ao->a;
    struct pool *p = a->p;
    uint64_t off = a->off;
    size_t len = a->len;

    if (!err && read_crossed(p, ao->seen))
        err = ESTALE;             /* read again on demand, after resends */
    free(ao);
    a->done(a, err);              /* may free a */
    LOCK_FOR_SCOPE(&p->lock);
    if (err) {
        /* Not an error of anyone's yet: the range is read again on
         * demand, and that read reports its own failure. */
        log_debug("read-ahead of %zu bytes at offset %" PRIu64 " failed: "
                  "%s", len, off, strerror(err));
    } else {
        p->st.bytes_read += len;
        p->st.requests[POOL_READ]++;
    }
    assert(p->areads > 0);
    p->areads--;
    pthread_cond_broadcast(&p->cond);
}

int pool_read_start(struct pool *p, struct pool_aread *a)
{
    uint64_t off = a->off, len = a->len;

    assert(len > 0 && len <= pool_read_max(p));
    LOCK_FOR_SCOPE(&p->lock);
    if (p->lost || p->stopping)
        return -EIO;
    pool_check_reconnect_locked(p);
    pool_seal_overlapping_locked(p, off, len, NULL);
    pool_dispatch_locked(p);
    uint64_t zero = extmap_covered(&p->known_zero, off, off + len);
    uint64_t pending = extmap_covered(&p->pending_zero, off, off + len);
    int r = 0;
    if (zero + pending == len) {
        memset(a->buf, 0, len);
        r = 1;
    } else if (pending > 0 || queue_overlaps(p, off, len)) {
        r = -EAGAIN;
    } else {
        struct aread_op *ao = calloc(1, sizeof *ao);
        if (!ao)
            return -EAGAIN;
        ao->a = a;
        ao->seen = p->reconnects_seen;
        ao->op = (struct nbdx_op) { .kind = NBDX_OP_READ, .off = off,
                                    .len = len, .buf = a->buf,
                                    .done = aread_done };
        a->p = p;
        p->areads++;
        nbdx_submit(p->x, &ao->op);   /* only queues; done() comes later */
    }
    return r;
}

/* ---- holes ----------------------------------------------------------- */

/* If pos is inside a range of m, its end; else pos. */
static uint64_t skip_range(const struct extmap *m, uint64_t pos)
{
    struct ext e;
    return extmap_next(m, pos, &e) && e.start <= pos ? e.end : pos;
}

/* Start of the first range of m at or after pos, or UINT64_MAX. */
static uint64_t next_range(const struct extmap *m, uint64_t pos)
{
    struct ext e;
    if (!extmap_next(m, pos, &e))
        return UINT64_MAX;
    return e.start > pos ? e.start : pos;
}

/* The first byte at or after pos not known to read as zero. */
static uint64_t data_start_locked(struct pool *p, uint64_t pos)
{
    for (;;) {
        uint64_t n = skip_range(&p->known_zero, pos);
        n = skip_range(&p->pending_zero, n);
        if (n == pos)
            return pos;
        pos = n;
    }
}

/* The first byte at or after pos known to read as zero, or UINT64_MAX. */
static uint64_t hole_start_locked(struct pool *p, uint64_t pos)
{
    uint64_t a = next_range(&p->known_zero, pos);
    uint64_t b = next_range(&p->pending_zero, pos);
    return a < b ? a : b;
}

int64_t pool_seek(struct pool *p, uint64_t off, int whence, uint64_t size)
{
    uint64_t pos = off;

    if (off >= size)
        return -ENXIO;
    {
        LOCK_FOR_SCOPE(&p->lock);
        if (whence == SEEK_DATA) {
            pos = data_start_locked(p, pos);
        } else {
            pos = hole_start_locked(p, pos);
            if (pos > size)
                pos = size;
        }
    }
    if (whence == SEEK_DATA && pos >= size)
        return -ENXIO;
    return (int64_t) pos;
}

unsigned pool_data_ranges(struct pool *p, uint64_t pos, uint64_t limit,
                          uint64_t merge, uint64_t want,
                          struct pool_range *v, unsigned n)
{
    unsigned k = 0;
    uint64_t got = 0;

    LOCK_FOR_SCOPE(&p->lock);
    while (got < want) {
        pos = data_start_locked(p, pos);
        if (pos >= limit)
            break;
        uint64_t end = hole_start_locked(p, pos);
        if (end > limit)
            end = limit;
        if (k > 0 && pos - v[k - 1].end < merge) {
            got += end - v[k - 1].end;    /* the short hole joins them */
            v[k - 1].end = end;
        } else if (k < n) {
            v[k++] = (struct pool_range) { pos, end };
            got += end - pos;
        } else {
            break;
        }
        pos = end;
    }
    return k;
}

uint64_t pool_allocated(struct pool *p, uint64_t size)
{
    LOCK_FOR_SCOPE(&p->lock);
    uint64_t z = extmap_covered(&p->known_zero, 0, size) +
                 extmap_covered(&p->pending_zero, 0, size);
    return z < size ? size - z : 0;
}

bool pool_touched_next(struct pool *p, uint64_t pos, struct pool_range *out)
{
    struct ext e;
    bool found;

    {
        LOCK_FOR_SCOPE(&p->lock);
        if (p->touched_all || !p->cfg.track_touched) {
            e = (struct ext) { 0, UINT64_MAX };
            found = true;
        } else {
            found = extmap_next(&p->touched, pos, &e);
        }
    }
    if (found)
        *out = (struct pool_range) { e.start, e.end };
    return found;
}
