/* transport/pool.c: write-back buffers, coalescing and request ordering:
 * create, drain, flush, the idle thread, stats and destroy.  The design
 * (requests, ordering invariants, zero-copy writes, landings, zero maps)
 * and the layers of the pool's files are in pool-internal.h.
 *
 * THREAD MODEL
 * pool_drain() and pool_flush() run on worker threads (a close's flush,
 * fsync) and on the main thread at unmount; pool_flush() takes
 * pool->flush_lock before pool->lock and drops pool->lock around the NBD
 * flush.  pool_abandon_zeroing() runs on the stop thread (daemon/stopsig.c).
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
    if (extmap_count(&p->pending_zero) == 0)
        p->pending_repended = false;
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

static void check_canaries_locked(struct pool *p);

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
        /* What a restart lost is known first: the canaries are read
         * back (here, or by the flusher: it holds no lock meanwhile). */
        if (p->canary_check && !p->canary_busy)
            check_canaries_locked(p);
        pool_canary_wait_locked(p);
        if (pool_damaged_locked(p) || gen < p->durable_told)
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

/* The oldest generation not yet acknowledged: a flush sent now covers
 * every change older than this (pool_gen()).  Everything not answered
 * yet is queued, in flight, filling or pending; a write resent after a
 * reconnect is queued with the generation of its first change. */
static uint64_t flush_cut_locked(struct pool *p)
{
    uint64_t cut = p->next_seq;

    /* A write into a request reads pool_gen() >= its gen0 (equal when
     * nothing was sealed between the request's making and the write):
     * so the cut is below every unanswered request's gen0, or a write
     * still FILLING (never sent) would count as covered. */
    for (const struct pool_req *r = p->queue.head; r; r = r->next)
        cut = MIN(cut, r->gen0 ? r->gen0 - 1 : 0);
    for (const struct pool_req *r = p->filling.head; r; r = r->next)
        cut = MIN(cut, r->gen0 ? r->gen0 - 1 : 0);
    if (extmap_count(&p->pending_zero) > 0 && p->pending_repended)
        cut = MIN(cut, p->pending_gen0);
    return cut;
}

/* What one flush covers, as seen when it is sent. */
struct flush_round {
    uint64_t changes;             /* p->changes then */
    uint64_t cut;                 /* flush_cut_locked() then */
    uint64_t epoch;               /* retained writes up to this epoch */
    uint64_t reconnects;          /* a reconnect after: it covers nothing */
};

/* Before an NBD flush: what is unflushed becomes what this flush
 * covers.  True if nothing was written since the last good flush:
 * nothing to make durable (and an unmount after the server went away
 * need not wait to reconnect). */
static bool flush_begin(struct pool *p, struct flush_round *f)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    pool_dispatch_locked(p);              /* resends, if it made any */
    f->changes = p->changes;
    f->cut = flush_cut_locked(p);
    f->reconnects = p->reconnects_seen;
    bool clean = f->changes == p->flushed_changes && !p->flush_failed &&
                 !p->retained.head;
    if (clean)
        return true;
    for (unsigned i = 0; i < 2; i++) {
        struct extmap t = p->flushing[i]; /* empty: the last flush is done */
        p->flushing[i] = p->unflushed[i];
        p->unflushed[i] = t;
    }
    f->epoch = p->epoch++;
    p->flush_covers = f->epoch;
    p->flush_in_flight = true;
    p->acked_since_flush = 0;
    p->last_flush_ns = mono_now_ns();
    return false;
}

/* Keep a sample of a flushed write (not all zero: a disk that lost it
 * would read the same). */
static void add_canary_locked(struct pool *p, const struct pool_req *q,
                              uint64_t rc)
{
    if (q->len < CANARY_LEN)
        return;
    uint64_t h = pool_canary_hash(q->data, CANARY_LEN);
    static const char zero[CANARY_LEN];
    if (h == pool_canary_hash(zero, CANARY_LEN))
        return;
    p->canaries[p->next_canary++ % NCANARIES] =
        (struct canary){ .off = q->off, .hash = h, .rc = rc,
                        .valid = true };
}

/* The flush's result r counts: a failure leaves what it covered
 * unflushed (and retained); a success lets the retained writes it
 * covers go and repairs a failed flush.  A reconnect since flush_begin()
 * (the reply may be the new server's, which never had them): it covers
 * nothing, and the retained writes were sent again.  True if it
 * counted. */
