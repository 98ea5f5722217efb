/* tests/unit/test-vhd-stream.c: the stream decoder fed real VHD files (from
 * blktap, vhd-tool, qemu-img) in many piece sizes, with zero runs turned
 * into gaps and holes; the decoded disk's sha256 must equal the fixture
 * README's.  Also decodes each file through vhd_image_lookup.
 *
 * Usage: test-vhd-stream FIXTURE      e.g. tap-dyn-64m
 */
#undef NDEBUG
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhd-util.h"

enum mode {
    DENSE,              /* cat, dd, cp --sparse=never */
    SKIP_ZEROS,         /* cp --sparse=auto, dd conv=sparse: forward jumps */
    PUNCH_AHEAD,        /* cp --sparse=always: punch, then write after it */
    REPUNCH,            /* jump over zeros, write, then punch the jumped range */
    RANDOM_SPLIT,       /* random piece sizes, rsync-like fine zero skipping */
};
static const char *mode_name[] = { "dense", "skip-zeros", "punch-ahead",
                                   "repunch", "random-split" };

struct feeder {
    struct vhd_stream *s;
    const uint8_t *f;
    size_t len;
    uint64_t rng;
};

static void must(int r, struct vhd_stream *s, const char *what)
{
    if (r < 0) {
        fprintf(stderr, "%s failed: %d %s\n", what, r, vhd_stream_error(s));
        abort();
    }
}

static void feed_dense(struct feeder *fd, size_t piece)
{
    for (size_t off = 0; off < fd->len; off += piece) {
        size_t n = fd->len - off < piece ? fd->len - off : piece;
        must(vhd_stream_feed(fd->s, off, fd->f + off, n), fd->s, "feed");
    }
}

/* Zero chunks of 'piece' bytes become a jump, a forward punch, or a jump
 * followed (after the next write) by a backwards re-punch. */
static void feed_sparse(struct feeder *fd, size_t piece, enum mode m)
{
    size_t off = 0, hole_start = 0, hole_len = 0;
    while (off < fd->len) {
        size_t n = fd->len - off < piece ? fd->len - off : piece;
        if (is_zero(fd->f + off, n)) {
            if (m == PUNCH_AHEAD)
                must(vhd_stream_hole(fd->s, off, n), fd->s, "punch");
            if (hole_len == 0)
                hole_start = off;
            hole_len = off + n - hole_start;
        } else {
            must(vhd_stream_feed(fd->s, off, fd->f + off, n), fd->s, "feed");
            if (m == REPUNCH && hole_len) {
                must(vhd_stream_hole(fd->s, hole_start, hole_len), fd->s,
                     "re-punch");
                /* a zero write into the gap is a no-op too */
                static const uint8_t z[512];
                must(vhd_stream_feed(fd->s, hole_start, z,
                                     hole_len < 512 ? hole_len : 512),
                     fd->s, "zero rewrite");
            }
            hole_len = 0;
        }
        off += n;
    }
    if (hole_len)                       /* truncate extends the file */
        must(vhd_stream_hole(fd->s, hole_start, hole_len), fd->s, "tail");
}

/* Random, unaligned pieces; leading/trailing zero sectors of each piece are
 * skipped (rsync --sparse writes only the non-zero middle). */
static void feed_random(struct feeder *fd, size_t piece)
{
    size_t off = 0;
    while (off < fd->len) {
        size_t n = 1 + vt_rand(&fd->rng) % (2 * piece);
        if (n > fd->len - off)
            n = fd->len - off;
        size_t a = off, b = off + n;
        while (a < b && fd->f[a] == 0)
            a++;
        while (b > a && fd->f[b - 1] == 0)
            b--;
        if (b > a)
            must(vhd_stream_feed(fd->s, a, fd->f + a, b - a), fd->s, "feed");
        off += n;
    }
    must(vhd_stream_hole(fd->s, off, 0), fd->s, "empty hole");
    if (vhd_stream_position(fd->s) < fd->len)
        must(vhd_stream_hole(fd->s, vhd_stream_position(fd->s),
                             fd->len - vhd_stream_position(fd->s)),
             fd->s, "truncate");
}

