/* tests/unit/vhd-util.c: fixtures, digests and a memory disk sink. */
#undef NDEBUG
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "tests/unit/vhd-util.h"

static const char *fixture_dir(void)
{
    const char *d = getenv("NBDFERRY_VHD_FIXTURES");
    return d && *d ? d : VHD_FIXTURE_DIR;
}

void vt_load_fixture(const char *name, uint8_t **buf, size_t *len)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "xz -dc '%s/%s.xz'", fixture_dir(), name);
    FILE *p = popen(cmd, "r");
    CHECK(p);
    size_t cap = 1 << 20, n = 0;
    uint8_t *b = malloc(cap);
    CHECK(b);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            b = realloc(b, cap);
            CHECK(b);
        }
        size_t r = fread(b + n, 1, cap - n, p);
        if (r == 0)
            break;
        n += r;
    }
    int st = pclose(p);
    if (st != 0 || n == 0) {
        fprintf(stderr, "cannot decompress fixture %s (%s)\n", name, cmd);
        abort();
    }
    *buf = b;
    *len = n;
}

void vt_sha256(const void *buf, size_t len, char out[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    CHECK(ctx);
    CHECK(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1);
    CHECK(EVP_DigestUpdate(ctx, buf, len) == 1);
    CHECK(EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen == 32);
    EVP_MD_CTX_free(ctx);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

/* From tests/fixtures/vhd/README.md. */
static const struct { const char *name, *sha; } expected[] = {
    { "qemu-dyn-10m.raw", "9ee0e52708d59b1a9b24edeef15e05bdb672eefca5d8282530ac7828d96d0558" },
    { "qemu-dyn-10m.vhd", "a0fadc5f7c2f2863d318e72d79bc24411b387040930aaa01a7efde8a378b8a7d" },
    { "tap-diff-64m.raw", "5078c01df7148d118cd10b25b2e686eb05f336b684ebc84a4dc18df35a709c14" },
    { "tap-diff-64m.vhd", "c9ed9451647a8d4dfc1df4561051308f69f6912c41190bed3f02eef591405815" },
    { "tap-dyn-64m.raw", "fde1cce37ce5c6cc62462a9647f5b0ab8351afb97f46614020f304efca20700e" },
    { "tap-dyn-64m.vhd", "5e4ddc69cb49b8b4407fd7dd124ca7c88a7fa0d0c947a34a40b9f7827190dc37" },
    { "tap-fixed-8m.raw", "136994e4eb8fe10f014ecdde33b3d85b8b09c21dda2d072f433bce9fc6e5c687" },
    { "tap-fixed-8m.vhd", "c249e8b3d265fc05269e96be1b77a1f66ec83988d1f88e0b2b9aad0ae8aa107f" },
    { "vhdtool-delta-64m.vhd", "d4287537163d84d6dfd404cf0857f072db2f6a7f9037f1bc465556b85f8351db" },
    { "vhdtool-raw-100m3s.raw", "e7869e441d63678750ce6e55f9a0a5af2d1564f4891f861cff4f92e0b8932f9e" },
    { "vhdtool-raw-100m3s.vhd", "e59c87323cf9bf4aada7c1805c9e39bcb77be10f4ac37f6c6ed9f03bfca59d7f" },
};

const char *vt_expected_sha(const char *name)
{
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        if (strcmp(expected[i].name, name) == 0)
            return expected[i].sha;
    return NULL;
}

/* ---- memory disk sink ------------------------------------------------------ */

static void disk_bounds(struct vt_disk *d, uint64_t off, uint64_t len)
{
    CHECK(d->began);
    CHECK(len > 0);
    CHECK(off + len <= d->cap);
    if (d->kind != VHD_FIXED)
        CHECK(off + len <= d->vsize);
    if (off + len > d->high)
        d->high = off + len;
}

static int disk_begin(void *opaque, const struct nbdf_begin *b)
{
    struct vt_disk *d = opaque;
    enum vhd_kind kind = (enum vhd_kind) b->kind;
    uint64_t size = b->size;
    CHECK(b->overlay == (kind == VHD_DIFF));
    CHECK(!d->began);
    CHECK(kind == VHD_FIXED ? size == 0 : size > 0 && size <= d->cap);
    d->began = true;
    d->kind = kind;
    d->vsize = size;
    if (kind != VHD_DIFF)
        memset(d->buf, 0, d->cap);
    return 0;
}

static int disk_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    struct vt_disk *d = opaque;
    disk_bounds(d, off, len);
    if (d->fail_after && ++d->data_calls >= (uint64_t) d->fail_after)
        return -EIO;
    if (!d->fail_after)
        d->data_calls++;
    d->data_bytes += len;
    memcpy(d->buf + off, buf, len);
    return 0;
}

static int disk_zero(void *opaque, uint64_t off, uint64_t len)
{
    struct vt_disk *d = opaque;
    disk_bounds(d, off, len);
    d->zero_calls++;
    d->zero_bytes += len;
    memset(d->buf + off, 0, len);
    return 0;
}

const struct nbdf_sink vt_disk_sink = { .begin = disk_begin,
                                        .data = disk_data,
                                        .zero = disk_zero };

uint64_t vt_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* ---- image API helpers ----------------------------------------------------- */

int vt_image_parse(const uint8_t *file, size_t len, struct vhd_image **out,
                   struct nbdf_err *err)
{
    struct vhd_image *img;
    if (len < 512) {
        snprintf(err->msg, sizeof err->msg, "file shorter than a footer");
        return -EINVAL;
    }
    int r = vhd_image_new(file + len - 512, len, &img, err);
    if (r < 0)
        return r;
    uint64_t off;
    size_t n;
    while ((r = vhd_image_next(img, &off, &n)) > 0) {
        CHECK(off + n <= len);
        if ((r = vhd_image_supply(img, file + off, err)) < 0)
            break;
    }
    if (r < 0) {
        vhd_image_free(img);
        return r;
    }
    *out = img;
    return 0;
}

void vt_image_decode(const struct vhd_image *img, const uint8_t *file,
                     uint8_t *disk)
{
    uint64_t size = vhd_image_size(img), off = 0;
    while (off < size) {
        struct vhd_place p;
        CHECK(vhd_image_lookup(img, off, NULL, &p) == 0);
        if (p.src == VHD_SRC_BITMAP)
            CHECK(vhd_image_lookup(img, off, file + p.file_off, &p) == 0);
        CHECK(p.len > 0 && off + p.len <= size);
        if (p.src == VHD_SRC_FILE)
            memcpy(disk + off, file + p.file_off, p.len);
        else if (p.src == VHD_SRC_ZERO)
            memset(disk + off, 0, p.len);
        else
            CHECK(p.src == VHD_SRC_PARENT);
        off += p.len;
    }
}
