/* transport/pool.c: write-back buffers, coalescing and request ordering:
 * create, drain, flush, the idle thread, stats and destroy.  The design
 * (requests, ordering invariants, zero-copy writes, landings, zero maps)
 * and the layers of the pool's files are in pool-internal.h.
 *
 * THREAD MODEL
 * pool_drain() and pool_flush() run on worker threads (a close's flush,
 * fsync) and on the main thread at unmount; pool_flush() takes
 * pool->flush_lock before pool->lock and drops pool->lock around the NBD
 * flush.  pool_abandon_zeroing() runs on the stop thread (fs/stopsig.c).
 * The idle thread waits on pool->idle_cond and seals under pool->lock.
 * pool_get_stats() runs on the status and progress threads.
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/minmax.h"
#include "common/monotime.h"
#include "common/signals.h"

/* ---- draining and flushing ------------------------------------------- */

/* Zeroing done (acknowledged, or found unneeded) since base. */
static uint64_t zeroing_count_locked(const struct pool *p)
{
    return p->st.bytes_zeroed + p->st.bytes_zero_skipped;
}

/* pool_drain(); returns the generation it waited for (pool_gen()).
 * Without zeroes, the pending zeroes stay pending (pool_checkpoint()). */
static uint64_t drain_gen(struct pool *p, bool zeroes)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_seal_all_locked(p);
    if (!zeroes) {
        pool_dispatch_locked(p);
        uint64_t gen = p->next_seq;
        pool_wait_seq_locked(p, gen);
        return gen;
    }
    if (p->zero_drains++ == 0) {
        p->zeroing_total = extmap_covered(&p->pending_zero, 0, p->size);
        p->zeroing_base = zeroing_count_locked(p);
    }
    pool_materialize_locked(p, 0);             /* a failure is recorded */
    pool_dispatch_locked(p);
    uint64_t gen = p->next_seq;
    pool_wait_seq_locked(p, gen);
    p->zero_drains--;
    return gen;
}

void pool_drain(struct pool *p)
{
    drain_gen(p, true);
}

uint64_t pool_gen(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    return p->next_seq;
}

/* Tell cfg.on_durable that changes older than gen are durable, if no
 * damage is left (a failed write's range is not).  Called with
 * flush_lock held (or from a drain on a server without flush), so calls
 * come one at a time, in order. */
static void tell_durable(struct pool *p, uint64_t gen)
{
    if (!p->cfg.on_durable)
        return;
    {
        LOCK_FOR_SCOPE(&p->lock);
        pool_check_reconnect_locked(p);
        if (pool_damaged_locked(p) || gen <= p->durable_told)
            return;
        p->durable_told = gen;
    }
    p->cfg.on_durable(p->cfg.durable_opaque, gen);
}

void pool_abandon_zeroing(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    p->zeroing_abandoned = true;
    pthread_cond_broadcast(&p->cond);     /* a drain waiting for a slot */
}

/* One NBD flush; a server's EIO is tried again twice, 10 ms apart. */
static int flush_once(struct pool *p)
{
    int r = 0;

    for (unsigned i = 0; i <= EIO_RETRIES; i++) {
        struct nbdx_op op = { .kind = NBDX_OP_FLUSH };
        if (i > 0) {
            log_warn("flush failed: %s; sending it again (%u of %u)",
                     strerror(-r), i, EIO_RETRIES);
            nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 },
                      NULL);
        }
        r = nbdx_run(p->x, &op);
        if (r != -EIO)
            break;
    }
    return r;
}

/* Before an NBD flush: what is unflushed becomes what this flush
 * covers.  True if nothing was written since the last good flush:
 * nothing to make durable (and an unmount after the server went away
 * need not wait to reconnect).  *changes: the count the flush covers. */
static bool flush_begin(struct pool *p, uint64_t *changes)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    *changes = p->changes;
    bool clean = *changes == p->flushed_changes && !p->flush_failed;
    for (unsigned i = 0; !clean && i < 2; i++) {
        struct extmap t = p->flushing[i]; /* empty: the last flush is done */
        p->flushing[i] = p->unflushed[i];
        p->unflushed[i] = t;
    }
    return clean;
}

/* The flush's result r counts: a failure leaves what it covered
 * unflushed; a success repairs a failed flush. */
