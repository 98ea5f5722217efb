/* tests/unit/test-blkpass.c: digest/blkpass against a model of the file.
 *
 * Each case applies writes, zeroings and truncates to a blkpass and to a
 * byte array; a value the pass gives must be the blkhash (digest/blkhash,
 * itself checked against the public values) of the array at that size.
 * The cases a copy tool produces (a truncate then pieces in any order, a
 * write over the whole file then a truncate, holes punched where nothing
 * was written) must give a value; the ones the pass cannot know (part of
 * a hashed block rewritten, older data left) must say so. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest/blkhash.h"
#include "digest/blkpass.h"

#define N (3u * 1024 * 1024 + 777)

static unsigned char model[N + 65536];
static unsigned char data[N + 65536];
static uint64_t size;
static struct nbdf_err why;

static void reference(const char *md, uint64_t bs, char *hex)
{
    struct blkhash *h;
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n;

    assert(blkhash_create(md, bs, &h) == 0);
    assert(blkhash_update(h, 0, model, size) == 0);
    assert(blkhash_finish(h, size, d, &n) == 0);
    for (unsigned i = 0; i < n; i++)
        sprintf(hex + 2 * i, "%02x", d[i]);
    blkhash_free(h);
}

static void do_write(struct blkpass *p, uint64_t off, uint64_t len)
{
    int r = blkpass_write(p, off, data + off, len, NULL, &why);
    if (r < 0) {
        fprintf(stderr, "write %llu+%llu: %s\n", (unsigned long long) off,
                (unsigned long long) len, why.msg);
        abort();
    }
    memcpy(model + off, data + off, len);
    if (off + len > size)
        size = off + len;
}

static void do_zero(struct blkpass *p, uint64_t off, uint64_t len)
{
    assert(blkpass_zero(p, off, len, &why) == 0);
    memset(model + off, 0, len);
}

static void do_truncate(struct blkpass *p, uint64_t to)
{
    if (blkpass_truncate(p, to, &why) < 0) {
        fprintf(stderr, "truncate %llu: %s\n", (unsigned long long) to, why.msg);
        abort();
    }
    if (to < size)
        memset(model + to, 0, size - to);
    size = to;
}

static void expect_value(struct blkpass *p, const char *md, uint64_t bs)
{
    char got[2 * EVP_MAX_MD_SIZE + 1], want[2 * EVP_MAX_MD_SIZE + 1];
    int r = blkpass_finish(p, size, got, &why);

    if (r < 0) {
        fprintf(stderr, "%s/%llu: no value: %s\n", md,
                (unsigned long long) bs, why.msg);
        abort();
    }
    reference(md, bs, want);
    if (strcmp(got, want)) {
        fprintf(stderr, "%s/%llu at %llu: got %s want %s\n", md,
                (unsigned long long) bs, (unsigned long long) size, got,
                want);
        abort();
    }
}

/* Cut [0, len) into n pieces at random points, in random order. */
static size_t pieces(uint64_t len, uint64_t (*out)[2], size_t n)
{
    uint64_t *cut = malloc((n + 1) * sizeof *cut);
    cut[0] = 0;
    for (size_t i = 1; i < n; i++)
        cut[i] = (uint64_t) rand() % len;
    cut[n] = len;
    for (size_t i = 1; i < n; i++)          /* insertion sort: n is small */
        for (size_t j = i; j > 0 && cut[j - 1] > cut[j]; j--) {
            uint64_t t = cut[j]; cut[j] = cut[j - 1]; cut[j - 1] = t;
        }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (cut[i] < cut[i + 1]) {
            out[k][0] = cut[i];
            out[k++][1] = cut[i + 1] - cut[i];
        }
    for (size_t i = k; i > 1; i--) {
        size_t j = (size_t) rand() % i;
        uint64_t a = out[i - 1][0], b = out[i - 1][1];
        out[i - 1][0] = out[j][0]; out[i - 1][1] = out[j][1];
        out[j][0] = a; out[j][1] = b;
    }
    free(cut);
    return k;
}

