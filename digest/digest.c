/* digest/digest.c: the inline digest's front (digest.h): the queue of items
 * every strategy shares, its budgets, and the entry points, which hand
 * each change to the strategy's hooks (digest-int.h): one forward pass
 * hashed with sha256 (digest/digest-sha256.c) or blkhash in any order
 * (digest/digest-blkhash.c).
 *
 * THREAD MODEL
 * digest_write/write_held/zero/truncate/close/replace/barrier/foreign
 * run on the thread that changed the raw file, after the pool accepted
 * the change: the FUSE receiving thread for writes (fs/fuseloop.c), a
 * FUSE worker for a durable write, a truncate, a fallocate or a flush
 * (the close); a format view's decoded data on the thread feeding the
 * view or on its unpack threads (views/unpackers.h: the VMDK view's
 * inflaters, the qcow2 view's decompressors).
 * digest_get() runs on whichever thread opens the status file,
 * digest_settle() and digest_fingerprints() on the thread verifying a
 * read-back.  They only check the pass and queue work: a data item is
 * the written bytes where the pool holds them (digest_write_held(): the
 * pool buffer stays unchanged and unused until the item is released) or
 * a copy (digest_write()), a zero item (a gap, a punched hole, the tail
 * up to the size at close) is a length.  One digest thread takes the
 * items in order and hashes them (the strategy's thread hook); blkhash
 * hashes a write's whole blocks on blkpass's helper threads too.
 * d->lock protects everything in struct digest except what only the
 * digest thread touches (sha256's EVP context; the blkpass, under
 * d->bp_lock, which digest_fingerprints() takes too); no lock is held
 * while hashing.  d->idle wakes digest_settle() when the thread has
 * nothing left.  Releasing an item takes the pool's lock: lock order
 * d->lock, then the pool's; d->bp_lock, then the blkpass reader's.
 *
 * THE BUDGETS: the digest never takes the pipeline's buffers.  Holds of
 * pool buffers are bounded by their own budget (digest_set_hold_limit():
 * the bytes of the pool's hold_buffers, which the pool keeps apart from
 * pool_size); a held write past it is copied into the queue and its pool
 * buffer given back at once (copied_bytes).  The queue's copies are
 * bounded by queue_limit, the digest's own memory: payload plus ITEM_COST
 * for each item, zero items included, held payload not (a million
 * one-byte writes at a stride are a million gap items).  A writer that
 * finds it full waits for the thread (d->space; copy_wait_ns counts it:
 * the only place the copy waits on the digest) — memory stays bounded
 * and a busy machine still gets its digest, at the hash's speed — but
 * for at most WAIT_MAX_S (CLOCK_MONOTONIC): past that (hashing a huge
 * hole, say) the digest is abandoned rather than the copy held up.  A
 * slow hasher thus slows the copy only once both budgets are spent, and
 * never the writes in flight.
 */
#include "digest/digest-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cleanup.h"
#include "common/iszero.h"
#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"

#define WAIT_MAX_S 10             /* a writer waits this long for room */

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

void digest_drop_data(const struct item *it)
{
    free(it->known);
    if (it->later)
        it->later->put(it->later);
    if (it->release)
        it->release(it->ref);
    else
        free((void *) it->data);
}

void digest_free_queue_locked(struct digest *d)
{
    while (d->head) {
        struct item *it = d->head;
        d->head = it->next;
        d->pool_held -= it->pool_bytes;
        digest_drop_data(it);
        free(it);
    }
    d->tail = NULL;
    d->queued = 0;
}

bool digest_active_locked(const struct digest *d)
{
    return d->state == DIGEST_IDLE || d->state == DIGEST_COMPUTING;
}

void digest_drop_held_locked(struct digest *d)
{
    while (d->held) {
        struct held *h = d->held;
        d->held = h->next;
        free(h);
    }
    d->held_bytes = 0;
}

