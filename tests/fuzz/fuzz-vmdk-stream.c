/* tests/fuzz/fuzz-vmdk-stream.c: libFuzzer target for the VMDK stream
 * decoder.
 *
 * Input: 4 control bytes, then a VMDK file.  The control bytes seed how
 * the file is cut into writes (1 byte to 64 KiB) and which all-zero pieces
 * become forward gaps, holes, or gaps re-punched backwards.  Oracles:
 *   - begin() exactly once, before any data(); data() only inside
 *     [0, capacity), each disk byte at most once;
 *   - every failure names its rule (a non-empty message);
 *   - the cutting does not matter: the same file fed in one piece gives
 *     the same result and, for disks up to 1 MiB, the same bytes;
 *   - monolithicSparse: when the random-access parser accepts the file
 *     too, it reads the same disk (both go through the same tables;
 *     streamOptimized files may legitimately differ, markers against
 *     tables).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "vmdk/vmdk.h"
#include "tests/unit/stream-cuts.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DISK_CAP (1u << 20)

struct sink_state {
    bool began;
    uint64_t capacity;
    uint8_t *disk;                      /* DISK_CAP bytes */
    uint8_t *seen;                      /* a byte per disk byte */
};

static int s_begin(void *o, const struct nbdf_begin *b)
{
    enum vmdk_kind kind = (enum vmdk_kind) b->kind;
    uint64_t capacity = b->size;
    struct sink_state *st = o;
    if (st->began || (kind != VMDK_STREAM_OPTIMIZED &&
                      kind != VMDK_MONOLITHIC_SPARSE) || capacity == 0)
        abort();
    st->began = true;
    st->capacity = capacity;
    uint64_t n = capacity < DISK_CAP ? capacity : DISK_CAP;
    memset(st->disk, 0, n);
    memset(st->seen, 0, n);
    return 0;
}

static int s_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct sink_state *st = o;
    if (!st->began || len == 0 || off + len > st->capacity || off + len < off)
        abort();
    if (off + len <= DISK_CAP) {
        for (size_t i = 0; i < len; i++)
            if (st->seen[off + i]++)
                abort();                /* a disk byte placed twice */
        memcpy(st->disk + off, buf, len);
    }
    return 0;
}

static const struct nbdf_sink sink = { .begin = s_begin, .data = s_data };

CUTS_STREAM(stream_cuts, vmdk);

static int feed(struct vmdk_stream *s, const uint8_t *f, size_t len,
                uint32_t seed)
{
    return cuts_feed(&stream_cuts, s, f, len, seed, 1 + (seed & 0xFFFF));
}

/* Decode f with cutting seed (0: one piece); returns the result. */
static int decode(struct sink_state *st, const uint8_t *f, size_t len,
                  uint32_t seed)
{
    struct vmdk_stream *s;
    st->began = false;
    st->capacity = 0;
    if (vmdk_stream_new(&sink, st, &s) < 0)
        abort();
    int r = seed ? feed(s, f, len, seed)
                 : (len ? vmdk_stream_feed(s, 0, f, len) : 0);
    if (r == 0)
        r = vmdk_stream_finish(s);
    if (r < 0 && !vmdk_stream_error(s)[0])
        abort();                        /* every failure names its rule */
    if (r < 0 && vmdk_stream_finish(s) != r)
        abort();                        /* errors are sticky */
    vmdk_stream_free(s);
    return r;
}

/* The disk as the image API reads a monolithicSparse file, into ref. */
static int image_decode(const uint8_t *f, size_t len, uint8_t *ref,
                        uint64_t *cap)
{
    struct vmdk_image *img;
    struct nbdf_err e;
    uint64_t off;
    size_t n;
    int r;

    if (len < 512 || vmdk_image_new(f, len, &img, &e) < 0)
        return -1;
    while ((r = vmdk_image_next(img, &off, &n)) > 0)
        if (vmdk_image_supply(img, f + off, &e) < 0)
            break;
    *cap = vmdk_image_header(img)->capacity * 512;
    if (r != 0 || *cap > DISK_CAP ||
        (vmdk_image_header(img)->flags & VMDK_FLAG_MARKERS)) {
        vmdk_image_free(img);
        return -1;
    }
    for (uint64_t d = 0; d < *cap; ) {
        struct vmdk_place p;
        if (vmdk_image_lookup(img, d, &p) < 0)
            abort();
        if (p.src == VMDK_SRC_FILE)
            memcpy(ref + d, f + p.file_off, p.len);
        else
            memset(ref + d, 0, p.len);
        d += p.len;
    }
    vmdk_image_free(img);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct sink_state a, b;
    if (!a.disk) {
        a.disk = malloc(DISK_CAP), a.seen = malloc(DISK_CAP);
        b.disk = malloc(DISK_CAP), b.seen = malloc(DISK_CAP);
    }
    if (size < 4)
        return 0;
    uint32_t seed;
    memcpy(&seed, data, 4);
    const uint8_t *f = data + 4;
    size_t len = size - 4;

    int ra = decode(&a, f, len, seed | 1);
    int rb = decode(&b, f, len, 0);
    if ((ra == 0) != (rb == 0)) {
        fprintf(stderr, "cut decode %d, whole decode %d\n", ra, rb);
        abort();
    }
    if (ra == 0 && (a.capacity != b.capacity ||
                    memcmp(a.disk, b.disk, a.capacity < DISK_CAP
                                           ? a.capacity : DISK_CAP) != 0)) {
        fprintf(stderr, "cut and whole decodes differ\n");
        abort();
    }
    static uint8_t *ref;
    uint64_t cap;
    if (!ref)
        ref = malloc(DISK_CAP);
    if (ra == 0 && image_decode(f, len, ref, &cap) == 0 &&
        (cap != a.capacity || memcmp(ref, a.disk, cap) != 0)) {
        fprintf(stderr, "stream and image decodes differ\n");
        abort();
    }
    return 0;
}
