/* digest/digest-sha256.c: the inline digest's sha256 strategy (digest-int.h):
 * one forward pass over the raw file, hashed in order as one stream.
 *
 * THREAD MODEL
 * The hooks run with d->lock held on the thread that reported the
 * change (digest/digest.c, THREAD MODEL: the FUSE receiving thread for
 * writes, a FUSE worker for the rest, a view's unpack threads);
 * they only check the pass and queue items.  sha_thread, the one digest
 * thread, hashes the queue in order with OpenSSL EVP; its EVP context is
 * its own, and it holds no lock while hashing.
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
 * THE PASS OVER A VIEW'S DISK (digest_replace)
 * An image written through the VHD or VMDK view that replaces the disk
 * (fixed, dynamic, streamOptimized, monolithicSparse) starts a pass as a
 * truncate to 0 then to its size would; the decoded data and zeroes
 * follow (fs/rawfile.c) and the view's close closes it.  blkhash takes
 * them in any order; sha256 only in disk order across the view's
 * requests (within one, the reorder hold below sorts them), and the
 * reason then names the view and --blkhash.  A differencing VHD is
 * applied over the old content: no pass.
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
#include "digest/digest-int.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/signals.h"

#define ZERO_BUF (1u << 20)

static const char zeros[ZERO_BUF];

/* ---- the digest thread ----------------------------------------------- */

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

/* Hash the queue until digest_take_locked() says stop.  Holds d->lock
 * except while hashing. */
static void sha_serve(struct digest *d, EVP_MD_CTX *ctx)
{
    uint64_t ctx_gen = UINT64_MAX;
    struct item it;

    LOCK_FOR_SCOPE(&d->lock);
    while (digest_take_locked(d, &it)) {
        uint64_t gen = d->gen;
        bool fresh = gen != ctx_gen;
        pthread_mutex_unlock(&d->lock);
        digest_slow_down(d, &it);

        bool ok = ctx && (!fresh ||
                          EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1) &&
                  hash_piece(ctx, &it);
        char hex[65] = "";
        /* Cheap (one block), so done whenever the queue may be empty. */
        if (ok)
            ok = snapshot_hex(ctx, hex);
        if (it.data)
            digest_drop_data(&it);
        ctx_gen = ok ? gen : UINT64_MAX;

        pthread_mutex_lock(&d->lock);
        digest_done_item_locked(d, &it);
        if (gen != d->gen)
            continue;             /* the pass restarted or ended meanwhile */
        if (!ok) {
            digest_fail_locked(d, DIGEST_ABANDONED, "OpenSSL sha256 failed");
            continue;
        }
        d->hashed += it.len;
        memcpy(d->hex, hex, sizeof hex);
        d->hex_len = d->hashed;
        d->hex_gen = gen;
    }
}

static void *sha_thread(void *arg)
{
    block_stop_signals();
    struct digest *d = arg;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();

    sha_serve(d, ctx);
    EVP_MD_CTX_free(ctx);
    return NULL;
}

/* ---- the pass -------------------------------------------------------- */

static void start_pass_locked(struct digest *d)
{
    digest_free_queue_locked(d);
    digest_drop_held_locked(d);
    d->gen++;
    d->state = DIGEST_COMPUTING;
    d->pos = d->hashed = 0;
    d->zero_beyond = true;
    d->closed = false;
    d->reason[0] = '\0';
    digest_push_zero_locked(d, 0);       /* so an empty pass has a digest too */
}

static void sha_truncate(struct digest *d, uint64_t size, uint64_t old)
{
    if (size == 0)
        start_pass_locked(d);
    else if (!digest_active_locked(d) || size == old)
        ;
    else if (size < d->pos)
        digest_fail_locked(d, DIGEST_NOT_FORWARD, "truncate to %" PRIu64
                           " cut bytes already hashed (position %" PRIu64 ")",
                           size, d->pos);
    else {
        if (size == d->pos)
            d->zero_beyond = true;
        d->closed = false;
    }
}

/* A change at off: may the pass go on to off?  Queues the gap. */
static bool advance_to_locked(struct digest *d, uint64_t off,
                              const char *what)
{
    if (!digest_active_locked(d))
        return false;
    if (off < d->pos) {
        digest_fail_locked(d, DIGEST_NOT_FORWARD, "%s at offset %" PRIu64
                           " is before the position %" PRIu64 "%s%s%s", what,
                           off, d->pos,
                           d->via ? " (the disk written through " : "",
                           d->via ? d->via : "",
                           d->via ? "; --blkhash takes any order)" : "");
        return false;
    }
    if (off > d->pos && !d->zero_beyond) {
        digest_fail_locked(d, DIGEST_NOT_FORWARD, "%s at offset %" PRIu64
                           " skips bytes from %" PRIu64 " that hold older "
                           "data (no truncate to 0 started this pass)", what,
                           off, d->pos);
        return false;
    }
    if (d->state == DIGEST_IDLE) {
        d->state = DIGEST_COMPUTING;
        digest_push_zero_locked(d, 0);
    }
    if (off > d->pos)
        digest_push_zero_locked(d, off - d->pos);
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
    digest_push_data_locked(d, h->off, h->data, h->len, free, h, NULL);
    return digest_active_locked(d);
}

