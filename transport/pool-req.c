/* transport/pool-req.c: requests: sealing, sending in order and
 * completing (invariants 2 and 3 of pool-internal.h).
 *
 * THREAD MODEL
 * The sealing and sending run under pool->lock on whichever thread
 * writes, reads, drains or seals (the idle thread).  req_done() runs on
 * an nbdx I/O thread, outside libnbd, and takes pool->lock;
 * nbdx_submit() is called with it held (it only queues).
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <libnbd.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/monotime.h"

/* ---- sending --------------------------------------------------------- */

static void req_done(struct nbdx_op *op, int err);

static bool overlaps_earlier(const struct pool_req *r)
{
    for (const struct pool_req *e = r->prev; e; e = e->prev)
        if (pool_overlaps(e->off, e->len, r->off, r->len))
            return true;
    return false;
}

static void send_req_locked(struct pool *p, struct pool_req *r)
{
    struct nbdx_op *op = &r->op;

    assert(r->state == REQ_QUEUED && r->len > 0);
    assert(!overlaps_earlier(r));                     /* invariant 2 */

    memset(op, 0, sizeof *op);
    op->off = r->off;
    op->len = r->len;
    op->done = req_done;
    op->opaque = r;
    if (r->kind == REQ_WRITE || !p->can_zero) {
        op->kind = NBDX_OP_WRITE;
        op->buf = r->data;
    } else {
        op->kind = NBDX_OP_ZERO;
        op->flags = p->fast_zero ? LIBNBD_CMD_FLAG_FAST_ZERO : 0;
    }
    if (p->cfg.track_touched && !p->touched_all &&
        extmap_add(&p->touched, r->off, r->off + r->len) < 0)
        p->touched_all = true;        /* too fragmented: assume all */
    r->state = REQ_IN_FLIGHT;
    r->sent_rc = nbdx_reconnects(p->x);
    if (p->in_flight++ == 0 && p->idle_since_ns) {
        p->st.idle_ns += mono_now_ns() - p->idle_since_ns;
        p->idle_since_ns = 0;
    }
    if (p->in_flight > p->st.in_flight_peak)
        p->st.in_flight_peak = p->in_flight;
    nbdx_submit(p->x, op);
}

/* Send every queued request that invariant 2 allows, up to the limit. */
void pool_dispatch_locked(struct pool *p)
{
    for (struct pool_req *r = p->queue.head;
         r && p->in_flight < p->max_in_flight; r = r->next)
        if (r->state == REQ_QUEUED && !r->busy && !overlaps_earlier(r))
            send_req_locked(p, r);
}

void pool_seal_locked(struct pool *p, struct pool_req *r)
{
    if (r->state == REQ_FILLING)
        pool_list_remove(&p->filling, r);
    else if (r->kind == REQ_ZERO)         /* made now, or made pending */
        r->gen0 = p->pending_gen0 < p->next_seq ? p->pending_gen0
                                                : p->next_seq;
    r->state = REQ_QUEUED;
    r->seq = p->next_seq++;
    pool_list_append(&p->queue, r);
    for (unsigned i = 0; i < NCANARIES; i++)
        if (p->canaries[i].valid &&
            pool_overlaps(p->canaries[i].off, CANARY_LEN, r->off, r->len))
            p->canaries[i].valid = false; /* changed since its flush */
}

/* Seal every FILLING buffer overlapping [off, off+len) except keep. */
void pool_seal_overlapping_locked(struct pool *p, uint64_t off,
                                  uint64_t len, struct pool_req *keep)
{
    struct pool_req *r = p->filling.head;
    while (r) {
        struct pool_req *next = r->next;
        if (r != keep && pool_overlaps(r->off, r->len, off, len))
            pool_seal_locked(p, r);
        r = next;
    }
}

void pool_seal_all_locked(struct pool *p)
{
    while (p->filling.head)
        pool_seal_locked(p, p->filling.head);
}

/* keep: an acknowledged write whose buffer stays until a flush covers
 * it (see "RETAINED WRITES" in pool-internal.h). */