static struct blkpass *fresh(const char *md, uint64_t bs, size_t budget)
{
    struct blkpass *p;

    assert(blkpass_create(md, bs, budget, &p) == 0);
    memset(model, 0xa5, sizeof model);     /* "older data" */
    size = N;
    return p;
}

/* O_TRUNC, then pieces in any order with a hole punched where none goes,
 * then a close; then a rewrite of one whole block and a close again. */
static void truncate_then_shuffled(const char *md, uint64_t bs)
{
    static uint64_t pc[400][2];
    struct blkpass *p = fresh(md, bs, 64u << 20);
    uint64_t hole = N / 3, hole_len = 200000;

    do_truncate(p, 0);
    size_t k = pieces(N, pc, 400);
    for (size_t i = 0; i < k; i++) {
        uint64_t s = pc[i][0], e = s + pc[i][1];
        if (s < hole)
            do_write(p, s, (e < hole ? e : hole) - s);
        if (e > hole + hole_len)
            do_write(p, s > hole + hole_len ? s : hole + hole_len,
                     e - (s > hole + hole_len ? s : hole + hole_len));
        if (i == k / 2)
            do_zero(p, hole, hole_len);
    }
    expect_value(p, md, bs);
    do_write(p, bs, bs);                   /* a whole block again */
    expect_value(p, md, bs);
    blkpass_free(p);
}

/* No truncate: a shorter file written over the old one in any order, then
 * the old one cut to its size (as rsync --inplace does). */
static void overwrite_then_truncate(const char *md, uint64_t bs)
{
    static uint64_t pc[100][2];
    struct blkpass *p = fresh(md, bs, 64u << 20);

    size_t k = pieces(N - 12345, pc, 100);
    for (size_t i = 0; i < k; i++)
        do_write(p, pc[i][0], pc[i][1]);
    do_truncate(p, N - 12345);
    expect_value(p, md, bs);
    blkpass_free(p);
}

/* What the pass cannot know. */
static void refusals(void)
{
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    struct blkpass *p = fresh("sha256", 65536, 64u << 20);

    do_write(p, 0, N / 2);                 /* older data beyond */
    assert(blkpass_finish(p, size, hex, &why) == -ENODATA);
    assert(strstr(why.msg, "did not write"));
    assert(blkpass_write(p, 5, data, 10, NULL, &why) == -ESTALE);
    assert(strstr(why.msg, "after it was hashed"));
    blkpass_free(p);

    p = fresh("sha256", 65536, 64u << 20);
    do_write(p, 0, 65536);
    assert(blkpass_zero(p, 100, 10, &why) == -ESTALE);
    blkpass_free(p);

    p = fresh("sha256", 65536, 64u << 20);
    do_write(p, 0, 3 * 65536);
    assert(blkpass_truncate(p, 65536 + 7, &why) == -ESTALE);
    blkpass_free(p);

    /* Two blocks of copies; a third block in part, with older data in
     * the first: it cannot be let go. */
    p = fresh("sha256", 65536, 2 * 65536);
    do_write(p, 0, 100);
    do_write(p, 65536, 100);
    assert(blkpass_write(p, 2 * 65536, data, 100, NULL, &why) == -E2BIG);
    blkpass_free(p);

    /* The same after a truncate to 0: the rest is zero, so it goes. */
    p = fresh("sha256", 65536, 2 * 65536);
    do_truncate(p, 0);
    do_write(p, 0, 100);
    do_write(p, 65536, 100);
    do_write(p, 2 * 65536, 100);
    expect_value(p, "sha256", 65536);
    blkpass_free(p);
}

/* THE READER: the disk is the model (every change applied so far). */
static int read_model(void *ctx, uint64_t off, void *buf, size_t len)
{
    (void) ctx;
    memcpy(buf, model + off, len);
    return 0;
}

/* The refusals above, with a reader: each is followed and gives the
 * right value. */
