/* tests/unit/test-imagefile-read.c: the one image reader (imagefile/) over
 * every format's table.
 *
 * Each image is made here by qemu-img (and qemu-io for an overlay's own
 * data) from one raw disk of random data and zero runs, or taken from the
 * VHD fixtures: a dynamic and a fixed VHD, the fixtures' differencing
 * chain (child and parent found through its locator), a streamOptimized
 * VMDK (compressed grains) and a monolithicSparse one, a dynamic VHDX, a
 * qcow2 and a compressed one, and a qcow2 overlay over a compressed qcow2
 * backing file.  Each is read whole, in pieces of odd sizes at odd
 * offsets, and its extents walked, against what qemu-img converts it to:
 * the same bytes, and every range called zero reads zero.  Then the chain
 * rules: a qcow2 chain that loops and a VHD whose parent is missing are
 * refused with their messages.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/format.h"
#include "imagefile/imagefile.h"
#include "qcow2/qcow2.h"
#include "vhd/vhd.h"
#include "vhdx/vhdx.h"
#include "vmdk/vmdk.h"

#define MiB (1024 * 1024)
#define RAW_SIZE (6 * MiB + 12800)      /* whole sectors, no whole block */

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    abort(); } } while (0)

static char dir[] = "/tmp/imagefile-test.XXXXXX";

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        abort();
    }
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static uint8_t *load(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    CHECK(fd >= 0 && fstat(fd, &st) == 0);
    uint8_t *b = malloc(st.st_size ? st.st_size : 1);
    CHECK(b && imagefile_pread(fd, b, st.st_size, 0) == 0);
    close(fd);
    *len = st.st_size;
    return b;
}

/* The raw source in 64 KiB runs: random, zero, text (which compresses:
 * qemu-img -c stores only clusters that shrink), and zeros over [2 MiB,
 * 4 MiB): a whole VHD block. */
