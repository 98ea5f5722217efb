/* tests/unit/test-vhdx-synth.c: the VHDX synthesizer, read back by two
 * independent readers: qemu-img (check clean, compare equal to the disk,
 * map showing only the allocated blocks), our own stream decoder and our
 * random-access reader (vhdx_image_*).
 * The synthesized file is read in random pieces, as a reader in any order
 * would.  A missing qemu-img is a failure. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx.h"
#include "test-util.h"

#define MiB (1ull << 20)
/* The image's own virtual size (sh() args: dir, file stem): qemu-img 8
 * and later print the protocol node's in "children" too, ahead of it,
 * so a grep of "virtual-size" finds two (qemu 10, Debian 13). */
#define VIRTUAL_SIZE                                                     \
    "qemu-img info -f vhdx --output=json %s/%s.vhdx | /usr/bin/python3 " \
    "-c 'import json, sys; print(json.load(sys.stdin)[\"virtual-size\"])'"

struct disk { const uint8_t *bytes; uint64_t size; uint64_t reads; };

static int read_disk(void *o, uint64_t off, void *buf, size_t len)
{
    struct disk *d = o;
    CHECK(off + len <= d->size && len > 0);
    memcpy(buf, d->bytes + off, len);
    d->reads += len;
    return 0;
}

/* The synthesized file, read in pieces of random size back to front, and
 * again in one piece: the two must agree. */
static uint8_t *synth_file(struct vhdx_synth *s, struct disk *d, size_t *len)
{
    uint64_t size = vhdx_synth_file_size(s);
    uint8_t *f = malloc(size);
    CHECK(f);
    memset(f, 0xCC, size);
    unsigned seed = 5;
    size_t npieces = 0;
    uint64_t *starts = malloc(sizeof *starts * (size / 4096 + 2));
    for (uint64_t off = 0; off < size;) {
        uint64_t n = 1 + rand_r(&seed) % (3 * MiB);
        starts[npieces++] = off;
        off += n;
    }
    starts[npieces] = size;
    /* Read pieces back to front, then front to back again over a copy. */
    for (size_t i = npieces; i-- > 0;) {
        uint64_t a = starts[i], b = starts[i + 1];
        CHECK(vhdx_synth_read(s, a, f + a, b - a, read_disk, d) == (int64_t) (b - a));
    }
    uint8_t *g = malloc(size);
    CHECK(g && vhdx_synth_read(s, 0, g, size, read_disk, d) == (int64_t) size);
    CHECK(memcmp(f, g, size) == 0);                    /* order-free */
    CHECK(vhdx_synth_read(s, size, g, 10, read_disk, d) == 0);
    free(g);
    free(starts);
    *len = size;
    return f;
}

struct got { uint8_t *bytes; uint64_t size; };
static int g_begin(void *o, const struct nbdf_begin *b)
{
    const struct vhdx_info *info = b->info;
    struct got *g = o;
    CHECK(info->meta.disk_size == g->size && !info->meta.has_parent);
    memset(g->bytes, 0, g->size);
    return 0;
}
static int g_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct got *g = o;
    CHECK(off + len <= g->size);
    memcpy(g->bytes + off, buf, len);
    return 0;
}

/* The random-access reader over the file in memory. */
struct mem { const uint8_t *f; size_t len; };
static int mem_read(void *o, void *buf, size_t len, uint64_t off)
{
    const struct mem *m = o;
    if (off > m->len || len > m->len - off)
        return -EINVAL;
    memcpy(buf, m->f + off, len);
    return 0;
}

/* vhdx_image_*: the same disk, read in odd pieces; blocks the
 * synthesizer did not store read as zero without a file read. */
static void image_equals(const uint8_t *f, size_t len, const uint8_t *disk,
                         uint64_t size)
{
    struct mem m = { f, len };
    struct vhdx_image *img;
    struct nbdf_err e = { "" };
    int r = vhdx_image_open(mem_read, &m, len, &img, &e);
    if (r)
        fprintf(stderr, "image: %s\n", e.msg);
    CHECK(r == 0 && vhdx_image_meta(img)->disk_size >= size);
    uint64_t bs = vhdx_image_meta(img)->block_size;
    uint8_t *out = malloc(size);
    for (uint64_t off = 0, n; off < size; off += n) {
        n = 1 + (off * 7919 + 13) % 3000000;
        if (n > size - off)
            n = size - off;
        CHECK(vhdx_image_read(img, out + off, (size_t) n, off) == 0);
    }
    CHECK(memcmp(out, disk, size) == 0);
    for (uint64_t b = 0; b * bs < size; b++) {
        uint64_t n = size - b * bs < bs ? size - b * bs : bs;
        bool zero = true;
        for (uint64_t i = 0; i < n && zero; i++)
            zero = disk[b * bs + i] == 0;
        if (!zero)
            CHECK(vhdx_image_block(img, b) != 0);
    }
    CHECK(vhdx_image_read(img, out, 1, vhdx_image_meta(img)->disk_size) ==
          -EINVAL);
    free(out);
    vhdx_image_free(img);
}

