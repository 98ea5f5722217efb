/* tests/fuzz/fuzz-vhd-synth.c: libFuzzer target for the VHD synthesizer
 * behind the export view (MNT/nbd.vhd read side).
 *
 * Input: 1 byte of flags and 8 bytes of disk size (taken modulo a cap
 * the flags choose: 4 MiB for the full decode, 64 GiB, or just past the
 * VHD limit), then
 * 8-byte (offset, length) allocation records (32-bit each, scaled to the
 * disk), then read requests (offset, length) for the final check.
 * Oracles:
 *   - vhd_synth_new refuses exactly sizes 0 and over VHD_MAX_SIZE;
 *   - allocation is refused out of range and after seal;
 *   - the file size is footer + header + BAT + one bitmap and block per
 *     allocated 2 MiB block + footer; the footer copy equals the trailing
 *     footer and both decode; read_disk is asked only for allocated
 *     blocks, inside the disk;
 *   - reads at any offset and length agree with one whole read;
 *   - small disks: vhd_image parses the whole file and decodes it to the
 *     disk's pattern in allocated blocks and zeros elsewhere.
 * Run with -rss_limit_mb=256 (scripts/test-sanitizers does).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhd/vhd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BLOCK (2u << 20)
#define SMALL_CAP (4u << 20)            /* full decode up to this disk size */
#define FILE_CAP (SMALL_CAP + 3 * (BLOCK + 512) + 4096)
#define MAX_BLOCKS ((VHD_MAX_SIZE + BLOCK - 1) / BLOCK)
#define MAX_RECORDS 64
#define MAX_READS 16

struct disk {
    uint64_t size;
    const uint8_t *alloc;               /* per block, 1 = allocated */
    uint32_t nblocks;
};

static uint8_t pattern(uint64_t off)
{
    return (uint8_t) (off * 131 + (off >> 9) + 7);
}

