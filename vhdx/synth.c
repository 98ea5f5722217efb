/* vhdx/synth.c: a dynamic VHDX of a raw disk, answered at any offset.
 * See the layout in vhdx/vhdx.h.
 *
 * The fixed part (header section, metadata region) is built once at seal;
 * the BAT and the blocks are computed per read: a bit per block says
 * allocated, and a count of allocated blocks per 64 gives each block's
 * file offset in O(1) (its rank). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx-internal.h"

#define LOG_OFF   (1ull << 20)
#define META_OFF  (2ull << 20)
#define BAT_OFF   (3ull << 20)
#define HEAD_LEN  (VHDX_REGION2_OFF + VHDX_REGION_BYTES)
#define META_LEN  ((64ull << 10) + 5 * 4096)        /* table + 5 small items */
#define BAT_MAX_ENTRIES (2ull << 20)                /* 16 MiB of BAT */

struct vhdx_synth {
    struct vhdx_meta m;                 /* disk_size: whole sectors */
    uint64_t raw_size;                  /* the disk's bytes; zeros past it */
    struct vhdx_geom g;
    uint8_t guid[16];
    uint64_t *bits;                     /* a bit per payload block */
    uint64_t *rank;                     /* allocated blocks before word i */
    uint64_t nwords, nalloc;
    uint64_t bat_len, data0;
    bool sealed;
    uint8_t head[HEAD_LEN];             /* the header section's used part */
    uint8_t meta[META_LEN];
};

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t) v; p[1] = (uint8_t) (v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t) v); put16(p + 2, (uint16_t) (v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t) v); put32(p + 4, (uint32_t) (v >> 32)); }

static void checksum(uint8_t *p, size_t len)
{
    put32(p + 4, 0);
    put32(p + 4, vhdx_crc32c(0, p, len));
}

int vhdx_synth_new(uint64_t disk_size, const uint8_t guid[16],
                   struct vhdx_synth **out, struct nbdf_err *err)
{
    if (disk_size == 0 || disk_size > VHDX_DISK_MAX)
        return nbdf_errf(err, -EINVAL, "a VHDX disk is 1 byte to 64 TiB, "
                         "not %llu bytes", (unsigned long long) disk_size);
    struct vhdx_synth *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    /* A virtual size is whole logical sectors: round up, as qemu-img
     * convert -O vhdx does; the bytes past the disk read as zero. */
    s->raw_size = disk_size;
    disk_size = (disk_size + 511) / 512 * 512;
    uint64_t bs = VHDX_SYNTH_BLOCK;
    while (disk_size / bs > BAT_MAX_ENTRIES && bs < VHDX_BLOCK_MAX)
        bs *= 2;
    s->m = (struct vhdx_meta){ .block_size = (uint32_t) bs,
                               .disk_size = disk_size, .logical_sector = 512,
                               .physical_sector = 4096, .have_page83 = true };
    memcpy(s->m.page83, guid, 16);
    memcpy(s->guid, guid, 16);
    vhdx_geom(&s->m, &s->g);
    s->nwords = (s->g.payload_blocks + 63) / 64;
    s->bits = calloc(s->nwords, 8);
    s->rank = calloc(s->nwords + 1, 8);
    if (!s->bits || !s->rank) {
        vhdx_synth_free(s);
        return -ENOMEM;
    }
    *out = s;
    return 0;
}

int vhdx_synth_allocate(struct vhdx_synth *s, uint64_t off, uint64_t len)
{
    if (s->sealed || off >= s->m.disk_size || len > s->m.disk_size - off)
        return -EINVAL;
    if (len == 0)
        return 0;
    for (uint64_t b = off / s->m.block_size;
         b <= (off + len - 1) / s->m.block_size; b++)
        s->bits[b / 64] |= 1ull << (b % 64);
    return 0;
}

