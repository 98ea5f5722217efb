/* transport/pool-errors.c: what fs/ is told: the retained writes resent
 * after a reconnect (and those a reconnect may have lost), the error
 * sequence of the handles, the damage checks, and healing after a lost
 * connection.
 *
 * THREAD MODEL
 * Everything runs under pool->lock: pool_check_reconnect_locked() from
 * req_done() on nbdx I/O threads (where it never waits), from
 * pool_flush() and the stats; the rest from fs/'s error checks on the
 * receiver (a write's check) and worker threads (open, close, fsync).
 * pool_heal_locked() drops the lock around nbdx_heal(), which blocks.
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

static void log_lost(uint64_t off, uint64_t len, unsigned *logged)
{
    if ((*logged)++ < 16)
        log_err("write of %" PRIu64 " bytes at offset %" PRIu64 " may be "
                "lost: acknowledged, then the connection was made again "
                "before an NBD flush covered it, and its bytes were no "
                "longer kept to send again", len, off);
}

static int rezero_pieces_locked(struct pool *p, uint64_t start, uint64_t end,
                                struct extmap *t);

/* The ranges of m, writes acknowledged by a server that a reconnect
 * replaced before an NBD flush covered them and whose buffers were let go
 * (see "RETAINED WRITES" in pool-internal.h), become damage, but for the
 * parts that a request made since (a resend included) or a pending zero
 * will write anyway. */
static void lose_set_locked(struct pool *p, struct extmap *m, unsigned *logged)
{
    struct ext e, k;
    struct extmap t;

    extmap_init(&t, p->map_max, false);
    for (uint64_t pos = 0; extmap_next(m, pos, &e); pos = e.end) {
        pool_set_clear(&t);
        int r = rezero_pieces_locked(p, e.start, e.end, &t);
        for (uint64_t q = e.start; r == 0 && extmap_next(&p->pending_zero, q,
                                                         &k) &&
                                   k.start < e.end; q = k.end)
            r = extmap_remove(&t, k.start, k.end);
        if (r < 0) {                      /* not known: all of it */
            pool_set_clear(&t);
            extmap_add(&t, e.start, e.end);
        }
        for (uint64_t q = e.start; extmap_next(&t, q, &k); q = k.end) {
            pool_note_failure_locked(p, POOL_WRITE, k.start, k.end - k.start,
                                     EIO, true);
            log_lost(k.start, k.end - k.start, logged);
        }
    }
    extmap_free(&t);
    pool_set_clear(m);
}

/* ---- retained writes ------------------------------------------------- */

/* A piece [off, off+len) of r, its bytes inside r's buffer; NULL when
 * out of memory. */
static struct pool_req *new_piece_locked(struct pool *p, struct pool_req *r,
                                         uint64_t off, uint64_t len)
{
    struct pool_req *c = calloc(1, sizeof *c);

    if (!c)
        return NULL;
    c->kind = REQ_WRITE;
    c->p = p;
    c->off = off;
    c->len = len;
    c->data = r->data + (off - r->off);
    c->gen0 = r->gen0;
    c->ack_epoch = r->ack_epoch;
    c->touched_ns = r->touched_ns;
    c->parent = r;
    r->pieces++;
    return c;
}

static void list_insert_before(struct req_list *l, struct pool_req *at,
                               struct pool_req *r)
{
    r->next = at;
    r->prev = at->prev;
    if (at->prev)
        at->prev->next = r;
    else
        l->head = r;
    at->prev = r;
    l->n++;
}

void pool_evict_locked(struct pool *p, struct pool_req *r)
{
    bool covered = p->flush_in_flight && r->ack_epoch <= p->flush_covers;

    assert(r->state == REQ_RETAINED);
    pool_list_remove(&p->retained, r);
    pool_set_add_cover_locked(p, &p->unflushed[UNFLUSHED_WRITE], r->off,
                              r->off + r->len);
    if (covered)                  /* the flush in flight covers it too */
        pool_set_add_cover_locked(p, &p->flushing[UNFLUSHED_WRITE], r->off,
                                  r->off + r->len);
    pool_free_req_locked(p, r);
    pthread_cond_broadcast(&p->cond);
}

