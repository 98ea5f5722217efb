/* transport/pool-zero.c: the zero maps (known_zero, pending_zero) and
 * the zero requests made from them (see pool-internal.h, "ZERO MAPS").
 *
 * THREAD MODEL
 * Everything runs under pool->lock, on the threads that write, truncate
 * and drain (the receiver and the workers); a zeroing waiting for a zero
 * slot sleeps on pool->cond.  pool_add_pending_locked() also runs on
 * nbdx I/O threads (a reconnect's lost zeroes), where it never waits.
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/minmax.h"

/* ---- zeroing --------------------------------------------------------- */

/* The longest zero request to make now (pool-internal.h,
 * ZERO_EXT_MAX_LEN). */
static uint64_t zero_max_locked(const struct pool *p)
{
    if (!p->can_zero)
        return p->cfg.request_size;
    if (!p->ext_headers || !p->fast_zero)
        return pool_max_request(p, ZERO_MAX_LEN);
    uint64_t max = ZERO_EXT_MAX_LEN;
    if (p->block_min > 1)
        max -= max % p->block_min;
    return max;
}

/* One step of zeroing [*pos, end): skip the known-zero range *pos is in,
 * or queue one zero request for the piece up to the next known-zero
 * range (or extend the last queued one).  Never sleeps, so it decides
 * from the state as it is: -EAGAIN when no zero request may be queued
 * now (the caller waits, then calls again), -ENOMEM. */
static int zero_piece_locked(struct pool *p, uint64_t *pos, uint64_t end,
                             bool from_tool)
{
    uint64_t max = zero_max_locked(p);
    uint64_t start = *pos, stop = end;
    struct ext k;

    if (extmap_next(&p->known_zero, start, &k) && k.start < end) {
        if (k.start <= start) {
            uint64_t skip = k.end < end ? k.end : end;
            p->st.bytes_zero_skipped += skip - start;
            if (from_tool)            /* nothing to wait for */
                p->st.bytes_acked += skip - start;
            *pos = skip;
            return 0;
        }
        stop = k.start;
    }
    if (stop - start > max)
        stop = start + max;
    /* Writes buffered in the range are older than this zero (a write made
     * later removes its range from pending_zero and known_zero): they go
     * first (invariant 1 for zeroes). */
    pool_seal_overlapping_locked(p, start, stop - start, NULL);
    /* Extend the last queued zero request if this one continues it
     * (a tool writing zeros chunk by chunk): fewer, larger requests.
     * Safe: nothing is queued after it, and dispatch checks overlaps
     * with the range as it is when it is sent. */
    struct pool_req *t = p->queue.tail;
    if (t && t->kind == REQ_ZERO && t->state == REQ_QUEUED &&
        t->from_tool == from_tool && t->off + t->len == start &&
        t->len + (stop - start) <= max) {
        t->len += stop - start;
    } else {
        if (p->nzero_reqs >= MAX_ZERO_REQS)
            return -EAGAIN;
        struct pool_req *r = calloc(1, sizeof *r);
        if (!r)
            return -ENOMEM;
        r->kind = REQ_ZERO;
        r->from_tool = from_tool;
        r->p = p;
        r->off = start;
        r->len = stop - start;
        r->data = p->zero_buf;
        p->nzero_reqs++;
        pool_seal_locked(p, r);
    }
    extmap_add(&p->known_zero, start, stop);      /* lossy: cannot fail */
    *pos = stop;
    return 0;
}

static void wait_zero_slot_locked(struct pool *p)
{
    pool_dispatch_locked(p);
    pool_cond_wait_locked(p, "zero-slot");
}

/* At most this many ranges left unzeroed are logged one by one. */
#define ABANDON_LOG_RANGES 16

/* The zeroing was given up (pool_abandon_zeroing()): what is still
 * pending stays so.  Logged once, range by range, and recorded once as a
 * failure of the whole span, so that close, fsync and the exit status
 * say the disk does not read as asked.  -ECANCELED. */
static int abandoned_locked(struct pool *p)
{
    struct ext e;
    uint64_t pos = 0, first = UINT64_MAX, last = 0, bytes = 0;
    size_t n = 0;

    if (p->abandon_reported || !extmap_count(&p->pending_zero))
        return -ECANCELED;
    p->abandon_reported = true;
    while (extmap_next(&p->pending_zero, pos, &e)) {
        if (n++ < ABANDON_LOG_RANGES)
            log_err("zeroing abandoned: %" PRIu64 " bytes at offset %" PRIu64
                    " not zeroed (they may hold old data)", e.end - e.start,
                    e.start);
        first = first < e.start ? first : e.start;
        last = e.end;
        bytes += e.end - e.start;
        pos = e.end;
    }
    if (n > ABANDON_LOG_RANGES)
        log_err("zeroing abandoned: %zu more ranges not zeroed; %" PRIu64
                " bytes in all", n - ABANDON_LOG_RANGES, bytes);
    pool_record_failure_locked(p, POOL_ZERO, first, last - first, ECANCELED);
    return -ECANCELED;
}

