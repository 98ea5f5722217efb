/* transport/pool.c: write-back buffers, coalescing and request ordering.
 *
 * THREAD MODEL
 * FUSE worker threads call pool_write/zero/read/drain/flush.  nbdx I/O
 * threads call req_done() when a reply arrives (during the block status
 * scan at mount, scan_extent() and scan_done(), which take pool->lock).
 * One idle thread seals buffers nobody has written to for idle_ms.
 * Everything below is protected by pool->lock; pool->cond is broadcast
 * whenever a request completes or a buffer frees.  nbdx_submit() is
 * called with pool->lock held (it only queues: nbdx's conn->lock is a
 * leaf).  No lock is held across a network wait: pool_read() and
 * pool_flush() drop it around nbdx_run().
 *
 * Every wait on pool->cond lets other threads change everything: after
 * one, a function decides again from the state as it is then, never from
 * what it read before (ranges chosen, map lookups, buffers found).
 *
 * REQUESTS
 * A request (struct pool_req) is a write buffer or a zero range.  A write
 * buffer starts FILLING: writes that land inside it or extend it are
 * copied in.  It is sealed (QUEUED) when full, when idle, when a read or a
 * zero touches its range, or when the pool needs buffers.  Sealing gives a
 * request its place in the queue; the queue is in sealing order.
 *
 * ORDERING INVARIANTS
 *  1. FILLING buffers never overlap each other.  Before a write lands in a
 *     new buffer, or extends one over another, every other FILLING buffer
 *     it overlaps is sealed first: they hold older bytes.
 *  2. A QUEUED request is sent only when no earlier request in the queue
 *     overlaps it, so overlapping requests are never in flight together
 *     and reach the server in the order they were made.
 *  3. A request leaves the queue, and its buffer returns to the free list,
 *     only in req_done(), after the server replied, and once no hold is
 *     left on it (pool_hold_release()).
 * Each is asserted where it is relied on (assert(): on in test builds).
 *
 * ZERO-COPY WRITES
 * pool_fill_begin() reserves a write at the tail of FILLING buffers (or
 * in new ones) and marks them busy; the caller fills them without the
 * lock.  A busy buffer is never sent, trimmed or written by anyone else:
 * a write that would land in it goes to a new buffer (sealing it first if
 * they overlap, invariant 1), queued after it.  So a reservation is
 * always the tail of its buffers, and undoing it is shrinking them.  The
 * write takes effect (maps, counters, zero-chunk conversion) at commit.
 * A hold keeps a buffer's bytes [0, held_end) unchanged: no write lands
 * below held_end, and the buffer is not reused until released.
 *
 * LANDINGS
 * pool_land_begin() lends the receive loop the free tail of a FILLING
 * buffer (landing set) or a whole free buffer (state NEW, in no list), to
 * read the next request into before knowing whether it is a write.
 * Unlike a reservation it may last for ever, so it blocks nothing: the
 * buffer is sealed and sent as usual up to its len (the bytes past len
 * are not part of any request), only no other write lands in it (find_*
 * skip it, take_straddling_zeros() too) and a hold keeps it from reuse
 * until pool_land_end().  pool_land_commit() turns the landed bytes into
 * a reservation at the buffer's tail (or the whole buffer's first write)
 * and commits it as pool_fill_commit() does, if the buffer is still
 * FILLING with its tail where the write starts.
 *
 * ZERO MAPS
 * known_zero: ranges that will read as zero once every queued request is
 * done (block status at start, zero requests when sealed; writes remove
 * their range when they are absorbed).  pending_zero: ranges that must
 * read as zero but have not been zeroed yet (truncate); disjoint from
 * known_zero; turned into zero requests at the next drain.  Reads overlay
 * pending_zero, so they already read as zero.  Both are bounded
 * (cfg.zero_map_ranges ranges, O(log n) updates): known_zero forgets
 * ranges past its bound (costing a read or a zeroing, never skipping
 * one); pending_zero is turned into zero requests early, oldest range
 * first, when it nears its bound.  touched: every range a write or zero
 * request was sent for, for the read-back (pool_touched_next; kept only
 * with cfg.track_touched); exact, and once it would pass the same bound,
 * replaced by "everything".
 */
#include "transport/pool.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <libnbd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>             /* SEEK_DATA */

#include "common/cleanup.h"
#include "common/iszero.h"
#include "common/log.h"
#include "common/minmax.h"
#include "common/monotime.h"
#include "common/rounding.h"
#include "common/signals.h"
#include "transport/extmap.h"
#include "transport/nbdx.h"

#define HUGE_PAGE (2u << 20)      /* x86-64 and arm64 (4K pages) THP size */
#define MAX_FILLING 4             /* buffers open for coalescing at once */
#define MAX_ZERO_REQS 256         /* zero requests queued at once */
/* Request lengths.  A server that advertises no maximum block size may
 * refuse, or worse, silently mishandle, anything over 32 MiB: the NBD
 * protocol tells clients to assume that limit (nbd-server 3.24 answers a
 * 256 MiB write-zeroes with success after zeroing its first 64 MiB).  So
 * without an advertised maximum no request of any kind exceeds 32 MiB;
 * with one, none exceeds it.  The caps below apply on top. */
#define DEFAULT_MAX_LEN (32u << 20)
#define ZERO_MAX_LEN (1u << 30)   /* largest write-zeroes request */
#define READ_MAX_LEN (32u << 20)  /* largest read request */
#define SCAN_MAX_LEN (1u << 31)   /* largest block status request */
#define MAX_FAILURES 1024
#define DAMAGE_RANGES 4096        /* bound of the damage and unflushed sets;
                                   * past it they merge to a covering range */
#define UNFLUSHED_WRITE 0
#define UNFLUSHED_ZERO 1
#define EIO_RETRIES 2             /* an EIO write or zero is sent again this
                                   * many times before it counts */
#define ZERO_CHUNK (64u << 10)    /* all-zero payload runs this size and
                                   * alignment become write-zeroes */

enum req_kind {
    REQ_WRITE,
    REQ_ZERO,
    REQ_COPY,                     /* a private copy handed out as a hold;
                                   * never queued */
};
enum req_state {
    REQ_NEW, REQ_FILLING, REQ_QUEUED, REQ_IN_FLIGHT,
    REQ_DONE,                     /* answered or dropped, kept for holds */
};

struct pool_req {
    enum req_kind kind;
    enum req_state state;
    bool from_tool;               /* ZERO: an all-zero run the copy tool
                                   * wrote; counts as acknowledged data */
    bool replied;                 /* the server answered (invariant 3) */
    unsigned retries;             /* EIO answers resent so far */
    uint64_t off, len;            /* the range; a FILLING buffer grows */
    char *data;                   /* WRITE: owned buffer of request_size;
                                   * ZERO via writes: the shared zero page */
    uint64_t seq;                 /* place in the queue, set when sealed */
    uint64_t touched_ns;
    bool busy;                    /* WRITE: reserved by pool_fill_begin()
                                   * and not committed: not sent, and no
                                   * other write lands in it */
    bool landing;                 /* WRITE: data[len, request_size) is a
                                   * landing (pool_land_begin()): sent and
                                   * answered as usual up to len, but no
                                   * other write lands in it, and it is
                                   * not reused before pool_land_end() */
    unsigned holds;               /* pool_hold_release() calls to come */
    uint64_t held_end;            /* WRITE: data[0, held_end) is held:
                                   * never rewritten in place */
    struct pool *p;
    struct nbdx_op op;
    struct pool_req *prev, *next; /* filling list or queue */
};

