/* digest/blkhash.c: blkhash over OpenSSL EVP (see blkhash.h).
 *
 * Block digests live in chunks of BLKHASH_CHUNK consecutive blocks,
 * allocated when a block in them first gets data; every slot of a chunk
 * holds a digest (the zero block's until the block gets data), so
 * blkhash_finish() feeds a chunk to the outer digest in one call, and an
 * absent chunk as a run of the zero block's digest.  A slot differs from
 * the zero digest exactly when its block holds data.
 *
 * Folding (blkhash_fold): the caller may declare a prefix of blocks
 * final; their digests go into the outer digest at once (h->outer) and
 * their chunks are freed, so a long in-order stream keeps only the
 * blocks not yet folded.  What is left of the folded blocks is one
 * fingerprint per region (blkhash_fingerprints), at most FOLD_REGIONS of
 * them: regions double in size when more would be needed.
 *
 * THREAD MODEL: see blkhash.h.  h->lock protects chunks, nchunks, the
 * short-block fields and the fold state; everything else is written once
 * in blkhash_create().
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest/blkhash.h"
#include "common/cleanup.h"
#include "common/iszero.h"
#include "digest/sha256x.h"
#include "common/vector.h"

#define BLKHASH_CHUNK 1024u              /* blocks per chunk */
#define HASH_GROUP 16u                   /* blocks hashed in one call: the
                                          * AVX-512 path takes 16 */
#define FOLD_REGIONS (1u << 18)          /* fingerprints of folded blocks:
                                          * 2 MiB at most */

DEFINE_VECTOR_TYPE(chunk_vector, unsigned char *, 16);
DEFINE_VECTOR_TYPE(fp_vector, uint64_t, 64);

struct blkhash {
    EVP_MD *md;                          /* owned (EVP_MD_fetch) */
    uint64_t block_size;
    unsigned dsize;                      /* bytes per block digest */
    bool lanes;                          /* sha256 on digest/sha256x.c */
    unsigned char zero_digest[EVP_MAX_MD_SIZE];  /* D(block_size zeros) */
    unsigned char *zero_run;             /* BLKHASH_CHUNK zero digests */
    pthread_mutex_t lock;
    struct chunk_vector chunks;          /* len == cap; NULL: all zero */
    uint64_t short_block;                /* index of the short last block */
    size_t short_len;                    /* its length; 0: none stored */
    EVP_MD_CTX *outer;                   /* digests of blocks [0, folded) */
    uint64_t folded;
    struct fp_vector fold_fp;            /* fingerprints of folded blocks,
                                          * regions of 2^fold_shift blocks */
    unsigned fold_shift;
};

static const unsigned char zeros[64 << 10];

/* ---- parsing ---- */

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

static int parse_block_size(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    unsigned shift = 0;

    if (*s < '0' || *s > '9')
        return -EINVAL;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (v > BLKHASH_MAX_BLOCK)
            return -EINVAL;              /* too large; stops any overflow */
        v = v * 10 + (uint64_t) (*s - '0');
    }
    switch (*s) {
    case 'k': case 'K': shift = 10; s++; break;
    case 'm': case 'M': shift = 20; s++; break;
    case 'g': case 'G': shift = 30; s++; break;
    }
    if (*s || v > BLKHASH_MAX_BLOCK || (v << shift) > BLKHASH_MAX_BLOCK ||
        v == 0)
        return -EINVAL;
    *out = v << shift;
    return 0;
}

int blkhash_parse_spec(const char *spec, char *name, uint64_t *block_size,
                       struct nbdf_err *why)
{
    size_t n = strcspn(spec, "/");

    *block_size = BLKHASH_DEFAULT_BLOCK;
    if (n == 0 && spec[0] == '\0') {
        snprintf(name, BLKHASH_NAME_MAX, "%s", BLKHASH_DEFAULT_DIGEST);
        return 0;
    }
    if (n == 0 || n >= BLKHASH_NAME_MAX)
        return nbdf_errf(why, -EINVAL, "a digest name of 1 to %d characters "
                         "is needed", BLKHASH_NAME_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if (!name_char(spec[i]))
            return nbdf_errf(why, -EINVAL, "bad character in digest name");
    memcpy(name, spec, n);
    name[n] = '\0';
    if (spec[n] == '/' && parse_block_size(spec + n + 1, block_size) < 0)
        return nbdf_errf(why, -EINVAL, "bad block size '%.32s' (1 to %u "
                         "bytes, suffix k, M or G)", spec + n + 1,
                         BLKHASH_MAX_BLOCK);
    return 0;
}

/* ---- hashing ---- */

static int digest_zeros(const EVP_MD *md, uint64_t len, unsigned char *out)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int ok = c && EVP_DigestInit_ex(c, md, NULL) == 1;

