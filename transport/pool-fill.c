/* transport/pool-fill.c: zero-copy writes (fills), holds and landings
 * (see pool-internal.h, "ZERO-COPY WRITES" and "LANDINGS").
 *
 * THREAD MODEL
 * Fills and landings are the FUSE receiver thread's (fs/rawfile.c,
 * fs/fuseloop.c: one landing at a time); the caller fills reserved or
 * landed memory without pool->lock, everything else runs under it.
 * pool_hold_release() runs on whichever thread held the bytes (the
 * digest thread, its hashers, the receiver).
 */
#include "transport/pool-internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "common/monotime.h"
#include "common/rounding.h"

/* ---- zero-copy writes ------------------------------------------------ */

/* A FILLING buffer that a write at off would extend at its tail. */
static struct pool_req *find_tail(struct pool *p, uint64_t off)
{
    for (struct pool_req *r = p->filling.head; r; r = r->next)
        if (!r->busy && !r->landing && r->off + r->len == off &&
            off >= r->off + r->held_end &&
            off < r->off + p->cfg.request_size)
            return r;
    return NULL;
}

/* Undo a reservation, last segment first.  Each segment was the tail of
 * its buffer and nothing landed after it (the buffer was busy), so giving
 * it back is shrinking the buffer; one left empty was new: it goes. */
static void unreserve_locked(struct pool *p, struct pool_fill *f)
{
    while (f->nseg > 0) {
        struct pool_seg *s = &f->seg[--f->nseg];
        struct pool_req *r = s->req;
        assert(r->busy);
        assert(r->data + r->len == (char *) s->mem + s->len);
        r->busy = false;
        r->len -= s->len;
        if (r->len == 0) {
            assert(r->holds == 0);
            pool_list_remove(r->state == REQ_FILLING ? &p->filling
                                                     : &p->queue, r);
            pool_free_req_locked(p, r);
        }
    }
    pthread_cond_broadcast(&p->cond);
}

/* Reserve [off, off+n) at the tail of FILLING buffer b for f, its
 * range already out of pending_zero: b is busy (not sent, nothing else
 * lands in it) until the commit.  Older buffered bytes overlapping it are
 * sealed first (invariant 1); a full buffer is sealed, to be sent once
 * committed.  A fill's segments and a landing's bytes are reserved
 * alike. */
static void reserve_seg_locked(struct pool *p, struct pool_fill *f,
                               struct pool_req *b, uint64_t off, size_t n)
{
    assert(b->state == REQ_FILLING && !b->busy && b->off + b->len == off);
    assert(f->nseg < POOL_FILL_SEGS);
    f->seg[f->nseg++] = (struct pool_seg) {
        .mem = b->data + (off - b->off), .len = n, .req = b };
    b->busy = true;
    b->len += n;
    pool_seal_overlapping_locked(p, off, n, b);
    assert(!pool_filling_overlaps_other(p, b));       /* invariant 1 */
    if (b->len == p->cfg.request_size)
        pool_seal_locked(p, b);            /* sent once committed */
}

/* One pass at reserving f->off, f->len.  1: waited for a buffer (nothing
 * is reserved; try again), 0 or -errno.  The reserved range leaves
 * pending_zero here, under the lock, not at commit: a drain while the
 * caller fills it unlocked would otherwise queue a zero over it after
 * its (sealed, busy) buffer, and the zero would win over this write,
 * which is newer than the truncate. */
