/* tests/unit/vmdk-util.h: what the VMDK unit tests share: the
 * source disk (grains of data, all-zero grains, a half-zero grain, a short
 * last grain), a disk the stream decoder writes into (each byte at most
 * once), decode_ok() with several cuttings and image_ok() through the
 * random-access parser.  Header-only: each test is one executable. */
#ifndef NBDFERRY_VMDK_TEST_UTIL_H
#define NBDFERRY_VMDK_TEST_UTIL_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "vmdk/vmdk.h"
#include "stream-cuts.h"
#include "test-util.h"

/* ---- files and tools ------------------------------------------------------- */

/* 5 MiB + 12800 bytes: grains of random data, all-zero grains, a grain
 * half zero, and a short last grain. */
#define RAW_SIZE ((5u << 20) + 12800u)
static uint8_t *make_raw(void)
{
    uint8_t *raw = calloc(1, RAW_SIZE);
    uint64_t x = 42;
    for (size_t g = 0; g * 65536 < RAW_SIZE; g++) {
        if (g % 5 == 2 || g == 7 || g == 8)
            continue;                               /* zero grains */
        size_t end = (g + 1) * 65536 < RAW_SIZE ? (g + 1) * 65536 : RAW_SIZE;
        size_t start = g * 65536 + (g == 11 ? 32768 : 0);
        for (size_t i = start; i < end; i += 8) {
            uint64_t v = rnd(&x);
            memcpy(raw + i, &v, end - i < 8 ? end - i : 8);
        }
    }
    save("src.raw", raw, RAW_SIZE);
    return raw;
}


/* ---- a disk the decoder writes into ------------------------------------ */

struct disk {
    uint8_t *buf;
    uint64_t cap;
    bool began;
    enum vmdk_kind kind;
    uint64_t capacity;
    uint64_t calls, bytes;
    uint8_t *written;                               /* a byte per disk byte */
    int fail_after;                                 /* >0: data() -EIO then */
};

static int d_begin(void *o, const struct nbdf_begin *b)
{
    struct disk *d = o;
    enum vmdk_kind kind = (enum vmdk_kind) b->kind;
    uint64_t capacity = b->size;
    CHECK(!b->overlay && b->unit == VMDK_SECTOR);
    CHECK(!d->began);
    CHECK(capacity <= d->cap);
    d->began = true;
    d->kind = kind;
    d->capacity = capacity;
    memset(d->buf, 0, capacity);                    /* "replace the disk" */
    return 0;
}

static int d_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct disk *d = o;
    CHECK(d->began && len > 0 && off + len <= d->capacity);
    for (size_t i = 0; i < len; i++)
        CHECK(!d->written[off + i]++);              /* each byte once */
    if (d->fail_after && ++d->calls == (uint64_t) d->fail_after)
        return -EIO;
    memcpy(d->buf + off, buf, len);
    d->bytes += len;
    return 0;
}

static const struct nbdf_sink sink = { .begin = d_begin, .data = d_data };

/* The same through the grain() hook, as the view uses it (inflated here,
 * synchronously, with the library's rules). */
static int d_grain(void *o, const void *unit, const void *cdata, size_t clen)
{
    const struct vmdk_grain *g = unit;
    CHECK(cdata == g->cdata && clen == g->clen);
    static struct vmdk_inflater *z;
    static uint8_t out[1 << 20];
    struct nbdf_err e;
    if (!z)
        CHECK(vmdk_inflater_new(&z) == 0);
    CHECK(g->grain_bytes <= sizeof out && g->disk_off < g->capacity);
    int64_t n = vmdk_grain_inflate(z, g, out, &e);
    if (n < 0)
        return (int) n;
    return d_data(o, g->disk_off, out, (size_t) n);
}
static const struct nbdf_sink sink_g = { .begin = d_begin, .data = d_data,
                                         .compressed = d_grain };

static void disk_init(struct disk *d, uint64_t cap)
{
    memset(d, 0, sizeof *d);
    d->cap = cap;
    d->buf = malloc(cap);
    d->written = calloc(1, cap);
    memset(d->buf, 0xA5, cap);                      /* stale content */
}

static void disk_free(struct disk *d)
{
    free(d->buf);
    free(d->written);
}

/* Feed f[0, len) cut by seed (0: one piece; tests/unit/stream-cuts.h),
 * pieces of 1..maxp bytes.  Returns the first error or finish()'s
 * result. */
CUTS_STREAM(stream_cuts, vmdk);

static int decode(struct vmdk_stream *s, const uint8_t *f, size_t len,
                  uint64_t seed, size_t maxp)
{
    int r = cuts_feed(&stream_cuts, s, f, len, (uint32_t) seed,
                      seed ? (unsigned) maxp : 0);
    return r ? r : vmdk_stream_finish(s);
}

