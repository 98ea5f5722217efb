/* tests/unit/test-vmdk-format.c: sparse header and descriptor rules, one
 * by one: each mutation of a valid header or descriptor must be refused
 * with its own errno and a message naming the rule. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmdk/vmdk.h"

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    abort(); } } while (0)

static struct vmdk_header valid(bool stream)
{
    struct vmdk_header h = {
        .magic = VMDK_MAGIC, .version = stream ? 3 : 1,
        .flags = VMDK_FLAG_NL_TEST | VMDK_FLAG_RGD |
                 (stream ? VMDK_FLAG_COMPRESSED | VMDK_FLAG_MARKERS : 0),
        .capacity = 8192, .grain_size = 128, .desc_offset = 1,
        .desc_size = 20, .gtes_per_gt = 512, .rgd_offset = 21,
        .gd_offset = stream ? VMDK_GD_AT_END : 26, .overhead = 128,
        .nl = { '\n', ' ', '\r', '\n' },
        .compress = stream ? VMDK_COMPRESS_DEFLATE : 0,
    };
    return h;
}

/* Encode h, decode it, expect code and (if code) a message containing
 * 'needle'. */
static void expect(const struct vmdk_header *h, int code, const char *needle)
{
    uint8_t sec[512];
    struct vmdk_header out;
    struct nbdf_err e = { "" };
    vmdk_header_encode(h, sec);
    int r = vmdk_header_decode(sec, &out, &e);
    if (r != code || (code && !strstr(e.msg, needle))) {
        fprintf(stderr, "expected %d \"%s\", got %d \"%s\"\n", code,
                needle ? needle : "", r, e.msg);
        abort();
    }
    if (code == 0)
        CHECK(memcmp(&out, h, sizeof out) == 0);
}

static void test_header_rules(void)
{
    for (int stream = 0; stream < 2; stream++) {
        struct vmdk_header h = valid(stream);
        expect(&h, 0, NULL);
        h = valid(stream), h.magic = 0x12345678;
        expect(&h, -EINVAL, "magic");
        h = valid(stream), h.version = 4;
        expect(&h, -ENOTSUP, "version");
        h = valid(stream), h.version = 0;
        expect(&h, -ENOTSUP, "version");
        h = valid(stream), h.nl[2] = '\n';
        expect(&h, -EINVAL, "newline");
        h = valid(stream), h.nl[2] = '\n', h.flags &= ~VMDK_FLAG_NL_TEST;
        expect(&h, 0, NULL);          /* not flagged: not checked */
        h = valid(stream), h.grain_size = 96;
        expect(&h, -EINVAL, "power of two");
        h = valid(stream), h.grain_size = 4;
        expect(&h, -EINVAL, "grain size");
        h = valid(stream), h.grain_size = 4096;
        expect(&h, -EINVAL, "grain size");
        h = valid(stream), h.capacity = 0;
        expect(&h, -EINVAL, "capacity is 0");
        h = valid(stream), h.capacity = UINT64_MAX;
        expect(&h, -EFBIG, "grains");
        h = valid(stream), h.gtes_per_gt = 0;
        expect(&h, -EINVAL, "grain table");
        h = valid(stream), h.gtes_per_gt = 1024;
        expect(&h, -EINVAL, "grain table");
        h = valid(stream), h.compress = 2;
        expect(&h, -ENOTSUP, "compression algorithm 2");
        h = valid(stream), h.overhead = 0;
        expect(&h, -EINVAL, "overhead");
        h = valid(stream), h.overhead = 1ull << 60;
        expect(&h, -EINVAL, "overhead");
        h = valid(stream), h.desc_offset = 0;
        expect(&h, -ENOTSUP, "no embedded descriptor");
        h = valid(stream), h.desc_size = 0;
        expect(&h, -EINVAL, "size 0");
        h = valid(stream), h.desc_size = 4096;
        expect(&h, -EFBIG, "descriptor of");
        h = valid(stream), h.desc_offset = 120;
        expect(&h, -EINVAL, "not inside the overhead");
        h = valid(stream), h.desc_offset = UINT64_MAX - 5;
        expect(&h, -EINVAL, "not inside the overhead");
    }
    struct vmdk_header h = valid(true);
    h.compress = 0;
    expect(&h, -EINVAL, "compressed-grains flag set");
    h = valid(false), h.compress = 1;
    expect(&h, -EINVAL, "compressed-grains flag clear");
    h = valid(false), h.flags |= VMDK_FLAG_MARKERS;
    expect(&h, -EINVAL, "markers flag set on uncompressed");
    h = valid(false), h.flags |= VMDK_FLAG_COMPRESSED, h.compress = 1;
    expect(&h, -ENOTSUP, "without markers");
    /* monolithicSparse: the grain directory must lie in the overhead. */
    h = valid(false), h.gd_offset = VMDK_GD_AT_END;
    expect(&h, -EINVAL, "grain directory");
    h = valid(false), h.gd_offset = 0;
    expect(&h, -EINVAL, "grain directory");
    h = valid(false), h.gd_offset = 128;
    expect(&h, -EINVAL, "grain directory");
    h = valid(false), h.gd_offset = 10;
    expect(&h, -EINVAL, "overlaps the descriptor");
    /* streamOptimized: any directory offset (qemu writes a real one). */
    h = valid(true), h.gd_offset = 26;
    expect(&h, 0, NULL);
    /* Sizes derived. */
    h = valid(false), h.capacity = 8193;
    CHECK(vmdk_header_grains(&h) == 65);
    CHECK(vmdk_header_gts(&h) == 1);
    CHECK(vmdk_header_grain_bytes(&h) == 65536);
}