    while (ok && len > 0) {
        size_t n = len < sizeof zeros ? len : sizeof zeros;
        ok = EVP_DigestUpdate(c, zeros, n) == 1;
        len -= n;
    }
    ok = ok && EVP_DigestFinal_ex(c, out, NULL) == 1;
    EVP_MD_CTX_free(c);
    return ok ? 0 : -EIO;
}

int blkhash_create(const char *digest, uint64_t block_size,
                   struct blkhash **out)
{
    struct blkhash *h;

    *out = NULL;
    if (block_size == 0 || block_size > BLKHASH_MAX_BLOCK)
        return -EINVAL;
    if (!(h = calloc(1, sizeof *h)))
        return -ENOMEM;
    h->block_size = block_size;
    h->md = EVP_MD_fetch(NULL, digest, NULL);
    if (!h->md || (EVP_MD_get_flags(h->md) & EVP_MD_FLAG_XOF) ||
        EVP_MD_get_size(h->md) <= 0) {
        blkhash_free(h);
        return -EINVAL;
    }
    h->dsize = (unsigned) EVP_MD_get_size(h->md);
    h->lanes = EVP_MD_is_a(h->md, "SHA2-256") && sha256x_available();
    pthread_mutex_init(&h->lock, NULL);
    if (digest_zeros(h->md, block_size, h->zero_digest) < 0) {
        blkhash_free(h);
        return -EIO;
    }
    if (!(h->zero_run = malloc((size_t) BLKHASH_CHUNK * h->dsize))) {
        blkhash_free(h);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < BLKHASH_CHUNK; i++)
        memcpy(h->zero_run + (size_t) i * h->dsize, h->zero_digest, h->dsize);
    *out = h;
    return 0;
}

void blkhash_free(struct blkhash *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->chunks.len; i++)
        free(h->chunks.ptr[i]);
    chunk_vector_reset(&h->chunks);
    free(h->zero_run);
    EVP_MD_CTX_free(h->outer);
    fp_vector_reset(&h->fold_fp);
    if (h->md) {
        EVP_MD_free(h->md);
        pthread_mutex_destroy(&h->lock);
    }
    free(h);
}

uint64_t blkhash_block_size(const struct blkhash *h)
{
    return h->block_size;
}

unsigned blkhash_digest_size(const struct blkhash *h)
{
    return h->dsize;
}

/* The chunk holding block b, allocated (all zero digests) if 'alloc';
 * NULL if absent and !alloc, or out of memory. */
static unsigned char *chunk_locked(struct blkhash *h, uint64_t b, bool alloc)
{
    uint64_t ci = b / BLKHASH_CHUNK;

    if (ci >= h->chunks.len) {
        struct chunk_vector *v = &h->chunks;
        if (!alloc || chunk_vector_reserve(v, ci + 1 - v->len) < 0)
            return NULL;
        memset(v->ptr + v->len, 0, (v->cap - v->len) * sizeof *v->ptr);
        v->len = v->cap;
    }
    if (!h->chunks.ptr[ci] && alloc) {
        h->chunks.ptr[ci] = malloc((size_t) BLKHASH_CHUNK * h->dsize);
        if (h->chunks.ptr[ci])
            memcpy(h->chunks.ptr[ci], h->zero_run,
                   (size_t) BLKHASH_CHUNK * h->dsize);
    }
    return h->chunks.ptr[ci];
}

/* Stores block b's digest; len < block_size marks it the short last block.
 * 'zero': the block is all zero (digest is ignored, nothing allocated). */
static int store(struct blkhash *h, uint64_t b, const unsigned char *digest,
                 size_t len, bool zero)
{
    int r = 0;

    LOCK_FOR_SCOPE(&h->lock);
    if (b < h->folded)
        return -ESTALE;                  /* folded in: final */
    unsigned char *c = chunk_locked(h, b, !zero);
    if (c)
        memcpy(c + (b % BLKHASH_CHUNK) * h->dsize,
               zero ? h->zero_digest : digest, h->dsize);
    else if (!zero)
        r = -ENOMEM;
    if (r == 0 && h->short_len && h->short_block == b)
        h->short_len = 0;
    if (r == 0 && !zero && len < h->block_size) {
        h->short_block = b;
        h->short_len = len;
    }
    return r;
}

