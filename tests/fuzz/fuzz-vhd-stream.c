/* tests/fuzz/fuzz-vhd-stream.c: libFuzzer target for the stream decoder.
 *
 * Input: 4 control bytes, then a VHD file.  The control bytes seed how the
 * file is cut into writes (1 byte to 64 KiB), which all-zero pieces become
 * forward jumps, forward holes or jumps re-punched backwards; with bit 31
 * set, footer and header checksums are recomputed first (fuzz-vhd-fixup.h)
 * so mutations reach the deeper rules.  Oracles:
 *   - begin() exactly once, before any data/zero;
 *   - nothing emitted outside [0, virtual size) (fixed: before the held-back
 *     tail);
 *   - when the stream and the image parser both accept the file and the
 *     disk is small, the stream's disk equals the image-lookup decode.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "vhd/vhd.h"
#include "tests/unit/stream-cuts.h"
#include "fuzz-vhd-fixup.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DISK_CAP (1u << 20)             /* differential check up to 1 MiB */
#define FILL 0xA5

struct sink_state {
    bool began;
    enum vhd_kind kind;
    uint64_t vsize;
    uint64_t file_len;
    uint8_t *disk;                      /* DISK_CAP bytes, FILL outside touched */
    uint64_t touched;                   /* [0, touched) may differ from FILL */
};

static void touch(struct sink_state *st, uint64_t end)
{
    if (end > DISK_CAP)
        end = DISK_CAP;
    if (end > st->touched)
        st->touched = end;
}

static void bounds(struct sink_state *st, uint64_t off, uint64_t len)
{
    if (!st->began || len == 0)
        abort();
    if (st->kind == VHD_FIXED ? off + len + 512 > st->file_len
                              : off + len > st->vsize || off + len < off)
        abort();
}

static int s_begin(void *o, const struct nbdf_begin *b)
{
    enum vhd_kind kind = (enum vhd_kind) b->kind;
    uint64_t size = b->size;
    struct sink_state *st = o;
    if (st->began)
        abort();
    st->began = true;
    st->kind = kind;
    st->vsize = size;
    if (kind != VHD_DIFF) {
        uint64_t n = kind == VHD_FIXED ? st->file_len : size;
        touch(st, n);
        memset(st->disk, 0, n < DISK_CAP ? n : DISK_CAP);
    }
    return 0;
}

static int s_data(void *o, uint64_t off, const void *buf, size_t len)
{
    struct sink_state *st = o;
    bounds(st, off, len);
    touch(st, off + len);
    if (off + len <= DISK_CAP)
        memcpy(st->disk + off, buf, len);
    return 0;
}

static int s_zero(void *o, uint64_t off, uint64_t len)
{
    struct sink_state *st = o;
    bounds(st, off, len);
    touch(st, off + len);
    if (off + len <= DISK_CAP)
        memset(st->disk + off, 0, len);
    return 0;
}

static const struct nbdf_sink sink = { .begin = s_begin, .data = s_data,
                                       .zero = s_zero };

CUTS_STREAM(stream_cuts, vhd);

static int feed(struct vhd_stream *s, const uint8_t *f, size_t len,
                uint32_t seed)
{
    return cuts_feed(&stream_cuts, s, f, len, seed, 1 + (seed & 0xFFFF));
}

/* Reference decode through the image API (random access). */
static int image_decode(const uint8_t *f, size_t len, uint8_t *disk,
                        uint64_t *vsize)
{
    struct vhd_image *img;
    struct nbdf_err err;
    if (len < 512 || vhd_image_new(f + len - 512, len, &img, &err) < 0)
        return -1;
    uint64_t off;
    size_t n;
    int r;
    while ((r = vhd_image_next(img, &off, &n)) > 0)
        if (vhd_image_supply(img, f + off, &err) < 0)
            break;
    *vsize = vhd_image_size(img);
    if (r != 0 || *vsize > DISK_CAP) {
        vhd_image_free(img);
        return -1;
    }
    for (off = 0; off < *vsize; ) {
        struct vhd_place p;
        if (vhd_image_lookup(img, off, NULL, &p) < 0)
            abort();
        if (p.src == VHD_SRC_BITMAP &&
            vhd_image_lookup(img, off, f + p.file_off, &p) < 0)
            abort();
        if (p.src == VHD_SRC_FILE)
            memcpy(disk + off, f + p.file_off, p.len);
        else if (p.src == VHD_SRC_ZERO)
            memset(disk + off, 0, p.len);
        off += p.len;
    }
    vhd_image_free(img);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *disk, *ref, *copy;
    static size_t copy_cap;
    if (!disk) {
        disk = malloc(DISK_CAP);
        ref = malloc(DISK_CAP);
        memset(disk, FILL, DISK_CAP);
        memset(ref, FILL, DISK_CAP);
    }
    if (size < 4)
        return 0;
    uint32_t seed;
    memcpy(&seed, data, 4);
    const uint8_t *f = data + 4;
    size_t len = size - 4;
    if ((seed & 0x80000000u) && len) {  /* memcpy(NULL, .., 0) is UB */
        if (len > copy_cap) {
            free(copy);
            copy = malloc(len);
            copy_cap = copy ? len : 0;
            if (!copy)
                return 0;
        }
        memcpy(copy, f, len);
        fixup_vhd(copy, len);
        f = copy;
    }

    struct sink_state st = { .file_len = len, .disk = disk };
    struct vhd_stream *s;
    if (vhd_stream_new(&sink, &st, &s) < 0)
        return 0;
    int r = feed(s, f, len, seed);
    if (r == 0)
        r = vhd_stream_finish(s);
    if (r < 0 && !vhd_stream_error(s)[0])
        abort();                        /* every failure names its rule */
    uint64_t svsize = vhd_stream_virtual_size(s);
    vhd_stream_free(s);
    uint64_t vsize = 0;
    if (r == 0 && image_decode(f, len, ref, &vsize) == 0 &&
        (vsize != svsize || memcmp(disk, ref, vsize) != 0)) {
        fprintf(stderr, "stream and image decodes differ\n");
        abort();
    }
    memset(disk, FILL, st.touched);     /* back to the baseline */
    memset(ref, FILL, vsize < DISK_CAP ? vsize : DISK_CAP);
    return 0;
}