#define DESC \
    "# Disk DescriptorFile\n" \
    "version=1\n" \
    "CID=9b757d86\n" \
    "parentCID=ffffffff\n" \
    "createType=\"%s\"\n" \
    "\n" \
    "# Extent description\n" \
    "%s\n" \
    "\n" \
    "#DDB\n" \
    "ddb.adapterType = \"ide\"\n"

static void expect_desc(bool stream, const char *type, const char *extent,
                        const char *extra, int code, const char *needle)
{
    char text[1024];
    struct vmdk_header h = valid(stream);
    struct vmdk_desc d;
    struct nbdf_err e = { "" };
    int n = snprintf(text, sizeof text, DESC, type, extent);
    snprintf(text + n, sizeof text - (size_t) n, "%s", extra);
    int r = vmdk_desc_parse(text, sizeof text, &h, &d, &e);
    if (r != code || (code && !strstr(e.msg, needle))) {
        fprintf(stderr, "desc: expected %d \"%s\", got %d \"%s\"\n", code,
                needle ? needle : "", r, e.msg);
        abort();
    }
    if (code == 0) {
        CHECK(d.cid == 0x9b757d86u && d.extents == 1);
        CHECK(d.extent_sectors == 8192);
        CHECK(strcmp(d.create_type, type) == 0);
        /* The extent's access word, whole (NOACCESS is 8 letters). */
        CHECK(strncmp(d.extent_access, extent, strlen(d.extent_access)) == 0);
        CHECK(extent[strlen(d.extent_access)] == ' ');
    }
}