static void flush_end(struct pool *p, int r, uint64_t changes)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);       /* before the flush counts */
    if (r < 0) {
        pool_record_failure_locked(p, POOL_FLUSH, 0, 0, -r);
        struct ext e;                     /* still not covered by a flush */
        for (unsigned i = 0; i < 2; i++)
            for (uint64_t pos = 0; extmap_next(&p->flushing[i], pos, &e);
                 pos = e.end)
                pool_set_add_cover_locked(p, &p->unflushed[i], e.start, e.end);
    } else {
        p->st.requests[POOL_FLUSH]++;
        if (p->flushed_changes < changes)
            p->flushed_changes = changes;
        if (p->flush_failed) {
            p->flush_failed = false;
            pool_mark_repaired_locked(p, 0, 0, true);
        }
    }
    pool_set_clear(&p->flushing[UNFLUSHED_WRITE]);
    pool_set_clear(&p->flushing[UNFLUSHED_ZERO]);
}

static int flush_after(struct pool *p, bool zeroes)
{
    uint64_t changes;

    uint64_t gen = drain_gen(p, zeroes);
    /* One flush at a time: p->flushing is what the one in flight covers
     * (flush_lock before p->lock, never while holding it). */
    LOCK_FOR_SCOPE(&p->flush_lock);
    if (!nbdx_info(p->x)->can_flush) {
        tell_durable(p, gen);
        return 0;
    }
    if (flush_begin(p, &changes)) {
        tell_durable(p, gen);
        return 0;
    }
    int r = flush_once(p);
    flush_end(p, r, changes);
    if (r == 0)
        tell_durable(p, gen);
    return r;
}

int pool_flush(struct pool *p)
{
    return flush_after(p, true);
}

int pool_checkpoint(struct pool *p)
{
    return flush_after(p, false);
}

/* ---- the idle thread ------------------------------------------------- */

static void *idle_thread(void *arg)
{
    block_stop_signals();
    struct pool *p = arg;
    uint64_t idle_ns = (uint64_t) p->cfg.idle_ms * 1000000u;

    LOCK_FOR_SCOPE(&p->lock);
    while (!p->stopping) {
        if (!p->filling.head) {
            pthread_cond_wait(&p->idle_cond, &p->lock);
            continue;
        }
        uint64_t now = mono_now_ns(), wake = UINT64_MAX;
        struct pool_req *r = p->filling.head;
        while (r) {
            struct pool_req *next = r->next;
            if (now - r->touched_ns >= idle_ns)
                pool_seal_locked(p, r);
            else if (r->touched_ns + idle_ns < wake)
                wake = r->touched_ns + idle_ns;
            r = next;
        }
        pool_dispatch_locked(p);
        if (wake == UINT64_MAX)
            continue;
        struct timespec ts = mono_deadline_ns(wake - now);
        pthread_cond_timedwait(&p->idle_cond, &p->lock, &ts);
    }
    return NULL;
}

/* ---- setup ----------------------------------------------------------- */

int pool_create(const struct pool_config *cfg, struct nbdx *x, uint64_t size,
                struct pool **out)
{
    const struct nbdx_info *info = nbdx_info(x);
    struct pool *p = calloc(1, sizeof *p);