static void decode_equals(const uint8_t *f, size_t len, const uint8_t *disk,
                          uint64_t size)
{
    struct got g = { malloc(size), size };
    memset(g.bytes, 0xEE, size);
    struct nbdf_sink sink = { .begin = g_begin, .data = g_data };
    struct vhdx_stream *s;
    CHECK(vhdx_stream_new(&sink, &g, NULL, &s) == 0);
    int r = vhdx_stream_feed(s, 0, f, len);
    if (r == 0)
        r = vhdx_stream_finish(s);
    if (r)
        fprintf(stderr, "decode: %s\n", vhdx_stream_error(s));
    CHECK(r == 0 && memcmp(g.bytes, disk, size) == 0);
    vhdx_stream_free(s);
    free(g.bytes);
    image_equals(f, len, disk, size);
}

static void small_disk(void)
{
    uint64_t size = 40 * MiB + 512;
    uint8_t *disk = calloc(1, size);
    unsigned seed = 11;
    static const uint8_t guid[17] = "nbdferry-test-01";   /* 16 and the NUL */
    struct vhdx_synth *s;
    struct nbdf_err e;
    CHECK(vhdx_synth_new(size, guid, &s, &e) == 0);
    CHECK(vhdx_synth_block_size(s) == VHDX_SYNTH_BLOCK);
    /* Data in blocks 0, 3 (a partial run), 7-9 (one long run), the last. */
    const struct { uint64_t off, len; } runs[] = {
        { 0, 4096 }, { 6 * MiB + 1000, 70000 }, { 14 * MiB - 512, 5 * MiB },
        { size - 512, 512 } };
    for (size_t i = 0; i < 4; i++) {
        for (uint64_t k = 0; k < runs[i].len; k++)
            disk[runs[i].off + k] = (uint8_t) rand_r(&seed) | 1;
        CHECK(vhdx_synth_allocate(s, runs[i].off, runs[i].len) == 0);
    }
    CHECK(vhdx_synth_seal(s) == 0);
    CHECK(vhdx_synth_allocate(s, 0, 1) == -EINVAL);     /* sealed */
    CHECK(vhdx_synth_blocks_allocated(s) == 1 + 1 + 4 + 1);
    struct disk d = { disk, size, 0 };
    size_t len;
    uint8_t *f = synth_file(s, &d, &len);
    CHECK(len == 4 * MiB + 7 * VHDX_SYNTH_BLOCK);       /* BAT: one MiB */

    char path[128];
    snprintf(path, sizeof path, "%s/s.vhdx", dir);
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(f, 1, len, fp) == len && fclose(fp) == 0);
    snprintf(path, sizeof path, "%s/s.raw", dir);
    fp = fopen(path, "wb");
    CHECK(fp && fwrite(disk, 1, size, fp) == size && fclose(fp) == 0);
    sh("qemu-img check -q -f vhdx %s/s.vhdx", dir);
    sh("qemu-img compare -q -f vhdx -F raw %s/s.vhdx %s/s.raw", dir, dir);
    sh("test \"$(" VIRTUAL_SIZE ")\" = %" PRIu64, dir, "s", size);
    decode_equals(f, len, disk, size);
    free(f);
    vhdx_synth_free(s);
    free(disk);
    printf("ok synthesized 40 MiB disk: qemu-img check, compare, our decoder\n");
}

/* A disk of 3 MiB + 1000 bytes (not whole sectors): the VHDX's virtual
 * size is rounded up to 3 MiB + 1024, as qemu-img convert -O vhdx does, the
 * last 24 bytes zeros; the disk is never read past its end. */