/* Queue the held writes that now follow pos without a gap. */
static void drain_contiguous_locked(struct digest *d)
{
    while (d->held && d->held->off <= d->pos && digest_active_locked(d)) {
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
        digest_fail_locked(d, DIGEST_NOT_FORWARD, "write at offset %" PRIu64
                           " is more than %zu bytes ahead of the position %"
                           PRIu64 " (the disk written through %s; --blkhash "
                           "takes any order)", off, d->limit, d->pos, d->via);
        return;
    }
    if (!h) {
        digest_fail_locked(d, DIGEST_ABANDONED, "out of memory");
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
        if (!digest_active_locked(d) || !push_held_locked(d, h))
            break;
    }
    while (list) {
        struct held *h = list;
        list = h->next;
        free(h);
    }
}

/* ---- the hooks -------------------------------------------------------- */

static void sha_barrier(struct digest *d)
{
    if (d->held)
        flush_held_locked(d);
}

/* known: sha256 hashes the stream, not blocks; it has no use for them. */
static void sha_write(struct digest *d, uint64_t off, const void *buf,
                      size_t len, const struct digest_known *known)
{
    if (d->via && digest_active_locked(d) && off > d->pos) {
        hold_locked(d, off, buf, len);
    } else if (advance_to_locked(d, off, "write")) {
        digest_push_data_locked(d, off, buf, len, NULL, NULL, NULL);
        if (d->via)
            drain_contiguous_locked(d);
    }
}

/* A view's decoded bytes come held too (rawfile_place()): beyond pos they
 * go to the reorder hold (a copy), as sha_write()'s do. */
static void sha_write_held(struct digest *d, uint64_t off, const void *buf,
                           size_t len, void (*release)(void *), void *ref,
                           const struct digest_known *known)
{
    if (d->via && digest_active_locked(d) && off > d->pos) {
        hold_locked(d, off, buf, len);
        release(ref);
    } else if (advance_to_locked(d, off, "write")) {
        digest_push_data_locked(d, off, buf, len, release, ref, NULL);
        if (d->via)
            drain_contiguous_locked(d);
    } else {
        release(ref);
    }
}

static void sha_zero(struct digest *d, uint64_t off, uint64_t len,
                     uint64_t apparent)
{
    if (d->held)
        flush_held_locked(d);     /* a view's zeroes come in file order */
    if (d->zero_beyond) {
        /* Beyond pos is zero already: only zeroing below it matters. */
        if (digest_active_locked(d) && off < d->pos)
            advance_to_locked(d, off, "zeroing");
    } else if (off <= d->pos && advance_to_locked(d, off, "zeroing")) {
        uint64_t end = off + len < apparent ? off + len : apparent;
        if (end > d->pos)
            digest_push_zero_locked(d, end - d->pos);
    }
}

static void sha_close(struct digest *d, uint64_t apparent)
{
    if (d->held)
        flush_held_locked(d);
    if (d->state == DIGEST_COMPUTING) {
        if (d->zero_beyond && d->pos < apparent)
            digest_push_zero_locked(d, apparent - d->pos);
        d->closed = true;
    }
}

static void sha_get(struct digest *d, uint64_t apparent,
                    struct digest_info *out)
{
    out->covered = d->state == DIGEST_COMPUTING ? d->hashed : 0;
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
}

static void sha_hint(const struct digest *d, char *out, size_t n)
{
    snprintf(out, n, "sha256sum SOURCE, or nbdferry-verify "
             "--digest=sha256 SOURCE");
}

static const struct digest_ops digest_sha256_ops = {
    .thread = sha_thread,
    .truncate = sha_truncate,
    .write = sha_write,
    .write_held = sha_write_held,
    .zero = sha_zero,
    .close = sha_close,
    .barrier = sha_barrier,
    .get = sha_get,
    .hint = sha_hint,
};

int digest_create(size_t queue_limit, struct digest **out)
{
    return digest_create_ops(queue_limit, &digest_sha256_ops, NULL, out);
}
