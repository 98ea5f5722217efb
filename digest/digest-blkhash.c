/* digest/digest-blkhash.c: the inline digest's blkhash strategy
 * (digest-int.h): writes in any order, hashed block by block by a
 * blkpass (digest/blkpass.h).
 *
 * THREAD MODEL
 * The hooks run with d->lock held on the thread that reported the
 * change (digest/digest.c, THREAD MODEL: the FUSE receiving thread for
 * writes, a FUSE worker for the rest, a view's unpack threads);
 * they only queue items.  blk_thread, the one digest thread, applies
 * them in order to the blkpass under d->bp_lock, with d->lock released;
 * the blkpass hashes a write's whole blocks on its own helper threads
 * too.  digest_fingerprints() (the read-back's thread) takes d->bp_lock
 * to read the pass.  Lock order: d->bp_lock, then the blkpass reader's
 * (pool_read()).
 *
 * THE PASS (digest_create_blkhash)
 * The queue and the thread of digest/digest.c, but not sha256's forward-pass
 * rules (digest/digest-sha256.c, THE PASS): every change (write, zeroing,
 * truncate below the size, close) is queued with its offset, in the
 * order the FUSE threads report it, and the thread
 * feeds them to a blkpass (digest/blkpass.h), which hashes each block on its
 * own, so writes may come in any order (qemu-img convert -W, rsync
 * --inplace, a truncate then writes anywhere).  A close queues a request
 * for the value at that size; the status shows it once the thread has
 * answered that close and nothing changed since.  A truncate to 0 starts
 * a new pass.  A block the pass hashed and let go that is then
 * changed in part is read back from the disk (digest_set_reader():
 * pool_read(), which sees every change reported so far), so rewrites over
 * any earlier content are followed.  When the blkpass loses track anyway
 * (no reader, a read failed, a folded block changed) the state is
 * "cannot-complete"; when bytes of the file were never written or zeroed
 * by the pass, "incomplete".
 *
 * THE VIEW'S PASS (digest_replace)
 * A view's decoded data reach the digest in an order that depends on
 * timing: within one request of the view's file, what the decoder
 * places itself and what its worker threads decompress arrive as each
 * is done, so a block far behind another may come after it (qemu-img
 * convert -c stores clusters it could not compress beside compressed
 * ones; a sparse disk puts hundreds of MiB between them).  The blkpass
 * would fold that block first and lose the pass, on some runs and not
 * others.  So a view's pass folds only at its barriers
 * (digest_barrier(): the request's every change is queued), when no
 * change of the request is still on its way, never behind where the
 * data ended a few MiB of writing ago (blkpass.c, THE VOLUME LAG), and
 * only once its block digests take BLKPASS_SETTLE_STATE (8 MiB: a disk
 * of 16 GiB), so that an image whose clusters lie in no disk order (a
 * VM's own qcow2: in the order the guest wrote them) still completes
 * on a disk that size, whatever the order.
 * XXX Two FUSE threads writing the same bytes at once may report their
 * writes in the other order than the pool applied them; a writer that
 * does this does not know its own result either.
 */
#include "digest/digest-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/signals.h"

#define PART_BUDGET (16u << 20)   /* copies of blocks written in part,
                                   * beyond the queue's limit */

/* ---- the blkhash thread ---------------------------------------------- */

/* One change or close, on the thread, without the lock.  0, -ENODATA
 * (close: incomplete) or another -errno; why says what. */
static int blk_apply(struct digest *d, const struct item *it, char *hex,
                     struct nbdf_err *why)
{
    switch (it->kind) {
    case ITEM_BLK_WRITE:
        if (it->later)
            it->later->wait(it->later);  /* on the workers: short */
        return blkpass_write(d->bp, it->off, it->data, it->len,
                             it->later ? &it->later->known : it->known, why);
    case ITEM_BLK_ZERO:
        return blkpass_zero(d->bp, it->off, it->len, why);
    case ITEM_BLK_TRUNCATE: {
        int r = blkpass_truncate(d->bp, it->off, why);
        if (r == 0 && it->off == 0 && it->len)
            blkpass_fold_at_settle(d->bp, BLKPASS_SETTLE_STATE);
        return r;
    }
    case ITEM_BLK_SETTLE:
        return blkpass_settle(d->bp, why);
    case ITEM_BLK_CLOSE:
        return blkpass_finish(d->bp, it->off, hex, why);
    case ITEM_STREAM:
        break;
    }
    abort();
}

