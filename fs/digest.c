/* fs/digest.c: the inline sha256 of one forward pass over the raw file.
 *
 * THREAD MODEL
 * FUSE worker threads call digest_write/zero/truncate/close after the pool
 * accepted the operation; digest_get() runs on whichever thread opens the
 * status file.  They only check the pass and queue work: a data item is
 * the written bytes where the pool holds them (digest_write_held(): the
 * pool buffer stays unchanged and unused until the item is released) or a
 * copy (digest_write()), a zero item (a gap, a punched hole, the tail up
 * to the size at close) is a length.
 *
 * THE BUDGETS: the digest never takes the pipeline's buffers.  Holds of
 * pool buffers are bounded by their own budget (digest_set_hold_limit():
 * the bytes of the pool's hold_buffers, which the pool keeps apart from
 * pool_size); a held write past it is copied into the queue and its pool
 * buffer given back at once (copied_bytes).  The queue's copies are
 * bounded by queue_limit, the digest's own memory; a writer that finds
 * it full waits for the hash (copy_wait_ns counts it: the only place the
 * copy waits on the digest).  A slow hasher thus slows the copy only
 * once both budgets are spent, and never the writes in flight.  Releasing an item takes the pool's lock: lock order d->lock,
 * then the pool's.  d->bp_lock is held by the blkhash thread while it
 * applies an item, and by digest_fingerprints() (read-back) while it
 * reads the pass; d->idle wakes digest_settle() when the thread has
 * nothing left.  One digest thread hashes the
 * queue in order with OpenSSL EVP.  d->lock protects everything in struct
 * digest except the EVP context, which only the digest thread touches; no
 * lock is held while hashing.  When the queue's memory (payload plus
 * ITEM_COST for each item, zero items included, held payload not: that
 * is the hold budget's; a million one-byte
 * writes at a stride are a million gap items) would exceed queue_limit,
 * a writer waits for the thread (d->space) — memory stays bounded and a
 * busy machine still gets its digest, at the hash's speed — but for at
 * most WAIT_MAX_S (CLOCK_MONOTONIC): past that (hashing a huge hole, say)
 * the digest is abandoned rather than the copy held up.
 *
 * THE PASS
 * A pass starts at a truncate to 0 (O_TRUNC).  pos is where the pass has
 * got to: [0, pos) is queued or hashed.  zero_beyond says every byte at or
 * beyond pos reads as zero (true after a truncate to 0 or to pos), so a
 * write beyond pos hashes the gap as zeros, and a close hashes zeros up to
 * the file's size.  Anything that changes bytes below pos (a write or
 * punch before it, a truncate below it) ends the pass: the status says
 * "not-a-forward-pass" and never shows a value.  Without zero_beyond a
 * gap holds old data, so it ends the pass too.
 *
 * THE BLKHASH PASS (digest_create_blkhash)
 * The same queue and thread, but the rules above do not apply: every
 * change (write, zeroing, truncate below the size, close) is queued with
 * its offset, in the order the FUSE threads report it, and the thread
 * feeds them to a blkpass (fs/blkpass.h), which hashes each block on its
 * own, so writes may come in any order (qemu-img convert -W, rsync
 * --inplace, a truncate then writes anywhere).  A close queues a request
 * for the value at that size; the status shows it once the thread has
 * answered that close and nothing changed since.  A truncate to 0 starts
 * a new pass, as above.  A block the pass hashed and let go that is then
 * changed in part is read back from the disk (digest_set_reader():
 * pool_read(), which sees every change reported so far), so rewrites over
 * any earlier content are followed.  When the blkpass loses track anyway
 * (no reader, a read failed, a folded block changed) the state is
 * "cannot-complete"; when bytes of the file were never written or zeroed
 * by the pass, "incomplete".
 * XXX Two FUSE threads writing the same bytes at once may report their
 * writes in the other order than the pool applied them; a writer that
 * does this does not know its own result either.
 *
 * THE PASS OVER A VIEW'S DISK (digest_replace)
 * An image written through the VHD or VMDK view that replaces the disk
 * (fixed, dynamic, streamOptimized, monolithicSparse) starts a pass as a
 * truncate to 0 then to its size would; the decoded data and zeroes
 * follow (fs/rawfile.c) and the view's close closes it.  blkhash takes
 * them in any order; sha256 only in disk order across the view's
 * requests (within one, the reorder hold below sorts them), and the
 * reason then names the view and --blkhash.  A differencing VHD is applied over the old
 * content: no pass.
 *
 * THE REORDER HOLD (sha256, a view's pass)
 * The VMDK view's inflater threads place one request's grains in the
 * order they finish.  A write beyond pos is held (a copy, in offset
 * order, at most queue_limit bytes: past that the pass ends) instead of
 * deciding at once that the gap before it is a hole; a write at pos
 * releases the held ones that follow it.  digest_barrier(), after each
 * request to the view (every grain of it placed), and a zeroing or a
 * close release the rest: a gap still open then is a hole (the image's
 * zeros since it began).  A grain that arrives after its barrier (two
 * requests served at once) lands below pos and ends the pass: never a
 * wrong value.
 *
 * XXX Writes of one single-threaded tool arrive in order (the kernel sends
 * a direct-I/O write() as sequential requests).  Tools writing from
 * several threads at once (qemu-img convert -W) may be reported as
 * not-a-forward-pass.  Fix: hold writes beyond pos for a short reorder
 * window before deciding the gap is a hole.
 */
