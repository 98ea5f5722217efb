/* tools/verify/sink.c: digest, block fingerprints and tail check of one
 * side.  Used by exactly one thread (the side's worker). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tools/verify/verify.h"

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
    k->nblocks = (digest_len + block_size - 1) / block_size;
    k->tail_nonzero = -1;
    k->abort = abort;
    k->blocks = calloc(k->nblocks ? k->nblocks : 1, sizeof *k->blocks);
    k->md = EVP_MD_CTX_new();
    if (!k->blocks || !k->md) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    if (EVP_DigestInit_ex(k->md, md, NULL) != 1) {
        verify_err("EVP_DigestInit_ex failed");
        return -EIO;
    }
    return 0;
}

void sink_free(struct sink *k)
{
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

static int hash_data(struct sink *k, const unsigned char *p, size_t n)
{
    fingerprint_data(k, k->pos, p, n);
    return digest_update(k, p, n);
}

static int hash_zero(struct sink *k, uint64_t n)
{
    while (n > 0) {
        size_t piece = n < sizeof zero_buf ? n : sizeof zero_buf;
        int r = digest_update(k, zero_buf, piece);
        if (r < 0)
            return r;
        n -= piece;
    }
    return 0;
}

/* Past digest_len every byte must be zero; remember the first that isn't. */
static int check_tail(struct sink *k, const unsigned char *p, size_t n)
{
    size_t done = 0;

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
    if (k->pos != k->end && k->tail_nonzero < 0) {
        verify_err("internal error: side ended at %llu of %llu bytes",
                   (unsigned long long) k->pos, (unsigned long long) k->end);
        return -EIO;
    }
    if (EVP_DigestFinal_ex(k->md, k->digest, &k->digest_size) != 1) {
        verify_err("EVP_DigestFinal_ex failed");
        return -EIO;
    }
    return 0;
}
