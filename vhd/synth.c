/* vhd/synth.c: produce the bytes of a dynamic VHD describing a raw disk.
 *
 * Layout (vhd-tool-like, readable by qemu, libvhd and vhd-tool):
 *
 *   0                      footer copy
 *   512                    dynamic header, table offset 1536
 *   1536                   BAT, 4 * nblocks rounded up to 512, 0xFF padding
 *   data_start             per allocated block, in increasing virtual order:
 *                          512-byte all-ones bitmap, 2 MiB of data
 *   file_size - 512        footer
 *
 * Everything but block data is computed; block data comes from read_disk.
 */
#include <stdlib.h>

#include "vhd/vhd-internal.h"

#define SYNTH_BLOCK     VHD_BLOCK_SIZE_DEFAULT
#define SYNTH_BAT_OFF   1536u
#define SYNTH_STRIDE    ((uint64_t) SYNTH_BLOCK + VHD_SECTOR)

struct vhd_synth {
    uint64_t disk_size;                 /* bytes read_disk may serve */
    uint64_t size;                      /* current_size */
    uint32_t nblocks;
    uint8_t *alloc;                     /* owned; one byte per block */
    uint32_t *order;                    /* owned, sealed: k-th allocated block */
    uint32_t *slot;                     /* owned, sealed: block -> k or UNUSED */
    uint32_t nalloc;
    bool sealed;
    uint64_t bat_bytes, data_start, file_size;
    uint8_t footer[512];
    uint8_t header[1024];
};

int vhd_synth_new(uint64_t disk_size, const uint8_t uuid[16],
                  uint32_t timestamp, struct vhd_synth **out,
                  struct nbdf_err *err)
{
    if (disk_size == 0)
        return nbdf_errf(err, -EINVAL, "cannot describe an empty disk as VHD");
    if (disk_size > VHD_MAX_SIZE)
        return nbdf_errf(err, -EFBIG, "disk of %llu bytes exceeds the VHD "
                         "limit of 2040 GiB (%llu bytes)",
                         (unsigned long long) disk_size,
                         (unsigned long long) VHD_MAX_SIZE);
    struct vhd_synth *s = calloc(1, sizeof *s);
    if (!s)
        return nbdf_errf(err, -ENOMEM, "out of memory");
    s->disk_size = disk_size;
    s->size = ROUND_UP(disk_size, VHD_SECTOR);
    s->nblocks = (s->size + SYNTH_BLOCK - 1) / SYNTH_BLOCK;
    s->alloc = calloc(s->nblocks, 1);
    if (!s->alloc) {
        free(s);
        return nbdf_errf(err, -ENOMEM, "out of memory");
    }
    struct vhd_footer f = {
        .features = VHD_FEATURE_RESERVED,
        .version = VHD_VERSION, .data_offset = VHD_SECTOR,
        .timestamp = timestamp,
        .creator_version = 0x00010000, .creator_os = 0,
        .original_size = s->size, .current_size = s->size,
        .disk_type = VHD_DYNAMIC,
    };
    /* Not NUL-terminated: copied, not initialized from a literal
     * (GCC 15 warns of the literal's dropped NUL). */
    memcpy(f.cookie, "conectix", sizeof f.cookie);
    memcpy(f.creator_app, "win ", sizeof f.creator_app);
    vhd_geometry(s->size, &f.cylinders, &f.heads, &f.sectors);
    memcpy(f.uuid, uuid, 16);
    vhd_footer_encode(&f, s->footer);
    *out = s;
    return 0;
}

void vhd_synth_free(struct vhd_synth *s)
{
    if (!s)
        return;
    free(s->alloc);
    free(s->order);
    free(s->slot);
    free(s);
}

int vhd_synth_allocate(struct vhd_synth *s, uint64_t disk_off, uint64_t len)
{
    if (s->sealed || disk_off >= s->size || len > s->size - disk_off)
        return -EINVAL;
    if (len == 0)
        return 0;
    uint64_t first = disk_off / SYNTH_BLOCK;
    uint64_t last = (disk_off + len - 1) / SYNTH_BLOCK;
    memset(s->alloc + first, 1, last - first + 1);
    return 0;
}

static void synth_header(struct vhd_synth *s)
{
    struct vhd_header h = {
        .data_offset = UINT64_MAX,
        .table_offset = SYNTH_BAT_OFF, .version = VHD_VERSION,
        .max_entries = s->nblocks, .block_size = SYNTH_BLOCK,
    };
    memcpy(h.cookie, "cxsparse", sizeof h.cookie);
    vhd_header_encode(&h, s->header);
}

