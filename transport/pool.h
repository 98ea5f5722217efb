/* transport/pool.h: the write-back pool — everything fs/ may know about it.
 *
 * The pool turns byte-range writes from FUSE into large, ordered,
 * pipelined NBD requests.  Its promises:
 *  - pool_write() copies the caller's bytes before returning;
 *  - contiguous writes coalesce into one request of up to request_size;
 *  - a buffer returns to the pool only when the server has replied;
 *  - two overlapping requests are never in flight together, and they
 *    reach the server in the order they were made;
 *  - memory is bounded: writers wait for a free buffer;
 *  - no failure is lost: each failed request is recorded with its range
 *    and an error sequence number (errseq-like), and its range stays
 *    damage until a later request over it succeeds: while any damage is
 *    left, pool_damage() says so, and fs/ fails every close and fsync.
 *
 * All offsets are disk offsets, already checked against the export size.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct nbdx;
struct pool;

struct pool_config {
    size_t request_size;      /* largest NBD write, bytes */
    size_t pool_size;         /* write-back memory, bytes */
    unsigned depth;           /* requests in flight per connection */
    unsigned idle_ms;         /* send a partly filled buffer after this */
    bool write_through;       /* stock behaviour: no coalescing, each write
                               * waits for its reply (benchmarks) */
    bool destination_is_zero; /* trust the user: the disk reads as zero */
    bool scan_extents;        /* learn zero ranges from block status */
    unsigned scan_wait_ms;    /* the scan gives the server up after this
                               * long without a reply (0: 15 s) */
    bool scan_timed_out;      /* an earlier pool's scan got no reply (the
                               * status says so); no scan now */
    size_t zero_map_ranges;   /* most ranges each zero map holds (0:
                               * POOL_ZERO_MAP_RANGES) */
    bool track_touched;       /* keep pool_touched_next()'s map (the
                               * read-back); the same bound */
    unsigned hold_buffers;    /* buffers answered and waiting only for
                               * holds (the inline digest) that do not
                               * count against pool_size: the holders'
                               * own bound, so a slow holder does not take
                               * the writers' buffers.  Past it, held
                               * buffers count as the writers' again
                               * (memory stays bounded) */
    /* Durability, for a record of what the server holds for good (the
     * manifest): see pool_gen().  NULL: not told. */
    void (*on_durable)(void *opaque, uint64_t gen);
    void *durable_opaque;
    /* A restarted server is survived: an acknowledged write keeps its
     * buffer (counted against pool_size) until a successful NBD flush
     * covers it, and is sent again after a reconnect.  A pool thread
     * sends the flushes that free them: when a writer waits for a
     * buffer, when half the buffers are retained, every flush_bytes
     * acknowledged (0: no byte budget) and every flush_interval_ms while
     * something is unflushed (0: no interval).  Off (or a server without
     * flush): acknowledged writes go at once, and a reconnect before a
     * flush makes them damage. */
    bool retain;
    unsigned flush_interval_ms;
    uint64_t flush_bytes;
};

/* What fs/ asks for: a flush at least this often while writing. */
#define POOL_FLUSH_INTERVAL_MS 10000u
#define POOL_FLUSH_BYTES (1ull << 30)

/* Default bound of each zero map: about 64 bytes a range, so 4 MiB each.
 * Past it the known-zero map forgets its smaller pieces (costing reads
 * and zeroing that were not needed, never a skipped one) and the pending
 * zeroes are sent early, oldest range first. */
#define POOL_ZERO_MAP_RANGES 65536

enum pool_counter_kind { POOL_WRITE, POOL_ZERO, POOL_FLUSH, POOL_READ };
/* "write", "zero", "flush", "read": for messages and the status file. */
const char *pool_kind_name(enum pool_counter_kind k);

struct pool_failure {
    uint64_t seq;             /* error sequence number */
    uint64_t off, len;
    int err;                  /* positive errno */
    enum pool_counter_kind kind;
    bool lost;                /* POOL_WRITE: acknowledged, then perhaps lost
                               * when a reconnect came before a flush */
    bool repaired;            /* a later request over all of it succeeded
                               * (a flush: a later flush did) */
    int64_t time_s, repaired_s;   /* CLOCK_REALTIME seconds */
};

struct pool_range {
    uint64_t start, end;
};

#define POOL_DAMAGE_LISTED 16