/* Decode a whole file; expect success and the raw disk back. */
static void decode_ok(const char *name, const uint8_t *f, size_t len,
                      const uint8_t *raw, size_t raw_len, enum vmdk_kind kind)
{
    static const size_t maxp[] = { 0, 1 << 20, 4096, 70000, 131072, 7 };
    for (unsigned i = 0; i < sizeof maxp / sizeof *maxp; i++) {
        if (maxp[i] == 7 && len > (8u << 20))
            continue;                               /* 1-byte pieces: small only */
        struct disk d;
        struct vmdk_stream *s;
        disk_init(&d, raw_len + 65536);
        CHECK(vmdk_stream_new(i % 2 ? &sink_g : &sink, &d, &s) == 0);
        int r = decode(s, f, len, i, maxp[i]);
        if (r != 0) {
            fprintf(stderr, "%s cut %u: %d %s\n", name, i, r,
                    vmdk_stream_error(s));
            abort();
        }
        CHECK(d.kind == kind && vmdk_stream_kind(s) == kind);
        CHECK(d.capacity == (raw_len + 511) / 512 * 512);
        CHECK(memcmp(d.buf, raw, raw_len) == 0);
        CHECK(is_zero(d.buf + raw_len, d.capacity - raw_len));
        struct vmdk_stream_stats st;
        vmdk_stream_stats(s, &st);
        if (kind == VMDK_STREAM_OPTIMIZED)         /* qemu-img: no EOS */
            CHECK((st.eos || vmdk_stream_header(s)->gd_offset !=
                   VMDK_GD_AT_END) && st.grains > 0);
        vmdk_stream_free(s);
        disk_free(&d);
    }
    printf("  %s: decoded with %zu cuttings\n", name, sizeof maxp / sizeof *maxp);
}

/* ---- the random-access parser, independent of the stream decoder ------ */

/* Parse f with the image API; decode the disk into out (capacity bytes)
 * through lookups, inflating marker grains.  0 or -errno, e set. */
static int image_decode(const uint8_t *f, size_t len, uint8_t *out,
                        uint64_t *capacity, struct nbdf_err *e)
{
    struct vmdk_image *img;
    static struct vmdk_inflater *z;
    static uint8_t gbuf[1 << 20];
    uint64_t off;
    size_t n;
    int r;

    if (!z)
        CHECK(vmdk_inflater_new(&z) == 0);
    if (len < 512 || (r = vmdk_image_new(f, len, &img, e)) < 0)
        return len < 512 ? -EINVAL : r;
    while ((r = vmdk_image_next(img, &off, &n)) > 0) {
        CHECK(off + n <= len);
        if ((r = vmdk_image_supply(img, f + off, e)) < 0)
            break;
    }
    const struct vmdk_header *h = vmdk_image_header(img);
    *capacity = h->capacity * 512;
    for (uint64_t d = 0; r == 0 && d < *capacity; ) {
        struct vmdk_place p;
        CHECK(vmdk_image_lookup(img, d, &p) == 0 && p.len > 0);
        if (p.src == VMDK_SRC_ZERO)
            memset(out + d, 0, p.len);
        else if (p.src == VMDK_SRC_FILE)
            memcpy(out + d, f + p.file_off, p.len);
        else {
            uint64_t lba;
            uint32_t size;
            CHECK(p.file_off + 12 <= len);
            vmdk_marker_decode(f + p.file_off, &lba, &size);
            CHECK(lba * 512 == d && size > 0 && p.file_off + 12 + size <= len);
            struct vmdk_grain g;
            vmdk_grain_init(&g, h, lba, p.file_off, f + p.file_off + 12, size);
            memset(gbuf, 0, g.grain_bytes);
            int64_t k = vmdk_grain_inflate(z, &g, gbuf, e);
            CHECK(k >= 0);
            memcpy(out + d, gbuf, p.len);
        }
        d += p.len;
    }
    vmdk_image_free(img);
    return r;
}

static void image_ok(const char *name, const uint8_t *f, size_t len,
                     const uint8_t *raw, size_t raw_len)
{
    struct nbdf_err e = { "" };
    uint64_t cap = 0;
    uint8_t *out = malloc(raw_len + 65536);
    int r = image_decode(f, len, out, &cap, &e);
    if (r != 0) {
        fprintf(stderr, "%s: image parse: %d %s\n", name, r, e.msg);
        abort();
    }
    CHECK(cap == (raw_len + 511) / 512 * 512);
    CHECK(memcmp(out, raw, raw_len) == 0 && is_zero(out + raw_len, cap - raw_len));
    free(out);
    printf("  %s: random-access parse agrees\n", name);
}

#endif /* NBDFERRY_VMDK_TEST_UTIL_H */
