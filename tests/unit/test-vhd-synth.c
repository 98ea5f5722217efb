/* tests/unit/test-vhd-synth.c: synthesize a dynamic VHD from a memory disk,
 * read it back in odd pieces, parse it with the image API and decode it
 * with the stream decoder: the bytes must round-trip.  Also the size limit
 * and the layout formula. */
#undef NDEBUG
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhd-util.h"

#define MiB (1ull << 20)
#define BLK (2 * MiB)

struct mem {
    const uint8_t *disk;
    uint64_t size;
    uint64_t calls;
};

static int mem_read(void *opaque, uint64_t off, void *buf, size_t len)
{
    struct mem *m = opaque;
    CHECK(len > 0 && off + len <= m->size);
    memcpy(buf, m->disk + off, len);
    m->calls++;
    return 0;
}

static int fail_read(void *opaque, uint64_t off, void *buf, size_t len)
{
    return -EIO;
}

static const uint8_t uuid[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                  14, 15, 16 };

/* Whole synthesized file, read in pieces of varying size. */
static uint8_t *synth_all(struct vhd_synth *sy, struct mem *m, uint64_t *len,
                          uint64_t *rng)
{
    uint64_t fsz = vhd_synth_file_size(sy), off = 0;
    uint8_t *f = malloc(fsz);
    CHECK(f);
    while (off < fsz) {
        size_t want = 1 + vt_rand(rng) % (3 * MiB);
        int64_t n = vhd_synth_read(sy, off, f + off, want, mem_read, m);
        CHECK(n > 0 && (uint64_t) n <= want && off + n <= fsz);
        off += n;
    }
    CHECK(vhd_synth_read(sy, fsz, f, 10, mem_read, m) == 0);
    *len = fsz;
    return f;
}

static void round_trip(uint64_t disk_size, unsigned alloc_pct, uint64_t seed)
{
    uint64_t rng = seed;
    uint64_t vsize = (disk_size + 511) / 512 * 512;
    uint8_t *disk = calloc(1, vsize);
    uint8_t *expect = calloc(1, vsize);
    CHECK(disk && expect);
    struct vhd_synth *sy;
    struct nbdf_err e = { "" };
    CHECK(vhd_synth_new(disk_size, uuid, 12345, &sy, &e) == 0);
    uint64_t nblocks = (vsize + BLK - 1) / BLK, nalloc = 0;
    for (uint64_t b = 0; b < nblocks; b++) {
        if (vt_rand(&rng) % 100 >= alloc_pct)
            continue;
        uint64_t start = b * BLK, end = start + BLK < disk_size ? start + BLK
                                                                : disk_size;
        /* a sector of data somewhere in the block, the rest zero */
        uint64_t at = start + vt_rand(&rng) % (end - start);
        for (uint64_t k = at; k < end && k < at + 700; k++)
            disk[k] = expect[k] = 1 + (k * 7) % 251;
        CHECK(vhd_synth_allocate(sy, at, 1) == 0);
        nalloc++;
    }
    /* An allocation map wider than data: a whole-range mark of block 0. */
    CHECK(vhd_synth_allocate(sy, 0, vsize + 1) == -EINVAL);
    CHECK(vhd_synth_seal(sy) == 0);
    CHECK(vhd_synth_allocate(sy, 0, 1) == -EINVAL);     /* sealed */
    uint64_t bat = (4 * nblocks + 511) / 512 * 512;
    CHECK(vhd_synth_file_size(sy) ==
          512 + 1024 + bat + nalloc * (512 + BLK) + 512);

    struct mem m = { disk, disk_size, 0 };
    uint64_t flen;
    uint8_t *f = synth_all(sy, &m, &flen, &rng);

    /* valid per the image parser, no warnings about geometry */
    struct vhd_image *img;
    if (vt_image_parse(f, flen, &img, &e) < 0) {
        fprintf(stderr, "synthesized file invalid: %s\n", e.msg);
        abort();
    }
    CHECK(vhd_image_kind(img) == VHD_DYNAMIC);
    CHECK(vhd_image_size(img) == vsize);
    CHECK(vhd_image_allocated(img) == nalloc);
    CHECK(memcmp(vhd_image_footer(img)->creator_app, "win ", 4) == 0);
    CHECK(memcmp(vhd_image_footer(img)->uuid, uuid, 16) == 0);
    CHECK(vhd_lint(vhd_image_footer(img), vhd_image_header(img), NULL, NULL)
          == 0);
    uint8_t *viaimg = calloc(1, vsize);
    vt_image_decode(img, f, viaimg);
    CHECK(memcmp(viaimg, expect, vsize) == 0);
    vhd_image_free(img);

    /* stream decode in odd pieces */
    struct vt_disk d = { .cap = vsize };
    d.buf = malloc(vsize);
    struct vhd_stream *s;
    CHECK(vhd_stream_new(&vt_disk_sink, &d, &s) == 0);
    for (uint64_t off = 0; off < flen; ) {
        size_t n = 1 + vt_rand(&rng) % 70000;
        if (n > flen - off)
            n = flen - off;
        CHECK(vhd_stream_feed(s, off, f + off, n) == 0);
        off += n;
    }
    CHECK(vhd_stream_finish(s) == 0);
    CHECK(d.kind == VHD_DYNAMIC && d.vsize == vsize);
    char a[65], b[65];
    vt_sha256(d.buf, vsize, a);
    vt_sha256(expect, vsize, b);
    printf("synth %llu bytes, %llu/%llu blocks: file %llu, sha %s\n",
           (unsigned long long) disk_size, (unsigned long long) nalloc,
           (unsigned long long) nblocks, (unsigned long long) flen, a);
    CHECK(strcmp(a, b) == 0);
    vhd_stream_free(s);

    /* read errors propagate */
    if (nalloc) {
        uint8_t tmp[4096];
        uint64_t first = 512 + 1024 + bat + 512;
        CHECK(vhd_synth_read(sy, first, tmp, sizeof tmp, fail_read, NULL)
              == -EIO);
    }
    free(d.buf);
    free(viaimg);
    free(f);
    free(disk);
    free(expect);
    vhd_synth_free(sy);
}