static bool flush_end(struct pool *p, int r, const struct flush_round *f)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);       /* before the flush counts */
    pool_dispatch_locked(p);
    p->flush_in_flight = false;
    bool counted = r == 0 && p->reconnects_seen == f->reconnects;
    if (r < 0) {
        pool_record_failure_locked(p, POOL_FLUSH, 0, 0, -r);
        struct ext e;                     /* still not covered by a flush */
        for (unsigned i = 0; i < 2; i++)
            for (uint64_t pos = 0; extmap_next(&p->flushing[i], pos, &e);
                 pos = e.end)
                pool_set_add_cover_locked(p, &p->unflushed[i], e.start, e.end);
    } else if (counted) {
        p->st.requests[POOL_FLUSH]++;
        if (p->flushed_changes < f->changes)
            p->flushed_changes = f->changes;
        if (p->flush_failed) {
            p->flush_failed = false;
            pool_mark_repaired_locked(p, 0, 0, true);
        }
        struct pool_req *q;
        unsigned sampled = 0;
        while ((q = p->retained.head) && q->ack_epoch <= f->epoch) {
            pool_list_remove(&p->retained, q);
            if (sampled < 2 && q->len >= CANARY_LEN) {
                add_canary_locked(p, q, f->reconnects);  /* two a flush */
                sampled++;
            }
            pool_free_req_locked(p, q);
        }
    } else
        p->st.requests[POOL_FLUSH]++;     /* answered, but covers nothing */
    pool_set_clear(&p->flushing[UNFLUSHED_WRITE]);
    pool_set_clear(&p->flushing[UNFLUSHED_ZERO]);
    pthread_cond_broadcast(&p->cond);     /* buffers may be free */
    return counted;
}

/* One flush of what is acknowledged now, flush_lock held.  *cut: the
 * generation it made durable (0: none); *sent: a flush was sent. */
static int flush_locked(struct pool *p, uint64_t *cut, bool *sent)
{
    struct flush_round f;

    *cut = 0;
    *sent = false;
    if (flush_begin(p, &f)) {
        *cut = f.cut;
        return 0;
    }
    *sent = true;
    int r = flush_once(p);
    if (flush_end(p, r, &f))
        *cut = f.cut;
    return r;
}

static uint64_t reconnects_now(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    pool_check_reconnect_locked(p);
    pool_dispatch_locked(p);
    return p->reconnects_seen;
}

static int flush_after(struct pool *p, bool zeroes)
{
    for (;;) {
        uint64_t seen = reconnects_now(p);
        uint64_t gen = drain_gen(p, zeroes), cut;
        bool sent;
        /* One flush at a time: p->flushing is what the one in flight
         * covers (flush_lock before p->lock, never while holding it). */
        LOCK_FOR_SCOPE(&p->flush_lock);
        if (!nbdx_info(p->x)->can_flush) {
            tell_durable(p, gen);
            return 0;
        }
        int r = flush_locked(p, &cut, &sent);
        if (r < 0)
            return r;
        if (cut)
            tell_durable(p, MIN(gen, cut));
        /* Everything older than gen covered: done.  Not so after a
         * reconnect during the drain or the flush: the writes it resent
         * are drained and flushed again. */
        if (cut >= gen || reconnects_now(p) == seen)
            return 0;
    }
}

int pool_flush(struct pool *p)
{
    return flush_after(p, true);
}

int pool_checkpoint(struct pool *p)
{
    return flush_after(p, false);
}

/* ---- the flusher thread ---------------------------------------------- */

/* With retention: sends an NBD flush when a writer waits for retained
 * buffers, when half the buffers are retained, every cfg.flush_bytes
 * acknowledged and every cfg.flush_interval_ms while something is
 * unflushed; and dispatches what a reconnect noticed elsewhere
 * queued. */
static bool flush_due_locked(struct pool *p, uint64_t now, uint64_t *wake)
{
    uint64_t every = (uint64_t) p->cfg.flush_interval_ms * 1000000u;

    if (p->lost)                          /* a flush would fail: wait */
        return false;
    if (p->flush_wanted || 2 * p->retained.n >= p->nbufs ||
        (p->cfg.flush_bytes && p->acked_since_flush >= p->cfg.flush_bytes))
        return true;
    if (!every || (!p->retained.head && !p->acked_since_flush &&
                   p->changes == p->flushed_changes))
        return false;
    if (now - p->last_flush_ns >= every)
        return true;
    *wake = p->last_flush_ns + every;
    return false;
}

/* After a reconnect: read the canaries back.  A server that returns
 * other bytes than a flush had covered lost stable data (a RAM disk that
 * restarted empty): nothing the pool holds can repair that, so all of
 * the disk counts as damage, loudly.  p->lock held; dropped meanwhile. */