/* The outcome of one item, with d->lock held and the pass unchanged. */
static void blk_record_locked(struct digest *d, const struct item *it, int r,
                              const char *hex, const struct nbdf_err *why)
{
    d->hashed = blkpass_hashed(d->bp);
    d->reused = blkpass_reused(d->bp);
    if (it->kind == ITEM_BLK_CLOSE && (r == 0 || r == -ENODATA)) {
        d->res_seq = it->seq;
        d->res_state = r == 0 ? DIGEST_COMPLETE : DIGEST_INCOMPLETE;
        snprintf(d->hex, sizeof d->hex, "%s", r == 0 ? hex : "");
        /* Cut to fit; the precision tells the compiler so. */
        snprintf(d->res_reason, sizeof d->res_reason, "%.*s",
                 (int)sizeof d->res_reason - 1, r ? why->msg : "");
    } else if (r < 0) {
        digest_fail_locked(d, DIGEST_CANNOT_COMPLETE, "%s", why->msg);
    }
}

static void *blk_thread(void *arg)
{
    block_stop_signals();
    struct digest *d = arg;
    uint64_t pass_gen = UINT64_MAX;
    struct item it;

    LOCK_FOR_SCOPE(&d->lock);
    while (digest_take_locked(d, &it)) {
        uint64_t gen = d->gen;
        char hex[DIGEST_HEX_MAX] = "";
        struct nbdf_err why = { "" };
        pthread_mutex_unlock(&d->lock);
        digest_slow_down(d, &it);

        int r = 0;
        {
            LOCK_FOR_SCOPE(&d->bp_lock);
            if (gen != pass_gen && (r = blkpass_reset(d->bp)) < 0)
                nbdf_errf(&why, r, "cannot start: %s", strerror(-r));
            if (r == 0)
                r = blk_apply(d, &it, hex, &why);
        }
        if (it.data)
            digest_drop_data(&it);
        pass_gen = gen;

        pthread_mutex_lock(&d->lock);
        digest_done_item_locked(d, &it);
        if (gen == d->gen)        /* else the pass restarted or ended */
            blk_record_locked(d, &it, r, hex, &why);
    }
    return NULL;
}

/* ---- queueing -------------------------------------------------------- */

/* Queue a change other than a write; false if the pass is over. */
static bool blk_push_locked(struct digest *d, enum item_kind kind,
                            uint64_t off, uint64_t len)
{
    if (!digest_active_locked(d))
        return false;
    struct item *it = calloc(1, sizeof *it);
    if (!it) {
        digest_fail_locked(d, DIGEST_ABANDONED, "out of memory");
        return false;
    }
    *it = (struct item) { .kind = kind, .off = off, .len = len };
    d->state = DIGEST_COMPUTING;
    d->closed = false;
    d->queued += digest_item_cost(it);   /* digest_take_locked() takes it off */
    digest_push_locked(d, it);
    return true;
}

static void blk_start_pass_locked(struct digest *d)
{
    digest_free_queue_locked(d);
    d->gen++;
    d->state = DIGEST_COMPUTING;
    d->pos = d->hashed = d->reused = 0;
    d->reason[0] = '\0';
    blk_push_locked(d, ITEM_BLK_TRUNCATE, 0, d->via != NULL);
}

static void blk_truncate(struct digest *d, uint64_t size, uint64_t old)
{
    if (size == 0)
        blk_start_pass_locked(d);
    else if (size < old)
        blk_push_locked(d, ITEM_BLK_TRUNCATE, size, 0);
    else if (size != old)
        d->closed = false;        /* the bytes [old, size) are zero already */
}

static void blk_write_locked(struct digest *d, uint64_t off, const void *buf,
                             size_t len, void (*release)(void *), void *ref,
                             const struct digest_known *known)
{
    if (!digest_active_locked(d)) {
        if (release)
            release(ref);
        return;
    }
    d->state = DIGEST_COMPUTING;
    d->closed = false;
    digest_push_data_locked(d, off, buf, len, release, ref, known);
}