static void build_head(struct vhdx_synth *s)
{
    uint8_t *h = s->head;
    memcpy(h, "vhdxfile", 8);
    static const char creator[] = "nbdferry";
    for (size_t i = 0; i < sizeof creator - 1; i++)
        put16(h + 8 + 2 * i, (uint16_t) creator[i]);
    for (int i = 0; i < 2; i++) {
        uint8_t *p = h + (i ? VHDX_HEADER2_OFF : VHDX_HEADER1_OFF);
        memcpy(p, "head", 4);
        put64(p + 8, (uint64_t) i + 1);
        memcpy(p + 16, s->guid, 16);             /* file write GUID */
        memcpy(p + 32, s->guid, 16);             /* data write GUID */
        put16(p + 66, 1);                        /* version; log GUID zero */
        put32(p + 68, (uint32_t) (LOG_OFF));     /* 1 MiB log ... */
        put64(p + 72, LOG_OFF);                  /* ... at 1 MiB */
        checksum(p, VHDX_HEADER_BYTES);
    }
    for (int i = 0; i < 2; i++) {
        uint8_t *p = h + (i ? VHDX_REGION2_OFF : VHDX_REGION1_OFF);
        memcpy(p, "regi", 4);
        put32(p + 8, 2);
        memcpy(p + 16, vhdx_guid_bat, 16);
        put64(p + 32, BAT_OFF);
        put32(p + 40, (uint32_t) s->bat_len);
        put32(p + 44, 1);                        /* required */
        memcpy(p + 48, vhdx_guid_metadata, 16);
        put64(p + 64, META_OFF);
        put32(p + 72, (uint32_t) VHDX_MiB);
        put32(p + 76, 1);
        checksum(p, VHDX_REGION_BYTES);
    }
}

static void build_meta(struct vhdx_synth *s)
{
    uint8_t *m = s->meta;
    memcpy(m, "metadata", 8);
    const struct { const uint8_t *guid; uint32_t len, flags; } items[] = {
        { vhdx_guid_file_params, 8, 4 },
        { vhdx_guid_disk_size, 8, 4 | 2 },
        { vhdx_guid_logical_sector, 4, 4 | 2 },
        { vhdx_guid_physical_sector, 4, 4 | 2 },
        { vhdx_guid_page83, 16, 4 | 2 },
    };
    put16(m + 10, 5);
    for (unsigned i = 0; i < 5; i++) {
        uint8_t *e = m + 32 + 32 * i;
        memcpy(e, items[i].guid, 16);
        put32(e + 16, (uint32_t) (65536 + 4096 * i));
        put32(e + 20, items[i].len);
        put32(e + 24, items[i].flags);
    }
    put32(m + 65536, s->m.block_size);           /* flags 0: dynamic */
    put64(m + 65536 + 4096, s->m.disk_size);
    put32(m + 65536 + 8192, 512);
    put32(m + 65536 + 12288, 4096);
    memcpy(m + 65536 + 16384, s->guid, 16);
}

int vhdx_synth_seal(struct vhdx_synth *s)
{
    if (s->sealed)
        return 0;
    uint64_t n = 0;
    for (uint64_t w = 0; w < s->nwords; w++) {
        s->rank[w] = n;
        n += (uint64_t) __builtin_popcountll(s->bits[w]);
    }
    s->rank[s->nwords] = n;
    s->nalloc = n;
    s->bat_len = (s->g.bat_entries * 8 + VHDX_MiB - 1) / VHDX_MiB * VHDX_MiB;
    s->data0 = BAT_OFF + s->bat_len;
    build_head(s);
    build_meta(s);
    s->sealed = true;
    return 0;
}

uint64_t vhdx_synth_file_size(const struct vhdx_synth *s)
{
    return s->data0 + s->nalloc * s->m.block_size;
}

uint32_t vhdx_synth_block_size(const struct vhdx_synth *s)
{
    return s->m.block_size;
}

uint64_t vhdx_synth_blocks_allocated(const struct vhdx_synth *s)
{
    return s->nalloc;
}

static bool allocated(const struct vhdx_synth *s, uint64_t b)
{
    return s->bits[b / 64] >> (b % 64) & 1;
}

static uint64_t rank_of(const struct vhdx_synth *s, uint64_t b)
{
    uint64_t below = s->bits[b / 64] & ((1ull << (b % 64)) - 1);
    return s->rank[b / 64] + (uint64_t) __builtin_popcountll(below);
}