/* Replace retained write r, in its place in the retained list, by its
 * parts outside [off, end): none (r goes), or pieces of its buffer.
 * Out of memory: r is let go (pool_evict_locked()). */
static void retained_cut_one_locked(struct pool *p, struct pool_req *r,
                                    uint64_t off, uint64_t end)
{
    uint64_t lo = r->off, hi = r->off + r->len;
    struct pool_req *a = NULL, *b = NULL;

    if (lo < off && !(a = new_piece_locked(p, r, lo, off - lo))) {
        pool_evict_locked(p, r);
        return;
    }
    if (end < hi && !(b = new_piece_locked(p, r, end, hi - end))) {
        if (a) {
            r->pieces--;
            free(a);
        }
        pool_evict_locked(p, r);
        return;
    }
    if (a) {
        a->state = REQ_RETAINED;
        list_insert_before(&p->retained, r, a);
    }
    if (b) {
        b->state = REQ_RETAINED;
        list_insert_before(&p->retained, r, b);
    }
    pool_list_remove(&p->retained, r);
    if (r->pieces > 0)
        r->state = REQ_SPLIT;
    else
        pool_free_req_locked(p, r);
    pthread_cond_broadcast(&p->cond);
}

void pool_retained_cut_locked(struct pool *p, uint64_t off, uint64_t len)
{
    struct pool_req *r = p->retained.head;

    while (r) {
        struct pool_req *next = r->next;
        if (pool_overlaps(r->off, r->len, off, len))
            retained_cut_one_locked(p, r, off, off + len);
        r = next;
    }
}

/* Remove from t the ranges of the requests of l over [start, end). */
static int remove_reqs(struct extmap *t, const struct req_list *l,
                       uint64_t start, uint64_t end)
{
    int r = 0;
    for (const struct pool_req *q = l->head; r == 0 && q; q = q->next)
        if (pool_overlaps(q->off, q->len, start, end - start))
            r = extmap_remove(t, q->off, q->off + q->len);
    return r;
}

static int remove_map(struct extmap *t, struct extmap *m, uint64_t start,
                      uint64_t end)
{
    struct ext k;
    int r = 0;
    for (uint64_t q = start; r == 0 && extmap_next(m, q, &k) &&
                             k.start < end; q = k.end)
        r = extmap_remove(t, k.start, k.end);
    return r;
}

/* Resend the retained writes, newest first, each minus what something
 * newer covers: the resends already made (newer retained writes), the
 * requests queued, in flight or filling, pending zeroes, damage.  What
 * is left goes to *out: the write itself when all of it is, else pieces
 * of its buffer.  Returns the bytes resent. */
static uint64_t resend_retained_locked(struct pool *p, struct req_list *out,
                                       unsigned *logged)
{
    struct extmap t;
    struct ext k;
    uint64_t bytes = 0;

    extmap_init(&t, p->map_max, false);
    while (p->retained.tail) {
        struct pool_req *r = p->retained.tail;
        uint64_t lo = r->off, hi = r->off + r->len;

        pool_list_remove(&p->retained, r);
        pool_set_clear(&t);
        int e = extmap_add(&t, lo, hi);
        if (e == 0)
            e = remove_reqs(&t, out, lo, hi);
        if (e == 0)
            e = remove_reqs(&t, &p->queue, lo, hi);
        if (e == 0)
            e = remove_reqs(&t, &p->filling, lo, hi);
        if (e == 0)
            e = remove_map(&t, &p->pending_zero, lo, hi);
        if (e == 0)
            e = remove_map(&t, &p->damage, lo, hi);
        if (e < 0) {
            /* What is newer here is not known: not resent, so not over a
             * newer change either; loud. */
            pool_note_failure_locked(p, POOL_WRITE, lo, hi - lo, EIO, true);
            log_lost(lo, hi - lo, logged);
            pool_free_req_locked(p, r);
            continue;
        }
        if (extmap_covered(&t, lo, hi) == hi - lo) {
            r->state = REQ_NEW;           /* sealed into the queue below */
            r->resend = true;
            r->replied = false;
            r->retries = 0;
            pool_list_append(out, r);
            bytes += r->len;
            continue;
        }
        r->state = REQ_SPLIT;             /* until its pieces are made */
        for (uint64_t q = lo; extmap_next(&t, q, &k) && k.start < hi;
             q = k.end) {
            struct pool_req *c = new_piece_locked(p, r, k.start,
                                                  k.end - k.start);
            if (!c) {
                pool_note_failure_locked(p, POOL_WRITE, k.start,
                                         k.end - k.start, EIO, true);
                log_lost(k.start, k.end - k.start, logged);
                continue;
            }
            c->state = REQ_NEW;
            c->resend = true;
            pool_list_append(out, c);
            bytes += c->len;
        }
        if (r->pieces == 0)               /* all of it newer elsewhere */
            pool_free_req_locked(p, r);
    }
    extmap_free(&t);
    return bytes;
}