struct req_list {
    struct pool_req *head, *tail;
    unsigned n;
};

struct pool {
    struct pool_config cfg;
    struct nbdx *x;
    uint64_t size;
    bool can_zero, fast_zero;
    unsigned max_in_flight;
    uint64_t max_len;             /* longest request the server takes */

    pthread_mutex_t lock;
    pthread_cond_t cond;          /* a request completed, a buffer freed */
    pthread_cond_t idle_cond;     /* wakes the idle thread */
    pthread_t idle_thread;
    bool stopping;

    struct req_list filling;      /* FILLING buffers, most recent last */
    struct req_list queue;        /* QUEUED and IN_FLIGHT, in seq order */
    uint64_t next_seq;
    unsigned in_flight, nzero_reqs;

    char **free_bufs;             /* buffers not in use */
    unsigned nfree, nbufs, nallocated;
    unsigned nheld;               /* answered buffers waiting for holds */
    struct pool_req *landing;     /* the buffer under the landing, if any
                                   * (one at a time: the receive loop's) */
    char *zero_buf;               /* request_size zero bytes, read-only */

    struct extmap known_zero, pending_zero;
    size_t map_max;               /* bound of each zero map, ranges */
    struct extmap touched;        /* every write and zero ever sent (exact;
                                   * past its bound, touched_all) */
    bool touched_all;

    bool lost;                    /* connection lost: refuse new writes */
    uint64_t err_seq;
    unsigned nfailures;
    struct pool_failure *failures;/* the first MAX_FAILURES */
    int last_err;

    /* DAMAGE: what the disk may not hold.  damage: ranges whose last
     * write or zero failed (or whose acknowledged writes a reconnect may
     * have lost), until a later request over them succeeds; by invariant
     * 2 overlapping requests complete in the order they were made, so the
     * last to complete is the last made and the set is exact (bounded:
     * past DAMAGE_RANGES it merges into one covering range, more damage,
     * never less).  flush_failed: the last NBD flush failed.  While either
     * holds, every close and fsync fails (pool_damage()). */
    struct extmap damage;
    bool damage_everything;       /* the set could not be kept: all of it */
    int damage_err;               /* errno of the latest damage */
    bool flush_failed;
    uint64_t repairs;             /* failures repaired */
    /* Acknowledged writes ([UNFLUSHED_WRITE]) and zeroes
     * ([UNFLUSHED_ZERO]) no successful NBD flush covers yet: unflushed
     * since the flush in progress (if any) was sent, flushing before it.
     * At a reconnect a volatile server may have restarted without them:
     * the writes become damage, the zeroes (which need no data) are made
     * pending again.  Bounded like damage. */
    struct extmap unflushed[2], flushing[2];
    uint64_t reconnects_seen;     /* nbdx_reconnects() as last seen */
    pthread_mutex_t flush_lock;   /* one NBD flush at a time: flushing is
                                   * the set the one in flight covers */

    struct pool_stats st;
    uint64_t changes;             /* write and zero requests completed */
    uint64_t flushed_changes;     /* ... as of the last good flush */
    uint64_t idle_since_ns;       /* nothing in flight since; 0 = busy */
    unsigned areads;              /* pool_read_start() reads not done */

    /* The zeroing of a drain, for the status: drains running, and what
     * was pending when the first began (total) against the zeroing
     * acknowledged or found unneeded since (base: the counters then). */
    unsigned zero_drains;
    uint64_t zeroing_total, zeroing_base;
    bool zeroing_abandoned;       /* pool_abandon_zeroing(): for good */
    bool abandon_reported;
};

static bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

/* Every wait on pool->cond goes through here.  Unit tests get a hook
 * that runs just before the thread sleeps (they build with
 * POOL_TEST_HOOKS), to change the world at exactly that point. */
#ifdef POOL_TEST_HOOKS
void pool_test_before_wait(struct pool *p, const char *what);
#else
#define pool_test_before_wait(p, what) ((void) 0)
#endif

static void cond_wait_locked(struct pool *p, const char *what)
{
    pool_test_before_wait(p, what);
    pthread_cond_wait(&p->cond, &p->lock);
}

/* The longest request of a kind whose own cap is cap. */
static uint64_t max_request(const struct pool *p, uint64_t cap)
{
    return p->max_len < cap ? p->max_len : cap;
}

/* ---- lists ----------------------------------------------------------- */