static void check_canaries_locked(struct pool *p)
{
    struct canary c[NCANARIES];
    unsigned lost = 0, failed = 0;
    char *buf = malloc(CANARY_LEN);

    uint64_t rc = p->reconnects_seen;

    p->canary_check = false;
    p->canary_busy = true;
    memcpy(c, p->canaries, sizeof c);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; buf && i < NCANARIES; i++) {
        if (!c[i].valid || c[i].rc >= rc)   /* flushed since */
            continue;
        if (pool_read(p, c[i].off, buf, CANARY_LEN) < 0) {
            failed++;
            continue;
        }
        pthread_mutex_lock(&p->lock);
        bool still = p->canaries[i].valid && p->canaries[i].off == c[i].off &&
                     p->canaries[i].hash == c[i].hash;
        if (still && pool_canary_hash(buf, CANARY_LEN) == c[i].hash)
            p->canaries[i].rc = rc;       /* the new server holds it */
        pthread_mutex_unlock(&p->lock);
        if (still && pool_canary_hash(buf, CANARY_LEN) != c[i].hash) {
            if (lost++ == 0)
                log_err("the server lost data an NBD flush had covered: "
                        "%u bytes at offset %" PRIu64 " read back changed "
                        "after the reconnect (a server restarted without "
                        "its stable storage, a RAM disk?); every byte "
                        "written before may be wrong: copy everything "
                        "again", CANARY_LEN, c[i].off);
        }
    }
    free(buf);
    pthread_mutex_lock(&p->lock);
    if (lost) {
        pool_note_failure_locked(p, POOL_WRITE, 0, p->size, EIO, true);
        p->st.flushed_lost++;
    } else if (failed)
        log_warn("%u samples of flushed data could not be read back after "
                 "the reconnect", failed);
    p->canary_busy = false;
    pthread_cond_broadcast(&p->cond);
}

static void *flusher_thread(void *arg)
{
    block_stop_signals();
    struct pool *p = arg;

    pthread_mutex_lock(&p->lock);
    p->last_flush_ns = mono_now_ns();
    while (!p->stopping) {
        pool_check_reconnect_locked(p);
        pool_dispatch_locked(p);
        if (p->canary_check) {
            check_canaries_locked(p);
            continue;
        }
        uint64_t now = mono_now_ns(), wake = 0;
        if (!flush_due_locked(p, now, &wake)) {
            if (wake) {
                struct timespec ts = mono_deadline_ns(wake - now);
                pthread_cond_timedwait(&p->flusher_cond, &p->lock, &ts);
            } else
                pthread_cond_wait(&p->flusher_cond, &p->lock);
            continue;
        }
        p->flush_wanted = false;
        bool sent = false;
        pthread_mutex_unlock(&p->lock);
        {
            LOCK_FOR_SCOPE(&p->flush_lock);
            uint64_t cut;
            int r = flush_locked(p, &cut, &sent);
            if (r == 0 && cut)
                tell_durable(p, cut);
        }
        pthread_mutex_lock(&p->lock);
        if (sent)
            p->st.flushes_auto++;
        if (p->flush_failed && !p->flush_wanted && !p->stopping) {
            /* Failed: not again before the interval (a writer that needs
             * buffers meanwhile lets the oldest go). */
            p->last_flush_ns = mono_now_ns();
            uint64_t every = (uint64_t) p->cfg.flush_interval_ms * 1000000u;
            struct timespec ts = mono_deadline_ns(every ? every
                                                        : 1000000000u);
            pthread_cond_timedwait(&p->flusher_cond, &p->lock, &ts);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
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
    p->ext_headers = info->ext_headers;
    p->block_min = info->block_min;
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
    mono_cond_init(&p->flusher_cond);
    p->retain = cfg->retain && info->can_flush;
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
    if (p->retain) {
        r = pthread_create(&p->flusher, NULL, flusher_thread, p);
        if (r != 0) {
            log_err("pthread_create: %s", strerror(r));
            pool_destroy(p);
            return -r;
        }
        p->flusher_started = true;
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
    out->bufs_retained = p->retained.n;
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
            pthread_cond_broadcast(&p->flusher_cond);
        }
        pthread_join(p->idle_thread, NULL);
        if (p->flusher_started)
            pthread_join(p->flusher, NULL);
    }
    /* Retained writes: no flush is sent here (the caller's, if any, was
     * sent before).  A piece's buffer goes with its last piece. */
    while (p->retained.head) {
        struct pool_req *q = p->retained.head;
        pool_list_remove(&p->retained, q);
        pool_free_req_locked(p, q);
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
    pthread_cond_destroy(&p->flusher_cond);
    extmap_free(&p->touched);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    pthread_cond_destroy(&p->idle_cond);
    free(p);
}
