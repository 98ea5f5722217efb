/* transport/pool-scan.c: the block status scan at mount, which learns
 * which ranges of the disk read as zero.
 *
 * THREAD MODEL
 * pool_create() runs the scan before the mount exists and before the
 * idle thread starts: nothing else uses the pool yet.  Its callbacks run
 * on nbdx I/O threads, several at once, and take pool->lock.
 */
#include "transport/pool-internal.h"

#include <inttypes.h>
#include <libnbd.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/monotime.h"

/* ---- setup ----------------------------------------------------------- */

/* The scan at mount: block status requests for consecutive windows of
 * at most pool_max_request(p, SCAN_MAX_LEN) bytes, SCAN_DEPTH of them in
 * flight (a 1 TiB disk is 32768 windows of 32 MiB: one at a time, each
 * round trip would count).  op comes first: the callbacks find the slot
 * from the op itself.  Extent callbacks run on I/O threads, several at
 * once, so they take pool->lock; nothing else uses the pool yet. */
#define SCAN_DEPTH 32
#define SCAN_BUDGET_NS (10ull * NS_PER_S)   /* no request sent after it */
/* A block status request that never comes back (a hung server, a broken
 * extents implementation) would hold the mount, then be timed out and
 * fail the connection for good.  So no reply for cfg->scan_wait_ms, or
 * none past the budget plus that, gives the server up: the connections
 * are dropped (nbdx_abandon()) and pool_create() fails with -ETIMEDOUT;
 * the daemon connects again without the scan. */
#define SCAN_WAIT_MS 15000u

struct scan {
    struct nbdx_op op;
    struct pool *p;
    uint64_t end;                 /* end of the last extent seen */
    bool busy;                    /* submitted, done() not run yet */
    int err;
};

static void scan_extent(struct nbdx_op *op, uint64_t off, uint64_t len,
                        uint32_t flags)
{
    struct scan *s = (struct scan *) op;

    LOCK_FOR_SCOPE(&s->p->lock);
    if (flags & LIBNBD_STATE_ZERO)
        extmap_add(&s->p->known_zero, off, off + len);
    s->end = off + len;
}

static void scan_done(struct nbdx_op *op, int err)
{
    struct scan *s = (struct scan *) op;

    LOCK_FOR_SCOPE(&s->p->lock);
    s->err = err;
    s->busy = false;
    pthread_cond_broadcast(&s->p->cond);
}

static void scan_submit_locked(struct pool *p, struct scan *s, uint64_t off,
                               uint64_t len)
{
    *s = (struct scan){ .op = { .kind = NBDX_OP_BLOCK_STATUS, .off = off,
                                .len = len, .extent = scan_extent,
                                .done = scan_done },
                        .p = p, .end = off, .busy = true };
    nbdx_submit(p->x, &s->op);
}

/* A slot's reply is in.  Returns false if the scan must stop (the known
 * zeroes gathered so far stay: they are true, the rest is just not
 * known).  A reply that covers only part of its window is asked again
 * for the rest. */
static bool scan_reply_locked(struct pool *p, struct scan *s)
{
    uint64_t wend = s->op.off + s->op.len;

    s->op.len = 0;                    /* slot free */
    if (s->err || s->end <= s->op.off) {
        log_info("block status stopped at %" PRIu64 ": %s", s->op.off,
                 s->err ? strerror(s->err) : "no progress");
        return false;
    }
    if (s->end < wend)
        scan_submit_locked(p, s, s->end, wend - s->end);
    return true;
}
/* Wait for a scan reply, the last one having come at *last (or the scan
 * begun at t0), up to the scan's deadlines; past one of them give the
 * server up (its requests then fail at once) and return true. */