static int reserve_locked(struct pool *p, struct pool_fill *f)
{
    size_t done = 0;
    int perr = 0;

    f->nseg = 0;
    if (pool_pending_room_locked(p, &perr))
        return perr ? perr : 1;           /* waited: decide again */
    while (done < f->len) {
        uint64_t off = f->off + done;
        struct pool_req *b = find_tail(p, off);
        int err = 0;

        if (!b && f->nseg == POOL_FILL_SEGS) {
            unreserve_locked(p, f);
            return -EAGAIN;
        }
        if (!b) {
            pool_seal_overlapping_locked(p, off, f->len - done, NULL);
            if (f->nseg > 0 && pool_spare_locked(p) == 0) {
                unreserve_locked(p, f);   /* never wait holding buffers */
                return -EAGAIN;
            }
            b = pool_new_filling_locked(p, off, &err);
            if (!b) {
                unreserve_locked(p, f);
                return err ? err : 1;
            }
        }
        size_t room = b->off + p->cfg.request_size - off;
        size_t n = f->len - done < room ? f->len - done : room;
        err = extmap_remove(&p->pending_zero, off, off + n);
        if (err < 0) {
            if (b->len == 0 && !b->busy)
                pool_discard_filling_locked(p, b);
            unreserve_locked(p, f);
            return err;
        }
        b->touched_ns = mono_now_ns();
        reserve_seg_locked(p, f, b, off, n);
        done += n;
    }
    return 0;
}

int pool_fill_begin(struct pool *p, uint64_t off, size_t len,
                    struct pool_fill *f)
{
    int r;

    f->off = off;
    f->len = len;
    f->nseg = f->nhold = 0;
    if (p->cfg.write_through || len == 0)
        return -EAGAIN;
    LOCK_FOR_SCOPE(&p->lock);
    /* A write arriving after the loss tries the server again; one that
     * waited for a buffer while the server was given up on fails with
     * the requests it waited for: a heal try there (a handshake up to
     * --request-timeout on a paused server) would stretch the
     * documented request + retry timeout. */
    r = pool_heal_locked(p) < 0 ? -EIO : reserve_locked(p, f);
    while (r == 1)
        r = p->lost ? -EIO : reserve_locked(p, f);
    pool_dispatch_locked(p);
    return r;
}

/* Is [off, off+len) of the filled write all zero? */
static bool fill_is_zero(const struct pool_fill *f, uint64_t off, size_t len)
{
    uint64_t pos = f->off;

    for (unsigned i = 0; i < f->nseg && len > 0; pos += f->seg[i++].len) {
        if (off >= pos + f->seg[i].len)
            continue;
        size_t n = pos + f->seg[i].len - off < len
                       ? (size_t) (pos + f->seg[i].len - off) : len;
        if (!is_zero((const char *) f->seg[i].mem + (off - pos), n))
            return false;
        off += n;
        len -= n;
    }
    return true;
}

/* Would pool_write() have turned part of this write into write-zeroes?
 * Whole aligned zero chunks, or a chunk straddling the start of the
 * write whose first part is zero in the buffer before it (see
 * take_straddling_zeros()). */
static bool fill_has_zeros(struct pool *p, const struct pool_fill *f)
{
    uint64_t end = f->off + f->len;
    uint64_t lo = ROUND_DOWN(f->off, (uint64_t) ZERO_CHUNK);

    for (uint64_t z = lo == f->off ? lo : lo + ZERO_CHUNK;
         z + ZERO_CHUNK <= end; z += ZERO_CHUNK)
        if (fill_is_zero(f, z, ZERO_CHUNK))
            return true;
    if (lo == f->off || lo + ZERO_CHUNK > end)
        return false;
    const struct pool_req *b = f->seg[0].req;
    return b->off <= lo && is_zero(b->data + (lo - b->off), f->off - lo) &&
           fill_is_zero(f, f->off, lo + ZERO_CHUNK - f->off);
}

static void add_hold_locked(struct pool_fill *f, struct pool_req *r,
                            uint64_t off, const void *mem, size_t len)
{
    r->holds++;
    f->hold[f->nhold++] = (struct pool_hold) {
        .off = off, .mem = mem, .len = len, .ref = r };
}