static int read_disk(void *opaque, uint64_t off, void *buf, size_t len)
{
    const struct disk *d = opaque;
    if (len == 0 || off >= d->size || len > d->size - off)
        abort();                        /* outside the disk */
    if (!d->alloc[off / BLOCK] || !d->alloc[(off + len - 1) / BLOCK])
        abort();                        /* asked for an unallocated block */
    uint8_t *b = buf;
    for (size_t i = 0; i < len; i++)
        b[i] = pattern(off + i);
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 |
           (uint32_t) p[2] << 8 | p[3];
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The footer copy, header and trailing footer, read through the
 * synthesizer, decode and agree. */
static void check_metadata(const struct vhd_synth *s, struct disk *d,
                           uint32_t nalloc)
{
    uint8_t head[1536], tail[512];
    struct vhd_footer f;
    struct vhd_header h;
    uint64_t fsize = vhd_synth_file_size(s);
    uint64_t bat = ((uint64_t) d->nblocks * 4 + 511) / 512 * 512;
    if (fsize != 1536 + bat + (uint64_t) nalloc * (512 + BLOCK) + 512)
        abort();
    if (vhd_synth_read(s, 0, head, sizeof head, read_disk, d) != 1536 ||
        vhd_synth_read(s, fsize - 512, tail, 512, read_disk, d) != 512 ||
        vhd_synth_read(s, fsize, tail, 1, read_disk, d) != 0)
        abort();
    if (memcmp(head, tail, 512) != 0)
        abort();
    if (vhd_footer_decode(tail, &f, NULL) < 0 ||
        vhd_header_decode(head + 512, &h, NULL) < 0 ||
        vhd_header_check(&f, &h, NULL) < 0)
        abort();
    if (f.current_size != (d->size + 511) / 512 * 512 ||
        f.disk_type != VHD_DYNAMIC)
        abort();
}

/* Whole-file oracles for small disks: pieces agree with one read, and
 * the image parser decodes the file back to the disk. */
static void check_small(const struct vhd_synth *s, struct disk *d,
                        const uint8_t *reads, size_t nreads)
{
    uint64_t fsize = vhd_synth_file_size(s);
    /* Static buffers: per-run allocations would fill ASan's quarantine
     * and the RSS limit with it. */
    static uint8_t file[FILE_CAP], piece[BLOCK + 4096];
    if (fsize > sizeof file)
        abort();
    if (vhd_synth_read(s, 0, file, fsize, read_disk, d) != (int64_t) fsize)
        abort();
    for (size_t i = 0; i < nreads; i++) {
        uint64_t off = be32(reads + 8 * i) % (fsize + 1024);
        size_t len = be32(reads + 8 * i + 4) % (BLOCK + 4096);
        int64_t n = vhd_synth_read(s, off, piece, len, read_disk, d);
        uint64_t want = off >= fsize ? 0 : (fsize - off < len ? fsize - off
                                                              : len);
        if (n != (int64_t) want || memcmp(piece, file + off, want) != 0)
            abort();
    }
    struct vhd_image *img;
    uint64_t off;
    size_t len;
    int r;
    if (vhd_image_new(file + fsize - 512, fsize, &img, NULL) < 0)
        abort();
    while ((r = vhd_image_next(img, &off, &len)) > 0)
        if (off + len > fsize || vhd_image_supply(img, file + off, NULL) < 0)
            abort();
    if (r < 0)
        abort();
    for (uint64_t p = 0; p < d->size;) {
        struct vhd_place pl;
        if (vhd_image_lookup(img, p, NULL, &pl) < 0)
            abort();
        if (pl.src == VHD_SRC_BITMAP &&
            vhd_image_lookup(img, p, file + pl.file_off, &pl) < 0)
            abort();
        uint64_t n = pl.len < d->size - p ? pl.len : d->size - p;
        bool alloc = d->alloc[p / BLOCK];
        if (alloc ? pl.src != VHD_SRC_FILE : pl.src != VHD_SRC_ZERO)
            abort();
        for (uint64_t k = 0; alloc && k < n; k += 509)
            if (file[pl.file_off + k] != pattern(p + k))
                abort();
        p += pl.len;
    }
    vhd_image_free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t uuid[16] = { 1, 2, 3, 4, 5, 6, 0x47, 8,
                                      0x89, 10, 11, 12, 13, 14, 15, 16 };
    if (size < 9)
        return 0;
    static uint8_t alloc[MAX_BLOCKS];
    bool small = data[0] & 1;
    uint64_t raw = rd64(data + 1);
    uint64_t cap = small ? SMALL_CAP : data[0] & 2 ? VHD_MAX_SIZE + (1u << 20)
                                                   : 64ull << 30;
    uint64_t dsize = raw % (cap + 1);
    data += 9;
    size -= 9;

    struct vhd_synth *s;
    struct nbdf_err e = { "" };
    int r = vhd_synth_new(dsize, uuid, 12345, &s, &e);
    uint64_t cur = (dsize + 511) / 512 * 512;
    if ((dsize == 0 || cur > VHD_MAX_SIZE) != (r < 0))
        abort();
    if (r < 0) {
        if (!e.msg[0])
            abort();                    /* refused without a message */
        return 0;
    }

    struct disk d = { .size = dsize };
    d.nblocks = (uint32_t) ((cur + BLOCK - 1) / BLOCK);
    memset(alloc, 0, d.nblocks);
    d.alloc = alloc;
    size_t nrec = size / 8 < MAX_RECORDS ? size / 8 : MAX_RECORDS;
    size_t used = nrec * 8 / 2;         /* first half: allocations */
    for (size_t i = 0; i + 8 <= used; i += 8) {
        uint64_t off = (uint64_t) be32(data + i) * (dsize / 0xFFFFFFFFu + 1);
        uint64_t len = be32(data + i + 4) % (dsize + 2);
        bool ok = off < cur && len <= cur - off;
        r = vhd_synth_allocate(s, off, len);
        if (ok != (r == 0))
            abort();
        if (r == 0 && len)
            for (uint64_t b = off / BLOCK; b <= (off + len - 1) / BLOCK; b++)
                alloc[b] = 1;
    }
    if (vhd_synth_seal(s) < 0 || vhd_synth_seal(s) < 0)
        abort();
    if (dsize && vhd_synth_allocate(s, 0, 1) == 0)
        abort();                        /* sealed */
    uint32_t nalloc = 0;
    for (uint32_t b = 0; b < d.nblocks; b++)
        nalloc += alloc[b];
    check_metadata(s, &d, nalloc);
    if (small) {
        size_t nreads = (size - used) / 8;
        check_small(s, &d, data + used,
                    nreads < MAX_READS ? nreads : MAX_READS);
    }
    vhd_synth_free(s);
    return 0;
}
