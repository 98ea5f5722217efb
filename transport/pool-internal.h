/* transport/pool-internal.h: the pool's private state, shared by the
 * files of transport/pool*.c and by nothing else (never included outside
 * transport/; fs/ knows only transport/pool.h).
 *
 * LAYERS, bottom first: each file calls only the ones above it in this
 * list (tools/dev/import-graph checks that no object imports in a cycle)
 *   pool-damage.c  failure records, the damage set, making zeroes pending,
 *                  freeing requests, the canaries' hash
 *   pool-errors.c  retained writes: resent or lost at a reconnect, cut by
 *                  zeroes, let go; the error sequence, healing
 *   pool-req.c     requests: sealing, sending, completion (req_done)
 *   pool-zero.c    zero requests from the zero maps, the drain's zeroing
 *   pool-write.c   buffers and copied writes (pool_write)
 *   pool-fill.c    zero-copy writes (fills), holds and landings
 *   pool-read.c    reads, asynchronous reads, seek and data ranges
 *   pool-scan.c    the block status scan at mount
 *   pool.c         create, drain, flush, the idle thread, stats, destroy
 *
 * THREAD MODEL
 * fs/ calls the pool from several threads at once: the FUSE receiver
 * thread (fs/fuseloop.c) serves writes (pool_write, fills, landings, the
 * write's error check); worker threads serve everything else (reads,
 * a close's flush, fsync, truncate, fallocate, durable writes, open's
 * heal); the digest thread and its hashers release holds (the receiver
 * too, when the digest drops one); the status and progress threads read
 * the stats; the main thread creates, flushes and destroys the pool.
 * nbdx I/O threads run the completions (req_done(), aread_done(), the
 * scan's callbacks).  One idle thread seals buffers nobody has written
 * to for idle_ms.
 * Everything below is protected by pool->lock; pool->cond is broadcast
 * whenever a request completes or a buffer frees.  nbdx_submit() is
 * called with pool->lock held (it only queues: nbdx's conn->lock is a
 * leaf).  No lock is held across a network wait: pool_read() and
 * pool_flush() drop it around nbdx_run(), heal_locked() around
 * nbdx_heal().  pool->flush_lock (one NBD flush at a time) is taken
 * before pool->lock, never while holding it.
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
 *     left on it (pool_hold_release()); with cfg.retain, a write's buffer
 *     only once a successful NBD flush covers it too (RETAINED WRITES).
 * Each is asserted where it is relied on (assert() is on in every build
 * type: the top-level CMakeLists.txt drops NDEBUG).
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
 * RETAINED WRITES (cfg.retain)
 * An acknowledged write is not yet on the server's stable storage: a
 * server that restarts (nbdkit killed, a RAM disk) may come back without
 * it.  So req_done() keeps an acknowledged write's buffer, unchanged, in
 * the retained list (state RETAINED, in acknowledgement order, stamped
 * with the flush epoch), until an NBD flush sent after the
 * acknowledgement succeeds without a reconnect in between
 * (flush_end()).  Retained buffers are in use: they count against
 * pool_size, so memory stays bounded; a writer that finds no spare
 * buffer asks the flusher thread for a flush and waits, as it waits for
 * a reply.  The flusher also flushes every cfg.flush_interval_ms and
 * every cfg.flush_bytes acknowledged, and as soon as half the buffers are
 * retained, so a flush is under way before a writer has to wait.  A
 * retained buffer is never written, landed in or lent: only FILLING
 * buffers and free ones are.
 * At a reconnect (pool_check_reconnect_locked()) every retained write is
 * sent again, oldest first, to the new server, minus the parts that
 * something newer covers (a later retained write, a request queued,
 * in flight or filling, a pending zero, damage): the newer one wins.  A
 * write resent whole goes back to the queue; one resent in parts becomes
 * a SPLIT parent whose pieces (requests with parent set, their data
 * inside the parent's buffer) are queued, the buffer going back once the
 * last piece is done.  A zero acknowledged after a retained write it
 * overlaps cuts that write into its remaining pieces at once (the zero's
 * own repair after a reconnect is the pending zero, see pool-errors.c).
 * A resent write awaits the next flush again.  Only an acknowledged write
 * whose buffer was let go before a flush covered it (retention off, a
 * bound that could not wait: the last flush failed; a piece that could
 * not be allocated) is in unflushed[UNFLUSHED_WRITE]; at a reconnect that
 * is damage ("may be lost"), the loud path.
 * Generations: a request carries gen0, pool_gen() as it was when its
 * first change was made; a flush covers the changes older than the
 * oldest gen0 not yet acknowledged (flush_cut_locked()).
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
#pragma once

#include "transport/pool.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/cleanup.h"
#include "common/list.h"
#include "transport/extmap.h"
#include "transport/nbdx.h"

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
/* With NBD extended headers, requests without a payload (write-zeroes,
 * block status) are not held to max_len nor to 32 bits: the server's
 * maximum block size bounds what it buffers, and QEMU's NBD client,
 * once extended headers are negotiated, sends zero and trim of any
 * length (block/nbd.c, nbd_refresh_limits()).  libnbd checks only the
 * payload of writes against it.  A zero this long is made only while
 * the server takes fast zeroes (LIBNBD_CMD_FLAG_FAST_ZERO: it fails at
 * once rather than write zeroes slowly), so that one request cannot
 * outlast --request-timeout on a server that would write every byte;
 * 64 GiB makes a 17 TiB disk 272 requests.  XXX: a fast zero refused
 * (ENOTSUP) is sent again whole without the flag (pool-req.c); a server
 * that refuses fast zeroes only sometimes could then take long over it.
 * The fix: split the request back to ZERO_MAX_LEN pieces there. */