static bool scan_wait_locked(struct pool *p, uint64_t t0, uint64_t last,
                             bool abandoned)
{
    uint64_t wait = (uint64_t) (p->cfg.scan_wait_ms ? p->cfg.scan_wait_ms
                                                    : SCAN_WAIT_MS) *
                    NS_PER_MS;
    uint64_t due = last + wait, now = mono_now_ns();

    if (abandoned) {
        pool_cond_wait_locked(p, "scan");
        return false;
    }
    if (due > t0 + SCAN_BUDGET_NS + wait)
        due = t0 + SCAN_BUDGET_NS + wait;
    if (now >= due) {
        log_info("block status: no reply from the server for %.1f s: "
                 "dropping the connections", (double) (now - last) / 1e9);
        nbdx_abandon(p->x);
        return true;
    }
    pool_test_before_wait(p, "scan");
    struct timespec ts = mono_deadline_ns(due - now);
    pthread_cond_timedwait(&p->cond, &p->lock, &ts);
    return false;
}

/* The length of a scan window.  With NBD extended headers a block status
 * request may cover more than 4 GiB and is not held to the maximum block
 * size (a count is a hint: the server answers for as much as it likes,
 * and the rest is asked again): the disk is cut into SCAN_DEPTH windows,
 * all asked at once, so a 17 TiB disk is 32 requests and not 557,056 of
 * 32 MiB (qemu-nbd's maximum block size), and a fragmented disk, whose
 * replies come back partial, still keeps every slot busy. */
static uint64_t scan_window(const struct pool *p)
{
    uint64_t win = pool_max_request(p, SCAN_MAX_LEN);
    uint64_t align = p->block_min > 1 ? p->block_min : 1;

    if (!p->ext_headers)
        return win;
    uint64_t share = p->size / SCAN_DEPTH + 1;
    share += align - 1 - (share + align - 1) % align;   /* round up */
    return share > win ? share : win;
}

/* Learn which ranges read as zero, from base:allocation.  Runs before the
 * mount exists and before the idle thread starts.  0, or -ETIMEDOUT: the
 * server did not answer in time and was given up (nbdx_abandon()). */
static int scan_slots(struct pool *p, struct scan *slots)
{
    uint64_t pos = 0, t0 = mono_now_ns();
    uint64_t win = scan_window(p);
    uint64_t last = t0;               /* the last reply */
    bool stop = false, abandoned = false;

    LOCK_FOR_SCOPE(&p->lock);
    for (;;) {
        unsigned busy = 0;
        if (!stop && mono_now_ns() - t0 > SCAN_BUDGET_NS) {
            log_info("block status scan stopped at %" PRIu64 " after 10s",
                     pos);
            stop = true;
        }
        for (unsigned i = 0; i < SCAN_DEPTH; i++) {
            struct scan *s = &slots[i];
            if (!s->busy && s->op.len) {
                last = mono_now_ns();
                /* Gone for good: going on would mount a disk every
                 * write to which fails. */
                if (pool_conn_lost_err(s->err) && !abandoned) {
                    nbdx_abandon(p->x);   /* the others fail at once */
                    abandoned = stop = true;
                }
                if (stop)
                    s->op.len = 0;    /* what it found is recorded */
                else if (!scan_reply_locked(p, s))
                    stop = true;
            }
            if (!s->busy && !stop && pos < p->size) {
                uint64_t len = p->size - pos < win ? p->size - pos : win;
                scan_submit_locked(p, s, pos, len);
                pos += len;
            }
            busy += s->busy;
        }
        if (busy == 0)
            break;
        if (scan_wait_locked(p, t0, last, abandoned))
            abandoned = stop = true;
    }
    extmap_remove(&p->known_zero, p->size, UINT64_MAX);
    if (!abandoned)                   /* else this pool is not used */
        log_info("disk: %" PRIu64 " of %" PRIu64 " bytes known to read as "
                 "zero", extmap_covered(&p->known_zero, 0, p->size), p->size);
    p->st.scan = abandoned ? "timed out" : stop ? "partial" : "complete";
    return abandoned ? -ETIMEDOUT : 0;
}

int pool_scan_extents(struct pool *p)
{
    struct scan *slots = calloc(SCAN_DEPTH, sizeof *slots);

    if (!slots)
        return 0;                     /* nothing known: correct, slower */
    int r = scan_slots(p, slots);
    free(slots);
    return r;
}