static void list_append(struct req_list *l, struct pool_req *r)
{
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

static void list_remove(struct req_list *l, struct pool_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        l->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

/* ---- failures -------------------------------------------------------- */

const char *pool_kind_name(enum pool_counter_kind k)
{
    static const char *const names[] = {
        [POOL_WRITE] = "write", [POOL_ZERO] = "zero",
        [POOL_FLUSH] = "flush", [POOL_READ] = "read",
    };
    assert((unsigned) k < sizeof names / sizeof names[0]);
    return names[k];
}

/* ---- damage ---------------------------------------------------------- */

/* Add [start, end) to a bounded set.  Past its bound the set becomes one
 * range covering all it held and the new one: more damage, never less.
 * Only a failed allocation of that one range loses the set, and then all
 * of the disk counts as damaged. */
static void set_add_cover_locked(struct pool *p, struct extmap *m,
                                 uint64_t start, uint64_t end)
{
    struct ext e;
    uint64_t lo = start, hi = end;

    if (start >= end || extmap_add(m, start, end) == 0)
        return;
    for (uint64_t pos = 0; extmap_next(m, pos, &e); pos = e.end) {
        lo = MIN(lo, e.start);
        hi = MAX(hi, e.end);
    }
    extmap_remove(m, 0, UINT64_MAX);          /* no split: cannot fail */
    if (extmap_add(m, lo, hi) < 0) {
        if (!p->damage_everything)
            log_err("out of memory: every byte of the disk now counts as "
                    "possibly wrong");
        p->damage_everything = true;
        p->damage_err = EIO;
    }
}

static void set_clear(struct extmap *m)
{
    extmap_remove(m, 0, UINT64_MAX);
}

static bool damaged_locked(const struct pool *p)
{
    return p->damage_everything || p->flush_failed ||
           extmap_count(&p->damage) > 0;
}

/* Mark the failures no damage covers any more as repaired. */
static void mark_repaired_locked(struct pool *p, uint64_t off, uint64_t len,
                                 bool flush)
{
    for (unsigned i = 0; i < p->nfailures; i++) {
        struct pool_failure *f = &p->failures[i];
        if (f->repaired || (f->kind == POOL_FLUSH) != flush)
            continue;
        if (!flush && (!overlaps(f->off, f->len, off, len) ||
                       extmap_covered(&p->damage, f->off, f->off + f->len)))
            continue;
        f->repaired = true;
        f->repaired_s = time(NULL);
        p->repairs++;
        log_info("%s of %" PRIu64 " bytes at offset %" PRIu64 " repaired",
                 f->lost ? "lost write" : pool_kind_name(f->kind), f->len,
                 f->off);
    }
}

/* A write or zero over [off, off+len) succeeded: what it covers is
 * repaired (it is the last request made there: invariant 2). */
static void damage_clear_locked(struct pool *p, uint64_t off, uint64_t len)
{
    if (extmap_covered(&p->damage, off, off + len) == 0)
        return;
    if (extmap_remove(&p->damage, off, off + len) < 0)
        return;                   /* a split past the bound: stays damaged */
    mark_repaired_locked(p, off, len, false);
}

static void note_failure_locked(struct pool *p, enum pool_counter_kind kind,
                                uint64_t off, uint64_t len, int err,
                                bool lost)
{
    p->err_seq++;
    p->last_err = err;
    p->st.errors++;
    if (lost)
        p->st.errors_lost++;
    if (p->nfailures < MAX_FAILURES)
        p->failures[p->nfailures++] = (struct pool_failure){
            .seq = p->err_seq, .off = off, .len = len, .err = err,
            .kind = kind, .lost = lost, .time_s = time(NULL) };
    p->damage_err = err;
    if (kind == POOL_FLUSH)
        p->flush_failed = true;
    else if (kind != POOL_READ)
        set_add_cover_locked(p, &p->damage, off, off + len);
}

static void record_failure_locked(struct pool *p, enum pool_counter_kind kind,
                                  uint64_t off, uint64_t len, int err)
{
    note_failure_locked(p, kind, off, len, err, false);
    if (err == ENOTCONN || err == ESHUTDOWN || err == ECONNRESET ||
        err == EPIPE || err == ECONNABORTED)
        p->lost = true;               /* reconnecting failed: latch it */
    log_err("%s of %" PRIu64 " bytes at offset %" PRIu64 " failed: %s",
            pool_kind_name(kind), len, off, strerror(err));
}

/* The ranges of m, acknowledged by a server that a reconnect replaced
 * before an NBD flush covered them, become damage. */
static void lose_set_locked(struct pool *p, struct extmap *m, unsigned *logged)
{
    struct ext e;

    for (uint64_t pos = 0; extmap_next(m, pos, &e); pos = e.end) {
        note_failure_locked(p, POOL_WRITE, e.start, e.end - e.start, EIO,
                            true);
        if ((*logged)++ < 16)
            log_err("write of %" PRIu64 " bytes at offset %" PRIu64 " may "
                    "be lost: acknowledged, then the connection was made "
                    "again before an NBD flush covered it",
                    e.end - e.start, e.start);
    }
    set_clear(m);
}

static int add_pending_locked(struct pool *p, uint64_t off, uint64_t end);

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
        if (overlaps(q->off, q->len, start, end - start))
            r = extmap_remove(t, q->off, q->off + q->len);
    for (const struct pool_req *q = p->filling.head; r == 0 && q;
         q = q->next)
        if (overlaps(q->off, q->len, start, end - start))
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
        set_clear(&t);
        int r = rezero_pieces_locked(p, e.start, e.end, &t);
        if (r == 0 && extmap_count(&p->pending_zero) + extmap_count(&t) + 2 >
                      p->map_max)
            r = -ENOSPC;
        for (uint64_t q = e.start; r == 0 && extmap_next(&t, q, &k);
             q = k.end) {
            extmap_remove(&p->known_zero, k.start, k.end);   /* lossy */
            r = add_pending_locked(p, k.start, k.end);
        }
        if (r < 0) {
            note_failure_locked(p, POOL_ZERO, e.start, e.end - e.start, EIO,
                                true);
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
    set_clear(m);
}

/* nbdx reconnected since we last looked: a volatile server (nbdkit
 * memory, a RAM disk) may have restarted empty, so every write it
 * acknowledged and no flush covered may be gone.  Checked before a
 * completion is counted and before a flush's result is: a reply after
 * the reconnect came from the new server (nbdx bumps its counter before
 * it resends), a reply before it from the old one. */
static void check_reconnect_locked(struct pool *p)
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
    check_reconnect_locked(p);
    if (p->st.errors != p->st.errors_lost || p->flush_failed)
        return -EBUSY;
    set_clear(&p->damage);
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
    check_reconnect_locked(p);
    return p->err_seq;
}

/* What a copy tool is told: a lost connection is an I/O error on the
 * file, not "transport endpoint is not connected" (which reads as if the
 * mount were gone). */
static int tool_errno(int err)
{
    return err == ENOTCONN || err == ESHUTDOWN || err == ECONNRESET ||
           err == EPIPE || err == ECONNABORTED ? EIO : err;
}

int pool_range_damage(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    check_reconnect_locked(p);
    if (!p->damage_everything && extmap_count(&p->damage) == 0)
        return 0;
    return tool_errno(p->damage_err ? p->damage_err : EIO);
}

int pool_damage(struct pool *p)
{
    LOCK_FOR_SCOPE(&p->lock);
    check_reconnect_locked(p);
    if (!damaged_locked(p))
        return 0;
    return tool_errno(p->damage_err ? p->damage_err : EIO);
}

static int error_since_locked(struct pool *p, uint64_t seq)
{
    if (p->err_seq <= seq)
        return 0;
    for (unsigned i = 0; i < p->nfailures; i++)
        if (p->failures[i].seq > seq)
            return tool_errno(p->failures[i].err);
    return tool_errno(p->last_err);   /* past the recorded ones */
}

/* After the connection was lost (p->lost), the next write, read or open
 * tries the server again (nbdx_heal; it blocks, so the lock is dropped
 * meanwhile).  0 once it answers: the latch is cleared and requests are
 * sent again; -EIO while it stays lost. */
static int heal_locked(struct pool *p)
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
    return heal_locked(p);
}

int pool_error_peek(struct pool *p, const uint64_t *seq)
{
    LOCK_FOR_SCOPE(&p->lock);
    return error_since_locked(p, *seq);
}

int pool_error_take(struct pool *p, uint64_t *seq)
{
    pthread_mutex_lock(&p->lock);
    int err = error_since_locked(p, *seq);
    *seq = p->err_seq;
    pthread_mutex_unlock(&p->lock);
    return err;
}

/* ---- sending --------------------------------------------------------- */

static void req_done(struct nbdx_op *op, int err);

static bool overlaps_earlier(const struct pool_req *r)
{
    for (const struct pool_req *e = r->prev; e; e = e->prev)
        if (overlaps(e->off, e->len, r->off, r->len))
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
    if (p->in_flight++ == 0 && p->idle_since_ns) {
        p->st.idle_ns += mono_now_ns() - p->idle_since_ns;
        p->idle_since_ns = 0;
    }
    if (p->in_flight > p->st.in_flight_peak)
        p->st.in_flight_peak = p->in_flight;
    nbdx_submit(p->x, op);
}