struct pool_stats {
    uint64_t bytes_written;   /* accepted from the copy tool */
    uint64_t bytes_acked;     /* of bytes_written, acknowledged by the
                               * server (all-zero runs: their write-zeroes
                               * acknowledged, or not needed) */
    uint64_t bytes_failed;    /* of bytes_written, answered with an error
                               * (never acknowledged: not waiting either) */
    uint64_t bytes_zeroed;    /* zeroed on the server, acknowledged */
    uint64_t bytes_zero_skipped; /* zeroing not needed: already zero */
    uint64_t bytes_read;
    uint64_t bytes_landed;    /* of bytes_written, received straight into
                               * their buffer (pool_land_commit()) */
    uint64_t requests[4];     /* completed, by enum pool_counter_kind */
    unsigned in_flight, in_flight_peak;
    unsigned bufs_in_use, nbufs;  /* nbufs: the writers' (pool_size) */
    unsigned hold_bufs;           /* pool_config.hold_buffers */
    size_t request_size;
    uint64_t wait_ns;         /* writers blocked on a full pool */
    uint64_t idle_ns;         /* time with nothing in flight (after first) */
    uint64_t errors;          /* failed requests */
    uint64_t errors_lost;     /* of them, writes counted lost at a reconnect */
    uint64_t bytes_resent;    /* acknowledged writes sent again after a
                               * reconnect (not yet covered by a flush) */
    unsigned bufs_retained;   /* of bufs_in_use, acknowledged writes kept
                               * until a flush covers them */
    uint64_t flushes_auto;    /* NBD flushes the pool sent by itself */
    uint64_t flushed_lost;    /* reconnects after which the server no
                               * longer held data a flush had covered */
    uint64_t pending_zero, known_zero;  /* bytes */
    uint64_t pending_zero_ranges, known_zero_ranges;
    unsigned nfailures;       /* entries in failures[] */
    struct pool_failure failures[16];   /* the first ones */
    /* Damage left now (pool_damage()): */
    bool unrepaired;          /* any of the three below */
    uint64_t damaged_bytes, damaged_ranges;
    bool damage_everything;   /* the set overflowed memory: all of it */
    bool flush_failed;        /* the last NBD flush failed */
    uint64_t repairs;         /* failures repaired since the mount */
    unsigned ndamage;         /* entries in damage[] */
    struct pool_range damage[POOL_DAMAGE_LISTED];   /* the first ones */
    /* The zeroing of the last drain (close, fsync, unmount): what was
     * pending when it began, and how much of it is done (acknowledged,
     * or found unneeded); active while a drain runs. */
    bool zeroing_active, zeroing_abandoned;
    uint64_t zeroing_done, zeroing_total;
    const char *scan;         /* the block status scan at mount: "complete",
                               * "partial" (its 10 s budget or an error),
                               * "timed out" (no reply: the connections
                               * were dropped, nothing is known zero),
                               * "unsupported", "off" */
};

/* Bytes written that still wait for the server's answer: neither
 * acknowledged nor failed. */
static inline uint64_t pool_stats_waiting(const struct pool_stats *s)
{
    uint64_t answered = s->bytes_acked + s->bytes_failed;
    return s->bytes_written > answered ? s->bytes_written - answered : 0;
}

int  pool_create(const struct pool_config *cfg, struct nbdx *x,
                 uint64_t size, struct pool **out);
/* Drains, stops the idle thread and frees.  Does not send NBD flush. */
void pool_destroy(struct pool *p);

/* Copy len bytes at off into the pool.  Returns len, or -errno: -EIO once
 * the connection is lost.  May wait for a free buffer. */
ssize_t pool_write(struct pool *p, uint64_t off, const void *buf, size_t len);

/* ---- zero-copy writes ------------------------------------------------
 * pool_write() without its copy: pool_fill_begin() reserves [off,
 * off+len) at the tail of FILLING buffers and says where the bytes go;
 * the caller fills seg[] in order, without the pool's lock (from the FUSE
 * pipe, say), then pool_fill_commit() does the rest of what pool_write()
 * does: all-zero chunks still become write-zeroes, the write is ordered
 * where it was reserved.  Between the two calls the reserved buffers are
 * not sent and no other write lands in them: a write overlapping them
 * goes to a new buffer, queued after them.
 *
 * Holds: pool_fill_commit(..., hold = true) keeps the committed bytes
 * readable and unchanged (hold[].mem) until each hold[].ref is given to
 * pool_hold_release(): the buffer goes back to the free list only once it
 * is both acknowledged by the server and released.  Held buffers count
 * against pool_size once more than pool_config.hold_buffers answered
 * buffers wait only for holds: up to that many are the holders' own. */