/* Digests of n blocks of len bytes each, block blk[i] at mem[i], all
 * holding data, stored.  Several at once on the SHA lanes (sha256x.h),
 * else one by one through OpenSSL. */
static int hash_store(struct blkhash *h, const uint64_t *blk,
                      const unsigned char *const *mem, size_t n, size_t len)
{
    unsigned char d[HASH_GROUP][EVP_MAX_MD_SIZE > SHA256X_DIGEST
                                ? EVP_MAX_MD_SIZE : SHA256X_DIGEST];
    int r = 0;

    assert(n <= HASH_GROUP);
    if (h->lanes) {
        unsigned char lane[HASH_GROUP][SHA256X_DIGEST];
        sha256x_many(mem, n, len, lane);
        for (size_t i = 0; i < n; i++)
            memcpy(d[i], lane[i], SHA256X_DIGEST);
    } else {
        for (size_t i = 0; i < n; i++)
            if (EVP_Digest(mem[i], len, d[i], NULL, h->md, NULL) != 1)
                return -EIO;
    }
    for (size_t i = 0; i < n && r == 0; i++)
        r = store(h, blk[i], d[i], len, false);
    return r;
}

int blkhash_put_digest(struct blkhash *h, uint64_t b,
                       const unsigned char *digest)
{
    return store(h, b, digest, h->block_size, false);
}

int blkhash_update_blocks(struct blkhash *h, const uint64_t *blk,
                          const unsigned char *const *mem, size_t n)
{
    uint64_t gb[HASH_GROUP];
    const unsigned char *gm[HASH_GROUP];
    size_t g = 0;
    int r;

    for (size_t i = 0; i < n; i++) {
        if (is_zero(mem[i], h->block_size)) {
            if ((r = store(h, blk[i], NULL, h->block_size, true)) < 0)
                return r;
            continue;
        }
        gb[g] = blk[i];
        gm[g++] = mem[i];
        if (g == HASH_GROUP) {
            if ((r = hash_store(h, gb, gm, g, h->block_size)) < 0)
                return r;
            g = 0;
        }
    }
    return g ? hash_store(h, gb, gm, g, h->block_size) : 0;
}

int blkhash_update(struct blkhash *h, uint64_t off, const void *buf,
                   size_t len)
{
    const unsigned char *p = buf;
    uint64_t blk[HASH_GROUP];
    const unsigned char *mem[HASH_GROUP];
    int r;

    if (off % h->block_size)
        return -EINVAL;
    while (len >= h->block_size) {
        size_t n = 0;
        for (; n < HASH_GROUP && len >= h->block_size; n++) {
            blk[n] = off / h->block_size;
            mem[n] = p;
            off += h->block_size;
            p += h->block_size;
            len -= h->block_size;
        }
        if ((r = blkhash_update_blocks(h, blk, mem, n)) < 0)
            return r;
    }
    if (len == 0)
        return 0;
    /* The short last block of the stream. */
    blk[0] = off / h->block_size;
    if (is_zero(p, len))
        return store(h, blk[0], NULL, len, true);
    return hash_store(h, blk, &p, 1, len);
}

int blkhash_zero(struct blkhash *h, uint64_t off, uint64_t len)
{
    if (off % h->block_size)
        return -EINVAL;
    uint64_t b = off / h->block_size;
    uint64_t end = b + (len + h->block_size - 1) / h->block_size;

    LOCK_FOR_SCOPE(&h->lock);
    if (b < h->folded && len > 0)
        return -ESTALE;
    while (b < end) {
        uint64_t stop = (b / BLKHASH_CHUNK + 1) * BLKHASH_CHUNK;
        unsigned char *c = chunk_locked(h, b, false);

        if (stop > end)
            stop = end;
        if (c)
            memcpy(c + (b % BLKHASH_CHUNK) * h->dsize, h->zero_run,
                   (stop - b) * h->dsize);
        if (h->short_len && h->short_block >= b && h->short_block < stop)
            h->short_len = 0;
        b = stop;
    }
    return 0;
}

/* ---- finish ---- */

static bool slot_is_zero(const struct blkhash *h, const unsigned char *c,
                         uint64_t b)
{
    return memcmp(c + (b % BLKHASH_CHUNK) * h->dsize, h->zero_digest,
                  h->dsize) == 0;
}