/* Send every queued request that invariant 2 allows, up to the limit. */
static void dispatch_locked(struct pool *p)
{
    for (struct pool_req *r = p->queue.head;
         r && p->in_flight < p->max_in_flight; r = r->next)
        if (r->state == REQ_QUEUED && !r->busy && !overlaps_earlier(r))
            send_req_locked(p, r);
}

static void seal_locked(struct pool *p, struct pool_req *r)
{
    if (r->state == REQ_FILLING)
        list_remove(&p->filling, r);
    r->state = REQ_QUEUED;
    r->seq = p->next_seq++;
    list_append(&p->queue, r);
}

/* Seal every FILLING buffer overlapping [off, off+len) except keep. */
static void seal_overlapping_locked(struct pool *p, uint64_t off,
                                    uint64_t len, struct pool_req *keep)
{
    struct pool_req *r = p->filling.head;
    while (r) {
        struct pool_req *next = r->next;
        if (r != keep && overlaps(r->off, r->len, off, len))
            seal_locked(p, r);
        r = next;
    }
}

static void seal_all_locked(struct pool *p)
{
    while (p->filling.head)
        seal_locked(p, p->filling.head);
}

/* Free a request that is in no list; a held buffer waits for its last
 * pool_hold_release() (invariant 3 plus: never reused while held). */
static void free_req_locked(struct pool *p, struct pool_req *r)
{
    if (r->holds > 0) {
        r->state = REQ_DONE;
        if (r->kind == REQ_WRITE)
            p->nheld++;
        return;
    }
    if (r->kind == REQ_WRITE)
        p->free_bufs[p->nfree++] = r->data;
    else if (r->kind == REQ_COPY)
        free(r->data);
    free(r);
}

static void release_req_locked(struct pool *p, struct pool_req *r)
{
    assert(r->state == REQ_IN_FLIGHT && r->replied);  /* invariant 3 */
    list_remove(&p->queue, r);
    if (r->kind == REQ_ZERO)
        p->nzero_reqs--;
    if (--p->in_flight == 0)
        p->idle_since_ns = mono_now_ns();
    free_req_locked(p, r);
}

/* nbdx completion: runs on an I/O thread, outside libnbd. */
static void req_done(struct nbdx_op *op, int err)
{
    struct pool_req *r = op->opaque;
    struct pool *p = r->p;

    pthread_mutex_lock(&p->lock);
    if (err == ENOTSUP && r->kind == REQ_ZERO &&
        (op->flags & LIBNBD_CMD_FLAG_FAST_ZERO)) {
        /* The server cannot zero fast here: plain write-zeroes instead. */
        p->fast_zero = false;
        p->in_flight--;
        r->state = REQ_QUEUED;
        dispatch_locked(p);
        pthread_mutex_unlock(&p->lock);
        return;
    }
    /* Nothing made before r overlaps it: its result is the range's
     * latest, which keeps the damage set exact (invariant 2). */
    assert(!overlaps_earlier(r));
    check_reconnect_locked(p);
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
        dispatch_locked(p);
        pthread_mutex_unlock(&p->lock);
        return;
    }
    if (err) {
        record_failure_locked(p, r->kind == REQ_WRITE ? POOL_WRITE : POOL_ZERO,
                              r->off, r->len, err);
        /* A zero's range joined known_zero when it was queued: it may
         * hold anything now, so a later truncate must zero it again. */
        if (r->kind == REQ_ZERO)
            extmap_remove(&p->known_zero, r->off, r->off + r->len);
    } else {
        damage_clear_locked(p, r->off, r->len);
        set_add_cover_locked(p, &p->unflushed[r->kind == REQ_WRITE ||
                                              !p->can_zero
                                              ? UNFLUSHED_WRITE
                                              : UNFLUSHED_ZERO],
                             r->off, r->off + r->len);
        if (r->kind == REQ_WRITE) {
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
    release_req_locked(p, r);
    dispatch_locked(p);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

/* Wait until nothing sealed before seq is queued or in flight. */
static void wait_seq_locked(struct pool *p, uint64_t seq)
{
    while (p->queue.head && p->queue.head->seq < seq)
        cond_wait_locked(p, "drain");
}

/* ---- zeroing --------------------------------------------------------- */

/* One step of zeroing [*pos, end): skip the known-zero range *pos is in,
 * or queue one zero request for the piece up to the next known-zero
 * range (or extend the last queued one).  Never sleeps, so it decides
 * from the state as it is: -EAGAIN when no zero request may be queued
 * now (the caller waits, then calls again), -ENOMEM. */
static int zero_piece_locked(struct pool *p, uint64_t *pos, uint64_t end,
                             bool from_tool)
{
    uint64_t max = p->can_zero ? max_request(p, ZERO_MAX_LEN)
                               : p->cfg.request_size;
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
    seal_overlapping_locked(p, start, stop - start, NULL);
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
        seal_locked(p, r);
    }
    extmap_add(&p->known_zero, start, stop);      /* lossy: cannot fail */
    *pos = stop;
    return 0;
}

static void wait_zero_slot_locked(struct pool *p)
{
    dispatch_locked(p);
    cond_wait_locked(p, "zero-slot");
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
    record_failure_locked(p, POOL_ZERO, first, last - first, ECANCELED);
    return -ECANCELED;
}

/* Turn pending zeroes into zero requests, oldest (lowest) range first,
 * until at most down_to ranges are left.  A range leaves pending_zero
 * in the same locked step that queues its zero request, so a write made
 * while this waits for a zero slot still removes its range from what is
 * zeroed.  -ENOMEM (recorded as a failure; the rest stays pending), or
 * -ECANCELED once the zeroing was abandoned. */
static int materialize_locked(struct pool *p, size_t down_to)
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
            record_failure_locked(p, POOL_ZERO, e.start, e.end - e.start, -r);
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
static bool pending_room_locked(struct pool *p, int *err)
{
    if (extmap_count(&p->pending_zero) + 2 <= p->map_max)
        return false;
    *err = materialize_locked(p, p->map_max / 2);
    return true;
}

/* Make [off, off+len) read as zero, ordered after every write made
 * before.  May wait for zero slots.  -ENOMEM. */
static int zero_locked(struct pool *p, uint64_t off, uint64_t len,
                       bool from_tool)
{
    uint64_t pos = off, end = off + len;
    int r = 0;

    while (pending_room_locked(p, &r))
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
            record_failure_locked(p, POOL_ZERO, pos, end - pos, -r);
            return r;
        }
    }
    return 0;
}