#include "fs/digest.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/blkhash.h"
#include "common/iszero.h"
#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/signals.h"
#include "fs/blkpass.h"

#define ZERO_SLICE (64u << 20)    /* zero bytes hashed per lock round */
#define ZERO_BUF (1u << 20)
#define WAIT_MAX_S 10             /* a writer waits this long for room */
#define ITEM_COST 64              /* bookkeeping of one queued item: the
                                   * item and the copy's malloc headers */
#define PART_BUDGET (16u << 20)   /* blkhash: copies of blocks written in
                                   * part, beyond the queue's limit */

enum item_kind {
    ITEM_STREAM,                  /* sha256: data, or len zero bytes */
    ITEM_BLK_WRITE,               /* blkhash: data at off */
    ITEM_BLK_ZERO,                /* [off, off + len) reads as zero */
    ITEM_BLK_TRUNCATE,            /* the file is off bytes long */
    ITEM_BLK_CLOSE,               /* the value at size off, please */
};

struct item {
    struct item *next;
    enum item_kind kind;
    uint64_t seq;                 /* blkhash: order of queueing */
    uint64_t off;                 /* blkhash */
    uint64_t len;
    const char *data;             /* NULL: len zero bytes */
    void (*release)(void *);      /* data is the writer's: give it back */
    void *ref;                    /* ... with release(ref); else owned */
    size_t pool_bytes;            /* len if data is a pool hold, else 0 */
};

/* A write of a view's pass that came before the bytes below it (THE
 * REORDER HOLD); data[] is its copy. */
struct held {
    struct held *next;
    uint64_t off;
    size_t len;
    char data[];
};

struct digest {
    pthread_mutex_t lock;
    pthread_cond_t cond;          /* work queued, or stopping */
    pthread_cond_t space;         /* the thread took a data item */
    pthread_t thread;
    bool stopping;
    bool busy;                    /* the thread holds a taken item */
    pthread_cond_t idle;          /* !busy and the queue is empty */

    enum digest_state state;      /* IDLE, COMPUTING, NOT_FORWARD, ABANDONED */
    bool closed;                  /* a close came after the last change */
    bool zero_beyond;
    uint64_t gen;                 /* bumped when a pass starts or ends */
    uint64_t pos;
    const char *via;              /* the view whose decoded disk this pass
                                   * hashes (digest_replace()), or NULL */
    struct held *held;            /* sha256, via a view: writes beyond pos
                                   * waiting for a barrier, by offset */
    size_t held_bytes;
    char reason[BLKPASS_REASON_MAX];

    struct item *head, *tail;
    size_t queued, limit;         /* payload + ITEM_COST per item */
    size_t pool_held, hold_limit; /* bytes of pool holds queued or being
                                   * hashed; their budget (THE BUDGETS) */
    uint64_t copied;              /* bytes copied past the hold budget */
    uint64_t wait_ns;             /* writers waited for room in the queue */
    unsigned delay_us;            /* NBDFERRY_DEBUG_DIGEST_DELAY_US: a slow
                                   * hasher, for tests */

    uint64_t hashed;              /* of this gen, by the thread */
    uint64_t hex_len, hex_gen;    /* what hex covers */
    char hex[DIGEST_HEX_MAX];

    /* blkhash only (bp NULL: sha256) */
    struct blkpass *bp;           /* the digest thread's, under bp_lock */
    pthread_mutex_t bp_lock;      /* digest_fingerprints() reads bp */
    char algorithm[32 + BLKHASH_NAME_MAX];
    uint64_t blkhash_block;
    uint64_t seq, close_seq;      /* items queued; the last close's seq */
    uint64_t res_seq;             /* the close the thread answered ... */
    enum digest_state res_state;  /* ... COMPLETE (hex) or INCOMPLETE */
    char res_reason[BLKPASS_REASON_MAX];
};

_Static_assert(DIGEST_HEX_MAX >= 2 * EVP_MAX_MD_SIZE + 1, "hex fits");

static const char zeros[ZERO_BUF];

const char *digest_state_name(enum digest_state s)
{
    static const char *names[] = {
        [DIGEST_DISABLED] = "disabled",
        [DIGEST_IDLE] = "idle",
        [DIGEST_COMPUTING] = "computing",
        [DIGEST_COMPLETE] = "complete",
        [DIGEST_INCOMPLETE] = "incomplete",
        [DIGEST_NOT_FORWARD] = "not-a-forward-pass",
        [DIGEST_ABANDONED] = "abandoned",
        [DIGEST_CANNOT_COMPLETE] = "cannot-complete",
    };
    return names[s];
}