/* The write is in place: account for it as absorb_locked() does. */
static void commit_in_place_locked(struct pool *p, struct pool_fill *f,
                                   bool hold)
{
    uint64_t off = f->off;

    for (unsigned i = 0; i < f->nseg; off += f->seg[i++].len) {
        struct pool_req *r = f->seg[i].req;
        size_t n = f->seg[i].len;
        assert(r->busy);
        r->busy = false;
        r->touched_ns = mono_now_ns();
        /* pending_zero: left at reservation. */
        extmap_remove(&p->known_zero, off, off + n);  /* lossy: cannot fail */
        p->st.bytes_written += n;
        if (hold) {
            uint64_t end = off + n - r->off;
            if (end > r->held_end)
                r->held_end = end;
            add_hold_locked(f, r, off, f->seg[i].mem, n);
        }
    }
    f->nseg = 0;
}

/* The write holds zero chunks: take it back out and write it the way
 * pool_write() does, from a private copy (the hold, if wanted). */
static ssize_t commit_by_copy_locked(struct pool *p, struct pool_fill *f,
                                     bool hold)
{
    struct pool_req *c = calloc(1, sizeof *c);
    char *copy = malloc(f->len);
    size_t pos = 0;

    if (!c || !copy) {
        free(c);
        free(copy);
        unreserve_locked(p, f);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < f->nseg; pos += f->seg[i++].len)
        memcpy(copy + pos, f->seg[i].mem, f->seg[i].len);
    unreserve_locked(p, f);
    ssize_t r = pool_write_split_locked(p, f->off, copy, f->len);
    c->kind = REQ_COPY;
    c->state = REQ_DONE;
    c->p = p;
    c->data = copy;
    if (r == 0 && hold)
        add_hold_locked(f, c, f->off, copy, f->len);
    pool_free_req_locked(p, c);
    return r;
}

ssize_t pool_fill_commit(struct pool *p, struct pool_fill *f, int err,
                         bool hold)
{
    ssize_t r = 0;

    f->nhold = 0;
    LOCK_FOR_SCOPE(&p->lock);
    if (err == 0 && p->lost)
        err = -EIO;
    if (err < 0) {
        unreserve_locked(p, f);
        r = err;
    } else if (fill_has_zeros(p, f))
        r = commit_by_copy_locked(p, f, hold);
    else
        commit_in_place_locked(p, f, hold);
    pool_dispatch_locked(p);
    return r < 0 ? r : (ssize_t) f->len;
}

void pool_hold_release(void *ref)
{
    struct pool_req *r = ref;
    struct pool *p = r->p;

    LOCK_FOR_SCOPE(&p->lock);
    assert(r->holds > 0);
    if (--r->holds == 0 && r->state == REQ_DONE) {
        if (r->kind == REQ_WRITE)
            p->nheld--;
        pool_free_req_locked(p, r);
        pthread_cond_broadcast(&p->cond);     /* a buffer is free */
    }
}

void pool_hold_dup(void *ref)
{
    struct pool_req *r = ref;

    LOCK_FOR_SCOPE(&r->p->lock);
    assert(r->holds > 0);
    r->holds++;
}

/* ---- landings: writes received straight into a buffer --------------- */