int pool_zero(struct pool *p, uint64_t off, uint64_t len)
{
    pthread_mutex_lock(&p->lock);
    int r = zero_locked(p, off, len, false);
    dispatch_locked(p);
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* Add the parts of [off, end) not known zero to pending_zero, keeping
 * the two maps disjoint.  When that would take too many ranges (known
 * zero is fragmented there), forget known zero in the range and make it
 * all pending: more zeroing at the drain, never less. */
static int add_pending_locked(struct pool *p, uint64_t off, uint64_t end)
{
    size_t k = extmap_count_in(&p->known_zero, off, end);

    if (extmap_count(&p->pending_zero) + k + 2 > p->map_max) {
        extmap_remove(&p->known_zero, off, end);  /* lossy: cannot fail */
        return extmap_add(&p->pending_zero, off, end);
    }
    uint64_t pos = off;
    struct ext z;
    while (pos < end) {
        uint64_t stop = end;
        if (extmap_next(&p->known_zero, pos, &z) && z.start < end)
            stop = z.start > pos ? z.start : pos;
        int r = extmap_add(&p->pending_zero, pos, stop);
        if (r < 0)
            return r;
        if (stop == end)
            break;
        pos = z.end < end ? z.end : end;
    }
    return 0;
}

int pool_zero_lazy(struct pool *p, uint64_t off, uint64_t len)
{
    int r = 0;

    pthread_mutex_lock(&p->lock);
    while (r == 0 && pending_room_locked(p, &r))
        ;
    if (r == 0)
        r = add_pending_locked(p, off, off + len);
    dispatch_locked(p);
    pthread_mutex_unlock(&p->lock);
    return r;
}

int pool_zero_damage(struct pool *p, uint64_t from)
{
    struct ext e;
    int r = 0;

    pthread_mutex_lock(&p->lock);
    for (uint64_t pos = from; r == 0 && extmap_next(&p->damage, pos, &e);
         pos = e.end) {
        while (r == 0 && pending_room_locked(p, &r))
            ;
        if (r == 0)
            r = add_pending_locked(p, MAX(e.start, from), e.end);
    }
    dispatch_locked(p);
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* ---- writing --------------------------------------------------------- */

static struct pool_req *find_filling(struct pool *p, uint64_t off)
{
    struct pool_req *tail_match = NULL;

    for (struct pool_req *r = p->filling.head; r; r = r->next) {
        if (off < r->off || off >= r->off + p->cfg.request_size)
            continue;
        if (r->busy || r->landing || off < r->off + r->held_end)
            continue;                     /* not to be written now */
        if (off < r->off + r->len)
            return r;                     /* inside: a rewrite */
        if (off == r->off + r->len)
            tail_match = r;               /* appends */
    }
    return tail_match;
}

/* Buffers a writer may take now: pool_size's, less those in use, where
 * up to hold_buffers answered buffers waiting only for holds are not the
 * writers' (pool_config.hold_buffers); never more than exist or may be
 * allocated (pool_size + hold_buffers in all). */
static unsigned spare_locked(const struct pool *p)
{
    unsigned own = p->nheld < p->cfg.hold_buffers ? p->nheld
                                                  : p->cfg.hold_buffers;
    unsigned in_use = p->nallocated - p->nfree - own;
    unsigned room = in_use < p->nbufs ? p->nbufs - in_use : 0;
    unsigned have = p->nfree + (p->nbufs + p->cfg.hold_buffers -
                                p->nallocated);

    return room < have ? room : have;
}

static char *get_buffer_locked(struct pool *p)
{
    if (spare_locked(p) == 0)
        return NULL;
    if (p->nfree > 0)
        return p->free_bufs[--p->nfree];
    if (p->nallocated < p->nbufs + p->cfg.hold_buffers) {
        void *b;
        size_t align = p->cfg.request_size % HUGE_PAGE == 0 ? HUGE_PAGE
                                                             : 4096;
        if (posix_memalign(&b, align, p->cfg.request_size) != 0)
            return NULL;
        /* Huge pages: one fault per buffer instead of 512, and fewer
         * TLB misses in the copies.  Advice only: failure is harmless. */
        if (align == HUGE_PAGE)
            madvise(b, p->cfg.request_size, MADV_HUGEPAGE);
        p->nallocated++;
        return b;
    }
    return NULL;
}

/* A new FILLING buffer at off, or NULL after waiting (the caller looks
 * again: the world changed while we slept). */
static struct pool_req *new_filling_locked(struct pool *p, uint64_t off,
                                           int *err)
{
    char *data;

    if (p->filling.n >= MAX_FILLING)
        seal_locked(p, p->filling.head);  /* the least recently opened */
    data = get_buffer_locked(p);
    if (!data) {
        /* Pool full: make sure what fills it can drain, then wait. */
        if (p->filling.head)
            seal_locked(p, p->filling.head);
        dispatch_locked(p);
        /* Nothing queued, filling or held: no buffer will come back (a
         * failed allocation with the pool empty), so waiting would be
         * forever. */
        if (p->queue.n == 0 && p->filling.n == 0 && p->nheld == 0) {
            *err = -ENOMEM;
            return NULL;
        }
        uint64_t t0 = mono_now_ns();
        cond_wait_locked(p, "buffer");
        p->st.wait_ns += mono_now_ns() - t0;
        return NULL;
    }
    struct pool_req *r = calloc(1, sizeof *r);
    if (!r) {
        p->free_bufs[p->nfree++] = data;
        *err = -ENOMEM;
        return NULL;
    }
    r->kind = REQ_WRITE;
    r->state = REQ_FILLING;
    r->p = p;
    r->off = off;
    r->data = data;
    list_append(&p->filling, r);
    pthread_cond_signal(&p->idle_cond);
    return r;
}

/* Give back a FILLING buffer that holds nothing. */
static void discard_filling_locked(struct pool *p, struct pool_req *b)
{
    assert(b->state == REQ_FILLING && b->len == 0 && !b->busy);
    list_remove(&p->filling, b);
    free_req_locked(p, b);
    pthread_cond_broadcast(&p->cond);
}

static __attribute__((unused)) bool
filling_overlaps_other(const struct pool *p, const struct pool_req *b)
{
    for (const struct pool_req *r = p->filling.head; r; r = r->next)
        if (r != b && overlaps(r->off, r->len, b->off, b->len))
            return true;
    return false;
}

/* Copy as much of the write as fits into one buffer.  Returns bytes
 * taken (0: waited, try again) or -errno. */
static ssize_t absorb_locked(struct pool *p, uint64_t off, const char *data,
                             size_t len)
{
    int err = 0;
    if (pending_room_locked(p, &err))
        return err;                       /* 0: decide again */

    struct pool_req *b = p->cfg.write_through ? NULL : find_filling(p, off);
    if (!b) {
        seal_overlapping_locked(p, off, len, NULL);
        b = new_filling_locked(p, off, &err);
        if (!b)
            return err;
    }
    size_t room = b->off + p->cfg.request_size - off;
    size_t n = len < room ? len : room;
    /* Out of pending_zero before the bytes land: a write left in it
     * would be zeroed at the next drain. */
    err = extmap_remove(&p->pending_zero, off, off + n);
    if (err < 0) {
        if (b->len == 0)
            discard_filling_locked(p, b);
        return err;
    }
    assert(b->state == REQ_FILLING);      /* never a buffer on the wire */
    memcpy(b->data + (off - b->off), data, n);
    if (off + n > b->off + b->len)
        b->len = off + n - b->off;
    seal_overlapping_locked(p, off, n, b);
    assert(!filling_overlaps_other(p, b));            /* invariant 1 */
    extmap_remove(&p->known_zero, off, off + n);  /* lossy: cannot fail */
    b->touched_ns = mono_now_ns();
    if (b->len == p->cfg.request_size || p->cfg.write_through)
        seal_locked(p, b);
    return (ssize_t) n;
}

/* Length of the run of whole all-zero ZERO_CHUNKs at the start of
 * data[0, len); the caller passes data at a ZERO_CHUNK-aligned offset. */
static size_t zero_run(const char *data, size_t len)
{
    size_t n = 0;
    while (len - n >= ZERO_CHUNK && is_zero(data + n, ZERO_CHUNK))
        n += ZERO_CHUNK;
    return n;
}

/* Copy bytes in, buffer by buffer.  -errno on failure. */
static ssize_t absorb_all_locked(struct pool *p, uint64_t off,
                                 const char *data, size_t len)
{
    size_t done = 0;
    while (done < len) {
        if (heal_locked(p) < 0)
            return -EIO;
        ssize_t r = absorb_locked(p, off + done, data + done, len - done);
        if (r < 0)
            return r;
        done += (size_t) r;
        /* Counted piece by piece: the next piece may wait for a buffer
         * (dropping the lock) while this one is acknowledged, and
         * acknowledged must never exceed written. */
        p->st.bytes_written += (uint64_t) r;
    }
    return 0;
}

/* A zero chunk can straddle two writes: tools that write zeros from an
 * unaligned offset (cp --sparse=never writes a hole's zeros starting where
 * the data ended) leave the chunk's first part at the end of a filling
 * buffer and its rest at the start of the next write.  If both parts are
 * zero, trim the buffer back to the chunk boundary, so the whole chunk
 * goes as write-zeroes.  Returns the bytes of the write taken (0: no). */
static ssize_t take_straddling_zeros(struct pool *p, uint64_t cur,
                                     const char *data, size_t len)
{
    uint64_t lo = ROUND_DOWN(cur, (uint64_t) ZERO_CHUNK);
    uint64_t hi = lo + ZERO_CHUNK;

    if (cur == lo || hi - cur > len || !is_zero(data, hi - cur))
        return 0;
    struct pool_req *b = p->filling.head;
    while (b && (b->busy || b->landing || b->off + b->len != cur))
        b = b->next;
    if (!b || b->off > lo || !is_zero(b->data + (lo - b->off), cur - lo))
        return 0;
    b->len = lo - b->off;
    if (b->len == 0)                      /* nothing left in it */
        discard_filling_locked(p, b);
    p->st.bytes_written += hi - cur;
    int r = zero_locked(p, lo, ZERO_CHUNK, true);
    return r < 0 ? r : (ssize_t) (hi - cur);
}

/* Split the write into payload and aligned all-zero runs of at least
 * ZERO_CHUNK: the runs become write-zeroes requests, or nothing where the
 * disk is known to read as zero already. */
static ssize_t write_split_locked(struct pool *p, uint64_t off,
                                  const char *data, size_t len)
{
    ssize_t taken = take_straddling_zeros(p, off, data, len);
    if (taken < 0)
        return taken;
    size_t pos = (size_t) taken;

    while (pos < len) {
        uint64_t a = ROUND_UP(off + pos, (uint64_t) ZERO_CHUNK);
        size_t payload_end = len;
        size_t zlen = 0;
        /* Find the next zero run at an aligned offset. */
        for (uint64_t z = a; z + ZERO_CHUNK <= off + len; z += ZERO_CHUNK) {
            zlen = zero_run(data + (z - off), len - (size_t) (z - off));
            if (zlen) {
                payload_end = (size_t) (z - off);
                break;
            }
        }
        ssize_t r = absorb_all_locked(p, off + pos, data + pos,
                                      payload_end - pos);
        if (r < 0)
            return r;
        if (zlen) {
            if (p->lost)
                return -EIO;
            p->st.bytes_written += zlen;
            r = zero_locked(p, off + payload_end, zlen, true);
            if (r < 0)
                return r;
        }
        pos = payload_end + zlen;
    }
    return 0;
}

ssize_t pool_write(struct pool *p, uint64_t off, const void *buf, size_t len)
{
    ssize_t r;

    pthread_mutex_lock(&p->lock);
    if (p->cfg.write_through)
        r = absorb_all_locked(p, off, buf, len);
    else
        r = write_split_locked(p, off, buf, len);
    dispatch_locked(p);
    if (p->cfg.write_through)
        wait_seq_locked(p, p->next_seq);
    pthread_mutex_unlock(&p->lock);
    return r < 0 ? r : (ssize_t) len;
}

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
            list_remove(r->state == REQ_FILLING ? &p->filling : &p->queue, r);
            free_req_locked(p, r);
        }
    }
    pthread_cond_broadcast(&p->cond);
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
    if (pending_room_locked(p, &perr))
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
            seal_overlapping_locked(p, off, f->len - done, NULL);
            if (f->nseg > 0 && spare_locked(p) == 0) {
                unreserve_locked(p, f);   /* never wait holding buffers */
                return -EAGAIN;
            }
            b = new_filling_locked(p, off, &err);
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
                discard_filling_locked(p, b);
            unreserve_locked(p, f);
            return err;
        }
        f->seg[f->nseg++] = (struct pool_seg) {
            .mem = b->data + (off - b->off), .len = n, .req = b };
        b->busy = true;
        b->len += n;
        b->touched_ns = mono_now_ns();
        seal_overlapping_locked(p, off, n, b);
        if (b->len == p->cfg.request_size)
            seal_locked(p, b);            /* sent once committed */
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
    pthread_mutex_lock(&p->lock);
    do
        r = heal_locked(p) < 0 ? -EIO : reserve_locked(p, f);
    while (r == 1);
    dispatch_locked(p);
    pthread_mutex_unlock(&p->lock);
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
    ssize_t r = write_split_locked(p, f->off, copy, f->len);
    c->kind = REQ_COPY;
    c->state = REQ_DONE;
    c->p = p;
    c->data = copy;
    if (r == 0 && hold)
        add_hold_locked(f, c, f->off, copy, f->len);
    free_req_locked(p, c);
    return r;
}

