/* tests/unit/test-blkhash.c: digest/blkhash against the public check
 * values (libnbd's copy-blkhash-known) and against a straightforward
 * in-order reference, for updates in any order, from several threads,
 * with holes, zeroed ranges and rewrites; and every SHA-256 lane of the
 * hashing path in use (test_lanes).  ctest runs it on each path the
 * machine has: as it chooses (AVX-512 sixteen lanes and SHA-NI pairs on
 * a CPU with both, which is checked), NBDFERRY_SHA256=sha-ni and
 * NBDFERRY_SHA256=openssl. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest/blkhash.h"
#include "digest/sha256x.h"

static void hex(const unsigned char *d, unsigned n, char *out)
{
    for (unsigned i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_hex(struct blkhash *h, uint64_t len, const char *want)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n;
    char got[2 * EVP_MAX_MD_SIZE + 1];

    assert(blkhash_finish(h, len, d, &n) == 0);
    hex(d, n, got);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "got %s\nwant %s\n", got, want);
        abort();
    }
}

/* The definition, in order, one EVP context per block. */
static void reference(const char *md_name, uint64_t bs, const unsigned char *p,
                      size_t len, unsigned char *out, unsigned *out_len)
{
    const EVP_MD *md = EVP_get_digestbyname(md_name);
    EVP_MD_CTX *outer = EVP_MD_CTX_new();
    unsigned char d[EVP_MAX_MD_SIZE], le[8];
    unsigned n;

    assert(md && outer && EVP_DigestInit_ex(outer, md, NULL) == 1);
    for (size_t off = 0; off < len; off += bs) {
        size_t piece = len - off < bs ? len - off : bs;
        assert(EVP_Digest(p + off, piece, d, &n, md, NULL) == 1);
        assert(EVP_DigestUpdate(outer, d, n) == 1);
    }
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char) ((uint64_t) len >> (8 * i));
    assert(EVP_DigestUpdate(outer, le, 8) == 1);
    assert(EVP_DigestFinal_ex(outer, out, out_len) == 1);
    EVP_MD_CTX_free(outer);
}

static void test_vectors(void)
{
    struct blkhash *h;

    assert(blkhash_create("sha256", 64 << 10, &h) == 0);
    check_hex(h, 0, "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc");
    assert(blkhash_update(h, 0, "hello", 5) == 0);
    check_hex(h, 5, "337355feb53a5309d5aba92796223c2c84ffab930e706c01fef573a2722545e6");
    blkhash_free(h);

    assert(blkhash_create("md5", 4, &h) == 0);
    assert(blkhash_update(h, 4, "o", 1) == 0);      /* out of order */
    assert(blkhash_update(h, 0, "hell", 4) == 0);
    check_hex(h, 5, "8262896de34125dec173722c920e8bd0");
    blkhash_free(h);
}

/* Random data with holes (zero blocks) and runs of zero bytes. */
static unsigned char *sparse_data(size_t len, uint64_t bs, unsigned seed)
{
    unsigned char *p = calloc(1, len ? len : 1);

    srand(seed);
    assert(p);
    for (size_t off = 0; off < len; off += bs) {
        size_t piece = len - off < bs ? len - off : bs;
        if (rand() % 4 == 0)
            continue;                                /* hole */
        for (size_t i = 0; i < piece; i++)
            p[off + i] = rand() % 3 == 0 ? 0 : (unsigned char) rand();
    }
    return p;
}

struct worker {
    struct blkhash *h;
    const unsigned char *p;
    size_t len;
    uint64_t bs;
    unsigned first, stride;
};

/* Every stride-th block, last first: another order than the reference. */
static void *update_blocks(void *arg)
{
    struct worker *w = arg;
    uint64_t n = (w->len + w->bs - 1) / w->bs;

    for (uint64_t b = n; b-- > 0;) {
        if (b % w->stride != w->first)
            continue;
        uint64_t off = b * w->bs;
        size_t piece = w->len - off < w->bs ? w->len - off : w->bs;
        assert(blkhash_update(w->h, off, w->p + off, piece) == 0);
    }
    return NULL;
}

