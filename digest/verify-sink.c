/* digest/verify-sink.c: digest, block fingerprints and tail check of one side
 * (verify-sink.h).  Used by exactly one thread (nbdferry-verify's side worker,
 * or the thread verifying a mount's read-back); in blkhash mode that
 * thread hands data blocks to the hasher's threads (verify-hasher.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "digest/verify-sink.h"

/* Read-only once the program starts: fed to EVP for known-zero ranges. */
static unsigned char zero_buf[1 << 20];

int sink_init(struct sink *k, const EVP_MD *md, uint64_t digest_len,
              uint64_t end, uint64_t block_size, atomic_bool *abort)
{
    memset(k, 0, sizeof *k);
    fp_init();
    k->digest_len = digest_len;
    k->end = end;
    k->block_size = block_size;
    k->nblocks = block_size ? (digest_len + block_size - 1) / block_size : 0;
    k->tail_nonzero = -1;
    k->abort = abort;
    k->blocks = block_size ? calloc(k->nblocks ? k->nblocks : 1,
                                    sizeof *k->blocks) : NULL;
    k->md = EVP_MD_CTX_new();
    if ((block_size && !k->blocks) || !k->md) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    if (EVP_DigestInit_ex(k->md, md, NULL) != 1) {
        verify_err("EVP_DigestInit_ex failed");
        return -EIO;
    }
    return 0;
}

/* Jobs of at least this many bytes (whole blocks): fewer queue trips. */
#define SINK_JOB_BYTES (1u << 20)

static unsigned job_bytes(const struct sink *k)
{
    uint64_t bs = blkhash_block_size(k->bh);
    return bs >= SINK_JOB_BYTES ? bs : SINK_JOB_BYTES / bs * bs;
}

void sink_fold(struct sink *k)
{
    k->fold = true;
}

int sink_blkhash(struct sink *k, const char *digest, uint64_t block_size,
                 unsigned workers)
{
    int r = blkhash_create(digest, block_size, &k->bh);

    if (r < 0) {
        verify_err("blkhash %s/%llu: %s", digest,
                   (unsigned long long) block_size, strerror(-r));
        return r;
    }
    if (!(k->part = malloc(block_size))) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    /* Two jobs per worker keep every worker busy while the producer reads. */
    return hasher_create(k->bh, workers, job_bytes(k),
                         2 * (size_t) workers * job_bytes(k), &k->hq);
}

void sink_free(struct sink *k)
{
    hasher_free(k->hq);
    blkhash_free(k->bh);
    free(k->part);
    k->hq = NULL;
    k->bh = NULL;
    k->part = NULL;
    EVP_MD_CTX_free(k->md);
    free(k->blocks);
    k->md = NULL;
    k->blocks = NULL;
}

bool sink_aborted(const struct sink *k)
{
    return atomic_load_explicit(k->abort, memory_order_relaxed);
}

static int digest_update(struct sink *k, const void *p, size_t n)
{
    if (EVP_DigestUpdate(k->md, p, n) != 1) {
        verify_err("EVP_DigestUpdate failed");
        return -EIO;
    }
    return 0;
}

/* Split at block boundaries: each piece updates one fingerprint. */
static void fingerprint_data(struct sink *k, uint64_t off,
                             const unsigned char *p, size_t n)
{
    while (n > 0) {
        uint64_t b = off / k->block_size;
        uint64_t in_block = off % k->block_size;
        size_t piece = k->block_size - in_block < n ? k->block_size - in_block : n;

        k->blocks[b] = fp_update(k->blocks[b], in_block, p, piece);
        off += piece;
        p += piece;
        n -= piece;
    }
}

/* ---- blkhash mode ---- */

/* The partial block is complete (or ends the stream): hash it unless it
 * is all zero, which is what blkhash assumes of blocks it never saw. */
static int bh_flush_part(struct sink *k)
{
    int r = 0;

    if (!is_zero(k->part, k->part_len))
        r = hasher_submit(k->hq, k->part_off, k->part, k->part_len);
    k->part_len = 0;
    return r;
}

/* Tops up the partial block with n bytes at p (zeros if p is NULL);
 * returns the bytes taken, or -errno. */
static int64_t bh_fill_part(struct sink *k, const unsigned char *p, uint64_t n)
{
    uint64_t bs = blkhash_block_size(k->bh);
    size_t take = bs - k->part_len < n ? bs - k->part_len : n;
    int r = 0;

    if (p)
        memcpy(k->part + k->part_len, p, take);
    else
        memset(k->part + k->part_len, 0, take);
    k->part_len += take;
    if (k->part_len == bs)
        r = bh_flush_part(k);
    return r < 0 ? r : (int64_t) take;
}

/* Whole blocks at off: runs of non-zero blocks go to the hasher, zero
 * blocks are skipped.  Returns the bytes consumed (whole blocks). */
static int64_t bh_whole_blocks(struct sink *k, uint64_t off,
                               const unsigned char *p, size_t n)
{
    uint64_t bs = blkhash_block_size(k->bh);
    size_t done = 0, max = job_bytes(k);

    while (n - done >= bs) {
        size_t run = 0;
        while (run < max && n - done - run >= bs && !is_zero(p + done + run, bs))
            run += bs;
        if (run == 0) {
            done += bs;                  /* an all-zero block */
            continue;
        }
        int r = hasher_submit(k->hq, off + done, p + done, run);
        if (r < 0)
            return r;
        done += run;
    }
    return (int64_t) done;
}

/* sink_fold(): every SINK_FOLD_BYTES, the blocks before the one being
 * gathered are final; once the hasher has them, they are folded into
 * the outer digest (blkhash_fold) and their per-block state freed. */