int vhd_synth_seal(struct vhd_synth *s)
{
    if (s->sealed)
        return 0;
    s->order = malloc((size_t) s->nblocks * sizeof *s->order);
    s->slot = malloc((size_t) s->nblocks * sizeof *s->slot);
    if (!s->order || !s->slot)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->nblocks; i++) {
        s->slot[i] = s->alloc[i] ? s->nalloc : VHD_BAT_UNUSED;
        if (s->alloc[i])
            s->order[s->nalloc++] = i;
    }
    s->bat_bytes = ROUND_UP(4ull * s->nblocks, VHD_SECTOR);
    s->data_start = SYNTH_BAT_OFF + s->bat_bytes;
    s->file_size = s->data_start + s->nalloc * SYNTH_STRIDE + VHD_SECTOR;
    synth_header(s);
    s->sealed = true;
    return 0;
}

uint64_t vhd_synth_file_size(const struct vhd_synth *s)
{
    return s->sealed ? s->file_size : 0;
}

/* ---- reading ---------------------------------------------------------------------- */

static void read_bat(const struct vhd_synth *s, uint64_t at, uint8_t *buf,
                     uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = at + i, idx = p / 4;
        uint32_t v = VHD_BAT_UNUSED;
        if (idx < s->nblocks && s->slot[idx] != VHD_BAT_UNUSED)
            v = (s->data_start + s->slot[idx] * SYNTH_STRIDE) / VHD_SECTOR;
        buf[i] = v >> (8 * (3 - p % 4));
    }
}

/* Bytes [at, at+n) of block data of the k-th allocated block. */
static int read_block_data(const struct vhd_synth *s, uint32_t k, uint64_t at,
                           uint8_t *buf, uint64_t n, vhd_read_disk_fn rd,
                           void *opaque)
{
    uint64_t disk_off = (uint64_t) s->order[k] * SYNTH_BLOCK + at;
    uint64_t have = disk_off < s->disk_size ? s->disk_size - disk_off : 0;
    if (have > n)
        have = n;
    memset(buf + have, 0, n - have);
    return have ? rd(opaque, disk_off, buf, have) : 0;
}

/* One piece inside one region; returns bytes produced or -errno. */
static int64_t read_piece(const struct vhd_synth *s, uint64_t off,
                          uint8_t *buf, uint64_t len, vhd_read_disk_fn rd,
                          void *opaque)
{
    uint64_t n;
    if (off < VHD_SECTOR) {
        n = VHD_SECTOR - off < len ? VHD_SECTOR - off : len;
        memcpy(buf, s->footer + off, n);
    } else if (off < SYNTH_BAT_OFF) {
        n = SYNTH_BAT_OFF - off < len ? SYNTH_BAT_OFF - off : len;
        memcpy(buf, s->header + (off - VHD_SECTOR), n);
    } else if (off < s->data_start) {
        n = s->data_start - off < len ? s->data_start - off : len;
        read_bat(s, off - SYNTH_BAT_OFF, buf, n);
    } else if (off < s->file_size - VHD_SECTOR) {
        uint64_t rel = off - s->data_start;
        uint32_t k = rel / SYNTH_STRIDE;
        uint64_t in = rel % SYNTH_STRIDE;
        if (in < VHD_SECTOR) {
            n = VHD_SECTOR - in < len ? VHD_SECTOR - in : len;
            memset(buf, 0xFF, n);
        } else {
            n = SYNTH_STRIDE - in < len ? SYNTH_STRIDE - in : len;
            int r = read_block_data(s, k, in - VHD_SECTOR, buf, n, rd, opaque);
            if (r < 0)
                return r;
        }
    } else {
        uint64_t at = off - (s->file_size - VHD_SECTOR);
        n = VHD_SECTOR - at < len ? VHD_SECTOR - at : len;
        memcpy(buf, s->footer + at, n);
    }
    return n;
}

int64_t vhd_synth_read(const struct vhd_synth *s, uint64_t off, void *buf,
                       size_t len, vhd_read_disk_fn rd, void *opaque)
{
    if (!s->sealed)
        return -EINVAL;
    if (off >= s->file_size)
        return 0;
    if (len > s->file_size - off)
        len = s->file_size - off;
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        int64_t n = read_piece(s, off + done, p + done, len - done, rd, opaque);
        if (n < 0)
            return n;
        done += n;
    }
    return done;
}