int pool_land_begin(struct pool *p, uint64_t next_off, size_t want,
                    bool wait, struct pool_landing *l)
{
    struct pool_req *b = NULL;

    *l = (struct pool_landing) { 0 };
    if (p->cfg.write_through || p->cfg.request_size < want)
        return -EAGAIN;           /* most writes would not fit */
    LOCK_FOR_SCOPE(&p->lock);
again:
    if (p->lost)
        return -EAGAIN;
    /* The tail of the buffer the next sequential write would extend... */
    for (struct pool_req *r = p->filling.head; r; r = r->next)
        if (!r->busy && !r->landing && r->off + r->len == next_off &&
            p->cfg.request_size - r->len >= want) {
            b = r;
            break;
        }
    /* ... or a whole free buffer, for a write anywhere.  A landing lasts
     * until the next request arrives, which may be never, so a writer
     * waiting for a buffer must have others to wait for: in flight,
     * filling (sealed when the pool runs out), or held by the digest
     * (within its own budget).  So never the last buffer of a pool of
     * fewer than four. */
    if (!b) {
        unsigned avail = pool_spare_locked(p);
        if (avail == 0 && wait && p->nbufs >= 4 &&
            (p->queue.n > 0 || p->filling.n > 0 || p->nheld > 0 ||
             p->retained.n > 0)) {
            /* As a write would: what fills the pool must drain. */
            pool_wait_buffer_locked(p, "landing");
            goto again;
        }
        if (avail == 0 || (avail < 2 && p->nbufs < 4))
            return -EAGAIN;
        char *data = pool_get_buffer_locked(p);
        if (!data)
            return -EAGAIN;
        b = pool_new_write_req_locked(p, data);
        if (!b)                       /* in no list until a write lands */
            return -EAGAIN;
    }
    b->landing = true;
    b->holds++;                       /* not reused before pool_land_end() */
    p->landing = b;
    l->req = b;
    l->mem = b->data + b->len;
    l->room = p->cfg.request_size - b->len;
    return 0;
}

ssize_t pool_land_commit(struct pool *p, struct pool_landing *l, uint64_t off,
                         size_t len, bool hold, struct pool_fill *f)
{
    struct pool_req *b = l->req;
    bool fresh;

    f->off = off;
    f->len = len;
    f->nseg = f->nhold = 0;
    if (!b || l->used || len == 0 || len > l->room)
        return -EAGAIN;
    LOCK_FOR_SCOPE(&p->lock);
    if (p->lost)
        return -EIO;
    assert(b->landing);
    fresh = b->state == REQ_NEW;
    if (!fresh && (b->state != REQ_FILLING || b->off + b->len != off))
        return -EAGAIN;           /* sealed meanwhile, or another offset */
    if (extmap_count(&p->pending_zero) + 2 > p->map_max)
        return -EAGAIN;           /* pool_fill_begin() makes room first */
    if (fresh) {
        /* As pool_new_filling_locked() at off, with the landing's buffer.
         * Older buffered bytes in the range go first (invariant 1). */
        pool_seal_overlapping_locked(p, off, len, NULL);
        if (p->filling.n >= MAX_FILLING)
            pool_seal_locked(p, p->filling.head);
        pool_open_filling_locked(p, b, off);
    }
    if (extmap_remove(&p->pending_zero, off, off + len) < 0) {
        if (fresh) {              /* back to an unused landing */
            pool_list_remove(&p->filling, b);
            b->state = REQ_NEW;
        }
        return -EAGAIN;
    }
    /* The bytes are in place: a reservation at the buffer's tail, then
     * committed as pool_fill_commit() does. */
    l->used = true;
    b->landing = false;
    p->landing = NULL;
    assert(l->mem == b->data + (off - b->off));
    reserve_seg_locked(p, f, b, off, len);
    if (fill_has_zeros(p, f)) {
        /* Zero runs go as write-zeroes, from a private copy, exactly as
         * pool_fill_commit() does.  The landing ends here: the copy is
         * taken before the bytes are given back. */
        b->holds--;
        l->req = NULL;
        ssize_t r = commit_by_copy_locked(p, f, hold);
        pool_dispatch_locked(p);
        return r < 0 ? r : (ssize_t) len;
    }
    commit_in_place_locked(p, f, hold);
    p->st.bytes_landed += len;
    pool_dispatch_locked(p);
    return (ssize_t) len;
}

void pool_land_end(struct pool *p, struct pool_landing *l)
{
    struct pool_req *b = l->req;

    if (!b)
        return;
    l->req = NULL;
    {
        LOCK_FOR_SCOPE(&p->lock);
        b->landing = false;
        if (p->landing == b)
            p->landing = NULL;
        if (b->state == REQ_NEW) {    /* a whole buffer nothing landed in */
            b->holds--;
            pool_free_req_locked(p, b);
            pthread_cond_broadcast(&p->cond);
            return;
        }
    }
    pool_hold_release(b);
}