#define POOL_FILL_SEGS 4

struct pool_hold {
    uint64_t off;             /* disk offset of mem[0] */
    const void *mem;
    size_t len;
    void *ref;                /* for pool_hold_release() */
};

struct pool_fill {
    uint64_t off;
    size_t len;
    unsigned nseg;
    struct pool_seg {
        void *mem;            /* put seg[i].len bytes here */
        size_t len;
        void *req;            /* the pool's */
    } seg[POOL_FILL_SEGS];
    unsigned nhold;           /* set by pool_fill_commit() */
    struct pool_hold hold[POOL_FILL_SEGS];
};

/* Reserve room for len bytes at off.  0: f->seg[] says where to put them;
 * pool_fill_commit() must follow.  -EAGAIN: this write cannot be reserved
 * (write-through mode, or it spans more than POOL_FILL_SEGS buffers): use
 * pool_write().  -EIO once the connection is lost.  May wait for a free
 * buffer (holding no reservation while it waits). */
int pool_fill_begin(struct pool *p, uint64_t off, size_t len,
                    struct pool_fill *f);

/* err: 0 if every reserved byte was filled, else the -errno of the fill;
 * the reservation is then undone and err returned.  Returns len or
 * -errno.  With hold, on success f->hold[0..nhold) covers the write, in
 * order (one hold per buffer; a private copy if the write was split
 * around zero chunks). */
ssize_t pool_fill_commit(struct pool *p, struct pool_fill *f, int err,
                         bool hold);

/* Give back one hold from pool_fill_commit().  Any thread; takes the
 * pool's lock. */
void pool_hold_release(void *ref);
/* One more hold on the same bytes (a second reader of them), given back
 * by its own pool_hold_release(ref).  Only while a hold on ref is kept. */
void pool_hold_dup(void *ref);

/* ---- landings: writes received straight into a pool buffer ------------
 * The FUSE receive loop reads each request not knowing what it is.  A
 * landing is where it puts the payload in case the request is a write:
 * the free tail of the buffer that the next sequential write (at
 * next_off) would extend, else a whole free buffer.  While a landing
 * lasts (the loop may wait for a request for ever) its buffer is sent and
 * answered as usual up to its current length, but no other write lands
 * in it and it is not reused; a write that overlaps it seals it first.
 * If the request was a write at the landing's offset (or anywhere, for a
 * whole buffer) whose bytes fit, pool_land_commit() commits them where
 * they are, without a copy.  Every landing ends with pool_land_end(). */
struct pool_landing {
    void *mem;                /* put up to room payload bytes here */
    size_t room;
    void *req;                /* the pool's; NULL: no landing */
    bool used;                /* committed */
};

/* 0: *l is a landing with room >= want if it is a tail, a whole buffer
 * otherwise.  -EAGAIN: none now (write-through, connection lost, no
 * buffer free).  With wait (writes are streaming in: the next request
 * would wait for a buffer anyway), waits for a buffer as a write does
 * rather than give up. */
int pool_land_begin(struct pool *p, uint64_t next_off, size_t want,
                    bool wait, struct pool_landing *l);

/* The request was a write of len bytes at off, read into l->mem.  Commit
 * them in place, as pool_fill_begin() + pool_fill_commit() would (f gets
 * the holds).  Returns len; -EAGAIN if they cannot stay where they are
 * (another offset, a buffer sealed meanwhile, zero runs that
 * pool_write() would send as write-zeroes, no room): the caller writes
 * them the usual way from a copy; -EIO once the connection is lost. */
ssize_t pool_land_commit(struct pool *p, struct pool_landing *l, uint64_t off,
                         size_t len, bool hold, struct pool_fill *f);

/* End the landing (committed or not).  l->req is NULL after. */
void pool_land_end(struct pool *p, struct pool_landing *l);

/* Make [off, off+len) read as zero, ordered after earlier writes.  Sent
 * as write-zeroes (never trim), skipped where the disk is known zero.
 * -ENOMEM if it could not be queued. */
int pool_zero(struct pool *p, uint64_t off, uint64_t len);