ssize_t pool_fill_commit(struct pool *p, struct pool_fill *f, int err,
                         bool hold)
{
    ssize_t r = 0;

    f->nhold = 0;
    pthread_mutex_lock(&p->lock);
    if (err == 0 && p->lost)
        err = -EIO;
    if (err < 0) {
        unreserve_locked(p, f);
        r = err;
    } else if (fill_has_zeros(p, f))
        r = commit_by_copy_locked(p, f, hold);
    else
        commit_in_place_locked(p, f, hold);
    dispatch_locked(p);
    pthread_mutex_unlock(&p->lock);
    return r < 0 ? r : (ssize_t) f->len;
}

void pool_hold_release(void *ref)
{
    struct pool_req *r = ref;
    struct pool *p = r->p;

    pthread_mutex_lock(&p->lock);
    assert(r->holds > 0);
    if (--r->holds == 0 && r->state == REQ_DONE) {
        if (r->kind == REQ_WRITE)
            p->nheld--;
        free_req_locked(p, r);
        pthread_cond_broadcast(&p->cond);     /* a buffer is free */
    }
    pthread_mutex_unlock(&p->lock);
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
        unsigned avail = spare_locked(p);
        if (avail == 0 && wait && p->nbufs >= 4 &&
            (p->queue.n > 0 || p->filling.n > 0 || p->nheld > 0)) {
            /* As a write would: what fills the pool must drain. */
            if (p->filling.head)
                seal_locked(p, p->filling.head);
            dispatch_locked(p);
            uint64_t t0 = mono_now_ns();
            cond_wait_locked(p, "landing");
            p->st.wait_ns += mono_now_ns() - t0;
            goto again;
        }
        if (avail == 0 || (avail < 2 && p->nbufs < 4))
            return -EAGAIN;
        char *data = get_buffer_locked(p);
        if (!data)
            return -EAGAIN;
        b = calloc(1, sizeof *b);
        if (!b) {
            p->free_bufs[p->nfree++] = data;
            return -EAGAIN;
        }
        b->kind = REQ_WRITE;
        b->state = REQ_NEW;           /* in no list until a write lands */
        b->p = p;
        b->data = data;
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
        /* As new_filling_locked() at off, with the landing's buffer.
         * Older buffered bytes in the range go first (invariant 1). */
        seal_overlapping_locked(p, off, len, NULL);
        if (p->filling.n >= MAX_FILLING)
            seal_locked(p, p->filling.head);
        b->off = off;
        b->state = REQ_FILLING;
        list_append(&p->filling, b);
        pthread_cond_signal(&p->idle_cond);
    }
    if (extmap_remove(&p->pending_zero, off, off + len) < 0) {
        if (fresh) {              /* back to an unused landing */
            list_remove(&p->filling, b);
            b->state = REQ_NEW;
        }
        return -EAGAIN;
    }
    /* The bytes are in place: commit them as pool_fill_commit() does. */
    l->used = true;
    b->landing = false;
    p->landing = NULL;
    b->busy = true;
    b->len += len;
    f->nseg = 1;
    f->seg[0] = (struct pool_seg) { .mem = l->mem, .len = len, .req = b };
    seal_overlapping_locked(p, off, len, b);
    assert(!filling_overlaps_other(p, b));            /* invariant 1 */
    if (b->len == p->cfg.request_size)
        seal_locked(p, b);
    if (fill_has_zeros(p, f)) {
        /* Zero runs go as write-zeroes, from a private copy, exactly as
         * pool_fill_commit() does.  The landing ends here: the copy is
         * taken before the bytes are given back. */
        b->holds--;
        l->req = NULL;
        ssize_t r = commit_by_copy_locked(p, f, hold);
        dispatch_locked(p);
        return r < 0 ? r : (ssize_t) len;
    }
    commit_in_place_locked(p, f, hold);
    p->st.bytes_landed += len;
    dispatch_locked(p);
    return (ssize_t) len;
}