/* End the pass: no value will be shown until the next truncate to 0. */
void digest_fail_locked(struct digest *d, enum digest_state state,
                        const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(d->reason, sizeof d->reason, fmt, ap);
    va_end(ap);
    d->state = state;
    d->gen++;                     /* the thread drops what it is hashing */
    digest_free_queue_locked(d);
    digest_drop_held_locked(d);
    log_info("inline digest: %s: %s", digest_state_name(state), d->reason);
}

void digest_push_locked(struct digest *d, struct item *it)
{
    it->seq = ++d->seq;
    QUEUE_APPEND(d->head, d->tail, it);
    pthread_cond_signal(&d->cond);
}

size_t digest_item_cost(const struct item *it)
{
    return ITEM_COST + (it->data && !it->pool_bytes ? it->len : 0);
}

static bool wait_for_room_locked(struct digest *d, size_t len);

/* Queue len zero bytes (len may be 0: it starts the thread's context). */
void digest_push_zero_locked(struct digest *d, uint64_t len)
{
    if (d->queued + ITEM_COST > d->limit &&
        !wait_for_room_locked(d, ITEM_COST))
        return;
    struct item *it = calloc(1, sizeof *it);
    if (!it) {
        digest_fail_locked(d, DIGEST_ABANDONED, "out of memory");
        return;
    }
    it->len = len;
    d->queued += digest_item_cost(it);
    digest_push_locked(d, it);
    d->pos += len;
}

/* NBDFERRY_DEBUG_DIGEST_GATE: a hasher that has not started yet, so a
 * test sees the writer wait for it whatever the machine's speed.  Opened
 * once, for good, by the first writer that finds the queue full. */