/* Like pool_zero(), but lazily: the range reads as zero at once and is
 * zeroed on the server at the next drain (or earlier, when the pending
 * map reaches its bound), except the parts written to before then.  Used
 * for truncate and O_TRUNC.  May wait for zero requests to complete. */
int pool_zero_lazy(struct pool *p, uint64_t off, uint64_t len);

/* The manifest (fs/manifest.c) found that a write of [off, off+len)
 * would bring the bytes the server already holds there: it is not sent.
 * Ordered like a write: a pending zero over the range (a truncate's) is
 * cancelled, so the range reads the server's bytes again.  Returns 1 if
 * the range was wholly pending zero (now cancelled), 0 if no byte of it
 * was (nothing to do), -EAGAIN if only part of it was, or if part of it
 * is known zero (the caller must write it), -ENOMEM. */
int pool_note_unchanged(struct pool *p, uint64_t off, uint64_t len);

/* A truncate to from: the damaged ranges at or past from must read as
 * zero too (the disk past the size does), and a failed zeroing there may
 * have left anything: zero them again, lazily, as pool_zero_lazy(). */
int pool_zero_damage(struct pool *p, uint64_t from);

/* Read, seeing every write and zero made before the call. */
int pool_read(struct pool *p, uint64_t off, void *buf, size_t len);

/* ---- asynchronous reads (read-ahead) ---------------------------------
 * pool_read_start() sends one NBD read without waiting for it.  It keeps
 * pool_read()'s ordering without ever blocking: a range that a write or
 * zero not yet answered overlaps (FILLING buffers are sealed and sent),
 * or that a pending zero partly covers, is refused with -EAGAIN, and the
 * caller reads it with pool_read() instead.  A range that reads as zero
 * entirely (known zero and pending zero) is zero-filled at once.  The
 * caller must drop the result if the range is written, zeroed or
 * truncated after the call (pool_read_start() cannot see later changes).
 * pool_destroy() waits for every started read's done(). */
struct pool_aread {
    uint64_t off;
    size_t len;               /* at most pool_read_max() */
    void *buf;                /* borrowed until done() */
    /* Called on an nbdx I/O thread, without the pool's lock; err is 0 or a
     * positive errno.  The pool does not touch the pool_aread afterwards. */
    void (*done)(struct pool_aread *a, int err);
    void *opaque;             /* the caller's */

    /* Private to the pool. */
    struct pool *p;
    struct nbdx_op *op;
};

/* 0: done() will be called.  1: buf was zero-filled, no done().  -EAGAIN:
 * use pool_read().  -EIO: the connection is lost. */
int pool_read_start(struct pool *p, struct pool_aread *a);

/* The longest read request the server takes (and pool_read_start()). */
size_t pool_read_max(struct pool *p);

/* Return once everything accepted before the call has been answered by
 * the server (success or failure), pending zeroes included. */
void pool_drain(struct pool *p);

/* Give up the zeroing of pending zeroes, for good (a second stop signal
 * during the final drain): a drain waiting to queue zero requests returns
 * once those already queued are answered.  What is left is logged, range
 * by range, and recorded as one failure (ECANCELED), so later closes,
 * fsyncs and the exit status report it.  Never waits for the server. */
void pool_abandon_zeroing(struct pool *p);

/* pool_drain(), then NBD flush.  Returns 0 or -errno of the flush. */
int pool_flush(struct pool *p);

/* Like pool_flush(), but pending zeroes (a truncate's, lazily zeroed)
 * stay pending: only the writes and zeroes already queued are drained
 * and flushed.  For a checkpoint in the middle of a copy (the manifest's
 * record of what is durable), which must not send a truncate's zeroing
 * that the copy's later writes would make unneeded.  cfg.on_durable is
 * told as after pool_flush(); pending zeroes are not changes yet. */
int pool_checkpoint(struct pool *p);

/* Generations.  pool_gen() read after a write or zero has returned is
 * a number G that says "this change is older than G".  A lazy zero
 * (pool_zero_lazy(), pool_zero_damage(): a truncate's) is a change only
 * once a drain sends it (pool_gen() read after that drain): until then
 * its ranges are the caller's to treat as unknown.  Zeroes a reconnect
 * made pending again are changes already: they hold D back until sent.  When
 * an NBD flush succeeds (or a drain ends, on a server without flush)
 * with no damage left, cfg.on_durable(cfg.durable_opaque, D) is called,
 * without the pool's lock, on the thread that flushed: every change older
 * than D is on the server's stable storage, and no reconnect came between
 * its acknowledgement and that flush without it being sent again.  D
 * never decreases from one call to the next; a later flush tells the
 * same D again (a change recorded with G == D after the first call, by
 * another thread, is covered by it). */