static void release_req_locked(struct pool *p, struct pool_req *r, bool keep)
{
    assert(r->state == REQ_IN_FLIGHT && r->replied);  /* invariant 3 */
    pool_list_remove(&p->queue, r);
    if (r->kind == REQ_ZERO)
        p->nzero_reqs--;
    if (--p->in_flight == 0)
        p->idle_since_ns = mono_now_ns();
    if (!keep) {
        pool_free_req_locked(p, r);
        return;
    }
    r->state = REQ_RETAINED;
    r->ack_epoch = p->epoch;
    pool_list_append(&p->retained, r);
    if (p->acked_since_flush == 0 && p->changes == p->flushed_changes)
        p->last_flush_ns = mono_now_ns(); /* unflushed from now on */
    p->acked_since_flush += r->len;
    /* Half the buffers retained, or the byte budget reached: a flush now,
     * before a writer has to wait for one. */
    if ((p->cfg.flush_bytes && p->acked_since_flush >= p->cfg.flush_bytes) ||
        2 * p->retained.n >= p->nbufs ||
        p->retained.n == 1)               /* the flusher's clock starts */
        pthread_cond_signal(&p->flusher_cond);
}

/* nbdx completion: runs on an I/O thread, outside libnbd. */
static void req_done(struct nbdx_op *op, int err)
{
    struct pool_req *r = op->opaque;
    struct pool *p = r->p;
    bool keep = false;

    LOCK_FOR_SCOPE(&p->lock);
    if (err == ENOTSUP && r->kind == REQ_ZERO &&
        (op->flags & LIBNBD_CMD_FLAG_FAST_ZERO)) {
        /* The server cannot zero fast here: plain write-zeroes instead. */
        p->fast_zero = false;
        p->in_flight--;
        r->state = REQ_QUEUED;
        pool_dispatch_locked(p);
        return;
    }
    /* Nothing made before r overlaps it: its result is the range's
     * latest, which keeps the damage set exact (invariant 2). */
    assert(!overlaps_earlier(r));
    pool_check_reconnect_locked(p);
    if (!err && p->retain && r->sent_rc != p->reconnects_seen) {
        /* In flight across a reconnect: which server answered is not
         * known, and the old one may be gone with it.  Sent again, in its
         * place (nothing newer over it was sent meanwhile: invariant 2). */
        if (r->kind == REQ_WRITE)
            p->st.bytes_resent += r->len;
        p->in_flight--;
        r->state = REQ_QUEUED;
        pool_dispatch_locked(p);
        return;
    }
    if (err == EIO && r->retries < EIO_RETRIES) {
        /* A server's EIO may be passing (a busy disk, a hiccup): send it
         * again, keeping its buffer and its place in the queue. */
        r->retries++;
        log_warn("%s of %" PRIu64 " bytes at offset %" PRIu64 " failed: %s; "
                 "sending it again (%u of %u)",
                 r->kind == REQ_WRITE ? "write" : "zero", r->len, r->off,
                 strerror(err), r->retries, EIO_RETRIES);
        p->in_flight--;
        r->state = REQ_QUEUED;
        pool_dispatch_locked(p);
        return;
    }
    if (err) {
        pool_record_failure_locked(p, r->kind == REQ_WRITE ? POOL_WRITE
                                                           : POOL_ZERO,
                                   r->off, r->len, err);
        if (r->kind == REQ_WRITE || r->from_tool)
            p->st.bytes_failed += r->len;
        /* A zero's range joined known_zero when it was queued: it may
         * hold anything now, so a later truncate must zero it again. */
        if (r->kind == REQ_ZERO)
            extmap_remove(&p->known_zero, r->off, r->off + r->len);
    } else {
        pool_damage_clear_locked(p, r->off, r->len);
        if (r->kind == REQ_WRITE)
            keep = p->retain;
        else if (p->retain)
            pool_retained_cut_locked(p, r->off, r->len);
        /* A write kept is resent after a reconnect; one not kept is what
         * a reconnect may lose.  A zero needs no data: zeroed again. */
        if (!keep)
            pool_set_add_cover_locked(p, &p->unflushed[r->kind == REQ_WRITE
                                                       ? UNFLUSHED_WRITE
                                                       : UNFLUSHED_ZERO],
                                      r->off, r->off + r->len);
        if (r->kind == REQ_WRITE && r->resend) {
            p->st.requests[POOL_WRITE]++;   /* acknowledged once before */
        } else if (r->kind == REQ_WRITE) {
            p->st.bytes_acked += r->len;
            p->st.requests[POOL_WRITE]++;
        } else {
            p->st.bytes_zeroed += r->len;
            p->st.requests[POOL_ZERO]++;
            if (r->from_tool)
                p->st.bytes_acked += r->len;
        }
    }
    p->changes++;
    r->replied = true;
    release_req_locked(p, r, keep);
    pool_dispatch_locked(p);
    pthread_cond_broadcast(&p->cond);
}

/* Wait until nothing sealed before seq is queued or in flight. */
void pool_wait_seq_locked(struct pool *p, uint64_t seq)
{
    while (p->queue.head && p->queue.head->seq < seq)
        pool_cond_wait_locked(p, "drain");
}