/* Turn pending zeroes into zero requests, oldest (lowest) range first,
 * until at most down_to ranges are left.  A range leaves pending_zero
 * in the same locked step that queues its zero request, so a write made
 * while this waits for a zero slot still removes its range from what is
 * zeroed.  -ENOMEM (recorded as a failure; the rest stays pending), or
 * -ECANCELED once the zeroing was abandoned. */
int pool_materialize_locked(struct pool *p, size_t down_to)
{
    struct ext e;

    while (extmap_count(&p->pending_zero) > down_to &&
           extmap_next(&p->pending_zero, 0, &e)) {
        if (p->zeroing_abandoned)
            return abandoned_locked(p);
        uint64_t pos = e.start;
        int r = zero_piece_locked(p, &pos, e.end, false);
        if (r == -EAGAIN) {
            wait_zero_slot_locked(p);
            continue;
        }
        if (r < 0) {
            pool_record_failure_locked(p, POOL_ZERO, e.start,
                                       e.end - e.start, -r);
            return r;
        }
        /* A prefix of a range: never splits, cannot fail. */
        r = extmap_remove(&p->pending_zero, e.start, pos);
        assert(r == 0);
    }
    return 0;
}

/* Before an update that may split one pending range: keep pending_zero
 * below its bound by zeroing half of it now.  True if that happened (it
 * may have waited: the caller decides again). */
bool pool_pending_room_locked(struct pool *p, int *err)
{
    if (extmap_count(&p->pending_zero) + 2 <= p->map_max)
        return false;
    *err = pool_materialize_locked(p, p->map_max / 2);
    return true;
}

/* Make [off, off+len) read as zero, ordered after every write made
 * before.  May wait for zero slots.  -ENOMEM. */
int pool_zero_locked(struct pool *p, uint64_t off, uint64_t len,
                     bool from_tool)
{
    uint64_t pos = off, end = off + len;
    int r = 0;

    while (pool_pending_room_locked(p, &r))
        if (r < 0)
            return r;
    r = extmap_remove(&p->pending_zero, off, end);
    if (r < 0)
        return r;
    while (pos < end) {
        r = zero_piece_locked(p, &pos, end, from_tool);
        if (r == -EAGAIN)
            wait_zero_slot_locked(p);
        else if (r < 0) {
            pool_record_failure_locked(p, POOL_ZERO, pos, end - pos, -r);
            return r;
        }
    }
    return 0;
}

int pool_zero(struct pool *p, uint64_t off, uint64_t len)
{
    LOCK_FOR_SCOPE(&p->lock);
    int r = pool_zero_locked(p, off, len, false);
    pool_dispatch_locked(p);
    return r;
}

int pool_zero_lazy(struct pool *p, uint64_t off, uint64_t len)
{
    int r = 0;

    LOCK_FOR_SCOPE(&p->lock);
    while (r == 0 && pool_pending_room_locked(p, &r))
        ;
    if (r == 0)
        r = pool_add_pending_locked(p, off, off + len);
    pool_dispatch_locked(p);
    return r;
}

int pool_zero_damage(struct pool *p, uint64_t from)
{
    struct ext e;
    int r = 0;

    LOCK_FOR_SCOPE(&p->lock);
    for (uint64_t pos = from; r == 0 && extmap_next(&p->damage, pos, &e);
         pos = e.end) {
        while (r == 0 && pool_pending_room_locked(p, &r))
            ;
        if (r == 0)
            r = pool_add_pending_locked(p, MAX(e.start, from), e.end);
    }
    pool_dispatch_locked(p);
    return r;
}

int pool_note_unchanged(struct pool *p, uint64_t off, uint64_t len)
{
    int r = 0;
    uint64_t end = off + len;

    LOCK_FOR_SCOPE(&p->lock);
    while (pool_pending_room_locked(p, &r))
        if (r < 0)
            return r;
    uint64_t pending = extmap_covered(&p->pending_zero, off, end);
    if (pending == 0)
        return extmap_covered(&p->known_zero, off, end) ? -EAGAIN : 0;
    if (pending != len)
        return -EAGAIN;
    r = extmap_remove(&p->pending_zero, off, end);
    return r < 0 ? r : 1;
}