void pool_land_end(struct pool *p, struct pool_landing *l)
{
    struct pool_req *b = l->req;

    if (!b)
        return;
    l->req = NULL;
    pthread_mutex_lock(&p->lock);
    b->landing = false;
    if (p->landing == b)
        p->landing = NULL;
    if (b->state == REQ_NEW) {        /* a whole buffer nothing landed in */
        b->holds--;
        free_req_locked(p, b);
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        return;
    }
    pthread_mutex_unlock(&p->lock);
    pool_hold_release(b);
}

/* ---- reading --------------------------------------------------------- */

static bool queue_overlaps(struct pool *p, uint64_t off, uint64_t len)
{
    for (struct pool_req *r = p->queue.head; r; r = r->next)
        if (overlaps(r->off, r->len, off, len))
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
    size_t max = (size_t) max_request(p, READ_MAX_LEN);

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
int pool_read(struct pool *p, uint64_t off, void *buf, size_t len)
{
    struct zero_snapshot snap;
    int r;

    pthread_mutex_lock(&p->lock);
    if (heal_locked(p) < 0) {
        pthread_mutex_unlock(&p->lock);
        return -EIO;
    }
    seal_overlapping_locked(p, off, len, NULL);
    dispatch_locked(p);
    while (queue_overlaps(p, off, len))
        cond_wait_locked(p, "read");
    bool all_zero = extmap_covered(&p->known_zero, off, off + len) +
                        extmap_covered(&p->pending_zero, off, off + len) ==
                    len;
    r = all_zero ? 0 : snapshot_pending_locked(p, off, len, &snap);
    pthread_mutex_unlock(&p->lock);

    if (all_zero)
        memset(buf, 0, len);
    else if (r == 0) {
        r = read_server(p, off, buf, len);
        if (r < 0)
            r = -tool_errno(-r);  /* a lost connection reads as EIO */
        overlay_snapshot(&snap, off, buf);
    }

    pthread_mutex_lock(&p->lock);
    if (r < 0) {
        /* The reader gets this error itself: not part of the errseq. */
        p->st.errors++;
        log_err("read of %zu bytes at offset %" PRIu64 " failed: %s", len,
                off, strerror(-r));
    } else {
        p->st.bytes_read += len;
        p->st.requests[POOL_READ]++;
    }
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* ---- asynchronous reads ---------------------------------------------- */

struct aread_op {
    struct nbdx_op op;
    struct pool_aread *a;
};

size_t pool_read_max(struct pool *p)
{
    return (size_t) max_request(p, READ_MAX_LEN);
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

    free(ao);
    a->done(a, err);              /* may free a */
    pthread_mutex_lock(&p->lock);
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
    pthread_mutex_unlock(&p->lock);
}

int pool_read_start(struct pool *p, struct pool_aread *a)
{
    uint64_t off = a->off, len = a->len;

    assert(len > 0 && len <= pool_read_max(p));
    pthread_mutex_lock(&p->lock);
    if (p->lost || p->stopping) {
        pthread_mutex_unlock(&p->lock);
        return -EIO;
    }
    seal_overlapping_locked(p, off, len, NULL);
    dispatch_locked(p);
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
        if (!ao) {
            pthread_mutex_unlock(&p->lock);
            return -EAGAIN;
        }
        ao->a = a;
        ao->op = (struct nbdx_op) { .kind = NBDX_OP_READ, .off = off,
                                    .len = len, .buf = a->buf,
                                    .done = aread_done };
        a->p = p;
        p->areads++;
        nbdx_submit(p->x, &ao->op);   /* only queues; done() comes later */
    }
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* ---- draining and flushing ------------------------------------------- */

/* Zeroing done (acknowledged, or found unneeded) since base. */
static uint64_t zeroing_count_locked(const struct pool *p)
{
    return p->st.bytes_zeroed + p->st.bytes_zero_skipped;
}

void pool_drain(struct pool *p)
{
    pthread_mutex_lock(&p->lock);
    seal_all_locked(p);
    if (p->zero_drains++ == 0) {
        p->zeroing_total = extmap_covered(&p->pending_zero, 0, p->size);
        p->zeroing_base = zeroing_count_locked(p);
    }
    materialize_locked(p, 0);             /* a failure is recorded */
    dispatch_locked(p);
    wait_seq_locked(p, p->next_seq);
    p->zero_drains--;
    pthread_mutex_unlock(&p->lock);
}

void pool_abandon_zeroing(struct pool *p)
{
    pthread_mutex_lock(&p->lock);
    p->zeroing_abandoned = true;
    pthread_cond_broadcast(&p->cond);     /* a drain waiting for a slot */
    pthread_mutex_unlock(&p->lock);
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

int pool_flush(struct pool *p)
{
    pool_drain(p);
    if (!nbdx_info(p->x)->can_flush)
        return 0;
    /* One flush at a time: p->flushing is what the one in flight covers. */
    pthread_mutex_lock(&p->flush_lock);
    /* Nothing written since the last good flush: nothing to make durable
     * (and an unmount after the server went away need not wait to
     * reconnect). */
    pthread_mutex_lock(&p->lock);
    check_reconnect_locked(p);
    uint64_t changes = p->changes;
    bool clean = changes == p->flushed_changes && !p->flush_failed;
    for (unsigned i = 0; !clean && i < 2; i++) {
        struct extmap t = p->flushing[i]; /* empty: the last flush is done */
        p->flushing[i] = p->unflushed[i];
        p->unflushed[i] = t;
    }
    pthread_mutex_unlock(&p->lock);
    if (clean) {
        pthread_mutex_unlock(&p->flush_lock);
        return 0;
    }
    int r = flush_once(p);
    pthread_mutex_lock(&p->lock);
    check_reconnect_locked(p);            /* before the flush counts */
    if (r < 0) {
        record_failure_locked(p, POOL_FLUSH, 0, 0, -r);
        struct ext e;                     /* still not covered by a flush */
        for (unsigned i = 0; i < 2; i++)
            for (uint64_t pos = 0; extmap_next(&p->flushing[i], pos, &e);
                 pos = e.end)
                set_add_cover_locked(p, &p->unflushed[i], e.start, e.end);
    } else {
        p->st.requests[POOL_FLUSH]++;
        if (p->flushed_changes < changes)
            p->flushed_changes = changes;
        if (p->flush_failed) {
            p->flush_failed = false;
            mark_repaired_locked(p, 0, 0, true);
        }
    }
    set_clear(&p->flushing[UNFLUSHED_WRITE]);
    set_clear(&p->flushing[UNFLUSHED_ZERO]);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->flush_lock);
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
    pthread_mutex_lock(&p->lock);
    if (whence == SEEK_DATA) {
        pos = data_start_locked(p, pos);
    } else {
        pos = hole_start_locked(p, pos);
        if (pos > size)
            pos = size;
    }
    pthread_mutex_unlock(&p->lock);
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

    pthread_mutex_lock(&p->lock);
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
    pthread_mutex_unlock(&p->lock);
    return k;
}

uint64_t pool_allocated(struct pool *p, uint64_t size)
{
    pthread_mutex_lock(&p->lock);
    uint64_t z = extmap_covered(&p->known_zero, 0, size) +
                 extmap_covered(&p->pending_zero, 0, size);
    pthread_mutex_unlock(&p->lock);
    return z < size ? size - z : 0;
}

bool pool_touched_next(struct pool *p, uint64_t pos, struct pool_range *out)
{
    struct ext e;
    bool found;

    pthread_mutex_lock(&p->lock);
    if (p->touched_all || !p->cfg.track_touched) {
        e = (struct ext) { 0, UINT64_MAX };
        found = true;
    } else {
        found = extmap_next(&p->touched, pos, &e);
    }
    pthread_mutex_unlock(&p->lock);
    if (found)
        *out = (struct pool_range) { e.start, e.end };
    return found;
}

/* ---- the idle thread ------------------------------------------------- */

static void *idle_thread(void *arg)
{
    block_stop_signals();
    struct pool *p = arg;
    uint64_t idle_ns = (uint64_t) p->cfg.idle_ms * 1000000u;

    pthread_mutex_lock(&p->lock);
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
                seal_locked(p, r);
            else if (r->touched_ns + idle_ns < wake)
                wake = r->touched_ns + idle_ns;
            r = next;
        }
        dispatch_locked(p);
        if (wake == UINT64_MAX)
            continue;
        struct timespec ts = mono_deadline_ns(wake - now);
        pthread_cond_timedwait(&p->idle_cond, &p->lock, &ts);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* ---- setup ----------------------------------------------------------- */

/* The scan at mount: block status requests for consecutive windows of
 * at most max_request(p, SCAN_MAX_LEN) bytes, SCAN_DEPTH of them in
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

    pthread_mutex_lock(&s->p->lock);
    if (flags & LIBNBD_STATE_ZERO)
        extmap_add(&s->p->known_zero, off, off + len);
    s->end = off + len;
    pthread_mutex_unlock(&s->p->lock);
}

static void scan_done(struct nbdx_op *op, int err)
{
    struct scan *s = (struct scan *) op;

    pthread_mutex_lock(&s->p->lock);
    s->err = err;
    s->busy = false;
    pthread_cond_broadcast(&s->p->cond);
    pthread_mutex_unlock(&s->p->lock);
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

/* The connection is gone for good (nbdx fails an op with these only when
 * it cannot reconnect): going on would mount a disk every write to which
 * fails. */
static bool scan_lost(int err)
{
    return err == ENOTCONN || err == ESHUTDOWN || err == ECONNRESET ||
           err == EPIPE || err == ECONNABORTED;
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
        cond_wait_locked(p, "scan");
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

/* Learn which ranges read as zero, from base:allocation.  Runs before the
 * mount exists and before the idle thread starts.  0, or -ETIMEDOUT: the
 * server did not answer in time and was given up (nbdx_abandon()). */
static int scan_extents(struct pool *p)
{
    struct scan *slots = calloc(SCAN_DEPTH, sizeof *slots);
    uint64_t pos = 0, t0 = mono_now_ns(), win = max_request(p, SCAN_MAX_LEN);
    uint64_t last = t0;               /* the last reply */
    bool stop = false, abandoned = false;

    if (!slots)
        return 0;                     /* nothing known: correct, slower */
    pthread_mutex_lock(&p->lock);
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
                if (scan_lost(s->err) && !abandoned) {
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
    pthread_mutex_unlock(&p->lock);
    free(slots);
    return abandoned ? -ETIMEDOUT : 0;
}

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
             scan_extents(p) < 0) {
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
    pthread_mutex_lock(&p->lock);
    check_reconnect_locked(p);
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
    out->unrepaired = damaged_locked(p);
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
    pthread_mutex_unlock(&p->lock);
}

void pool_destroy(struct pool *p)
{
    if (!p)
        return;
    bool started = !p->stopping;
    if (started) {
        pool_drain(p);
        pthread_mutex_lock(&p->lock);
        while (p->areads > 0)
            pthread_cond_wait(&p->cond, &p->lock);
        p->stopping = true;
        pthread_cond_broadcast(&p->idle_cond);
        pthread_mutex_unlock(&p->lock);
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
