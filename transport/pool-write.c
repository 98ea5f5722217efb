/* transport/pool-write.c: buffers, and writes copied into them
 * (pool_write), split into payload and write-zeroes runs.
 *
 * THREAD MODEL
 * pool_write() runs on the FUSE receiver thread (a durable write on a
 * worker) under pool->lock; it waits for a free buffer on pool->cond
 * and drops the lock to heal a lost connection.  The buffer helpers here
 * serve pool-fill.c too, under the same lock.
 */
#include "transport/pool-internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/bigbuf.h"
#include "common/iszero.h"
#include "common/monotime.h"
#include "common/rounding.h"

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
unsigned pool_spare_locked(const struct pool *p)
{
    unsigned own = p->nheld < p->cfg.hold_buffers ? p->nheld
                                                  : p->cfg.hold_buffers;
    unsigned in_use = p->nallocated - p->nfree - own;
    unsigned room = in_use < p->nbufs ? p->nbufs - in_use : 0;
    unsigned have = p->nfree + (p->nbufs + p->cfg.hold_buffers -
                                p->nallocated);

    return room < have ? room : have;
}

char *pool_get_buffer_locked(struct pool *p)
{
    if (pool_spare_locked(p) == 0)
        return NULL;
    if (p->nfree > 0)
        return p->free_bufs[--p->nfree];
    if (p->nallocated < p->nbufs + p->cfg.hold_buffers) {
        char *b = bigbuf_alloc(p->cfg.request_size);  /* huge pages */
        if (!b)
            return NULL;
        p->nallocated++;
        return b;
    }
    return NULL;
}

struct pool_req *pool_new_write_req_locked(struct pool *p, char *data)
{
    struct pool_req *r = calloc(1, sizeof *r);

    if (!r) {
        p->free_bufs[p->nfree++] = data;
        return NULL;
    }
    r->kind = REQ_WRITE;
    r->state = REQ_NEW;
    r->p = p;
    r->data = data;
    return r;
}

void pool_open_filling_locked(struct pool *p, struct pool_req *r,
                              uint64_t off)
{
    assert(r->kind == REQ_WRITE && r->state == REQ_NEW);
    r->off = off;
    r->gen0 = p->next_seq;
    r->state = REQ_FILLING;
    pool_list_append(&p->filling, r);
    pthread_cond_signal(&p->idle_cond);
}

void pool_wait_buffer_locked(struct pool *p, const char *what)
{
    if (p->filling.head)
        pool_seal_locked(p, p->filling.head);
    pool_dispatch_locked(p);
    if (p->retained.head) {
        /* Buffers wait for a flush: the flusher sends one.  If the last
         * flush failed, another may fail as well: the oldest is let go
         * instead (a reconnect before a good flush makes it damage),
         * rather than stop the copy on a flush that may never work. */
        if (p->flush_failed && !p->flush_in_flight) {
            pool_evict_locked(p, p->retained.head);
            return;
        }
        p->flush_wanted = true;
        pthread_cond_signal(&p->flusher_cond);
    }
    uint64_t t0 = mono_now_ns();
    pool_cond_wait_locked(p, what);
    p->st.wait_ns += mono_now_ns() - t0;
}

/* A new FILLING buffer at off, or NULL after waiting (the caller looks
 * again: the world changed while we slept). */
struct pool_req *pool_new_filling_locked(struct pool *p, uint64_t off,
                                         int *err)
{
    if (p->filling.n >= MAX_FILLING)
        pool_seal_locked(p, p->filling.head); /* the least recently opened */
    char *data = pool_get_buffer_locked(p);
    if (!data) {
        /* Nothing queued, filling or held: no buffer will come back (a
         * failed allocation with the pool empty), so waiting would be
         * forever. */
        if (p->queue.n == 0 && p->filling.n == 0 && p->nheld == 0 &&
            p->retained.n == 0) {
            *err = -ENOMEM;
            return NULL;
        }
        pool_wait_buffer_locked(p, "buffer");
        return NULL;
    }
    struct pool_req *r = pool_new_write_req_locked(p, data);
    if (!r) {
        *err = -ENOMEM;
        return NULL;
    }
    pool_open_filling_locked(p, r, off);
    return r;
}

/* Give back a FILLING buffer that holds nothing. */
void pool_discard_filling_locked(struct pool *p, struct pool_req *b)
{
    assert(b->state == REQ_FILLING && b->len == 0 && !b->busy);
    pool_list_remove(&p->filling, b);
    pool_free_req_locked(p, b);
    pthread_cond_broadcast(&p->cond);
}

bool pool_filling_overlaps_other(const struct pool *p,
                                 const struct pool_req *b)
{
    for (const struct pool_req *r = p->filling.head; r; r = r->next)
        if (r != b && pool_overlaps(r->off, r->len, b->off, b->len))
            return true;
    return false;
}

/* Copy as much of the write as fits into one buffer.  Returns bytes
 * taken (0: waited, try again) or -errno. */
static ssize_t absorb_locked(struct pool *p, uint64_t off, const char *data,
                             size_t len)
{
    int err = 0;
    if (pool_pending_room_locked(p, &err))
        return err;                       /* 0: decide again */

    struct pool_req *b = p->cfg.write_through ? NULL : find_filling(p, off);
    if (!b) {
        pool_seal_overlapping_locked(p, off, len, NULL);
        b = pool_new_filling_locked(p, off, &err);
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
            pool_discard_filling_locked(p, b);
        return err;
    }
    assert(b->state == REQ_FILLING);      /* never a buffer on the wire */
    memcpy(b->data + (off - b->off), data, n);
    if (off + n > b->off + b->len)
        b->len = off + n - b->off;
    pool_seal_overlapping_locked(p, off, n, b);
    assert(!pool_filling_overlaps_other(p, b));            /* invariant 1 */
    extmap_remove(&p->known_zero, off, off + n);  /* lossy: cannot fail */
    b->touched_ns = mono_now_ns();
    if (b->len == p->cfg.request_size || p->cfg.write_through)
        pool_seal_locked(p, b);
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
    bool later = false;
    while (done < len) {
        /* Only the first piece heals: see pool_fill_begin(). */
        if (later ? p->lost : pool_heal_locked(p) < 0)
            return -EIO;
        later = true;
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
        pool_discard_filling_locked(p, b);
    p->st.bytes_written += hi - cur;
    int r = pool_zero_locked(p, lo, ZERO_CHUNK, true);
    return r < 0 ? r : (ssize_t) (hi - cur);
}

/* Split the write into payload and aligned all-zero runs of at least
 * ZERO_CHUNK: the runs become write-zeroes requests, or nothing where the
 * disk is known to read as zero already. */
ssize_t pool_write_split_locked(struct pool *p, uint64_t off,
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
            r = pool_zero_locked(p, off + payload_end, zlen, true);
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

    LOCK_FOR_SCOPE(&p->lock);
    if (p->cfg.write_through)
        r = absorb_all_locked(p, off, buf, len);
    else
        r = pool_write_split_locked(p, off, buf, len);
    pool_dispatch_locked(p);
    if (p->cfg.write_through)
        pool_wait_seq_locked(p, p->next_seq);
    return r < 0 ? r : (ssize_t) len;
}