static void open_gate_locked(struct digest *d)
{
    if (d->gate) {
        d->gate = false;
        pthread_cond_signal(&d->cond);
    }
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
    open_gate_locked(d);
    while (no_room_locked(d, cost)) {
        /* A wakeup can race the deadline: only a queue still full at
         * the deadline abandons the digest. */
        if (pthread_cond_timedwait(&d->space, &d->lock, &deadline) ==
                ETIMEDOUT && no_room_locked(d, cost)) {
            d->wait_ns += mono_now_ns() - t0;
            digest_fail_locked(d, DIGEST_ABANDONED, "hashing fell behind "
                               "the writes for %d s (%zu bytes waiting)",
                               WAIT_MAX_S, d->queued);
            return false;
        }
    }
    d->wait_ns += mono_now_ns() - t0;
    if (d->state != DIGEST_COMPUTING || d->stopping)
        return false;
    if (d->gen != gen || (!d->ops->any_order && d->pos != pos)) {
        digest_fail_locked(d, d->ops->any_order ? DIGEST_CANNOT_COMPLETE
                                                : DIGEST_NOT_FORWARD,
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
/* The entries of known for whole blocks inside [off, off + len), copied
 * for an item: NULL if none (or out of memory: the pass hashes them). */
static struct digest_known *known_within(const struct digest_known *known,
                                         uint64_t off, size_t len)
{
    struct digest_known *k = NULL;
    uint64_t end = off + len;
    for (size_t i = 0; known && i < known->n; i++) {
        uint64_t s = known->block[i] * DIGEST_KNOWN_BS;
        if (s < off || s + DIGEST_KNOWN_BS > end)
            continue;
        if (!k && !(k = calloc(1, sizeof *k)))
            return NULL;
        digest_known_add(k, known->block[i], known->digest[i]);
    }
    return k;
}

void digest_push_data_locked(struct digest *d, uint64_t off, const void *buf,
                             size_t len, void (*release)(void *), void *ref,
                             const struct digest_known *known)
{
    if (!d->ops->any_order && is_zero(buf, len)) {
        /* sha256: zeros written are hashed from the shared zero page,
         * like a hole; no buffer is held or copied for them. */
        if (release)
            release(ref);
        digest_push_zero_locked(d, len);
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
            digest_fail_locked(d, DIGEST_ABANDONED, "out of memory");
            return;
        }
    }
    if (d->queued + cost > d->limit && !wait_for_room_locked(d, cost))
        goto drop;
    it = calloc(1, sizeof *it);
    if (!it) {
        digest_fail_locked(d, DIGEST_ABANDONED, "out of memory");
        goto drop;
    }
    it->data = copy ? copy : buf;
    it->release = release;
    it->ref = ref;
    it->pool_bytes = hold ? len : 0;
    if (d->takes_known && known && known->later) {
        it->later = known->later;
        it->later->get(it->later);
    } else {
        it->known = d->takes_known ? known_within(known, off, len) : NULL;
    }
    it->kind = d->ops->any_order ? ITEM_BLK_WRITE : ITEM_STREAM;
    it->off = off;
    it->len = len;
    d->pool_held += it->pool_bytes;
    d->queued += digest_item_cost(it);
    digest_push_locked(d, it);
    d->pos += len;
    return;
drop:
    free(copy);
    if (release)
        release(ref);
}

/* ---- the thread's side of the queue --------------------------------- */

/* NBDFERRY_DEBUG_DIGEST_DELAY_US: a hasher this much slower per data
 * item, so tests can show what a slow hasher costs the copy. */
void digest_slow_down(const struct digest *d, const struct item *it)
{
    if (d->delay_us && it->data) {
        struct timespec ts = { .tv_sec = d->delay_us / 1000000,
                               .tv_nsec = d->delay_us % 1000000 * 1000L };
        nanosleep(&ts, NULL);
    }
}

/* The thread is through with the item it took. */
void digest_done_item_locked(struct digest *d, const struct item *it)
{
    d->pool_held -= it->pool_bytes;
    d->busy = false;
    if (!d->head)
        pthread_cond_broadcast(&d->idle);
}

/* Take the next piece of work: a whole data item, or up to ZERO_SLICE of
 * a zero item.  Returns false when stopping. */
bool digest_take_locked(struct digest *d, struct item *out)
{
    while ((!d->head || d->gate) && !d->stopping)
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
    d->queued -= digest_item_cost(it);
    pthread_cond_broadcast(&d->space);
    free(it);
    return true;
}

/* ---- the entry points ---------------------------------------------- */

void digest_truncate(struct digest *d, uint64_t size, uint64_t old)
{
    if (!d)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    if (size == 0)
        d->via = NULL;            /* the raw file's own pass */
    d->ops->truncate(d, size, old);
}

void digest_replace(struct digest *d, uint64_t size)
{
    if (!d)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    d->ops->truncate(d, 0, 0);    /* a new pass, every byte zero ... */
    d->ops->truncate(d, size, 0); /* ... of a file this long */
}

void digest_barrier(struct digest *d)
{
    if (!d || !d->ops->barrier)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    d->ops->barrier(d);
}

void digest_write(struct digest *d, uint64_t off, const void *buf, size_t len,
                  const struct digest_known *known)
{
    if (!d || len == 0)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    d->ops->write(d, off, buf, len, known);
}

void digest_write_held(struct digest *d, uint64_t off, const void *buf,
                       size_t len, void (*release)(void *), void *ref,
                       const struct digest_known *known)
{
    if (!d || len == 0) {
        release(ref);
        return;
    }
    LOCK_FOR_SCOPE(&d->lock);
    d->ops->write_held(d, off, buf, len, release, ref, known);
}

void digest_zero(struct digest *d, uint64_t off, uint64_t len,
                 uint64_t apparent)
{
    if (!d || len == 0)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    d->ops->zero(d, off, len, apparent);
}

void digest_close(struct digest *d, uint64_t apparent)
{
    if (!d)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    d->ops->close(d, apparent);
}

void digest_foreign(struct digest *d, const char *what)
{
    if (!d)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    if (d->state != DIGEST_NOT_FORWARD)
        digest_fail_locked(d, DIGEST_NOT_FORWARD, "the disk was written "
                           "through %s", what);
    d->via = what;
}

void digest_get(struct digest *d, uint64_t apparent, struct digest_info *out)
{
    memset(out, 0, sizeof *out);
    out->algorithm = !d ? "none" : d->ops->any_order ? d->algorithm : "sha256";
    if (!d) {
        out->state = DIGEST_DISABLED;
        return;
    }
    d->ops->hint(d, out->check, sizeof out->check);
    LOCK_FOR_SCOPE(&d->lock);
    out->held = d->pool_held;
    out->hold_limit = d->hold_limit;
    out->copied = d->copied;
    out->copy_wait_ns = d->wait_ns;
    out->reused = d->reused;
    out->state = d->state;
    out->position = d->pos;
    out->queued = d->queued;
    snprintf(out->reason, sizeof out->reason, "%s", d->reason);
    d->ops->get(d, apparent, out);
}

int digest_settle(struct digest *d, unsigned timeout_s)
{
    int r = 0;

    if (!d)
        return 0;
    struct timespec deadline = mono_deadline_ns(timeout_s * NS_PER_S);
    LOCK_FOR_SCOPE(&d->lock);
    open_gate_locked(d);
    while ((d->head || d->busy) && !d->stopping && r == 0)
        if (pthread_cond_timedwait(&d->idle, &d->lock, &deadline) ==
            ETIMEDOUT)
            r = -ETIMEDOUT;
    return r;
}

int digest_fingerprints(struct digest *d, uint64_t size, unsigned *shift,
                        uint64_t **fp, size_t *n)
{
    if (!d || !d->ops->fingerprints)
        return -ENOTSUP;
    return d->ops->fingerprints(d, size, shift, fp, n);
}

/* ---- life ------------------------------------------------------------ */

/* The locks and d itself; the thread is gone or never ran. */
static void free_digest(struct digest *d)
{
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->bp_lock);
    pthread_cond_destroy(&d->cond);
    pthread_cond_destroy(&d->space);
    pthread_cond_destroy(&d->idle);
    free(d);
}

int digest_create_ops(size_t queue_limit, const struct digest_ops *ops,
                      struct blkpass *bp, struct digest **out)
{
    struct digest *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->limit = queue_limit;
    d->hold_limit = queue_limit;  /* digest_set_hold_limit() narrows it */
    const char *delay = getenv("NBDFERRY_DEBUG_DIGEST_DELAY_US");
    d->delay_us = delay ? (unsigned) strtoul(delay, NULL, 10) : 0;
    d->gate = getenv("NBDFERRY_DEBUG_DIGEST_GATE") != NULL;
    d->state = DIGEST_IDLE;
    d->ops = ops;
    d->bp = bp;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->bp_lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    mono_cond_init(&d->space);
    mono_cond_init(&d->idle);
    int r = pthread_create(&d->thread, NULL, ops->thread, d);
    if (r) {
        free_digest(d);           /* bp stays the caller's */
        return -r;
    }
    *out = d;
    return 0;
}

void digest_set_reader(struct digest *d,
                       int (*read)(void *ctx, uint64_t off, void *buf,
                                   size_t len),
                       void *ctx, uint64_t size)
{
    if (d && d->ops->set_reader)
        d->ops->set_reader(d, read, ctx, size);
}

void digest_set_filler(struct digest *d,
                       int (*fill)(void *ctx, uint64_t b,
                                   unsigned char *digest),
                       void *ctx)
{
    if (d && d->ops->set_filler)
        d->ops->set_filler(d, fill, ctx);
}

void digest_set_hold_limit(struct digest *d, size_t bytes)
{
    if (!d)
        return;
    LOCK_FOR_SCOPE(&d->lock);
    d->hold_limit = bytes;
}

void digest_destroy(struct digest *d)
{
    if (!d)
        return;
    {
        LOCK_FOR_SCOPE(&d->lock);
        d->stopping = true;
        pthread_cond_signal(&d->cond);
        pthread_cond_broadcast(&d->space);
        pthread_cond_broadcast(&d->idle);
    }
    pthread_join(d->thread, NULL);
    digest_free_queue_locked(d);
    digest_drop_held_locked(d);
    blkpass_free(d->bp);
    free_digest(d);
}