uint64_t pool_gen(struct pool *p);

/* Errors, reported like the kernel's errseq_t: each failure of a write,
 * zero or flush gets a sequence number; a file handle remembers the last
 * one it has been told about.  pool_error_seq() is the current number;
 * pool_error_take() returns the first error (positive errno) recorded
 * after *seq, or 0, and moves *seq to the current number. */
/* The connection was lost (every request fails): try the server again
 * now (transport/nbdx.h nbdx_heal).  0 if it answers, or nothing was
 * lost; -EIO otherwise.  Writes and reads do this themselves; fs/ calls
 * it at open, so that a new copy finds a healed mount. */
int pool_heal(struct pool *p);

uint64_t pool_error_seq(struct pool *p);

/* Every failure of this mount was a write counted lost at a reconnect
 * (acknowledged, then the connection was made again before a flush
 * covered it), no flush failed, and a read-back of the whole disk has
 * just found it holding every byte written: those writes were not lost
 * after all.  Marks them repaired and clears the damage.  -EBUSY (and
 * nothing changes) if any other failure happened. */
int pool_forgive_lost(struct pool *p);

/* Like pool_damage(), but only ranges left wrong (a failed NBD flush,
 * which only a later flush repairs, does not count): the end of a copy
 * sends no flush (fs/ops.c). */
int pool_range_damage(struct pool *p);
/* *seq is read (peek) or read and moved (take) under the pool's lock, so
 * one handle may be used by several threads at once. */
int pool_error_peek(struct pool *p, const uint64_t *seq);
int pool_error_take(struct pool *p, uint64_t *seq);

/* Damage: 0 if the disk holds everything the server acknowledged, else
 * the positive errno (EIO for a lost connection) of the latest failure
 * left unrepaired.  A range is damaged when its write or zero failed
 * (after the retries below), or when nbdx reconnected while writes it
 * acknowledged were not yet covered by a successful NBD flush and not
 * kept to be resent (cfg.retain off, a server without flush: a volatile
 * server may have restarted without them), or when a reconnected server
 * no longer holds samples of flushed data (all of the disk); it is
 * repaired when
 * a later write or zero of it succeeds (a rewrite, or a truncate's
 * zeroing landing).  A failed NBD flush is damage until a flush
 * succeeds.  The copy tool must be told at every close and fsync until
 * then: an error told once is lost to a close nobody checks (a shell's
 * redirection, dd's dup2).
 *
 * Retries: a write or zero the server answers with EIO is sent again
 * at once, up to twice, in its place in the queue and from its buffer;
 * a flush's EIO twice, 10 ms apart.  Every other errno (ENOSPC, EINVAL,
 * EROFS, EPERM, ...) counts at once.  A connection that drops is
 * nbdx's: it reconnects and resends within --retry-timeout. */
int pool_damage(struct pool *p);

/* SEEK_DATA / SEEK_HOLE over [0, size).  -ENXIO past the last data. */
int64_t pool_seek(struct pool *p, uint64_t off, int whence, uint64_t size);

/* The ranges of [pos, limit) that may hold data, in order (the holes known
 * now skipped, but for those shorter than merge, which join the ranges on
 * either side): at most n ranges, and no more once they hold want bytes.
 * Returns how many were stored in v.  A guide only (the next write may
 * change it): the read-ahead plans its chunks over them. */
unsigned pool_data_ranges(struct pool *p, uint64_t pos, uint64_t limit,
                          uint64_t merge, uint64_t want,
                          struct pool_range *v, unsigned n);

/* The first range that ends after pos of the ranges this pool ever sent
 * a write or a write-zeroes for (sent, whatever the answer); false if
 * none.  Exact: a range that was touched is never missed (when the map
 * would pass its bound, or without cfg.track_touched, every byte counts
 * as touched).  The
 * read-back reads these instead of trusting block status: a server that
 * acknowledges a zeroing it did not do reports the range as zero too. */
bool pool_touched_next(struct pool *p, uint64_t pos, struct pool_range *out);

/* Bytes of [0, size) that may hold data (not known to read as zero). */
uint64_t pool_allocated(struct pool *p, uint64_t size);

void pool_get_stats(struct pool *p, struct pool_stats *out);