static void unaligned_disk(void)
{
    uint64_t size = 3 * MiB + 1000, virt = 3 * MiB + 1024;
    uint8_t *disk = calloc(1, virt);
    unsigned seed = 13;
    for (uint64_t k = 0; k < size; k++)
        disk[k] = (uint8_t) rand_r(&seed) | 1;
    static const uint8_t guid[17] = "nbdferry-test-03";   /* 16 and the NUL */
    struct vhdx_synth *s;
    CHECK(vhdx_synth_new(size, guid, &s, NULL) == 0);
    CHECK(vhdx_synth_allocate(s, 0, size) == 0);
    CHECK(vhdx_synth_seal(s) == 0);
    struct disk d = { disk, size, 0 };
    size_t len;
    uint8_t *f = synth_file(s, &d, &len);
    char path[128];
    snprintf(path, sizeof path, "%s/u.vhdx", dir);
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(f, 1, len, fp) == len && fclose(fp) == 0);
    snprintf(path, sizeof path, "%s/u.raw", dir);
    fp = fopen(path, "wb");
    CHECK(fp && fwrite(disk, 1, virt, fp) == virt && fclose(fp) == 0);
    sh("qemu-img check -q -f vhdx %s/u.vhdx", dir);
    sh("qemu-img compare -q -f vhdx -F raw %s/u.vhdx %s/u.raw", dir, dir);
    sh("test \"$(" VIRTUAL_SIZE ")\" = %" PRIu64, dir, "u", virt);
    decode_equals(f, len, disk, virt);
    free(f);
    vhdx_synth_free(s);
    free(disk);
    printf("ok synthesized disk of 3 MiB + 1000 bytes: virtual size rounded "
           "up, zeros past the end\n");
}

/* A thin 6 TiB disk: blocks grow so that the BAT stays bounded; qemu-img
 * checks it and maps only the allocated blocks as data. */
static uint8_t zeros_or_pattern[8 << 20];
static int big_read(void *o, uint64_t off, void *buf, size_t len)
{
    (void) o; (void) off;
    CHECK(len <= sizeof zeros_or_pattern);
    memset(buf, 0x77, len);
    return 0;
}

static void big_disk(void)
{
    uint64_t size = 6ull << 40;
    static const uint8_t guid[17] = "nbdferry-test-02";   /* 16 and the NUL */
    struct vhdx_synth *s;
    CHECK(vhdx_synth_new(size, guid, &s, NULL) == 0);
    uint32_t bs = vhdx_synth_block_size(s);
    CHECK(bs == 4 * MiB && size / bs <= (2ull << 20));
    CHECK(vhdx_synth_allocate(s, 3ull << 40, 4096) == 0);
    CHECK(vhdx_synth_allocate(s, size - bs, bs) == 0);
    CHECK(vhdx_synth_seal(s) == 0);
    uint64_t flen = vhdx_synth_file_size(s);
    char path[128];
    snprintf(path, sizeof path, "%s/big.vhdx", dir);
    FILE *fp = fopen(path, "wb");
    CHECK(fp);
    uint8_t *buf = malloc(8 * MiB);
    for (uint64_t off = 0; off < flen; off += 8 * MiB) {
        int64_t n = vhdx_synth_read(s, off, buf, 8 * MiB, big_read, NULL);
        CHECK(n > 0 && fwrite(buf, 1, (size_t) n, fp) == (size_t) n);
    }
    CHECK(fclose(fp) == 0);
    free(buf);
    sh("qemu-img check -q -f vhdx %s/big.vhdx", dir);
    /* qemu's VHDX driver has no block status (map says all data), so
     * read through it: the pattern where allocated, zeros elsewhere. */
    sh("qemu-io -f vhdx -r -c 'read -P 0x77 %llu %u' -c 'read -P 0 %llu 1M' "
       "-c 'read -P 0 0 1M' -c 'read -P 0x77 %llu %u' %s/big.vhdx | "
       "grep -c 'Pattern verification failed' | grep -qx 0",
       3ull << 40, bs, (3ull << 40) + bs, (unsigned long long) (size - bs), bs,
       dir);
    sh("qemu-io -f vhdx -r -c 'read -P 0x77 %llu 4k' %s/big.vhdx 2>&1 | "
       "grep -q 'Pattern verification failed'", 1ull << 40, dir);  /* a hole */
    vhdx_synth_free(s);
    printf("ok synthesized thin 6 TiB disk: %u MiB blocks, %" PRIu64 " bytes\n",
           bs >> 20, flen);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    snprintf(dir, sizeof dir, "/tmp/vhdx-synth.XXXXXX");
    CHECK(mkdtemp(dir));
    if (system("qemu-img --version >/dev/null") != 0) {
        fprintf(stderr, "qemu-img is needed (qemu-utils)\n");
        return 1;
    }
    struct vhdx_synth *s;
    struct nbdf_err e = { "" };
    CHECK(vhdx_synth_new(0, (const uint8_t *) "0123456789abcdef", &s, &e) == -EINVAL);
    CHECK(strstr(e.msg, "1 byte to 64 TiB"));
    CHECK(vhdx_synth_new(65ull << 40, (const uint8_t *) "0123456789abcdef", &s, &e) == -EINVAL);
    small_disk();
    unaligned_disk();
    big_disk();
    sh("rm -rf %s", dir);
    return 0;
}