/* No block at or past 'nblocks' holds data. */
static bool nothing_past_locked(const struct blkhash *h, uint64_t nblocks)
{
    for (uint64_t ci = nblocks / BLKHASH_CHUNK; ci < h->chunks.len; ci++) {
        if (!h->chunks.ptr[ci])
            continue;
        uint64_t b = ci * BLKHASH_CHUNK > nblocks ? ci * BLKHASH_CHUNK : nblocks;
        for (; b < (ci + 1) * BLKHASH_CHUNK; b++)
            if (!slot_is_zero(h, h->chunks.ptr[ci], b))
                return false;
    }
    return true;
}

/* Feeds the digests of blocks [from, n) (all full-size) to c. */
static int feed_full_locked(struct blkhash *h, EVP_MD_CTX *c, uint64_t from,
                            uint64_t n)
{
    for (uint64_t b = from; b < n;) {
        uint64_t ci = b / BLKHASH_CHUNK, i = b % BLKHASH_CHUNK;
        uint64_t cnt = BLKHASH_CHUNK - i < n - b ? BLKHASH_CHUNK - i : n - b;
        const unsigned char *src =
            ci < h->chunks.len && h->chunks.ptr[ci] ? h->chunks.ptr[ci]
                                                    : h->zero_run;

        if (EVP_DigestUpdate(c, src + i * h->dsize, cnt * h->dsize) != 1)
            return -EIO;
        b += cnt;
    }
    return 0;
}

/* The digest of the short last block, index b, 'rest' bytes long. */
static int short_digest_locked(struct blkhash *h, uint64_t b, uint64_t rest,
                               unsigned char *d)
{
    unsigned char *c = chunk_locked(h, b, false);

    if (h->short_len && (h->short_block != b || h->short_len != rest))
        return -EINVAL;                  /* data ends elsewhere */
    if (h->short_len) {
        memcpy(d, c + (b % BLKHASH_CHUNK) * h->dsize, h->dsize);
        return 0;
    }
    if (c && !slot_is_zero(h, c, b))
        return -EINVAL;                  /* a full data block */
    return digest_zeros(h->md, rest, d);
}

static int finish_locked(struct blkhash *h, EVP_MD_CTX *c, uint64_t length)
{
    uint64_t full = length / h->block_size;
    uint64_t rest = length % h->block_size;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned char le[8];
    int r;

    if (!nothing_past_locked(h, full + (rest != 0)) || full < h->folded)
        return -EINVAL;
    if (!rest && h->short_len)
        return -EINVAL;
    if (h->outer && EVP_MD_CTX_copy_ex(c, h->outer) != 1)
        return -EIO;
    if ((r = feed_full_locked(h, c, h->folded, full)) < 0)
        return r;
    if (rest) {
        if ((r = short_digest_locked(h, full, rest, d)) < 0)
            return r;
        if (EVP_DigestUpdate(c, d, h->dsize) != 1)
            return -EIO;
    }
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char) (length >> (8 * i));
    return EVP_DigestUpdate(c, le, sizeof le) == 1 ? 0 : -EIO;
}

int blkhash_finish(struct blkhash *h, uint64_t length, unsigned char *out,
                   unsigned *out_len)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    int r = -ENOMEM;

    if (c && EVP_DigestInit_ex(c, h->md, NULL) == 1) {
        {
            LOCK_FOR_SCOPE(&h->lock);
            r = finish_locked(h, c, length);
        }
        if (r == 0 && EVP_DigestFinal_ex(c, out, out_len) != 1)
            r = -EIO;
    } else if (c) {
        r = -EIO;
    }
    EVP_MD_CTX_free(c);
    return r;
}

/* ---- fingerprints ---- */

int blkhash_fingerprints(struct blkhash *h, uint64_t length, unsigned shift,
                         uint64_t *fp, size_t n)
{
    uint64_t nblocks = (length + h->block_size - 1) / h->block_size;

    LOCK_FOR_SCOPE(&h->lock);
    if (h->folded && shift < h->fold_shift)
        return -EINVAL;
    for (size_t i = 0; i < h->fold_fp.len; i++)
        if ((i >> (shift - h->fold_shift)) < n)
            fp[i >> (shift - h->fold_shift)] ^= h->fold_fp.ptr[i];
    for (size_t ci = 0; ci < h->chunks.len; ci++) {
        const unsigned char *c = h->chunks.ptr[ci];
        for (uint64_t i = 0; c && i < BLKHASH_CHUNK; i++) {
            uint64_t b = (uint64_t) ci * BLKHASH_CHUNK + i;
            if (b < h->folded)
                continue;
            if (b >= nblocks || (b >> shift) >= n)
                break;
            if (!slot_is_zero(h, c, b))
                fp[b >> shift] ^= blkhash_fp_term(b, c + i * h->dsize);
        }
    }
    return 0;
}