#define ZERO_EXT_MAX_LEN (64ull << 30)
#define MAX_FAILURES 1024
#define DAMAGE_RANGES 4096        /* bound of the damage and unflushed sets;
                                   * past it they merge to a covering range */
#define UNFLUSHED_WRITE 0
#define UNFLUSHED_ZERO 1
#define EIO_RETRIES 2             /* an EIO write or zero is sent again this
                                   * many times before it counts */
#define NCANARIES 16              /* samples of flushed writes kept */
#define CANARY_LEN 4096u
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
    REQ_RETAINED,                 /* WRITE: acknowledged, in the retained
                                   * list until a flush covers it */
    REQ_SPLIT,                    /* WRITE: its buffer lent to pieces
                                   * (parent of each), in no list */
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
    uint64_t gen0;                /* pool_gen() at its first change */
    uint64_t ack_epoch;           /* RETAINED: the flush epoch then */
    uint64_t sent_rc;             /* nbdx_reconnects() when last sent */
    bool resend;                  /* sent again after a reconnect */
    struct pool_req *parent;      /* a piece: data is inside parent's
                                   * buffer (REQ_SPLIT), not owned */
    unsigned pieces;              /* SPLIT: pieces not yet freed */
    struct pool *p;
    struct nbdx_op op;
    struct pool_req *prev, *next; /* filling list, queue or retained */
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
    bool ext_headers;             /* nbdx_info: zero and block status may
                                   * pass max_len and 4 GiB */
    uint32_t block_min;           /* nbdx_info: 0 or 1 where none */

    pthread_mutex_t lock;
    pthread_cond_t cond;          /* a request completed, a buffer freed */
    pthread_cond_t idle_cond;     /* wakes the idle thread */
    pthread_t idle_thread;
    bool stopping;

    struct req_list filling;      /* FILLING buffers, most recent last */
    struct req_list queue;        /* QUEUED and IN_FLIGHT, in seq order */
    struct req_list retained;     /* RETAINED, in acknowledgement order */
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
    /* Retention (RETAINED WRITES): acknowledgements are stamped with
     * epoch; a flush covers the epochs up to the one current when it was
     * sent (flush_covers, while flush_in_flight).  The flusher thread
     * sends flushes of its own. */
    bool retain;                  /* cfg.retain and the server can flush */
    uint64_t epoch, flush_covers;
    bool flush_in_flight;
    uint64_t acked_since_flush;   /* write bytes acknowledged since the
                                   * last flush was sent */
    uint64_t last_flush_ns;       /* when the last flush was sent */
    bool flush_wanted;            /* a writer waits for retained buffers */
    bool flusher_started;
    pthread_t flusher;
    pthread_cond_t flusher_cond;  /* wakes the flusher */
    uint64_t pending_gen0;        /* pool_gen() when pending_zero last
                                   * became non-empty (or older) */
    bool pending_repended;        /* pending_zero holds zeroes a reconnect
                                   * made pending again: changes already
                                   * told by generation, so they hold the
                                   * flush's cut back until a drain sends
                                   * them.  A truncate's pending zeroes do
                                   * not: they are a change only once sent
                                   * (pool.h, pool_gen()) */
    /* Canaries: samples of flushed writes (CANARY_LEN bytes at off and
     * their hash), dropped when anything later is sealed over them.  A
     * reconnect has the flusher read them back: a server that lost them
     * lost data a flush had covered, which no resend can repair. */
    struct canary {
        uint64_t off, hash;
        uint64_t rc;              /* the connection its flush was on */
        bool valid;
    } canaries[NCANARIES];
    unsigned next_canary;
    bool canary_check;            /* a reconnect: read them back */
    bool canary_busy;             /* being read back: damage checks wait */

    struct pool_stats st;
    uint64_t changes;             /* write and zero requests completed */
    uint64_t flushed_changes;     /* ... as of the last good flush */
    uint64_t durable_told;        /* the last gen given to cfg.on_durable */
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