static void with_reader(void)
{
    struct blkpass *p = fresh("sha256", 65536, 64u << 20);

    blkpass_set_reader(p, read_model, NULL, sizeof model);
    do_write(p, 0, N);                     /* every byte known */
    do_write(p, 5, 10);                    /* inside a block hashed */
    expect_value(p, "sha256", 65536);
    do_zero(p, 70000, 10);                 /* zeroing inside one */
    expect_value(p, "sha256", 65536);
    do_truncate(p, 3 * 65536 + 7);         /* cut inside one */
    expect_value(p, "sha256", 65536);
    blkpass_free(p);

    /* No truncate: two copies at most, the third block's write lets the
     * first go with older data in it, which is read back. */
    p = fresh("sha256", 65536, 2 * 65536);
    blkpass_set_reader(p, read_model, NULL, sizeof model);
    do_write(p, 0, 100);
    do_write(p, 65536, 100);
    do_write(p, 2 * 65536, 100);
    do_write(p, 65536 + 100, 65536 - 100);
    do_write(p, 2 * 65536 + 100, N - 2 * 65536 - 100);
    expect_value(p, "sha256", 65536);
    blkpass_free(p);
}

/* Writes scattered over more ranges than the pass keeps end it (zero
 * blocks: nothing to hash, only the ranges grow). */
static void too_scattered(void)
{
    static const unsigned char zero[512];
    struct blkpass *p;
    int r = 0;
    uint64_t i;

    assert(blkpass_create("md5", 512, 1u << 20, &p) == 0);
    assert(blkpass_truncate(p, 0, &why) == 0);
    for (i = 0; i < (1u << 20) && r == 0; i++)
        r = blkpass_write(p, i * 1024, zero, 512, NULL, &why);
    assert(r == -E2BIG && strstr(why.msg, "too scattered"));
    assert(i > (1u << 19));
    blkpass_free(p);
}

/* Random changes: whenever the pass gives a value, it is the model's. */
static void random_changes(const char *md, uint64_t bs)
{
    struct blkpass *p = fresh(md, bs, 4 * bs);
    int values = 0;

    do_truncate(p, 0);
    for (int i = 0; i < 3000; i++) {
        uint64_t off = (uint64_t) rand() % N;
        uint64_t len = 1 + (uint64_t) rand() % (3 * bs);
        int r = 0, op = rand() % 10;
        if (off + len > N)
            len = N - off;
        if (op < 7) {
            r = blkpass_write(p, off, data + off, len, NULL, &why);
            if (r == 0) {
                memcpy(model + off, data + off, len);
                if (off + len > size)
                    size = off + len;
            }
        } else if (op < 9) {
            r = blkpass_zero(p, off, len, &why);
            if (r == 0)
                memset(model + off, 0, len);
        } else {
            r = blkpass_truncate(p, off, &why);
            if (r == 0) {
                if (off < size)
                    memset(model + off, 0, size - off);
                size = off;
            }
        }
        if (r == 0 && rand() % 20 == 0) {
            char got[2 * EVP_MAX_MD_SIZE + 1], want[2 * EVP_MAX_MD_SIZE + 1];
            r = blkpass_finish(p, size, got, &why);
            if (r == 0) {
                reference(md, bs, want);
                assert(strcmp(got, want) == 0);
                values++;
            }
        }
        if (r < 0) {                       /* lost track: a new pass */
            if (r != -ESTALE && r != -E2BIG && r != -ENODATA)
                fprintf(stderr, "%d: %s\n", r, why.msg);
            assert(r == -ESTALE || r == -E2BIG || r == -ENODATA);
            do_truncate(p, 0);
        }
    }
    blkpass_free(p);
    assert(values > 0);
}

/* ---- folding: state bounded for long streams ----
 * The same writes go to a folding blkpass (bs 256 bytes, so 1 Mi blocks
 * in 256 MiB; lag 1 MiB) and to a plain blkhash that keeps every block
 * digest: the values and the fingerprints must agree, and the pass's
 * per-block state must stay a small constant while the plain one grows
 * with the stream (32 bytes a block). */