/* ---- queue (d->lock held) -------------------------------------------- */

static void drop_data(const struct item *it)
{
    if (it->release)
        it->release(it->ref);
    else
        free((void *) it->data);
}

static void free_queue_locked(struct digest *d)
{
    while (d->head) {
        struct item *it = d->head;
        d->head = it->next;
        d->pool_held -= it->pool_bytes;
        drop_data(it);
        free(it);
    }
    d->tail = NULL;
    d->queued = 0;
}

static bool active_locked(const struct digest *d)
{
    return d->state == DIGEST_IDLE || d->state == DIGEST_COMPUTING;
}

static void drop_held_locked(struct digest *d)
{
    while (d->held) {
        struct held *h = d->held;
        d->held = h->next;
        free(h);
    }
    d->held_bytes = 0;
}

/* End the pass: no value will be shown until the next truncate to 0. */
static void fail_locked(struct digest *d, enum digest_state state,
                        const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_locked(struct digest *d, enum digest_state state,
                        const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(d->reason, sizeof d->reason, fmt, ap);
    va_end(ap);
    d->state = state;
    d->gen++;                     /* the thread drops what it is hashing */
    free_queue_locked(d);
    drop_held_locked(d);
    log_info("inline digest: %s: %s", digest_state_name(state), d->reason);
}

static void push_locked(struct digest *d, struct item *it)
{
    it->seq = ++d->seq;
    QUEUE_APPEND(d->head, d->tail, it);
    pthread_cond_signal(&d->cond);
}

static size_t item_cost(const struct item *it)
{
    return ITEM_COST + (it->data && !it->pool_bytes ? it->len : 0);
}

static bool wait_for_room_locked(struct digest *d, size_t len);

/* Queue len zero bytes (len may be 0: it starts the thread's context). */
static void push_zero_locked(struct digest *d, uint64_t len)
{
    if (d->queued + ITEM_COST > d->limit &&
        !wait_for_room_locked(d, ITEM_COST))
        return;
    struct item *it = calloc(1, sizeof *it);
    if (!it) {
        fail_locked(d, DIGEST_ABANDONED, "out of memory");
        return;
    }
    it->len = len;
    d->queued += item_cost(it);
    push_locked(d, it);
    d->pos += len;
}

static bool no_room_locked(const struct digest *d, size_t cost)
{
    return d->queued > 0 && d->queued + cost > d->limit &&
           d->state == DIGEST_COMPUTING && !d->stopping;
}

/* Wait until cost more bytes fit in the queue.  False if the digest
 * ended meanwhile (abandoned after WAIT_MAX_S, or the pass moved:
 * another writer got in). */
static bool wait_for_room_locked(struct digest *d, size_t cost)
{
    uint64_t gen = d->gen, pos = d->pos, t0 = mono_now_ns();
    struct timespec deadline = mono_deadline_ns(WAIT_MAX_S * NS_PER_S);
    while (no_room_locked(d, cost)) {
        /* A wakeup can race the deadline: only a queue still full at
         * the deadline abandons the digest. */
        if (pthread_cond_timedwait(&d->space, &d->lock, &deadline) ==
                ETIMEDOUT && no_room_locked(d, cost)) {
            d->wait_ns += mono_now_ns() - t0;
            fail_locked(d, DIGEST_ABANDONED, "hashing fell behind the writes "
                        "for %d s (%zu bytes waiting)", WAIT_MAX_S,
                        d->queued);
            return false;
        }
    }
    d->wait_ns += mono_now_ns() - t0;
    if (d->state != DIGEST_COMPUTING || d->stopping)
        return false;
    if (d->gen != gen || (!d->bp && d->pos != pos)) {
        fail_locked(d, d->bp ? DIGEST_CANNOT_COMPLETE : DIGEST_NOT_FORWARD,
                    "concurrent writes while waiting for the hash");
        return false;
    }
    return true;
}

/* Queue len bytes at buf: a copy (release NULL) or the writer's own
 * bytes, given back with release(ref).  Every path calls release once.
 * A hold past the hold budget becomes a copy, its buffer given back at
 * once (THE BUDGETS); the copy is made before waiting for room, so the
 * pool buffer is never kept while the writer waits. */
static void push_data_locked(struct digest *d, uint64_t off, const void *buf,
                             size_t len, void (*release)(void *), void *ref)
{
    if (!d->bp && is_zero(buf, len)) {
        /* sha256: zeros written are hashed from the shared zero page,
         * like a hole; no buffer is held or copied for them. */
        if (release)
            release(ref);
        push_zero_locked(d, len);
        return;
    }
    bool hold = release && d->pool_held + len <= d->hold_limit;
    size_t cost = ITEM_COST + (hold ? 0 : len);
    struct item *it = NULL;
    char *copy = NULL;

    if (!hold) {
        copy = malloc(len ? len : 1);
        if (copy)
            memcpy(copy, buf, len);
        if (release) {
            release(ref);
            release = NULL;
            d->copied += len;
        }
        if (!copy) {
            fail_locked(d, DIGEST_ABANDONED, "out of memory");
            return;
        }
    }
    if (d->queued + cost > d->limit && !wait_for_room_locked(d, cost))
        goto drop;
    it = calloc(1, sizeof *it);
    if (!it) {
        fail_locked(d, DIGEST_ABANDONED, "out of memory");
        goto drop;
    }
    it->data = copy ? copy : buf;
    it->release = release;
    it->ref = ref;
    it->pool_bytes = hold ? len : 0;
    it->kind = d->bp ? ITEM_BLK_WRITE : ITEM_STREAM;
    it->off = off;
    it->len = len;
    d->pool_held += it->pool_bytes;
    d->queued += item_cost(it);
    push_locked(d, it);
    d->pos += len;
    return;
drop:
    free(copy);
    if (release)
        release(ref);
}

/* ---- the digest thread ----------------------------------------------- */

/* NBDFERRY_DEBUG_DIGEST_DELAY_US: a hasher this much slower per data
 * item, so tests can show what a slow hasher costs the copy. */
static void slow_down(const struct digest *d, const struct item *it)
{
    if (d->delay_us && it->data) {
        struct timespec ts = { .tv_sec = d->delay_us / 1000000,
                               .tv_nsec = d->delay_us % 1000000 * 1000L };
        nanosleep(&ts, NULL);
    }
}

/* The thread is through with the item it took. */
static void done_item_locked(struct digest *d, const struct item *it)
{
    d->pool_held -= it->pool_bytes;
    d->busy = false;
    if (!d->head)
        pthread_cond_broadcast(&d->idle);
}

/* Take the next piece of work: a whole data item, or up to ZERO_SLICE of
 * a zero item.  Returns false when stopping. */
static bool take_locked(struct digest *d, struct item *out)
{
    while (!d->head && !d->stopping)
        pthread_cond_wait(&d->cond, &d->lock);
    if (d->stopping)
        return false;
    struct item *it = d->head;
    if (it->kind == ITEM_STREAM && !it->data && it->len > ZERO_SLICE) {
        *out = (struct item) { .len = ZERO_SLICE };
        it->len -= ZERO_SLICE;
        d->busy = true;
        return true;
    }
    d->busy = true;
    *out = *it;
    d->head = it->next;
    if (!d->head)
        d->tail = NULL;
    d->queued -= item_cost(it);
    pthread_cond_broadcast(&d->space);
    free(it);
    return true;
}

static bool hash_piece(EVP_MD_CTX *ctx, const struct item *it)
{
    if (it->data)
        return EVP_DigestUpdate(ctx, it->data, it->len) == 1;
    for (uint64_t left = it->len; left > 0;) {
        size_t n = left < ZERO_BUF ? (size_t) left : ZERO_BUF;
        if (EVP_DigestUpdate(ctx, zeros, n) != 1)
            return false;
        left -= n;
    }
    return true;
}

/* The digest of what is hashed so far, without ending the context. */
static bool snapshot_hex(EVP_MD_CTX *ctx, char hex[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    EVP_MD_CTX *copy = EVP_MD_CTX_new();
    bool ok = copy && EVP_MD_CTX_copy_ex(copy, ctx) == 1 &&
              EVP_DigestFinal_ex(copy, md, &n) == 1 && n == 32;

    EVP_MD_CTX_free(copy);
    for (unsigned i = 0; ok && i < n; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return ok;
}

static void *digest_thread(void *arg)
{
    block_stop_signals();
    struct digest *d = arg;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    uint64_t ctx_gen = UINT64_MAX;
    struct item it;

    pthread_mutex_lock(&d->lock);
    while (take_locked(d, &it)) {
        uint64_t gen = d->gen;
        bool fresh = gen != ctx_gen;
        pthread_mutex_unlock(&d->lock);
        slow_down(d, &it);

        bool ok = ctx && (!fresh ||
                          EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1) &&
                  hash_piece(ctx, &it);
        char hex[65] = "";
        /* Cheap (one block), so done whenever the queue may be empty. */
        if (ok)
            ok = snapshot_hex(ctx, hex);
        if (it.data)
            drop_data(&it);
        ctx_gen = ok ? gen : UINT64_MAX;

        pthread_mutex_lock(&d->lock);
        done_item_locked(d, &it);
        if (gen != d->gen)
            continue;             /* the pass restarted or ended meanwhile */
        if (!ok) {
            fail_locked(d, DIGEST_ABANDONED, "OpenSSL sha256 failed");
            continue;
        }
        d->hashed += it.len;
        memcpy(d->hex, hex, sizeof hex);
        d->hex_len = d->hashed;
        d->hex_gen = gen;
    }
    pthread_mutex_unlock(&d->lock);
    EVP_MD_CTX_free(ctx);
    return NULL;
}

/* ---- the blkhash thread ---------------------------------------------- */

/* One change or close, on the thread, without the lock.  0, -ENODATA
 * (close: incomplete) or another -errno; why says what. */
static int blk_apply(struct digest *d, const struct item *it, char *hex,
                     char *why)
{
    switch (it->kind) {
    case ITEM_BLK_WRITE:
        return blkpass_write(d->bp, it->off, it->data, it->len, why);
    case ITEM_BLK_ZERO:
        return blkpass_zero(d->bp, it->off, it->len, why);
    case ITEM_BLK_TRUNCATE:
        return blkpass_truncate(d->bp, it->off, why);
    case ITEM_BLK_CLOSE:
        return blkpass_finish(d->bp, it->off, hex, why);
    case ITEM_STREAM:
        break;
    }
    abort();
}

/* The outcome of one item, with d->lock held and the pass unchanged. */
static void blk_record_locked(struct digest *d, const struct item *it, int r,
                              const char *hex, const char *why)
{
    d->hashed = blkpass_hashed(d->bp);
    if (it->kind == ITEM_BLK_CLOSE && (r == 0 || r == -ENODATA)) {
        d->res_seq = it->seq;
        d->res_state = r == 0 ? DIGEST_COMPLETE : DIGEST_INCOMPLETE;
        snprintf(d->hex, sizeof d->hex, "%s", r == 0 ? hex : "");
        snprintf(d->res_reason, sizeof d->res_reason, "%s", r ? why : "");
    } else if (r < 0) {
        fail_locked(d, DIGEST_CANNOT_COMPLETE, "%s", why);
    }
}

static void *blk_thread(void *arg)
{
    block_stop_signals();
    struct digest *d = arg;
    uint64_t pass_gen = UINT64_MAX;
    struct item it;

    pthread_mutex_lock(&d->lock);
    while (take_locked(d, &it)) {
        uint64_t gen = d->gen;
        char hex[DIGEST_HEX_MAX] = "", why[BLKPASS_REASON_MAX] = "";
        pthread_mutex_unlock(&d->lock);
        slow_down(d, &it);

        int r = 0;
        pthread_mutex_lock(&d->bp_lock);
        if (gen != pass_gen && (r = blkpass_reset(d->bp)) < 0)
            snprintf(why, sizeof why, "cannot start: %s", strerror(-r));
        if (r == 0)
            r = blk_apply(d, &it, hex, why);
        pthread_mutex_unlock(&d->bp_lock);
        if (it.data)
            drop_data(&it);
        pass_gen = gen;

        pthread_mutex_lock(&d->lock);
        done_item_locked(d, &it);
        if (gen == d->gen)        /* else the pass restarted or ended */
            blk_record_locked(d, &it, r, hex, why);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* ---- the blkhash pass: queueing ------------------------------------- */

/* Queue a change other than a write; false if the pass is over. */
static bool blk_push_locked(struct digest *d, enum item_kind kind,
                            uint64_t off, uint64_t len)
{
    if (!active_locked(d))
        return false;
    struct item *it = calloc(1, sizeof *it);
    if (!it) {
        fail_locked(d, DIGEST_ABANDONED, "out of memory");
        return false;
    }
    *it = (struct item) { .kind = kind, .off = off, .len = len };
    d->state = DIGEST_COMPUTING;
    d->closed = false;
    d->queued += item_cost(it);   /* take_locked() takes it off */
    push_locked(d, it);
    return true;
}

static void blk_start_pass_locked(struct digest *d)
{
    free_queue_locked(d);
    d->gen++;
    d->state = DIGEST_COMPUTING;
    d->pos = d->hashed = 0;
    d->reason[0] = '\0';
    blk_push_locked(d, ITEM_BLK_TRUNCATE, 0, 0);
}

static void blk_truncate_locked(struct digest *d, uint64_t size, uint64_t old)
{
    if (size == 0)
        blk_start_pass_locked(d);
    else if (size < old)
        blk_push_locked(d, ITEM_BLK_TRUNCATE, size, 0);
    else if (size != old)
        d->closed = false;        /* the bytes [old, size) are zero already */
}

static void blk_write_locked(struct digest *d, uint64_t off, const void *buf,
                             size_t len, void (*release)(void *), void *ref)
{
    if (!active_locked(d)) {
        if (release)
            release(ref);
        return;
    }
    d->state = DIGEST_COMPUTING;
    d->closed = false;
    push_data_locked(d, off, buf, len, release, ref);
}

static void blk_close_locked(struct digest *d, uint64_t apparent)
{
    if (d->state == DIGEST_COMPUTING &&
        blk_push_locked(d, ITEM_BLK_CLOSE, apparent, 0)) {
        d->closed = true;
        d->close_seq = d->seq;
    }
}

static void blk_get_locked(struct digest *d, uint64_t apparent,
                           struct digest_info *out)
{
    out->covered = d->hashed;
    if (d->state != DIGEST_COMPUTING || !d->closed ||
        d->res_seq != d->close_seq)
        return;
    out->state = d->res_state;
    if (d->res_state == DIGEST_COMPLETE) {
        out->covered = apparent;
        memcpy(out->hex, d->hex, sizeof out->hex);
    } else {
        snprintf(out->reason, sizeof out->reason, "%s", d->res_reason);
    }
}

/* ---- the pass -------------------------------------------------------- */

static void start_pass_locked(struct digest *d)
{
    free_queue_locked(d);
    drop_held_locked(d);
    d->gen++;
    d->state = DIGEST_COMPUTING;
    d->pos = d->hashed = 0;
    d->zero_beyond = true;
    d->closed = false;
    d->reason[0] = '\0';
    push_zero_locked(d, 0);       /* so an empty pass has a digest too */
}

/* Caller holds d->lock. */
static void truncate_locked(struct digest *d, uint64_t size, uint64_t old)
{
    if (d->bp)
        blk_truncate_locked(d, size, old);
    else if (size == 0)
        start_pass_locked(d);
    else if (!active_locked(d) || size == old)
        ;
    else if (size < d->pos)
        fail_locked(d, DIGEST_NOT_FORWARD, "truncate to %" PRIu64
                    " cut bytes already hashed (position %" PRIu64 ")",
                    size, d->pos);
    else {
        if (size == d->pos)
            d->zero_beyond = true;
        d->closed = false;
    }
}

void digest_truncate(struct digest *d, uint64_t size, uint64_t old)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    if (size == 0)
        d->via = NULL;            /* the raw file's own pass */
    truncate_locked(d, size, old);
    pthread_mutex_unlock(&d->lock);
}

void digest_replace(struct digest *d, uint64_t size)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    truncate_locked(d, 0, 0);     /* a new pass, every byte zero ... */
    truncate_locked(d, size, 0);  /* ... of a file this long */
    pthread_mutex_unlock(&d->lock);
}

/* A change at off: may the pass go on to off?  Queues the gap. */
static bool advance_to_locked(struct digest *d, uint64_t off,
                              const char *what)
{
    if (!active_locked(d))
        return false;
    if (off < d->pos) {
        fail_locked(d, DIGEST_NOT_FORWARD, "%s at offset %" PRIu64
                    " is before the position %" PRIu64 "%s%s%s", what, off,
                    d->pos, d->via ? " (the disk written through " : "",
                    d->via ? d->via : "", d->via ? "; --blkhash takes any "
                                                   "order)" : "");
        return false;
    }
    if (off > d->pos && !d->zero_beyond) {
        fail_locked(d, DIGEST_NOT_FORWARD, "%s at offset %" PRIu64 " skips "
                    "bytes from %" PRIu64 " that hold older data (no "
                    "truncate to 0 started this pass)", what, off, d->pos);
        return false;
    }
    if (d->state == DIGEST_IDLE) {
        d->state = DIGEST_COMPUTING;
        push_zero_locked(d, 0);
    }
    if (off > d->pos)
        push_zero_locked(d, off - d->pos);
    d->closed = false;
    return d->state == DIGEST_COMPUTING;
}

/* ---- the reorder hold (sha256, a view's pass) ------------------------ */

/* Queue a held write (the thread frees it when hashed). */
static bool push_held_locked(struct digest *d, struct held *h)
{
    if (!advance_to_locked(d, h->off, "write")) {
        free(h);
        return false;
    }
    push_data_locked(d, h->off, h->data, h->len, free, h);
    return active_locked(d);
}

/* Queue the held writes that now follow pos without a gap. */
static void drain_contiguous_locked(struct digest *d)
{
    while (d->held && d->held->off <= d->pos && active_locked(d)) {
        struct held *h = d->held;
        d->held = h->next;
        d->held_bytes -= h->len;
        push_held_locked(d, h);   /* below pos: ends the pass */
    }
}

/* A write beyond pos of a view's pass: keep it, in offset order, until
 * the bytes before it arrive or a barrier says the gap is a hole. */
static void hold_locked(struct digest *d, uint64_t off, const void *buf,
                        size_t len)
{
    struct held *h = malloc(sizeof *h + len);

    if (d->held_bytes + len > d->limit) {
        free(h);
        fail_locked(d, DIGEST_NOT_FORWARD, "write at offset %" PRIu64
                    " is more than %zu bytes ahead of the position %" PRIu64
                    " (the disk written through %s; --blkhash takes any "
                    "order)", off, d->limit, d->pos, d->via);
        return;
    }
    if (!h) {
        fail_locked(d, DIGEST_ABANDONED, "out of memory");
        return;
    }
    *h = (struct held) { .off = off, .len = len };
    memcpy(h->data, buf, len);
    struct held **p = &d->held;
    while (*p && (*p)->off < off)
        p = &(*p)->next;
    h->next = *p;
    *p = h;
    d->held_bytes += len;
}

/* Every write before the barrier has arrived: what is still held
 * follows holes (zeros since the image began). */
static void flush_held_locked(struct digest *d)
{
    struct held *list = d->held;  /* detached: queueing may wait */

    d->held = NULL;
    d->held_bytes = 0;
    while (list) {
        struct held *h = list;
        list = h->next;
        if (!active_locked(d) || !push_held_locked(d, h))
            break;
    }
    while (list) {
        struct held *h = list;
        list = h->next;
        free(h);
    }
}

void digest_barrier(struct digest *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    if (!d->bp && d->held)
        flush_held_locked(d);
    pthread_mutex_unlock(&d->lock);
}

void digest_write(struct digest *d, uint64_t off, const void *buf, size_t len)
{
    if (!d || len == 0)
        return;
    pthread_mutex_lock(&d->lock);
    if (d->bp) {
        blk_write_locked(d, off, buf, len, NULL, NULL);
    } else if (d->via && active_locked(d) && off > d->pos) {
        hold_locked(d, off, buf, len);
    } else if (advance_to_locked(d, off, "write")) {
        push_data_locked(d, off, buf, len, NULL, NULL);
        if (d->via)
            drain_contiguous_locked(d);
    }
    pthread_mutex_unlock(&d->lock);
}

void digest_write_held(struct digest *d, uint64_t off, const void *buf,
                       size_t len, void (*release)(void *), void *ref)
{
    if (!d || len == 0) {
        release(ref);
        return;
    }
    pthread_mutex_lock(&d->lock);
    if (d->bp)
        blk_write_locked(d, off, buf, len, release, ref);
    else if (advance_to_locked(d, off, "write"))
        push_data_locked(d, off, buf, len, release, ref);
    else
        release(ref);
    pthread_mutex_unlock(&d->lock);
}

void digest_zero(struct digest *d, uint64_t off, uint64_t len,
                 uint64_t apparent)
{
    if (!d || len == 0)
        return;
    pthread_mutex_lock(&d->lock);
    if (!d->bp && d->held)
        flush_held_locked(d);     /* a view's zeroes come in file order */
    if (d->bp) {
        blk_push_locked(d, ITEM_BLK_ZERO, off, len);
    } else if (d->zero_beyond) {
        /* Beyond pos is zero already: only zeroing below it matters. */
        if (active_locked(d) && off < d->pos)
            advance_to_locked(d, off, "zeroing");
    } else if (off <= d->pos && advance_to_locked(d, off, "zeroing")) {
        uint64_t end = off + len < apparent ? off + len : apparent;
        if (end > d->pos)
            push_zero_locked(d, end - d->pos);
    }
    pthread_mutex_unlock(&d->lock);
}

void digest_close(struct digest *d, uint64_t apparent)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    if (!d->bp && d->held)
        flush_held_locked(d);
    if (d->bp) {
        blk_close_locked(d, apparent);
    } else if (d->state == DIGEST_COMPUTING) {
        if (d->zero_beyond && d->pos < apparent)
            push_zero_locked(d, apparent - d->pos);
        d->closed = true;
    }
    pthread_mutex_unlock(&d->lock);
}

void digest_foreign(struct digest *d, const char *what)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    if (d->state != DIGEST_NOT_FORWARD)
        fail_locked(d, DIGEST_NOT_FORWARD, "the disk was written through %s",
                    what);
    d->via = what;
    pthread_mutex_unlock(&d->lock);
}

/* The commands that compute this digest of the source, for the status:
 * blksum and nbdcopy --blkhash default to sha256 of 64 KiB blocks. */
static void check_hint(const struct digest *d, char *out, size_t n)
{
    if (!d->bp)
        snprintf(out, n, "sha256sum SOURCE, or nbdferry-verify "
                 "--digest=sha256 SOURCE");
    else if (strcmp(d->algorithm, "blkhash/sha256/65536") == 0)
        snprintf(out, n, "nbdferry-verify SOURCE, blksum SOURCE, or "
                 "nbdcopy --blkhash SOURCE null:");
    else
        snprintf(out, n, "nbdferry-verify --digest=%s SOURCE", d->algorithm);
}

void digest_get(struct digest *d, uint64_t apparent, struct digest_info *out)
{
    memset(out, 0, sizeof *out);
    out->algorithm = !d ? "none" : d->bp ? d->algorithm : "sha256";
    if (!d) {
        out->state = DIGEST_DISABLED;
        return;
    }
    check_hint(d, out->check, sizeof out->check);
    pthread_mutex_lock(&d->lock);
    out->held = d->pool_held;
    out->hold_limit = d->hold_limit;
    out->copied = d->copied;
    out->copy_wait_ns = d->wait_ns;
    out->state = d->state;
    if (d->bp) {
        out->position = d->pos;
        out->queued = d->queued;
        snprintf(out->reason, sizeof out->reason, "%s", d->reason);
        blk_get_locked(d, apparent, out);
        pthread_mutex_unlock(&d->lock);
        return;
    }
    out->covered = d->state == DIGEST_COMPUTING ? d->hashed : 0;
    out->position = d->pos;
    out->queued = d->queued;
    snprintf(out->reason, sizeof out->reason, "%s", d->reason);
    bool done = d->state == DIGEST_COMPUTING && d->closed && !d->head &&
                d->hex_gen == d->gen && d->hex_len == d->pos;
    if (done && d->pos == apparent) {
        out->state = DIGEST_COMPLETE;
        memcpy(out->hex, d->hex, sizeof out->hex);
    } else if (done && d->pos < apparent) {
        out->state = DIGEST_INCOMPLETE;
        snprintf(out->reason, sizeof out->reason, "this pass wrote bytes 0 "
                 "to %" PRIu64 "; the rest of the file holds older data",
                 d->pos);
    }
    pthread_mutex_unlock(&d->lock);
}

int digest_settle(struct digest *d, unsigned timeout_s)
{
    int r = 0;

    if (!d)
        return 0;
    struct timespec deadline = mono_deadline_ns(timeout_s * NS_PER_S);
    pthread_mutex_lock(&d->lock);
    while ((d->head || d->busy) && !d->stopping && r == 0)
        if (pthread_cond_timedwait(&d->idle, &d->lock, &deadline) ==
            ETIMEDOUT)
            r = -ETIMEDOUT;
    pthread_mutex_unlock(&d->lock);
    return r;
}

int digest_fingerprints(struct digest *d, uint64_t size, unsigned *shift,
                        uint64_t **fp, size_t *n)
{
    if (!d || !d->bp)
        return -ENOTSUP;
    pthread_mutex_lock(&d->bp_lock);
    unsigned min = blkpass_fp_min_shift(d->bp);
    uint64_t bs = d->blkhash_block;
    uint64_t nblocks = (size + bs - 1) / bs;
    if (*shift < min)
        *shift = min;
    *n = (size_t) ((nblocks + (1ull << *shift) - 1) >> *shift);
    *fp = calloc(*n ? *n : 1, sizeof **fp);
    int r = *fp ? blkpass_fingerprints(d->bp, size, *shift, *fp, *n)
                : -ENOMEM;
    pthread_mutex_unlock(&d->bp_lock);
    return r;
}

/* ---- life ------------------------------------------------------------ */

static int create(size_t queue_limit, struct blkpass *bp, struct digest **out)
{
    struct digest *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->limit = queue_limit;
    d->hold_limit = queue_limit;  /* digest_set_hold_limit() narrows it */
    const char *delay = getenv("NBDFERRY_DEBUG_DIGEST_DELAY_US");
    d->delay_us = delay ? (unsigned) strtoul(delay, NULL, 10) : 0;
    d->state = DIGEST_IDLE;
    d->bp = bp;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->bp_lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    mono_cond_init(&d->space);
    mono_cond_init(&d->idle);
    int r = pthread_create(&d->thread, NULL, bp ? blk_thread : digest_thread,
                           d);
    if (r) {
        pthread_mutex_destroy(&d->lock);
        pthread_mutex_destroy(&d->bp_lock);
        pthread_cond_destroy(&d->cond);
        pthread_cond_destroy(&d->space);
        pthread_cond_destroy(&d->idle);
        free(d);
        return -r;
    }
    *out = d;
    return 0;
}

int digest_create(size_t queue_limit, struct digest **out)
{
    return create(queue_limit, NULL, out);
}

int digest_create_blkhash(size_t queue_limit, const char *md,
                          uint64_t block_size, struct digest **out)
{
    struct blkpass *bp;
    int r = blkpass_create(md, block_size, PART_BUDGET, &bp);

    if (r < 0)
        return r;
    if ((r = create(queue_limit, bp, out)) < 0) {
        blkpass_free(bp);
        return r;
    }
    snprintf((*out)->algorithm, sizeof (*out)->algorithm,
             "blkhash/%s/%" PRIu64, md, block_size);
    (*out)->blkhash_block = block_size;
    return 0;
}

void digest_set_reader(struct digest *d,
                       int (*read)(void *ctx, uint64_t off, void *buf,
                                   size_t len),
                       void *ctx, uint64_t size)
{
    if (!d || !d->bp)
        return;
    pthread_mutex_lock(&d->bp_lock);
    blkpass_set_reader(d->bp, read, ctx, size);
    pthread_mutex_unlock(&d->bp_lock);
}

void digest_set_hold_limit(struct digest *d, size_t bytes)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    d->hold_limit = bytes;
    pthread_mutex_unlock(&d->lock);
}

void digest_destroy(struct digest *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->lock);
    d->stopping = true;
    pthread_cond_signal(&d->cond);
    pthread_cond_broadcast(&d->space);
    pthread_cond_broadcast(&d->idle);
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->thread, NULL);
    free_queue_locked(d);
    drop_held_locked(d);
    blkpass_free(d->bp);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->bp_lock);
    pthread_cond_destroy(&d->cond);
    pthread_cond_destroy(&d->space);
    pthread_cond_destroy(&d->idle);
    free(d);
}