static int bh_maybe_fold(struct sink *k, uint64_t pos)
{
    uint64_t bs = blkhash_block_size(k->bh);
    uint64_t upto = (k->part_len ? k->part_off : pos) / bs;
    int r;

    if (!k->fold || (upto - blkhash_folded(k->bh)) * bs < SINK_FOLD_BYTES)
        return 0;
    if ((r = hasher_drain(k->hq)) < 0)
        return r;
    if ((r = blkhash_fold(k->bh, upto)) < 0)
        verify_err("blkhash: folding %llu blocks: %s",
                   (unsigned long long) upto, strerror(-r));
    return r;
}

/* Data [off, off + n), or known zeros if p is NULL. */
static int bh_feed(struct sink *k, uint64_t off, const unsigned char *p,
                   uint64_t n)
{
    uint64_t bs = blkhash_block_size(k->bh);
    int64_t t;

    if (k->part_len) {
        if ((t = bh_fill_part(k, p, n)) < 0)
            return (int) t;
        off += t;
        n -= t;
        p = p ? p + t : NULL;
    }
    if (p)
        t = bh_whole_blocks(k, off, p, n);
    else
        t = (int64_t) (n / bs * bs);     /* zero blocks: nothing to do */
    if (t < 0)
        return (int) t;
    off += t;
    n -= t;
    if (n > 0) {
        k->part_off = off;
        t = bh_fill_part(k, p ? p + t : NULL, n);
        if (t < 0)
            return (int) t;
    }
    return bh_maybe_fold(k, off + n);
}

int64_t sink_defer(struct sink *k, uint64_t len, hasher_read_fn *read,
                   void *ctx, uint64_t *lead)
{
    uint64_t bs, n;
    int r;

    *lead = len;
    if (!k->bh || k->blocks || len > k->digest_len - k->pos ||
        k->pos > k->digest_len)
        return 0;                        /* bytes needed here, or never */
    bs = blkhash_block_size(k->bh);
    if (k->part_len) {
        *lead = bs - k->part_len < len ? bs - k->part_len : len;
        return 0;
    }
    n = len < job_bytes(k) ? len / bs * bs : job_bytes(k);
    if (n == 0)
        return 0;                        /* the short last block */
    if ((r = hasher_submit_read(k->hq, k->pos, n, read, ctx)) < 0)
        return r;
    k->pos += n;
    k->bytes_read += n;
    return (int64_t) n;
}

static int bh_finish(struct sink *k, uint64_t length)
{
    int r = k->part_len ? bh_flush_part(k) : 0;

    if (r == 0)
        r = hasher_drain(k->hq);
    if (r == 0 && blkhash_finish(k->bh, length, k->digest, &k->digest_size) < 0) {
        verify_err("internal error: blkhash_finish failed");
        r = -EIO;
    }
    return r;
}

/* ---- both modes ---- */

static int hash_data(struct sink *k, const unsigned char *p, size_t n)
{
    if (k->blocks)
        fingerprint_data(k, k->pos, p, n);
    if (k->bh)
        return bh_feed(k, k->pos, p, n);
    return digest_update(k, p, n);
}

static int hash_zero(struct sink *k, uint64_t n)
{
    if (k->bh)
        return bh_feed(k, k->pos, NULL, n);
    while (n > 0) {
        size_t piece = n < sizeof zero_buf ? n : sizeof zero_buf;
        int r = digest_update(k, zero_buf, piece);
        if (r < 0)
            return r;
        n -= piece;
    }
    return 0;
}

/* Past digest_len every byte must be zero; remember the first that isn't
 * (a caller that reads on after SINK_STOP keeps the first). */
static int check_tail(struct sink *k, const unsigned char *p, size_t n)
{
    size_t done = 0;

    if (k->tail_nonzero >= 0)
        return SINK_STOP;
    while (done < n) {
        size_t piece = n - done < sizeof zero_buf ? n - done : sizeof zero_buf;
        if (memcmp(p + done, zero_buf, piece) != 0) {
            size_t i = done;
            while (p[i] == 0)
                i++;
            k->tail_nonzero = (int64_t) (k->pos + i);
            return SINK_STOP;
        }
        done += piece;
    }
    return 0;
}

int sink_data(struct sink *k, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    int r = 0;

    if (len > k->end - k->pos)
        return -EINVAL;
    k->bytes_read += len;
    if (k->pos < k->digest_len) {
        size_t n = k->digest_len - k->pos < len ? k->digest_len - k->pos : len;
        if ((r = hash_data(k, p, n)) < 0)
            return r;
        k->pos += n;
        p += n;
        len -= n;
    }
    if (len > 0)
        r = check_tail(k, p, len);
    k->pos += len;
    return r;
}

int sink_zero(struct sink *k, uint64_t len)
{
    int r = 0;

    if (len > k->end - k->pos)
        return -EINVAL;
    k->bytes_zero += len;
    if (k->pos < k->digest_len) {
        uint64_t n = k->digest_len - k->pos < len ? k->digest_len - k->pos : len;
        r = hash_zero(k, n);
    }
    k->pos += len;
    return r;
}

int sink_finish(struct sink *k)
{
    if (k->open_ended)
        k->digest_len = k->end = k->pos;
    if (k->pos != k->end && k->tail_nonzero < 0) {
        verify_err("internal error: side ended at %llu of %llu bytes",
                   (unsigned long long) k->pos, (unsigned long long) k->end);
        return -EIO;
    }
    if (k->bh)
        return bh_finish(k, k->digest_len);
    if (EVP_DigestFinal_ex(k->md, k->digest, &k->digest_size) != 1) {
        verify_err("EVP_DigestFinal_ex failed");
        return -EIO;
    }
    return 0;
}