#define FBS 256u
#define FTOTAL (256u << 20)
#define FPIECE (1u << 20)

struct fold_case {
    struct blkpass *p;
    struct blkhash *h;
    size_t peak;
    unsigned char buf[FPIECE];
};

static struct fold_case *fold_start(void)
{
    struct fold_case *c = calloc(1, sizeof *c);

    assert(c && blkpass_create("sha256", FBS, 1u << 20, &c->p) == 0);
    assert(blkhash_create("sha256", FBS, &c->h) == 0);
    blkpass_set_fold_lag(c->p, 1u << 20);
    assert(blkpass_truncate(c->p, 0, &why) == 0);
    for (size_t i = 0; i < FPIECE; i++)
        c->buf[i] = (unsigned char) rand();
    return c;
}

/* len bytes at off, each block stamped with its offset: all differ. */
static void fold_write(struct fold_case *c, uint64_t off, size_t len)
{
    for (size_t i = 0; i + 8 <= len; i += FBS)
        memcpy(c->buf + i, &(uint64_t) { off + i }, 8);
    if (blkpass_write(c->p, off, c->buf, len, NULL, &why) < 0) {
        fprintf(stderr, "fold write %llu+%zu: %s\n",
                (unsigned long long) off, len, why.msg);
        abort();
    }
    assert(blkhash_update(c->h, off, c->buf, len) == 0);
    size_t m = blkpass_memory(c->p);
    if (m > c->peak)
        c->peak = m;
}

static void fold_check(struct fold_case *c, uint64_t len)
{
    char got[2 * EVP_MAX_MD_SIZE + 1], want[2 * EVP_MAX_MD_SIZE + 1];
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n;

    assert(blkpass_truncate(c->p, len, &why) == 0);
    if (blkpass_finish(c->p, len, got, &why) < 0) {
        fprintf(stderr, "fold: no value: %s\n", why.msg);
        abort();
    }
    assert(blkhash_finish(c->h, len, d, &n) == 0);
    for (unsigned i = 0; i < n; i++)
        sprintf(want + 2 * i, "%02x", d[i]);
    assert(strcmp(got, want) == 0);
    assert(blkpass_folded(c->p) > 0);

    unsigned shift = blkpass_fp_min_shift(c->p);
    uint64_t nblocks = (len + FBS - 1) / FBS;
    size_t nfp = (size_t) ((nblocks + (1ull << shift) - 1) >> shift);
    uint64_t *a = calloc(nfp, 8), *b = calloc(nfp, 8);
    assert(a && b);
    assert(blkpass_fingerprints(c->p, len, shift, a, nfp) == 0);
    assert(blkhash_fingerprints(c->h, len, shift, b, nfp) == 0);
    assert(memcmp(a, b, nfp * 8) == 0);
    if (shift > 0)                 /* finer than what was folded: no */
        assert(blkpass_fingerprints(c->p, len, 0, a, nfp) == -EINVAL);
    free(a);
    free(b);

    size_t plain = blkhash_memory(c->h);
    printf("fold: %llu bytes, pass state peak %zu bytes, plain blkhash "
           "%zu bytes\n", (unsigned long long) len, c->peak, plain);
    if (c->peak > (3u << 20) || c->peak * 8 > plain) {
        fprintf(stderr, "fold: pass state peaked at %zu bytes, plain "
                "blkhash %zu\n", c->peak, plain);
        abort();
    }
}

static void fold_end(struct fold_case *c)
{
    blkpass_free(c->p);
    blkhash_free(c->h);
    free(c);
}