static void run(const uint8_t *file, size_t len, struct vt_disk *d,
                const uint8_t *base, enum mode m, size_t piece,
                const char *want_sha, const char *label)
{
    struct vhd_stream *s;
    CHECK(vhd_stream_new(&vt_disk_sink, d, &s) == 0);
    if (base)
        memcpy(d->buf, base, d->cap);
    else
        memset(d->buf, 0xA5, d->cap);   /* begin() must clear it */
    d->began = false;
    d->high = d->data_bytes = d->zero_bytes = 0;
    struct feeder fd = { s, file, len, 0x9E3779B97F4A7C15ull ^ piece };
    switch (m) {
    case DENSE: feed_dense(&fd, piece); break;
    case RANDOM_SPLIT: feed_random(&fd, piece); break;
    default: feed_sparse(&fd, piece, m); break;
    }
    must(vhd_stream_finish(s), s, "finish");
    CHECK(vhd_stream_position(s) == len);
    uint64_t vsize = vhd_stream_virtual_size(s);
    CHECK(vsize > 0 && vsize <= d->cap && d->high <= vsize);
    char sha[65];
    vt_sha256(d->buf, vsize, sha);
    printf("%-24s %-12s piece %7zu: %s data %llu zero %llu\n", label,
           mode_name[m], piece, sha, (unsigned long long) d->data_bytes,
           (unsigned long long) d->zero_bytes);
    if (strcmp(sha, want_sha) != 0) {
        fprintf(stderr, "sha mismatch: want %s\n", want_sha);
        abort();
    }
    vhd_stream_free(s);
}

static void load_checked(const char *name, uint8_t **buf, size_t *len)
{
    char sha[65];
    vt_load_fixture(name, buf, len);
    vt_sha256(*buf, *len, sha);
    const char *want = vt_expected_sha(name);
    CHECK(want && strcmp(sha, want) == 0);
}

/* Random-access decode through vhd_image_lookup must agree too. */
static void check_image_decode(const uint8_t *file, size_t len,
                               const uint8_t *base, size_t cap,
                               const char *want_sha)
{
    struct vhd_image *img;
    struct nbdf_err e = { "" };
    if (vt_image_parse(file, len, &img, &e) < 0) {
        fprintf(stderr, "image parse: %s\n", e.msg);
        abort();
    }
    uint64_t size = vhd_image_size(img);
    CHECK(size <= cap);
    uint8_t *disk = calloc(1, cap);
    CHECK(disk);
    if (base)
        memcpy(disk, base, cap);
    vt_image_decode(img, file, disk);
    char sha[65];
    vt_sha256(disk, size, sha);
    printf("%-24s image lookup: %s\n", "", sha);
    CHECK(strcmp(sha, want_sha) == 0);
    free(disk);
    vhd_image_free(img);
}

struct fixture {
    const char *vhd, *base_raw, *want_raw;
};
static const struct fixture fixtures[] = {
    { "tap-dyn-64m.vhd", NULL, "tap-dyn-64m.raw" },
    { "tap-diff-64m.vhd", "tap-dyn-64m.raw", "tap-diff-64m.raw" },
    { "vhdtool-delta-64m.vhd", "tap-dyn-64m.raw", "tap-diff-64m.raw" },
    { "vhdtool-raw-100m3s.vhd", NULL, "vhdtool-raw-100m3s.raw" },
    { "tap-fixed-8m.vhd", NULL, "tap-fixed-8m.raw" },
    { "qemu-dyn-10m.vhd", NULL, "qemu-dyn-10m.raw" },
};

/* Limits refuse at the first sector, before begin() (dynamic and
 * differencing) or before any byte past the limit (fixed). */
static int feed_limited(const uint8_t *file, size_t len, struct vt_disk *d,
                        uint64_t max, bool fixed_ok)
{
    struct vhd_stream *s;
    CHECK(vhd_stream_new(&vt_disk_sink, d, &s) == 0);
    vhd_stream_limit(s, max, fixed_ok);
    d->began = false;
    d->high = 0;
    int r = vhd_stream_feed(s, 0, file, len);
    if (r == 0)
        r = vhd_stream_finish(s);
    CHECK(r == 0 || vhd_stream_error(s)[0]);
    vhd_stream_free(s);
    return r;
}