/* Of [start, end), keep in t what neither damage nor a request made
 * since (queued, in flight or filling: it rewrites its range) covers.
 * -ENOMEM/-ENOSPC if t cannot hold it. */
static int rezero_pieces_locked(struct pool *p, uint64_t start, uint64_t end,
                                struct extmap *t)
{
    struct ext d;
    int r = extmap_add(t, start, end);

    for (uint64_t pos = start; r == 0 && extmap_next(&p->damage, pos, &d) &&
                               d.start < end; pos = d.end)
        r = extmap_remove(t, d.start, d.end);
    for (const struct pool_req *q = p->queue.head; r == 0 && q; q = q->next)
        if (pool_overlaps(q->off, q->len, start, end - start))
            r = extmap_remove(t, q->off, q->off + q->len);
    for (const struct pool_req *q = p->filling.head; r == 0 && q;
         q = q->next)
        if (pool_overlaps(q->off, q->len, start, end - start))
            r = extmap_remove(t, q->off, q->off + q->len);
    return r;
}

/* Zeroes acknowledged by the old server and not flushed: they need no
 * data, so zero them again (pending, sent at the next drain), but not
 * where damage is (a lost write: a zero landing there would pass for its
 * repair) nor where a request made since will write anyway.  Never
 * waits (this runs on an I/O thread): when the pending map has no room,
 * they are damage instead. */
static void rezero_lost_locked(struct pool *p, struct extmap *m,
                               unsigned *logged)
{
    struct ext e, k;
    struct extmap t;

    extmap_init(&t, p->map_max, false);
    for (uint64_t pos = 0; extmap_next(m, pos, &e); pos = e.end) {
        pool_set_clear(&t);
        int r = rezero_pieces_locked(p, e.start, e.end, &t);
        if (r == 0 && extmap_count(&p->pending_zero) + extmap_count(&t) + 2 >
                      p->map_max)
            r = -ENOSPC;
        for (uint64_t q = e.start; r == 0 && extmap_next(&t, q, &k);
             q = k.end) {
            extmap_remove(&p->known_zero, k.start, k.end);   /* lossy */
            r = pool_add_pending_locked(p, k.start, k.end);
        }
        if (r < 0) {
            pool_note_failure_locked(p, POOL_ZERO, e.start, e.end - e.start,
                                     EIO, true);
            if ((*logged)++ < 16)
                log_err("zero of %" PRIu64 " bytes at offset %" PRIu64
                        " may be lost: acknowledged, then the connection "
                        "was made again before an NBD flush covered it",
                        e.end - e.start, e.start);
        } else {
            p->pending_gen0 = 0;          /* older than any generation */
            p->pending_repended = true;
            log_info("zeroing %" PRIu64 " bytes at offset %" PRIu64 " again:"
                     " the old connection had zeroed them without a flush",
                     e.end - e.start, e.start);
        }
    }
    extmap_free(&t);
    pool_set_clear(m);
}

/* nbdx reconnected since we last looked: a volatile server (nbdkit
 * memory, a RAM disk) may have restarted empty, so every write it
 * acknowledged and no flush covered may be gone.  Checked before a
 * completion is counted and before a flush's result is: a reply after
 * the reconnect came from the new server (nbdx bumps its counter before
 * it resends), a reply before it from the old one. */