static void fold_dense(void)
{
    struct fold_case *c = fold_start();

    for (uint64_t off = 0; off < FTOTAL; off += FPIECE)
        fold_write(c, off, FPIECE);
    fold_write(c, FTOTAL, 100);                     /* a short last block */
    /* A block folded long ago cannot change any more. */
    assert(blkpass_write(c->p, 0, c->buf, FBS, NULL, &why) == -ESTALE);
    assert(strstr(why.msg, "folded"));
    fold_end(c);

    c = fold_start();
    for (uint64_t off = 0; off < FTOTAL; off += FPIECE)
        fold_write(c, off, FPIECE);
    fold_write(c, FTOTAL, 100);
    fold_check(c, FTOTAL + 100);
    assert(blkpass_zero(c->p, 0, FBS, &why) == -ESTALE);
    fold_end(c);
}

/* qemu-img convert -W: windows of 8 pieces of 128 KiB, each window
 * shuffled (within the 1 MiB lag). */
static void fold_reordered(void)
{
    struct fold_case *c = fold_start();
    const uint64_t piece = FPIECE / 8;

    for (uint64_t w = 0; w < FTOTAL; w += 8 * piece) {
        unsigned order[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
        for (unsigned i = 7; i > 0; i--) {
            unsigned j = (unsigned) rand() % (i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (unsigned i = 0; i < 8; i++)
            fold_write(c, w + order[i] * piece, (size_t) piece);
    }
    fold_check(c, FTOTAL);
    fold_end(c);
}

/* cp --sparse=always: 4 KiB of data every 1 MiB of a 1 GiB file; the
 * holes fold as zero digests, and zeroing a folded hole again is fine. */
static void fold_sparse(void)
{
    struct fold_case *c = fold_start();
    uint64_t total = 4ull * FTOTAL;

    for (uint64_t off = 0; off < total; off += FPIECE)
        fold_write(c, off, 4096);
    assert(blkpass_zero(c->p, 8192, 65536, &why) == 0);
    fold_check(c, total);
    fold_end(c);
}

/* [off, off + len) in pieces of at most FPIECE. */
static void fold_span(struct fold_case *c, uint64_t off, uint64_t len)
{
    for (uint64_t done = 0; done < len; done += FPIECE)
        fold_write(c, off + done,
                   (size_t) (len - done < FPIECE ? len - done : FPIECE));
}

/* The value of the stream fold_write() made, against the plain twin,
 * without fold_check()'s memory bound (these streams are short). */
static void fold_value(struct fold_case *c, uint64_t len)
{
    char got[2 * EVP_MAX_MD_SIZE + 1], want[2 * EVP_MAX_MD_SIZE + 1];
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n;

    assert(blkpass_truncate(c->p, len, &why) == 0);
    if (blkpass_finish(c->p, len, got, &why) < 0) {
        fprintf(stderr, "fold: no value: %s\n", why.msg);
        abort();
    }
    assert(blkhash_finish(c->h, len, d, &n) == 0);
    for (unsigned i = 0; i < n; i++)
        sprintf(want + 2 * i, "%02x", d[i]);
    assert(strcmp(got, want) == 0);
    assert(blkpass_folded(c->p) > 0);
}

/* THE VOLUME LAG: 2 MiB of data, a hole of 6 MiB (more than the 1 MiB
 * lag), then data again: a block of the first run that comes after a
 * little of the second (qemu-img convert -c stores clusters so) was
 * not folded yet. */
static void fold_late_across_a_hole(void)
{
    struct fold_case *c = fold_start();
    const uint64_t a = 2u << 20, late = a - FBS, b = 8u << 20;

    fold_span(c, 0, late);
    fold_write(c, b, 32 * FBS);                     /* 32 blocks of B */
    fold_write(c, late, FBS);                       /* A's last, late */
    for (uint64_t off = b + 32 * FBS; off < b + (4u << 20); off += FPIECE)
        fold_write(c, off, FPIECE);
    fold_value(c, b + (4u << 20) + 32 * FBS);
    fold_end(c);
}

/* A view's pass folds only at blkpass_settle(): inside one group
 * (a write request whose clusters the view's threads place in any
 * order) a block far behind comes after much data far ahead. */
static void fold_at_settle(void)
{
    struct fold_case *c = fold_start();
    const uint64_t a = 2u << 20, late = a - FBS, b = 8u << 20;

    blkpass_fold_at_settle(c->p, 0);
    fold_span(c, 0, late);
    assert(blkpass_settle(c->p, &why) == 0);
    fold_write(c, b, FPIECE);                       /* 4096 blocks of B */
    fold_write(c, late, FBS);                       /* then A's last */
    assert(blkpass_settle(c->p, &why) == 0);
    for (uint64_t off = b + FPIECE; off < b + (4u << 20); off += FPIECE) {
        fold_write(c, off, FPIECE);
        assert(blkpass_settle(c->p, &why) == 0);
    }
    fold_value(c, b + (4u << 20));
    /* Folded at a settle: the first run is final now. */
    assert(blkpass_write(c->p, 0, c->buf, FBS, NULL, &why) == -ESTALE);
    fold_end(c);
}

/* A view's pass below its state bound: groups in no order at all (a
 * VM's own qcow2, clusters in the order the guest wrote them) over 32
 * MiB, far more than the 1 MiB lag: nothing folds, the value is the
 * plain twin's. */
static void fold_any_order_below_state(void)
{
    struct fold_case *c = fold_start();
    const uint64_t piece = 16u << 10, total = 32u << 20;
    const unsigned n = (unsigned) (total / piece);
    unsigned *order = malloc(n * sizeof *order);
    char got[2 * EVP_MAX_MD_SIZE + 1], want[2 * EVP_MAX_MD_SIZE + 1];
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned len;

    assert(order);
    blkpass_fold_at_settle(c->p, BLKPASS_SETTLE_STATE);
    for (unsigned i = 0; i < n; i++)
        order[i] = i;
    for (unsigned i = n - 1; i > 0; i--) {
        unsigned j = (unsigned) rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (unsigned i = 0; i < n; i++) {
        fold_write(c, order[i] * piece, (size_t) piece);
        assert(blkpass_settle(c->p, &why) == 0);
    }
    assert(blkpass_folded(c->p) == 0);
    assert(blkpass_truncate(c->p, total, &why) == 0);
    assert(blkpass_finish(c->p, total, got, &why) == 0);
    assert(blkhash_finish(c->h, total, d, &len) == 0);
    for (unsigned i = 0; i < len; i++)
        sprintf(want + 2 * i, "%02x", d[i]);
    assert(strcmp(got, want) == 0);
    free(order);
    fold_end(c);
}

/* THE FILLER: the model's blocks, sha256/64K, as a manifest would give
 * them; block 3 unknown until filler_knows_all. */
static bool filler_knows_all;
static unsigned filler_calls;

static int fill_model(void *ctx, uint64_t b, unsigned char *digest)
{
    unsigned n;
    filler_calls++;
    if (b == 3 && !filler_knows_all)
        return 0;
    const unsigned char *blk = model + b * 65536;
    bool zero = true;
    for (size_t i = 0; i < 65536 && zero; i++)
        zero = blk[i] == 0;
    if (zero)
        return 1;
    assert(EVP_Digest(blk, 65536, digest, &n, EVP_sha256(), NULL) == 1);
    return 2;
}

/* A writer of a few blocks of a file whose other blocks the filler
 * knows: a value, the whole file's; unknown to it: "incomplete". */
static void with_filler(void)
{
    struct blkpass *p = fresh("sha256", 65536, 1u << 20);
    char got[2 * EVP_MAX_MD_SIZE + 1];
    size = 32 * 65536;
    for (size_t i = 0; i < size; i++)       /* the disk as it was */
        model[i] = (unsigned char) (i / 65536 % 5 ? data[i] : 0);
    blkpass_set_filler(p, fill_model, NULL);
    do_write(p, 7 * 65536, 2 * 65536);      /* two blocks changed */
    do_write(p, 20 * 65536 + 100, 1000);    /* part of a block */
    filler_calls = 0;
    assert(blkpass_finish(p, size, got, &why) == -ENODATA);
    assert(filler_calls > 0);
    filler_knows_all = true;
    /* Block 20 is known in part: not filled, still incomplete. */
    assert(blkpass_finish(p, size, got, &why) == -ENODATA);
    do_write(p, 20 * 65536, 65536);          /* now whole */
    expect_value(p, "sha256", 65536);
    blkpass_free(p);
}

/* Writes that bring the digests of their whole blocks (known.h): the
 * pass stores them, counts them as reused, and hashes the rest; its
 * value is the file's.  A wrong digest given makes a wrong value: the
 * pass did take it rather than hash the bytes (a pass that hashed them
 * anyway would not save the work). */
static void known_of(uint64_t off, uint64_t len, struct digest_known *k)
{
    memset(k, 0, sizeof *k);
    for (uint64_t b = (off + 65535) / 65536; (b + 1) * 65536 <= off + len;
         b++) {
        unsigned char d[EVP_MAX_MD_SIZE];
        unsigned n;
        bool zero = true;
        for (size_t i = 0; i < 65536 && zero; i++)
            zero = data[b * 65536 + i] == 0;
        if (zero)
            continue;             /* a writer lists no zero block */
        assert(EVP_Digest(data + b * 65536, 65536, d, &n, EVP_sha256(),
                          NULL) == 1);
        digest_known_add(k, b, d);
    }
}

static void with_known(void)
{
    struct blkpass *p = fresh("sha256", 65536, 1u << 20);
    struct digest_known k;
    uint64_t len = 1u << 20, given = 0;
    do_truncate(p, 0);                      /* O_TRUNC */
    /* Unaligned 1 MiB writes: 15 whole blocks each, the ends in part. */
    for (uint64_t off = 1000; off + len <= N; off += len) {
        known_of(off, len, &k);
        given += k.n * 65536;
        assert(blkpass_write(p, off, data + off, len, &k, &why) == 0);
        memcpy(model + off, data + off, len);
        size = off + len;
    }
    assert(given > 0 && blkpass_reused(p) == given);
    expect_value(p, "sha256", 65536);
    blkpass_free(p);

    /* Another digest or block size: the pass hashes, whatever it is given. */
    p = fresh("sha1", 3000, 1u << 20);
    known_of(0, 1u << 20, &k);
    assert(blkpass_write(p, 0, data, 1u << 20, &k, &why) == 0);
    assert(blkpass_reused(p) == 0);
    blkpass_free(p);

    /* A wrong digest is taken as given: the value is not the file's. */
    char got[2 * EVP_MAX_MD_SIZE + 1], want[2 * EVP_MAX_MD_SIZE + 1];
    p = fresh("sha256", 65536, 1u << 20);
    do_truncate(p, 0);
    known_of(0, 1u << 20, &k);
    assert(k.n > 0);
    k.digest[0][0] ^= 1;
    assert(blkpass_write(p, 0, data, 1u << 20, &k, &why) == 0);
    memcpy(model, data, 1u << 20);
    size = 1u << 20;
    assert(blkpass_finish(p, size, got, &why) == 0);
    reference("sha256", 65536, want);
    assert(strcmp(got, want) != 0);
    blkpass_free(p);
}

int main(void)
{
    static const struct { const char *md; uint64_t bs; } kinds[] = {
        { "sha256", 65536 }, { "md5", 4096 }, { "sha1", 3000 },
        { "sha512", 1u << 20 },
    };

    srand(19);
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char) rand();
    for (size_t i = 0; i < 100000; i++)    /* zero runs in the data */
        data[N / 2 + i] = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        truncate_then_shuffled(kinds[i].md, kinds[i].bs);
        overwrite_then_truncate(kinds[i].md, kinds[i].bs);
        random_changes(kinds[i].md, kinds[i].bs);
    }
    refusals();
    with_reader();
    with_filler();
    with_known();
    too_scattered();
    fold_dense();
    fold_reordered();
    fold_sparse();
    fold_late_across_a_hole();
    fold_at_settle();
    fold_any_order_below_state();
    printf("blkpass: ok\n");
    return 0;
}