static inline bool pool_overlaps(uint64_t a, uint64_t alen, uint64_t b,
                                 uint64_t blen)
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

static inline void pool_cond_wait_locked(struct pool *p, const char *what)
{
    pool_test_before_wait(p, what);
    pthread_cond_wait(&p->cond, &p->lock);
}

/* The longest request of a kind whose own cap is cap. */
static inline uint64_t pool_max_request(const struct pool *p, uint64_t cap)
{
    return p->max_len < cap ? p->max_len : cap;
}

/* ---- lists ----------------------------------------------------------- */

static inline void pool_list_append(struct req_list *l, struct pool_req *r)
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

static inline void pool_list_remove(struct req_list *l, struct pool_req *r)
{
    if (!r->next)
        l->tail = r->prev;
    DLIST_UNLINK(l->head, r, prev, next);
    r->prev = r->next = NULL;
    l->n--;
}

static inline void pool_set_clear(struct extmap *m)
{
    extmap_remove(m, 0, UINT64_MAX);
}

/* The connection is gone for good: nbdx fails an op with these only when
 * it cannot reconnect (or was given up on). */
static inline bool pool_conn_lost_err(int err)
{
    return err == ENOTCONN || err == ESHUTDOWN || err == ECONNRESET ||
           err == EPIPE || err == ECONNABORTED;
}

/* What a copy tool is told: a lost connection is an I/O error on the
 * file, not "transport endpoint is not connected" (which reads as if the
 * mount were gone). */
static inline int pool_tool_errno(int err)
{
    return pool_conn_lost_err(err) ? EIO : err;
}

/* ---- pool-damage.c: failures, damage, pending zeroes ----------------- */

void pool_set_add_cover_locked(struct pool *p, struct extmap *m,
                               uint64_t start, uint64_t end);
bool pool_damaged_locked(const struct pool *p);
void pool_mark_repaired_locked(struct pool *p, uint64_t off, uint64_t len,
                               bool flush);
void pool_damage_clear_locked(struct pool *p, uint64_t off, uint64_t len);
/* Count a failure (lost: of an acknowledged write a reconnect may have
 * lost) and add its range to the damage; logs nothing. */