static void compare_threads(const char *md, uint64_t bs, size_t len)
{
    unsigned char *p = sparse_data(len, bs, (unsigned) (len + bs));
    unsigned char want[EVP_MAX_MD_SIZE], got[EVP_MAX_MD_SIZE];
    unsigned wn, gn;
    struct blkhash *h;
    pthread_t t[3];
    struct worker w[3];

    reference(md, bs, p, len, want, &wn);
    assert(blkhash_create(md, bs, &h) == 0);
    for (unsigned i = 0; i < 3; i++) {
        w[i] = (struct worker) { h, p, len, bs, i, 3 };
        assert(pthread_create(&t[i], NULL, update_blocks, &w[i]) == 0);
    }
    for (unsigned i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert(blkhash_finish(h, len, got, &gn) == 0);
    assert(gn == wn && memcmp(got, want, wn) == 0);
    blkhash_free(h);
    free(p);
}

/* Write garbage everywhere, then zero and rewrite: the last word counts. */
static void test_rewrite_and_zero(void)
{
    uint64_t bs = 4096;
    size_t len = 40 * bs + 123;
    unsigned char *p = sparse_data(len, bs, 7);
    unsigned char *junk = malloc(len);
    unsigned char want[EVP_MAX_MD_SIZE], got[EVP_MAX_MD_SIZE];
    unsigned wn, gn;
    struct blkhash *h;

    memset(junk, 0xa5, len);
    memset(p + 8 * bs, 0, 10 * bs);             /* zeroed range below */
    memset(p + 39 * bs, 0, len - 39 * bs);      /* zero tail, short block */
    reference("sha1", bs, p, len, want, &wn);
    assert(blkhash_create("sha1", bs, &h) == 0);
    assert(blkhash_update(h, 0, junk, len) == 0);
    assert(blkhash_zero(h, 0, len) == 0);
    assert(blkhash_update(h, 0, junk, len) == 0);
    assert(blkhash_update(h, 0, p, 8 * bs) == 0);
    assert(blkhash_zero(h, 8 * bs, 10 * bs) == 0);
    assert(blkhash_update(h, 18 * bs, p + 18 * bs, 21 * bs) == 0);
    assert(blkhash_zero(h, 39 * bs, len - 39 * bs) == 0);
    assert(blkhash_finish(h, len, got, &gn) == 0);
    assert(gn == wn && memcmp(got, want, wn) == 0);
    blkhash_free(h);
    free(p);
    free(junk);
}

/* A 1 TiB stream with one data block at each end: two chunks, not 16 M
 * block digests; blocks never written are the zero block. */
static void test_sparse_huge(void)
{
    struct blkhash *h, *h2;
    unsigned char a[EVP_MAX_MD_SIZE], b[EVP_MAX_MD_SIZE];
    unsigned an, bn;
    uint64_t tib = 1ull << 40, bs = 64 << 10;
    static unsigned char blk[64 << 10];

    memset(blk, 'x', sizeof blk);
    assert(blkhash_create("sha256", bs, &h) == 0);
    assert(blkhash_create("sha256", bs, &h2) == 0);
    assert(blkhash_update(h, 0, blk, bs) == 0);
    assert(blkhash_update(h, tib - bs, blk, bs) == 0);
    assert(blkhash_finish(h, tib, a, &an) == 0);
    /* Same content, the middle written explicitly as zeros and holes. */
    assert(blkhash_update(h2, tib - bs, blk, bs) == 0);
    memset(blk, 0, sizeof blk);
    assert(blkhash_update(h2, bs, blk, bs) == 0);
    assert(blkhash_zero(h2, 2 * bs, tib - 4 * bs) == 0);
    memset(blk, 'x', sizeof blk);
    assert(blkhash_update(h2, 0, blk, bs) == 0);
    assert(blkhash_finish(h2, tib, b, &bn) == 0);
    assert(an == bn && memcmp(a, b, an) == 0);
    blkhash_free(h);
    blkhash_free(h2);
}

static void test_errors(void)
{
    struct blkhash *h;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n;

    assert(blkhash_create("no-such-digest", 4096, &h) == -EINVAL && !h);
    assert(blkhash_create("shake128", 4096, &h) == -EINVAL);   /* an XOF */
    assert(blkhash_create("sha256", 0, &h) == -EINVAL);
    assert(blkhash_create("sha256", BLKHASH_MAX_BLOCK + 1, &h) == -EINVAL);
    assert(blkhash_create("sha256", 4, &h) == 0);
    assert(blkhash_update(h, 2, "ab", 2) == -EINVAL);          /* misaligned */
    assert(blkhash_zero(h, 3, 1) == -EINVAL);
    assert(blkhash_update(h, 8, "abcd", 4) == 0);
    assert(blkhash_finish(h, 8, d, &n) == -EINVAL);            /* data past end */
    assert(blkhash_finish(h, 12, d, &n) == 0 && n == 32);
    assert(blkhash_update(h, 12, "ab", 2) == 0);               /* short block */
    assert(blkhash_finish(h, 15, d, &n) == -EINVAL);           /* ends elsewhere */
    assert(blkhash_finish(h, 16, d, &n) == -EINVAL);
    assert(blkhash_finish(h, 14, d, &n) == 0);
    assert(blkhash_update(h, 12, "abcd", 4) == 0);             /* now full */
    assert(blkhash_finish(h, 14, d, &n) == -EINVAL);
    assert(blkhash_finish(h, 16, d, &n) == 0);
    blkhash_free(h);
}

static void test_parse(void)
{
    char name[BLKHASH_NAME_MAX];
    struct nbdf_err why;
    uint64_t bs;

    assert(blkhash_parse_spec("", name, &bs, &why) == 0);
    assert(strcmp(name, "sha256") == 0 && bs == 64 << 10);
    assert(blkhash_parse_spec("md5", name, &bs, &why) == 0);
    assert(strcmp(name, "md5") == 0 && bs == 64 << 10);
    assert(blkhash_parse_spec("sha512/4", name, &bs, &why) == 0);
    assert(strcmp(name, "sha512") == 0 && bs == 4);
    assert(blkhash_parse_spec("SHA2-256/1M", name, &bs, &why) == 0);
    assert(bs == 1 << 20);
    assert(blkhash_parse_spec("sha1/256k", name, &bs, &why) == 0);
    assert(bs == 256 << 10);
    assert(blkhash_parse_spec("sha1/64M", name, &bs, &why) == 0);
    const char *bad[] = { "/64k", "sha256/", "sha256/0", "sha256/65M",
                          "sha256/1G", "sha256/4x", "sha256/k", "sha 256",
                          "sha256/99999999999999999999999", "sha256/-1",
                          "sha256/1k/2" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why.msg[0] = '\0';
        assert(blkhash_parse_spec(bad[i], name, &bs, &why) ==
               -EINVAL);
        assert(why.msg[0] != '\0');
    }
}

/* Folding: blocks updated in a shuffled order, folded in stages, give
 * the reference value; folded chunks are freed; a folded block refuses
 * changes; fingerprints agree with an unfolded twin at any shift the
 * folded one allows. */
static void test_fold(const char *md, uint64_t bs, size_t len)
{
    unsigned char *p = sparse_data(len, bs, 7);
    unsigned char want[EVP_MAX_MD_SIZE], got[EVP_MAX_MD_SIZE];
    unsigned wn, gn;
    struct blkhash *h, *twin;
    uint64_t nblocks = (len + bs - 1) / bs, full = len / bs;
    uint64_t *order = malloc((nblocks ? nblocks : 1) * sizeof *order);

    reference(md, bs, p, len, want, &wn);
    assert(blkhash_create(md, bs, &h) == 0);
    assert(blkhash_create(md, bs, &twin) == 0);
    for (uint64_t i = 0; i < nblocks; i++)
        order[i] = i;
    /* Shuffle within windows of 64 blocks, fold what is behind. */
    for (uint64_t w = 0; w < nblocks; w += 64) {
        uint64_t n = nblocks - w < 64 ? nblocks - w : 64;
        for (uint64_t i = n - 1; i > 0; i--) {
            uint64_t j = (uint64_t) rand() % (i + 1), t = order[w + i];
            order[w + i] = order[w + j];
            order[w + j] = t;
        }
        for (uint64_t i = 0; i < n; i++) {
            uint64_t b = order[w + i], off = b * bs;
            size_t piece = len - off < bs ? len - off : bs;
            assert(blkhash_update(h, off, p + off, piece) == 0);
            assert(blkhash_update(twin, off, p + off, piece) == 0);
        }
        uint64_t upto = w + n < full ? w + n : full;
        assert(blkhash_fold(h, upto) == 0);
        assert(blkhash_folded(h) == upto);
    }
    assert(blkhash_finish(h, len, got, &gn) == 0);
    assert(gn == wn && memcmp(got, want, wn) == 0);
    if (full > 2 * 1024 && blkhash_digest_size(h) >= 32)
        /* Whole chunks were freed; a fingerprint (8 bytes a block until
         * the regions grow) is left of each folded block. */
        assert(blkhash_memory(h) * 2 <= blkhash_memory(twin));
    if (full > 2 * 1024) {
        assert(blkhash_update(h, 0, p, bs) == -ESTALE);
        assert(blkhash_zero(h, 0, bs) == -ESTALE);
    }
    unsigned shift = blkhash_fp_min_shift(h);
    size_t nfp = (size_t) ((nblocks + (1ull << shift) - 1) >> shift);
    uint64_t *a = calloc(nfp + 1, 8), *b = calloc(nfp + 1, 8);
    assert(blkhash_fingerprints(h, len, shift, a, nfp) == 0);
    assert(blkhash_fingerprints(twin, len, shift, b, nfp) == 0);
    assert(memcmp(a, b, nfp * 8) == 0);
    free(a);
    free(b);
    free(order);
    free(p);
    blkhash_free(h);
    blkhash_free(twin);
}

/* Every lane with its own data: 1 to 40 blocks of distinct random bytes
 * in one update (groups of sixteen on the AVX-512 lanes, the rest in
 * pairs and singles on the SHA-NI lanes), and sixteen equal blocks but
 * one, in each position; against the reference (OpenSSL's SHA-256 of
 * each block, then the combine).  A lane that computes or stores
 * another lane's digest changes the result. */
static void test_lanes(void)
{
    const uint64_t sizes[] = { 4096, 65536 };
    unsigned char want[EVP_MAX_MD_SIZE], got[EVP_MAX_MD_SIZE];
    unsigned wn, gn;
    struct blkhash *h;

    for (size_t s = 0; s < 2; s++) {
        uint64_t bs = sizes[s];
        unsigned char *p = malloc(40 * bs);
        assert(p);
        srand(11);
        for (size_t i = 0; i < 40 * bs; i++)
            p[i] = (unsigned char) (rand() >> 7);
        for (size_t n = 1; n <= 40; n++) {
            reference("sha256", bs, p, n * bs, want, &wn);
            assert(blkhash_create("sha256", bs, &h) == 0);
            assert(blkhash_update(h, 0, p, n * bs) == 0);
            assert(blkhash_finish(h, n * bs, got, &gn) == 0);
            if (gn != wn || memcmp(got, want, wn) != 0) {
                fprintf(stderr, "blkhash: %zu blocks of %llu bytes differ "
                        "from the reference on path %s\n", n,
                        (unsigned long long) bs, sha256x_path());
                abort();
            }
            blkhash_free(h);
        }
        for (size_t odd = 0; odd < 16; odd++) {
            memset(p, 0x5c, 16 * bs);
            p[odd * bs + bs / 2] ^= 1;
            reference("sha256", bs, p, 16 * bs, want, &wn);
            assert(blkhash_create("sha256", bs, &h) == 0);
            assert(blkhash_update(h, 0, p, 16 * bs) == 0);
            assert(blkhash_finish(h, 16 * bs, got, &gn) == 0);
            if (gn != wn || memcmp(got, want, wn) != 0) {
                fprintf(stderr, "blkhash: block %zu of 16 one bit off "
                        "differs from the reference on path %s\n", odd,
                        sha256x_path());
                abort();
            }
            blkhash_free(h);
        }
        free(p);
    }
    printf("blkhash: every lane of path %s agrees\n", sha256x_path());
}

int main(void)
{
    const char *env = getenv("NBDFERRY_SHA256");
    if (!env && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512f") &&
        strcmp(sha256x_path(), "avx512+sha-ni") != 0 &&
        strcmp(sha256x_path(), "avx512") != 0) {
        fprintf(stderr, "blkhash: the CPU has AVX-512 but the path is %s\n",
                sha256x_path());
        return 1;
    }
    if (env && strcmp(env, sha256x_path()) != 0) {
        fprintf(stderr, "blkhash: NBDFERRY_SHA256=%s but the path is %s (a "
                "CPU without it cannot test it)\n", env, sha256x_path());
        return 1;
    }
    test_lanes();
    test_vectors();
    test_parse();
    test_errors();
    test_rewrite_and_zero();
    test_sparse_huge();
    test_fold("sha256", 4096, (32u << 20) + 77);
    test_fold("md5", 1, 5000);
    test_fold("sha1", 512, 0);
    test_fold("sha512", 65536, 3u << 20);
    const char *mds[] = { "sha256", "md5", "sha1", "sha512" };
    const uint64_t sizes[] = { 1, 4, 4096, 65536, 1 << 20 };
    const size_t lens[] = { 0, 1, 4095, 65536, 65537, 3 << 20 };
    for (size_t m = 0; m < 4; m++)
        for (size_t s = 0; s < 5; s++)
            for (size_t l = 0; l < 6; l++)
                if (sizes[s] > 4 || lens[l] < 70000)
                    compare_threads(mds[m], sizes[s], lens[l]);
    puts("blkhash: ok");
    return 0;
}