static void test_limits(const uint8_t *file, size_t len, struct vt_disk *d,
                        const char *label)
{
    bool fixed = strstr(label, "fixed") != NULL;
    int r = feed_limited(file, len, d, VHD_MAX_SIZE, false);
    CHECK(fixed ? r == -EMEDIUMTYPE && !d->began : r == 0);
    r = feed_limited(file, len, d, 1024, true);
    CHECK(r == -ENOSPC && d->high <= 1024);
    CHECK(fixed || !d->began);
    uint8_t junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t) (i * 131 + 7);
    CHECK(feed_limited(junk, sizeof junk, d, VHD_MAX_SIZE, false) ==
          -EMEDIUMTYPE && !d->began);
    /* Even a mount that takes fixed VHDs refuses another format's
     * header in the first sector, before begin(). */
    static const char *const heads[] = { "QFI\xfb", "KDMV", "vhdxfile" };
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        memcpy(junk, heads[i], strlen(heads[i]));
        CHECK(feed_limited(junk, sizeof junk, d, VHD_MAX_SIZE, true) ==
              -EMEDIUMTYPE && !d->began);
    }
    memcpy(junk + 257, "ustar", 5);
    junk[0] = 0;
    CHECK(feed_limited(junk, sizeof junk, d, VHD_MAX_SIZE, true) ==
          -EMEDIUMTYPE && !d->began);
    printf("%-24s limits: refused before begin\n", label);
}

static void test_fixture(const struct fixture *fx)
{
    uint8_t *file, *want, *base = NULL;
    size_t len, wlen, blen = 0;
    load_checked(fx->vhd, &file, &len);
    load_checked(fx->want_raw, &want, &wlen);
    if (fx->base_raw)
        load_checked(fx->base_raw, &base, &blen);
    const char *want_sha = vt_expected_sha(fx->want_raw);
    struct vt_disk d = { .cap = wlen };
    d.buf = malloc(d.cap);
    CHECK(d.buf);

    test_limits(file, len, &d, fx->vhd);

    static const size_t pieces[] = { 1, 512, 4080, 4097, 131072, 1 << 20 };
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        run(file, len, &d, base, DENSE, pieces[i], want_sha, fx->vhd);
    run(file, len, &d, base, SKIP_ZEROS, 4096, want_sha, fx->vhd);
    run(file, len, &d, base, SKIP_ZEROS, 512, want_sha, fx->vhd);
    run(file, len, &d, base, PUNCH_AHEAD, 4096, want_sha, fx->vhd);
    run(file, len, &d, base, REPUNCH, 4096, want_sha, fx->vhd);
    run(file, len, &d, base, REPUNCH, 65536, want_sha, fx->vhd);
    run(file, len, &d, base, RANDOM_SPLIT, 3000, want_sha, fx->vhd);
    run(file, len, &d, base, RANDOM_SPLIT, 300000, want_sha, fx->vhd);
    check_image_decode(file, len, base, wlen, want_sha);

    /* Differencing over garbage: clear bits must keep the garbage; the
     * image-lookup decode is the reference. */
    if (base) {
        uint8_t *junk = malloc(wlen), *ref = malloc(wlen);
        CHECK(junk && ref);
        for (size_t k = 0; k < wlen; k++)
            junk[k] = 0x5A ^ (k >> 9);
        memcpy(ref, junk, wlen);
        struct vhd_image *img;
        struct nbdf_err e;
        CHECK(vt_image_parse(file, len, &img, &e) == 0);
        vt_image_decode(img, file, ref);
        vhd_image_free(img);
        char ref_sha[65];
        vt_sha256(ref, wlen, ref_sha);
        CHECK(strcmp(ref_sha, want_sha) != 0);   /* garbage survived */
        run(file, len, &d, junk, SKIP_ZEROS, 4096, ref_sha, "diff-over-junk");
        run(file, len, &d, junk, DENSE, 4097, ref_sha, "diff-over-junk");
        free(junk);
        free(ref);
    }
    free(d.buf);
    free(file);
    free(want);
    free(base);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        if (strncmp(fixtures[i].vhd, argv[1], strlen(argv[1])) == 0 &&
            fixtures[i].vhd[strlen(argv[1])] == '.') {
            test_fixture(&fixtures[i]);
            printf("ok\n");
            return 0;
        }
    }
    fprintf(stderr, "unknown fixture %s\n", argv[1]);
    return 2;
}