/* ---- folding ---- */

/* Room for the fingerprint of region r: grows the array, or doubles the
 * regions (merging pairs) past FOLD_REGIONS. */
static int fold_fp_room_locked(struct blkhash *h, uint64_t b)
{
    while ((b >> h->fold_shift) >= FOLD_REGIONS) {
        uint64_t *fp = h->fold_fp.ptr;
        for (size_t i = 0; i < h->fold_fp.len; i++)
            fp[i / 2] = (i % 2 ? fp[i / 2] : 0) ^ fp[i];
        h->fold_fp.len = (h->fold_fp.len + 1) / 2;
        h->fold_shift++;
    }
    struct fp_vector *v = &h->fold_fp;
    size_t need = (size_t) (b >> h->fold_shift) + 1;
    if (need <= v->len)
        return 0;
    size_t n = v->len ? v->len : 64;     /* folding halves len, not cap */
    while (n < need)
        n *= 2;
    if (n > FOLD_REGIONS)
        n = FOLD_REGIONS;
    if (fp_vector_reserve(v, n - v->len) < 0)
        return -ENOMEM;
    memset(v->ptr + v->len, 0, (n - v->len) * sizeof *v->ptr);
    v->len = n;
    return 0;
}

static int fold_fingerprints_locked(struct blkhash *h, uint64_t upto)
{
    int r;

    if (upto > 0 && (r = fold_fp_room_locked(h, upto - 1)) < 0)
        return r;
    for (uint64_t ci = h->folded / BLKHASH_CHUNK;
         ci < h->chunks.len && ci * BLKHASH_CHUNK < upto; ci++) {
        const unsigned char *c = h->chunks.ptr[ci];
        for (uint64_t b = ci * BLKHASH_CHUNK > h->folded ? ci * BLKHASH_CHUNK
                                                        : h->folded;
             c && b < upto && b < (ci + 1) * BLKHASH_CHUNK; b++)
            if (!slot_is_zero(h, c, b))
                h->fold_fp.ptr[b >> h->fold_shift] ^=
                    blkhash_fp_term(b, c + (b % BLKHASH_CHUNK) * h->dsize);
    }
    return 0;
}

int blkhash_fold(struct blkhash *h, uint64_t upto)
{
    int r;

    LOCK_FOR_SCOPE(&h->lock);
    if (upto <= h->folded)
        return 0;
    if (h->short_len && h->short_block < upto)
        return -EINVAL;
    if (!h->outer) {
        if (!(h->outer = EVP_MD_CTX_new()))
            return -ENOMEM;
        if (EVP_DigestInit_ex(h->outer, h->md, NULL) != 1)
            return -EIO;
    }
    if ((r = fold_fingerprints_locked(h, upto)) < 0 ||
        (r = feed_full_locked(h, h->outer, h->folded, upto)) < 0)
        return r;
    for (uint64_t ci = h->folded / BLKHASH_CHUNK;
         ci < h->chunks.len && (ci + 1) * BLKHASH_CHUNK <= upto; ci++) {
        free(h->chunks.ptr[ci]);
        h->chunks.ptr[ci] = NULL;
    }
    h->folded = upto;
    return 0;
}

uint64_t blkhash_folded(struct blkhash *h)
{
    LOCK_FOR_SCOPE(&h->lock);
    uint64_t f = h->folded;
    return f;
}

unsigned blkhash_fp_min_shift(struct blkhash *h)
{
    LOCK_FOR_SCOPE(&h->lock);
    unsigned s = h->folded ? h->fold_shift : 0;
    return s;
}

size_t blkhash_memory(struct blkhash *h)
{
    LOCK_FOR_SCOPE(&h->lock);
    size_t m = h->chunks.len * sizeof *h->chunks.ptr +
               h->fold_fp.len * sizeof *h->fold_fp.ptr;
    for (size_t i = 0; i < h->chunks.len; i++)
        if (h->chunks.ptr[i])
            m += (size_t) BLKHASH_CHUNK * h->dsize;
    return m;
}