static void blk_close(struct digest *d, uint64_t apparent)
{
    if (d->state == DIGEST_COMPUTING &&
        blk_push_locked(d, ITEM_BLK_CLOSE, apparent, 0)) {
        d->closed = true;
        d->close_seq = d->seq;
    }
}

static void blk_get(struct digest *d, uint64_t apparent,
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

static void blk_write(struct digest *d, uint64_t off, const void *buf,
                      size_t len, const struct digest_known *known)
{
    blk_write_locked(d, off, buf, len, NULL, NULL, known);
}

static void blk_zero(struct digest *d, uint64_t off, uint64_t len,
                     uint64_t apparent)
{
    blk_push_locked(d, ITEM_BLK_ZERO, off, len);
}

/* The end of a view's request (THE VIEW'S PASS). */
static void blk_barrier(struct digest *d)
{
    if (!d->via || d->state != DIGEST_COMPUTING)
        return;
    bool closed = d->closed;
    if (blk_push_locked(d, ITEM_BLK_SETTLE, 0, 0))
        d->closed = closed;       /* nothing changed */
}

static void blk_hint(const struct digest *d, char *out, size_t n)
{
    /* blksum and nbdcopy --blkhash default to sha256 of 64 KiB blocks. */
    if (strcmp(d->algorithm, "blkhash/sha256/65536") == 0)
        snprintf(out, n, "nbdferry-verify SOURCE, blksum SOURCE, or "
                 "nbdcopy --blkhash SOURCE null:");
    else
        snprintf(out, n, "nbdferry-verify --digest=%s SOURCE", d->algorithm);
}

static int blk_fingerprints(struct digest *d, uint64_t size, unsigned *shift,
                            uint64_t **fp, size_t *n)
{
    LOCK_FOR_SCOPE(&d->bp_lock);
    unsigned min = blkpass_fp_min_shift(d->bp);
    uint64_t bs = d->blkhash_block;
    uint64_t nblocks = (size + bs - 1) / bs;
    if (*shift < min)
        *shift = min;
    *n = (size_t) ((nblocks + (1ull << *shift) - 1) >> *shift);
    *fp = calloc(*n ? *n : 1, sizeof **fp);
    int r = *fp ? blkpass_fingerprints(d->bp, size, *shift, *fp, *n)
                : -ENOMEM;
    return r;
}

static void blk_set_reader(struct digest *d,
                           int (*read)(void *ctx, uint64_t off, void *buf,
                                       size_t len),
                           void *ctx, uint64_t size)
{
    LOCK_FOR_SCOPE(&d->bp_lock);
    blkpass_set_reader(d->bp, read, ctx, size);
}

static void blk_set_filler(struct digest *d,
                           int (*fill)(void *ctx, uint64_t b,
                                       unsigned char *digest),
                           void *ctx)
{
    /* The manifest's digests are SHA-256 of 64 KiB blocks. */
    if (strcmp(d->algorithm, "blkhash/sha256/65536") != 0)
        return;
    LOCK_FOR_SCOPE(&d->bp_lock);
    blkpass_set_filler(d->bp, fill, ctx);
}

static const struct digest_ops digest_blkhash_ops = {
    .any_order = true,
    .thread = blk_thread,
    .truncate = blk_truncate,
    .write = blk_write,
    .write_held = blk_write_locked,
    .zero = blk_zero,
    .close = blk_close,
    .barrier = blk_barrier,
    .get = blk_get,
    .hint = blk_hint,
    .fingerprints = blk_fingerprints,
    .set_reader = blk_set_reader,
    .set_filler = blk_set_filler,
};

int digest_create_blkhash(size_t queue_limit, const char *md,
                          uint64_t block_size, struct digest **out)
{
    struct blkpass *bp;
    int r = blkpass_create(md, block_size, PART_BUDGET, &bp);

    if (r < 0)
        return r;
    if ((r = digest_create_ops(queue_limit, &digest_blkhash_ops, bp,
                               out)) < 0) {
        blkpass_free(bp);
        return r;
    }
    snprintf((*out)->algorithm, sizeof (*out)->algorithm,
             "blkhash/%s/%" PRIu64, md, block_size);
    (*out)->blkhash_block = block_size;
    /* The writers' digests (known.h) are SHA-256 of 64 KiB blocks. */
    (*out)->takes_known = strcmp(md, "sha256") == 0 &&
                          block_size == DIGEST_KNOWN_BS;
    return 0;
}