static void make_raw(const char *path)
{
    uint8_t *b = calloc(1, RAW_SIZE);
    uint64_t s = 42;
    CHECK(b);
    for (size_t off = 0; off < RAW_SIZE; off += 65536) {
        if (off >= 2 * MiB && off < 4 * MiB)
            continue;
        for (size_t i = off; i < off + 65536 && i < RAW_SIZE; i++)
            if ((off / 65536) % 3 == 0)
                b[i] = (uint8_t) rnd(&s);
            else if ((off / 65536) % 3 == 2)
                b[i] = "imagefile test, a line of text\n"[i % 32];
    }
    FILE *f = fopen(path, "w");
    CHECK(f && fwrite(b, 1, RAW_SIZE, f) == RAW_SIZE && fclose(f) == 0);
    free(b);
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* f's disk against want (f->size bytes): whole, in odd pieces, and its
 * extents (zero ones read zero; at least one of each kind when asked). */
static void check_reads(struct imagefile *f, const uint8_t *want,
                        bool expect_zero)
{
    struct nbdf_err e;
    uint8_t *got = malloc(f->size);
    uint64_t s = 7, zeros = 0, data = 0;

    CHECK(got);
    CHECK(imagefile_read(f, 0, got, f->size, &e) == 0);
    CHECK(memcmp(got, want, f->size) == 0);
    for (int i = 0; i < 200; i++) {
        uint64_t off = rnd(&s) % f->size;
        size_t n = 1 + rnd(&s) % 300000;
        if (n > f->size - off)
            n = f->size - off;
        memset(got, 0xee, n);
        CHECK(imagefile_read(f, off, got, n, &e) == 0);
        CHECK(memcmp(got, want + off, n) == 0);
    }
    for (uint64_t off = 0; off < f->size;) {
        uint64_t len;
        bool z;
        CHECK(imagefile_extent(f, off, f->size - off, &len, &z, &e) == 0);
        CHECK(len >= 1 && len <= f->size - off);
        CHECK(!z || all_zero(want + off, len));
        *(z ? &zeros : &data) += len;
        off += len;
    }
    CHECK(zeros + data == f->size);
    CHECK(data > 0 && (!expect_zero || zeros > 0));
    free(got);
}

/* Open path as fmt with its chain, check it against qemu-img's raw. */
static void check_image(const char *name, const struct nbdf_format *fmt,
                        const char *qemu_fmt, bool expect_zero,
                        bool compressed)
{
    char path[512], raw[512];
    struct imagefile *f;
    struct nbdf_err e;
    size_t len;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(raw, sizeof raw, "%s/%s.back.raw", dir, name);
    sh("qemu-img convert -q -f %s -O raw '%s' '%s'", qemu_fmt, path, raw);
    uint8_t *want = load(raw, &len);
    int r = imagefile_open(path, fmt, false, &f, &e);
    if (r < 0)
        fprintf(stderr, "%s: %s (%s)\n", name, e.msg, strerror(-r));
    CHECK(r == 0);
    r = imagefile_open_chain(f, NULL, 0, &e);
    if (r < 0)
        fprintf(stderr, "%s: %s\n", name, e.msg);
    CHECK(r == 0);
    CHECK(f->size == len);
    check_reads(f, want, expect_zero);
    struct imagefile *bottom = f;
    while (bottom->backing)
        bottom = bottom->backing;
    CHECK(!compressed || bottom->unit_off != UINT64_MAX);   /* one decoded */
    printf("ok: %s (%s, %" PRIu64 " bytes, %u backing level%s)\n", name,
           fmt->name, f->size, imagefile_chain_depth(f),
           imagefile_chain_depth(f) == 1 ? "" : "s");
    imagefile_free(f);
    free(want);
}

/* The fixtures' differencing VHD over its parent, found by its locator
 * ("./tap-dyn-64m.vhd", beside it). */
static void check_vhd_chain(void)
{
    char child[512], want_path[512];
    struct imagefile *f;
    struct nbdf_err e;
    size_t len;

    sh("xz -dc '%s/tap-dyn-64m.vhd.xz' > '%s/tap-dyn-64m.vhd'",
       VHD_FIXTURE_DIR, dir);
    sh("xz -dc '%s/tap-diff-64m.vhd.xz' > '%s/tap-diff-64m.vhd'",
       VHD_FIXTURE_DIR, dir);
    sh("xz -dc '%s/tap-diff-64m.raw.xz' > '%s/tap-diff-64m.raw'",
       VHD_FIXTURE_DIR, dir);
    snprintf(child, sizeof child, "%s/tap-diff-64m.vhd", dir);
    snprintf(want_path, sizeof want_path, "%s/tap-diff-64m.raw", dir);
    uint8_t *want = load(want_path, &len);
    CHECK(imagefile_open(child, &vhd_format, false, &f, &e) == 0);
    CHECK(imagefile_open_chain(f, NULL, 0, &e) == 0);
    CHECK(imagefile_chain_depth(f) == 1 && f->backing && f->backing->fmt);
    CHECK(f->size == len);
    check_reads(f, want, true);
    imagefile_free(f);
    free(want);
    printf("ok: VHD differencing chain\n");

    /* Its parent gone: refused, naming what was tried. */
    sh("mv '%s/tap-dyn-64m.vhd' '%s/moved.vhd'", dir, dir);
    CHECK(imagefile_open(child, &vhd_format, false, &f, &e) == 0);
    CHECK(imagefile_open_chain(f, NULL, 0, &e) == -ENOENT);
    CHECK(strstr(e.msg, "cannot find the parent") &&
          strstr(e.msg, "tap-dyn-64m.vhd"));
    imagefile_free(f);
    /* ... unless named (--parent). */
    char moved[512];
    const char *parents[] = { moved };
    snprintf(moved, sizeof moved, "%s/moved.vhd", dir);
    CHECK(imagefile_open(child, &vhd_format, false, &f, &e) == 0);
    CHECK(imagefile_open_chain(f, parents, 1, &e) == 0);
    imagefile_free(f);
    printf("ok: VHD parent missing, then named\n");
}

/* A qcow2 overlay of its own data over a compressed backing file. */
static void make_overlay(void)
{
    sh("qemu-img convert -q -c -f raw -O qcow2 %s/src.raw %s/base-c.qcow2",
       dir, dir);
    sh("qemu-img create -q -f qcow2 -b base-c.qcow2 -F qcow2 %s/top.qcow2",
       dir);
    sh("qemu-io -f qcow2 -c 'write -P 0xab 1M 200k' -c 'write -z 3M 64k' "
       "%s/top.qcow2 > /dev/null", dir);
}

/* top -> mid -> top: a loop, refused by the chain's rule. */
static void check_qcow2_loop(void)
{
    char top[512];
    struct imagefile *f;
    struct nbdf_err e;

    sh("qemu-img create -q -f qcow2 %s/la.qcow2 1M", dir);
    sh("qemu-img create -q -f qcow2 -b la.qcow2 -F qcow2 %s/lb.qcow2", dir);
    sh("qemu-img rebase -q -u -f qcow2 -b lb.qcow2 -F qcow2 %s/la.qcow2", dir);
    snprintf(top, sizeof top, "%s/lb.qcow2", dir);
    CHECK(imagefile_open(top, &qcow2_format, false, &f, &e) == 0);
    CHECK(imagefile_open_chain(f, NULL, 0, &e) == -ELOOP);
    CHECK(strstr(e.msg, "the backing chain loops"));
    imagefile_free(f);
    printf("ok: qcow2 backing loop refused\n");
}

/* A table whose lookup places no bytes, or keeps asking for metadata:
 * the reader refuses it with -EIO and a message instead of looping on
 * the same offset. */
static int stub_new(uint64_t size, void **out, struct nbdf_err *err)
{
    (void) err;
    static uint64_t disk;
    disk = size;
    *out = &disk;
    return 0;
}
static int stub_next(const void *img, uint64_t *off, size_t *len)
{
    (void) img; (void) off; (void) len;
    return 0;
}
static int stub_supply(void *img, const void *buf, struct nbdf_err *err)
{
    (void) img; (void) buf; (void) err;
    return 0;
}
static enum nbdf_place_kind stub_kind;
static int stub_lookup(void *img, uint64_t off, struct nbdf_place *p,
                       struct nbdf_err *err)
{
    (void) img; (void) off; (void) err;
    *p = (struct nbdf_place){ .kind = stub_kind, .len = 0 };
    return 0;
}
static void stub_free(void *img) { (void) img; }
static uint64_t stub_size(const void *img) { return *(const uint64_t *) img; }
static uint64_t stub_unit(const void *img) { (void) img; return 65536; }

static void check_broken_lookup(void)
{
    static const struct nbdf_format stub = {
        .name = "stub", .image_new = stub_new, .image_next = stub_next,
        .image_supply = stub_supply, .image_lookup = stub_lookup,
        .image_free = stub_free, .image_size = stub_size,
        .image_unit = stub_unit,
    };
    char path[512];
    snprintf(path, sizeof path, "%s/src.raw", dir);
    for (int k = 0; k < 2; k++) {
        struct imagefile *f;
        struct nbdf_err e;
        uint8_t buf[4096];
        uint64_t len;
        bool zero;
        stub_kind = k ? NBDF_PLACE_NEED : NBDF_PLACE_FILE;
        CHECK(imagefile_open(path, &stub, false, &f, &e) == 0);
        CHECK(imagefile_read(f, 0, buf, sizeof buf, &e) == -EIO);
        CHECK(strstr(e.msg, k ? "keeps asking" : "placed in no bytes"));
        CHECK(imagefile_extent(f, 0, 1 << 20, &len, &zero, &e) == -EIO);
        imagefile_free(f);
    }
}

int main(void)
{
    CHECK(mkdtemp(dir));
    char raw[512];
    snprintf(raw, sizeof raw, "%s/src.raw", dir);
    make_raw(raw);

    static const struct {
        const char *name, *make;
        const struct nbdf_format *fmt;
        const char *qemu_fmt;
        bool compressed;
    } images[] = {
        { "dyn.vhd", "-O vpc -o subformat=dynamic", &vhd_format, "vpc", 0 },
        { "fixed.vhd", "-O vpc -o subformat=fixed", &vhd_format, "vpc", 0 },
        { "stream.vmdk", "-O vmdk -o subformat=streamOptimized",
          &vmdk_format, "vmdk", 1 },
        { "sparse.vmdk", "-O vmdk -o subformat=monolithicSparse",
          &vmdk_format, "vmdk", 0 },
        { "dyn.vhdx", "-O vhdx -o subformat=dynamic,block_size=1M",
          &vhdx_format, "vhdx", 0 },
        { "plain.qcow2", "-O qcow2", &qcow2_format, "qcow2", 0 },
        { "packed.qcow2", "-c -O qcow2 -o cluster_size=4096", &qcow2_format,
          "qcow2", 1 },
    };
    for (size_t i = 0; i < sizeof images / sizeof images[0]; i++) {
        sh("qemu-img convert -q -f raw %s %s/src.raw %s/%s", images[i].make,
           dir, dir, images[i].name);
        /* A fixed VHD maps no zeros; the others skip the raw's zero runs. */
        check_image(images[i].name, images[i].fmt, images[i].qemu_fmt,
                    strcmp(images[i].name, "fixed.vhd") != 0,
                    images[i].compressed);
    }
    make_overlay();
    check_image("top.qcow2", &qcow2_format, "qcow2", true, true);
    check_vhd_chain();
    check_qcow2_loop();
    check_broken_lookup();
    sh("rm -rf '%s'", dir);
    return 0;
}