static void test_desc_rules(void)
{
    const char *ext = "RW 8192 SPARSE \"a.vmdk\"";
    expect_desc(true, "streamOptimized", ext, "", 0, NULL);
    expect_desc(false, "monolithicSparse", ext, "", 0, NULL);
    expect_desc(true, "streamOptimized", "RDONLY 8192 SPARSE \"call-me-stream.vmdk\"",
                "", 0, NULL);
    expect_desc(true, "streamOptimized", "NOACCESS 8192 SPARSE \"a.vmdk\"",
                "", 0, NULL);
    expect_desc(true, "streamOptimized", "RW 8192 SPARSE \"a.vmdk\"\r",
                "", 0, NULL);         /* CRLF text */
    expect_desc(true, "monolithicSparse", ext, "", -EINVAL, "header has markers");
    expect_desc(false, "streamOptimized", ext, "", -EINVAL, "has no markers");
    expect_desc(false, "monolithicFlat", ext, "", -ENOTSUP, "monolithicFlat");
    expect_desc(false, "twoGbMaxExtentSparse", ext, "", -ENOTSUP, "createType");
    expect_desc(true, "streamOptimized", ext, "parentCID=12345678\n", -ENOTSUP,
                "delta disk");
    expect_desc(true, "streamOptimized", ext, "CID=xyz\n", -EINVAL, "CID");
    expect_desc(true, "streamOptimized", "RW 8191 SPARSE \"a.vmdk\"", "",
                -EINVAL, "header capacity 8192");
    expect_desc(true, "streamOptimized", "RW 8192 FLAT \"a.vmdk\" 0", "",
                -EINVAL, "extent type");
    expect_desc(true, "streamOptimized", "# none", "", -EINVAL, "0 extents");
    expect_desc(true, "streamOptimized", ext, "RW 8192 SPARSE \"b.vmdk\"\n",
                -EINVAL, "2 extents");
    expect_desc(true, "streamOptimized", "RW x SPARSE \"a.vmdk\"", "",
                -EINVAL, "without a size");
    expect_desc(true, "streamOptimized", "RW 99999999999999999999999 SPARSE \"a\"",
                "", -EINVAL, "not a number");
    /* No createType at all. */
    struct vmdk_header h = valid(true);
    struct vmdk_desc d;
    struct nbdf_err e = { "" };
    const char *t = "version=1\nRW 8192 SPARSE \"a\"\n";
    CHECK(vmdk_desc_parse(t, strlen(t), &h, &d, &e) == -EINVAL);
    CHECK(strstr(e.msg, "no createType"));
    /* Text stops at the first NUL (the descriptor's padding). */
    char buf[600] = "createType=\"streamOptimized\"\nRW 8192 SPARSE \"a\"\n";
    memcpy(buf + 100, "RW 1 SPARSE \"b\"\n", 16);
    CHECK(vmdk_desc_parse(buf, sizeof buf, &h, &d, &e) == 0);
}

static void count(void *o, const char *msg) { (void) msg; ++*(int *) o; }

static void test_lint(void)
{
    int n = 0;
    struct vmdk_header h = valid(true);
    CHECK(vmdk_lint(&h, count, &n) == 0 && n == 0);
    h.unclean_shutdown = 1;
    h.flags |= 1u << 5;
    h.gd_offset = 26;
    CHECK(vmdk_lint(&h, count, &n) == 3 && n == 3);
}

static void test_inflate(void)
{
    struct vmdk_inflater *z;
    /* zlib.compress(b"hello") */
    static const uint8_t hello[] = { 0x78, 0x9c, 0xcb, 0x48, 0xcd, 0xc9, 0xc9,
                                     0x07, 0x00, 0x06, 0x2c, 0x02, 0x15 };
    uint8_t out[16], bad[sizeof hello];
    CHECK(vmdk_inflater_new(&z) == 0);
    CHECK(vmdk_inflate(z, hello, sizeof hello, out, sizeof out) == 5);
    CHECK(memcmp(out, "hello", 5) == 0);
    CHECK(vmdk_inflate(z, hello, sizeof hello, out, 4) == -EINVAL);
    memcpy(bad, hello, sizeof bad);
    bad[sizeof bad - 1] ^= 1;                       /* Adler-32 */
    CHECK(vmdk_inflate(z, bad, sizeof bad, out, sizeof out) == -EINVAL);
    CHECK(vmdk_inflate(z, hello + 2, sizeof hello - 2, out, sizeof out) == -EINVAL);
    CHECK(vmdk_inflate(z, hello, sizeof hello - 3, out, sizeof out) == -EINVAL);
    vmdk_inflater_free(z);
}

int main(void)
{
    test_header_rules();
    test_desc_rules();
    test_lint();
    test_inflate();
    printf("test-vmdk-format: ok\n");
    return 0;
}