static void test_limits(void)
{
    struct vhd_synth *sy;
    struct nbdf_err e = { "" };
    CHECK(vhd_synth_new(0, uuid, 0, &sy, &e) == -EINVAL);
    CHECK(vhd_synth_new(VHD_MAX_SIZE + 1, uuid, 0, &sy, &e) == -EFBIG);
    CHECK(strstr(e.msg, "2040 GiB"));
    printf("limit: %s\n", e.msg);
    /* The largest disk: 1044480 BAT entries, nothing allocated; its stream
     * decodes without emitting anything. */
    CHECK(vhd_synth_new(VHD_MAX_SIZE, uuid, 0, &sy, &e) == 0);
    CHECK(vhd_synth_seal(sy) == 0);
    uint64_t fsz = vhd_synth_file_size(sy);
    CHECK(fsz == 512 + 1024 + 1044480ull * 4 + 512);
    uint8_t *f = malloc(fsz);
    CHECK(vhd_synth_read(sy, 0, f, fsz, fail_read, NULL) == (int64_t) fsz);
    struct vhd_image *img;
    CHECK(vt_image_parse(f, fsz, &img, &e) == 0);
    CHECK(vhd_image_blocks(img) == 1044480 && vhd_image_allocated(img) == 0);
    const struct vhd_footer *ft = vhd_image_footer(img);
    CHECK(ft->cylinders == 65535 && ft->heads == 16 && ft->sectors == 255);
    CHECK(vhd_qemu_size(ft) == VHD_MAX_SIZE && vhd_qemu10_size(ft) == VHD_MAX_SIZE);
    vhd_image_free(img);
    free(f);
    vhd_synth_free(sy);
}

/* A 10 MiB disk is not CHS-exact: qemu reads it whole only because the
 * creator is one it takes current_size from (documented in vhd.h). */
static void test_qemu_size(void)
{
    struct vhd_synth *sy;
    struct nbdf_err e;
    uint8_t f[512];
    CHECK(vhd_synth_new(10 * MiB, uuid, 0, &sy, &e) == 0);
    CHECK(vhd_synth_seal(sy) == 0);
    CHECK(vhd_synth_read(sy, 0, f, 512, fail_read, NULL) == 512);
    struct vhd_footer ft;
    CHECK(vhd_footer_decode(f, &ft, &e) == 0);
    CHECK(ft.current_size == 10 * MiB);
    CHECK(vhd_qemu_size(&ft) == 10 * MiB && vhd_qemu10_size(&ft) == 10 * MiB);
    CHECK((uint64_t) ft.cylinders * ft.heads * ft.sectors * 512 < 10 * MiB);
    vhd_synth_free(sy);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_limits();
    test_qemu_size();
    round_trip(20 * MiB, 50, 1);
    round_trip(10 * MiB + 1536 - 100, 100, 2);   /* not a multiple of 512 */
    round_trip(7 * MiB + 512, 0, 3);             /* nothing allocated */
    round_trip(512, 100, 4);                     /* one sector */
    round_trip(64 * MiB, 30, 5);
    printf("ok\n");
    return 0;
}