    if (!p)
        return -ENOMEM;
    p->cfg = *cfg;
    p->x = x;
    p->size = size;
    p->can_zero = info->can_zero;
    p->fast_zero = info->can_fast_zero;
    p->max_in_flight = cfg->depth * info->connections;
    p->max_len = info->block_max ? info->block_max : DEFAULT_MAX_LEN;
    /* Long ranges split into multiples of the minimum block size. */
    if (info->block_min > 1 && p->max_len >= info->block_min)
        p->max_len -= p->max_len % info->block_min;
    p->nbufs = (unsigned) (cfg->pool_size / cfg->request_size);
    if (p->nbufs < 2)
        p->nbufs = 2;
    p->free_bufs = calloc(p->nbufs + cfg->hold_buffers, sizeof *p->free_bufs);
    p->failures = calloc(MAX_FAILURES, sizeof *p->failures);
    p->zero_buf = calloc(1, cfg->request_size);
    if (!p->free_bufs || !p->failures || !p->zero_buf) {
        free(p->free_bufs);
        free(p->failures);
        free(p->zero_buf);
        free(p);
        return -ENOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    mono_cond_init(&p->cond);         /* the scan's wait is timed */
    mono_cond_init(&p->idle_cond);
    p->map_max = cfg->zero_map_ranges ? cfg->zero_map_ranges
                                      : POOL_ZERO_MAP_RANGES;
    if (p->map_max < 16)
        p->map_max = 16;
    extmap_init(&p->known_zero, p->map_max, true);
    extmap_init(&p->pending_zero, p->map_max, false);
    extmap_init(&p->damage, DAMAGE_RANGES, false);
    for (unsigned i = 0; i < 2; i++) {
        extmap_init(&p->unflushed[i], DAMAGE_RANGES, false);
        extmap_init(&p->flushing[i], DAMAGE_RANGES, false);
    }
    pthread_mutex_init(&p->flush_lock, NULL);
    p->reconnects_seen = nbdx_reconnects(x);
    extmap_init(&p->touched, p->map_max, false);
    p->idle_since_ns = 0;

    p->st.scan = cfg->scan_timed_out ? "timed out"
                 : cfg->scan_extents && !info->can_extents ? "unsupported"
                 : "off";
    if (cfg->destination_is_zero)
        extmap_add(&p->known_zero, 0, size);
    else if (cfg->scan_extents && info->can_extents &&
             pool_scan_extents(p) < 0) {
        p->stopping = true;           /* no idle thread to stop */
        pool_destroy(p);
        return -ETIMEDOUT;
    }

    int r = pthread_create(&p->idle_thread, NULL, idle_thread, p);
    if (r != 0) {
        log_err("pthread_create: %s", strerror(r));
        p->stopping = true;
        pool_destroy(p);
        return -r;
    }
    *out = p;
    return 0;
}

void pool_get_stats(struct pool *p, struct pool_stats *out)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    *out = p->st;
    out->damaged_bytes = p->damage_everything ? p->size
                         : extmap_covered(&p->damage, 0, UINT64_MAX);
    out->damaged_ranges = extmap_count(&p->damage);
    out->ndamage = 0;
    struct ext e;
    for (uint64_t pos = 0; out->ndamage < POOL_DAMAGE_LISTED &&
                           extmap_next(&p->damage, pos, &e); pos = e.end)
        out->damage[out->ndamage++] = (struct pool_range){ e.start, e.end };
    out->damage_everything = p->damage_everything;
    out->flush_failed = p->flush_failed;
    out->repairs = p->repairs;
    out->unrepaired = pool_damaged_locked(p);
    out->in_flight = p->in_flight;
    out->nbufs = p->nbufs;
    out->hold_bufs = p->cfg.hold_buffers;
    out->bufs_in_use = p->nallocated - p->nfree;
    /* A landing's buffer holding nothing of the writers' (a whole buffer
     * nothing landed in yet, or one already sent and answered) is free
     * but for the landing: not in use. */
    if (p->landing && p->landing->landing &&
        (p->landing->state == REQ_NEW ||
         (p->landing->state == REQ_DONE && p->landing->holds == 1)))
        out->bufs_in_use--;
    out->request_size = p->cfg.request_size;
    out->pending_zero = extmap_covered(&p->pending_zero, 0, p->size);
    out->known_zero = extmap_covered(&p->known_zero, 0, p->size);
    out->pending_zero_ranges = extmap_count(&p->pending_zero);
    out->known_zero_ranges = extmap_count(&p->known_zero);
    out->zeroing_active = p->zero_drains > 0 && p->zeroing_total > 0;
    out->zeroing_total = p->zeroing_total;
    uint64_t done = zeroing_count_locked(p) - p->zeroing_base;
    out->zeroing_done = done < p->zeroing_total ? done : p->zeroing_total;
    out->zeroing_abandoned = p->zeroing_abandoned;
    out->nfailures = MIN(p->nfailures, (unsigned) (sizeof out->failures /
                                                   sizeof out->failures[0]));
    memcpy(out->failures, p->failures,
           out->nfailures * sizeof *p->failures);
    if (p->idle_since_ns)
        out->idle_ns += mono_now_ns() - p->idle_since_ns;
}

void pool_destroy(struct pool *p)
{
    if (!p)
        return;
    bool started = !p->stopping;
    if (started) {
        pool_drain(p);
        {
            LOCK_FOR_SCOPE(&p->lock);
            while (p->areads > 0)
                pthread_cond_wait(&p->cond, &p->lock);
            p->stopping = true;
            pthread_cond_broadcast(&p->idle_cond);
        }
        pthread_join(p->idle_thread, NULL);
    }
    while (p->nfree > 0)
        free(p->free_bufs[--p->nfree]);
    free(p->free_bufs);
    free(p->failures);
    free(p->zero_buf);
    extmap_free(&p->known_zero);
    extmap_free(&p->pending_zero);
    extmap_free(&p->damage);
    for (unsigned i = 0; i < 2; i++) {
        extmap_free(&p->unflushed[i]);
        extmap_free(&p->flushing[i]);
    }
    pthread_mutex_destroy(&p->flush_lock);
    extmap_free(&p->touched);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    pthread_cond_destroy(&p->idle_cond);
    free(p);
}