void pool_check_reconnect_locked(struct pool *p)
{
    uint64_t n = nbdx_reconnects(p->x);
    unsigned logged = 0;
    struct req_list out = { 0 };

    if (n == p->reconnects_seen)
        return;
    p->reconnects_seen = n;
    if (p->retain) {
        p->canary_check = true;           /* the flusher reads them back */
        pthread_cond_signal(&p->flusher_cond);
    }
    /* The retained writes first: what they will write again is neither
     * lost nor to be zeroed again. */
    uint64_t resent = resend_retained_locked(p, &out, &logged);
    /* Into the queue oldest first (they are disjoint: any order would
     * do), sent by the caller's dispatch or the flusher's. */
    while (out.tail) {
        struct pool_req *r = out.tail;
        pool_list_remove(&out, r);
        r->state = REQ_QUEUED;
        r->seq = p->next_seq++;
        pool_list_append(&p->queue, r);
    }
    if (resent) {
        p->st.bytes_resent += resent;
        log_warn("%" PRIu64 " bytes resent after reconnect: acknowledged "
                 "by the server before, not yet covered by an NBD flush",
                 resent);
        pthread_cond_signal(&p->flusher_cond);    /* dispatch them */
    }
    lose_set_locked(p, &p->flushing[UNFLUSHED_WRITE], &logged);
    lose_set_locked(p, &p->unflushed[UNFLUSHED_WRITE], &logged);
    rezero_lost_locked(p, &p->flushing[UNFLUSHED_ZERO], &logged);
    rezero_lost_locked(p, &p->unflushed[UNFLUSHED_ZERO], &logged);
    if (logged > 16)
        log_err("... and %u more ranges that may be lost", logged - 16);
}

int pool_forgive_lost(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    if (p->st.errors != p->st.errors_lost || p->flush_failed)
        return -EBUSY;
    pool_set_clear(&p->damage);
    p->damage_everything = false;
    for (unsigned i = 0; i < p->nfailures; i++)
        if (!p->failures[i].repaired) {
            p->failures[i].repaired = true;
            p->failures[i].repaired_s = time(NULL);
            p->repairs++;
        }
    return 0;
}

uint64_t pool_error_seq(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    /* A reconnect (or heal) before this moment counts its lost writes
     * now, not at the next completion: a handle opened after it must not
     * be told of them as if they had happened while it was open. */
    pool_check_reconnect_locked(p);
    return p->err_seq;
}
int pool_range_damage(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    pool_canary_wait_locked(p);   /* what a restart lost counts */
    if (!p->damage_everything && extmap_count(&p->damage) == 0)
        return 0;
    return pool_tool_errno(p->damage_err ? p->damage_err : EIO);
}

int pool_damage(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    pool_canary_wait_locked(p);   /* what a restart lost counts */
    if (!pool_damaged_locked(p))
        return 0;
    return pool_tool_errno(p->damage_err ? p->damage_err : EIO);
}

static int error_since_locked(struct pool *p, uint64_t seq)
{
    if (p->err_seq <= seq)
        return 0;
    for (unsigned i = 0; i < p->nfailures; i++)
        if (p->failures[i].seq > seq)
            return pool_tool_errno(p->failures[i].err);
    return pool_tool_errno(p->last_err);   /* past the recorded ones */
}

/* After the connection was lost (p->lost), the next write, read or open
 * tries the server again (nbdx_heal; it blocks, so the lock is dropped
 * meanwhile).  0 once it answers: the latch is cleared and requests are
 * sent again; -EIO while it stays lost. */
int pool_heal_locked(struct pool *p)
{
    /* The transport's loss too: a loss found by a request whose failure
     * the pool did not latch (a read-ahead's) must not make an open, or
     * a copy whose writes all were found unchanged (the manifest), skip
     * the try and leave the mount failing every read. */
    if (!p->lost && !nbdx_lost(p->x))
        return 0;
    pthread_mutex_unlock(&p->lock);
    int r = nbdx_heal(p->x);
    pthread_mutex_lock(&p->lock);
    if (r == 0)
        p->lost = false;
    return p->lost ? -EIO : 0;
}

int pool_heal(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    return pool_heal_locked(p);
}

int pool_error_peek(struct pool *p, const uint64_t *seq)
{
    LOCK_FOR_SCOPE(&p->lock);
    return error_since_locked(p, *seq);
}

int pool_error_take(struct pool *p, uint64_t *seq)
{
    LOCK_FOR_SCOPE(&p->lock);
    int err = error_since_locked(p, *seq);
    *seq = p->err_seq;
    return err;
}