/* BAT entry i: a payload block's state and offset, or a bitmap (absent). */
static uint64_t bat_entry(const struct vhdx_synth *s, uint64_t i)
{
    if (vhdx_bat_is_bitmap(&s->g, i))
        return VHDX_SB_NOT_PRESENT;
    uint64_t b = i - i / (s->g.chunk_ratio + 1);
    if (b >= s->g.payload_blocks || !allocated(s, b))
        return VHDX_PB_NOT_PRESENT;
    return (s->data0 + rank_of(s, b) * s->m.block_size) | VHDX_PB_FULLY_PRESENT;
}

static void read_bat(const struct vhdx_synth *s, uint64_t at, uint8_t *buf,
                     size_t len)
{
    for (size_t k = 0; k < len;) {
        uint64_t i = (at + k) / 8, within = (at + k) % 8;
        uint8_t e[8];
        if (i < s->g.bat_entries)
            put64(e, bat_entry(s, i));
        else
            memset(e, 0, 8);
        size_t n = 8 - within < len - k ? 8 - within : len - k;
        memcpy(buf + k, e + within, n);
        k += n;
    }
}

/* The allocated block whose file bytes hold 'at' (past data0). */
static int read_block(const struct vhdx_synth *s, uint64_t at, uint8_t *buf,
                      size_t len, vhdx_read_disk_fn read_disk, void *opaque)
{
    uint64_t k = (at - s->data0) / s->m.block_size;     /* k-th allocated */
    uint64_t within = (at - s->data0) % s->m.block_size;
    uint64_t lo = 0, hi = s->nwords;                    /* word holding it */
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if (s->rank[mid] <= k)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t w = s->bits[lo], left = k - s->rank[lo];
    while (left--)
        w &= w - 1;                                     /* drop lowest bits */
    uint64_t b = lo * 64 + (uint64_t) __builtin_ctzll(w);
    uint64_t disk = b * s->m.block_size + within;
    size_t data = disk >= s->raw_size ? 0
                : s->raw_size - disk < len ? (size_t) (s->raw_size - disk)
                : len;
    if (data) {
        int r = read_disk(opaque, disk, buf, data);
        if (r < 0)
            return r;
    }
    memset(buf + data, 0, len - data);                  /* past the disk */
    return 0;
}

int64_t vhdx_synth_read(const struct vhdx_synth *s, uint64_t off, void *vbuf,
                        size_t len, vhdx_read_disk_fn read_disk, void *opaque)
{
    if (!s->sealed)
        return -EINVAL;
    uint64_t size = vhdx_synth_file_size(s);
    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t) (size - off);
    uint8_t *buf = vbuf;
    for (size_t k = 0; k < len;) {
        uint64_t at = off + k, end;
        size_t n;
        if (at < s->data0) {
            /* The fixed part: stop at the next structure boundary. */
            end = at < HEAD_LEN ? HEAD_LEN : at < META_OFF ? META_OFF
                : at < META_OFF + META_LEN ? META_OFF + META_LEN
                : at < BAT_OFF ? BAT_OFF : s->data0;
            n = end - at < len - k ? (size_t) (end - at) : len - k;
            if (at < HEAD_LEN)
                memcpy(buf + k, s->head + at, n);
            else if (at >= META_OFF && at < META_OFF + META_LEN)
                memcpy(buf + k, s->meta + (at - META_OFF), n);
            else if (at >= BAT_OFF)
                read_bat(s, at - BAT_OFF, buf + k, n);
            else
                memset(buf + k, 0, n);
        } else {
            uint64_t within = (at - s->data0) % s->m.block_size;
            n = s->m.block_size - within < len - k
                ? (size_t) (s->m.block_size - within) : len - k;
            int r = read_block(s, at, buf + k, n, read_disk, opaque);
            if (r < 0)
                return r;
        }
        k += n;
    }
    return (int64_t) len;
}

void vhdx_synth_free(struct vhdx_synth *s)
{
    if (!s)
        return;
    free(s->bits);
    free(s->rank);
    free(s);
}
