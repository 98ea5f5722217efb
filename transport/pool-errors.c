/* transport/pool-errors.c: what fs/ is told: the writes a reconnect
 * may have lost, the error sequence of the handles, the damage checks,
 * and healing after a lost connection.
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
#include <string.h>
#include <time.h>

#include "common/log.h"

/* The ranges of m, acknowledged by a server that a reconnect replaced
 * before an NBD flush covered them, become damage. */
static void lose_set_locked(struct pool *p, struct extmap *m, unsigned *logged)
{
    struct ext e;

    for (uint64_t pos = 0; extmap_next(m, pos, &e); pos = e.end) {
        pool_note_failure_locked(p, POOL_WRITE, e.start, e.end - e.start,
                                 EIO, true);
        if ((*logged)++ < 16)
            log_err("write of %" PRIu64 " bytes at offset %" PRIu64 " may "
                    "be lost: acknowledged, then the connection was made "
                    "again before an NBD flush covered it",
                    e.end - e.start, e.start);
    }
    pool_set_clear(m);
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
        } else
            log_info("zeroing %" PRIu64 " bytes at offset %" PRIu64 " again:"
                     " the old connection had zeroed them without a flush",
                     e.end - e.start, e.start);
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

    if (n == p->reconnects_seen)
        return;
    p->reconnects_seen = n;
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
    if (!p->damage_everything && extmap_count(&p->damage) == 0)
        return 0;
    return pool_tool_errno(p->damage_err ? p->damage_err : EIO);
}

int pool_damage(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
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
    if (!p->lost)
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