void pool_note_failure_locked(struct pool *p, enum pool_counter_kind kind,
                              uint64_t off, uint64_t len, int err, bool lost);
/* pool_note_failure_locked(), logged; latches p->lost on a lost
 * connection. */
void pool_record_failure_locked(struct pool *p, enum pool_counter_kind kind,
                                uint64_t off, uint64_t len, int err);
/* Free a request that is in no list; a held one waits for its holds, a
 * piece frees its parent's buffer with the last piece. */
void pool_free_req_locked(struct pool *p, struct pool_req *r);
/* Make [off, end) pending zero; never waits.  -ENOMEM/-ENOSPC. */
int pool_add_pending_locked(struct pool *p, uint64_t off, uint64_t end);

/* ---- pool-errors.c: lost writes, the error sequence, healing -------- */

/* After a reconnect since the last look: resend the retained writes
 * (queued, not sent: the caller, or the flusher it wakes, dispatches),
 * zero again the zeroes and count what may be lost; never waits. */
void pool_check_reconnect_locked(struct pool *p);
/* A zero over [off, off+len) was acknowledged: cut it out of the older
 * retained writes (never resend their bytes over it). */
void pool_retained_cut_locked(struct pool *p, uint64_t off, uint64_t len);
/* Let a retained write go before a flush covers it (its range counts as
 * acknowledged and unflushed: damage at a reconnect). */
void pool_evict_locked(struct pool *p, struct pool_req *r);
/* Wait while the canaries are read back after a reconnect. */
void pool_canary_wait_locked(struct pool *p);
uint64_t pool_canary_hash(const void *buf, size_t len);
/* Drops pool->lock while it tries the server: decide again after it. */
int pool_heal_locked(struct pool *p);

/* ---- pool-req.c: requests ------------------------------------------- */

/* Send every queued request that invariant 2 allows, up to the limit. */
void pool_dispatch_locked(struct pool *p);
/* Give r its place in the queue (from FILLING, or a new zero request). */
void pool_seal_locked(struct pool *p, struct pool_req *r);
/* Seal every FILLING buffer overlapping [off, off+len) except keep. */
void pool_seal_overlapping_locked(struct pool *p, uint64_t off, uint64_t len,
                                  struct pool_req *keep);
void pool_seal_all_locked(struct pool *p);
/* Wait until nothing sealed before seq is queued or in flight. */
void pool_wait_seq_locked(struct pool *p, uint64_t seq);

/* ---- pool-zero.c: zero requests -------------------------------------- */

int pool_materialize_locked(struct pool *p, size_t down_to);
/* May wait: true if it did (the caller decides again), *err set. */
bool pool_pending_room_locked(struct pool *p, int *err);
int pool_zero_locked(struct pool *p, uint64_t off, uint64_t len,
                     bool from_tool);

/* ---- pool-write.c: buffers and copied writes ------------------------- */

unsigned pool_spare_locked(const struct pool *p);
char *pool_get_buffer_locked(struct pool *p);
/* A REQ_NEW write request over data, in no list; NULL (data given back)
 * when out of memory. */
struct pool_req *pool_new_write_req_locked(struct pool *p, char *data);
/* Put a REQ_NEW write request at off into the filling list. */
void pool_open_filling_locked(struct pool *p, struct pool_req *r,
                              uint64_t off);
/* The pool is out of buffers: let what fills it drain, then wait. */
void pool_wait_buffer_locked(struct pool *p, const char *what);
struct pool_req *pool_new_filling_locked(struct pool *p, uint64_t off,
                                         int *err);
void pool_discard_filling_locked(struct pool *p, struct pool_req *b);
bool pool_filling_overlaps_other(const struct pool *p,
                                 const struct pool_req *b);
ssize_t pool_write_split_locked(struct pool *p, uint64_t off,
                                const char *data, size_t len);

/* ---- pool-scan.c: the block status scan ------------------------------ */

int pool_scan_extents(struct pool *p);
