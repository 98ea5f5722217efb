/* tests/unit/vhdx-build.h: build small VHDX files in memory, for what
 * qemu-img cannot write (differencing files with sector bitmaps, 4096-byte
 * sectors, the metadata and BAT after the blocks, a log to replay).  Used
 * by the unit test and the fuzz target; a test helper, not the library's
 * synthesizer.  Static functions: include it once per program. */
#ifndef NBDFERRY_VHDX_BUILD_H
#define NBDFERRY_VHDX_BUILD_H
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx.h"

#ifndef MiB
#define MiB (1ull << 20)
#endif

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t) v; p[1] = (uint8_t) (v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t) v); put16(p + 2, (uint16_t) (v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t) v); put32(p + 4, (uint32_t) (v >> 32)); }

static const uint8_t G_BAT[16] = { 0x66, 0x77, 0xC2, 0x2D, 0x23, 0xF6, 0x00, 0x42,
                                   0x9D, 0x64, 0x11, 0x5E, 0x9B, 0xFD, 0x4A, 0x08 };
static const uint8_t G_META[16] = { 0x06, 0xA2, 0x7C, 0x8B, 0x90, 0x47, 0x9A, 0x4B,
                                    0xB8, 0xFE, 0x57, 0x5F, 0x05, 0x0F, 0x88, 0x6E };
static const uint8_t G_PARAMS[16] = { 0x37, 0x67, 0xA1, 0xCA, 0x36, 0xFA, 0x43, 0x4D,
                                      0xB3, 0xB6, 0x33, 0xF0, 0xAA, 0x44, 0xE7, 0x6B };
static const uint8_t G_SIZE[16] = { 0x24, 0x42, 0xA5, 0x2F, 0x1B, 0xCD, 0x76, 0x48,
                                    0xB2, 0x11, 0x5D, 0xBE, 0xD8, 0x3B, 0xF4, 0xB8 };
static const uint8_t G_LSEC[16] = { 0x1D, 0xBF, 0x41, 0x81, 0x6F, 0xA9, 0x09, 0x47,
                                    0xBA, 0x47, 0xF2, 0x33, 0xA8, 0xFA, 0xAB, 0x5F };
static const uint8_t G_PSEC[16] = { 0xC7, 0x48, 0xA3, 0xCD, 0x5D, 0x44, 0x71, 0x44,
                                    0x9C, 0xC9, 0xE9, 0x88, 0x52, 0x51, 0xC5, 0x56 };
static const uint8_t G_PAGE83[16] = { 0xAB, 0x12, 0xCA, 0xBE, 0xE6, 0xB2, 0x23, 0x45,
                                      0x93, 0xEF, 0xC3, 0x09, 0xE0, 0x00, 0xC7, 0x46 };
static const uint8_t G_PARENT[16] = { 0x2D, 0x5F, 0xD3, 0xA8, 0x0B, 0xB3, 0x4D, 0x45,
                                      0xAB, 0xF7, 0xD3, 0xD8, 0x48, 0x34, 0xAB, 0x0C };

struct spec {
    uint64_t disk_size;
    uint32_t block_size, lsec;
    bool diff;
    bool regions_last;          /* metadata and BAT after the blocks */
    bool log_pending;
    /* per payload block: state, and for PARTIAL a sector pattern */
    const uint8_t *states;      /* VHDX_PB_* per block (NULL: all FULL) */
};

static void fix_crc(uint8_t *p, size_t len)
{
    put32(p + 4, 0);
    put32(p + 4, vhdx_crc32c(0, p, len));
}

/* Build a VHDX of spec whose payload is content (disk_size bytes); for
 * a differencing file, partially present blocks carry the sectors whose
 * index % 3 == 0, and want gets content there over base elsewhere.
 * Returns the file, its length in *len; want (disk_size) is filled. */
static uint8_t *build(const struct spec *sp, const uint8_t *content,
                      const uint8_t *base, uint8_t *want, size_t *len)
{
    struct vhdx_meta m = { .block_size = sp->block_size, .has_parent = sp->diff,
                           .disk_size = sp->disk_size,
                           .logical_sector = sp->lsec, .physical_sector = 4096 };
    struct vhdx_geom g;
    vhdx_geom(&m, &g);
    uint64_t bat_len = (g.bat_entries * 8 + MiB - 1) / MiB * MiB;
    uint64_t nblk = g.payload_blocks, bs = sp->block_size;
    uint64_t data0 = sp->regions_last ? 2 * MiB : 4 * MiB + bat_len;
    uint64_t flen = data0 + nblk * bs + g.bitmap_blocks * MiB;
    uint64_t meta_off = sp->regions_last ? flen : 3 * MiB;
    uint64_t bat_off = sp->regions_last ? flen + MiB : 4 * MiB;
    if (sp->regions_last)
        flen += MiB + bat_len;
    uint8_t *f = calloc(1, flen);
    if (!f)
        abort();
    memcpy(f, "vhdxfile", 8);
    for (int h = 0; h < 2; h++) {
        uint8_t *p = f + (h ? 128 : 64) * 1024;
        memcpy(p, "head", 4);
        put64(p + 8, 10 + h);
        if (sp->log_pending)
            p[48] = 1;
        put16(p + 64, sp->log_pending);
        put16(p + 66, 1);
        put32(p + 68, MiB);
        put64(p + 72, MiB);
        fix_crc(p, 4096);
    }
    for (int t = 0; t < 2; t++) {
        uint8_t *p = f + (t ? 256 : 192) * 1024;
        memcpy(p, "regi", 4);
        put32(p + 8, 2);
        memcpy(p + 16, G_BAT, 16); put64(p + 32, bat_off); put32(p + 40, (uint32_t) bat_len); put32(p + 44, 1);
        memcpy(p + 48, G_META, 16); put64(p + 64, meta_off); put32(p + 72, MiB); put32(p + 76, 1);
        fix_crc(p, 65536);
    }
    uint8_t *mt = f + meta_off;
    memcpy(mt, "metadata", 8);
    const uint8_t *ids[] = { G_PARAMS, G_SIZE, G_LSEC, G_PSEC, G_PAGE83,
                             G_PARENT };
    unsigned nitems = sp->diff ? 6 : 5;
    put16(mt + 10, (uint16_t) nitems);
    for (unsigned i = 0; i < nitems; i++) {
        uint8_t *e = mt + 32 + 32 * i;
        memcpy(e, ids[i], 16);
        put32(e + 16, 65536 + 4096 * i);
        put32(e + 20, i == 5 ? 64 : i == 4 ? 16 : 8);
        put32(e + 24, 4 | (i >= 1 && i <= 4 ? 2 : 0));
    }
    put32(mt + 65536, sp->block_size);
    put32(mt + 65540, sp->diff ? 2 : 0);
    put64(mt + 65536 + 4096, sp->disk_size);
    put32(mt + 65536 + 8192, sp->lsec);
    put32(mt + 65536 + 12288, 4096);
    memset(mt + 65536 + 16384, 0x42, 16);    /* page 83 data */
    if (sp->diff) {                          /* one pair: "a" = "b" */
        uint8_t *pl = mt + 65536 + 20480;
        put16(pl + 18, 1);
        put32(pl + 20, 32); put32(pl + 24, 40); put16(pl + 28, 2); put16(pl + 30, 2);
        put16(pl + 32, 'a'); put16(pl + 40, 'b');
    }
    uint8_t *bat = f + bat_off;
    memcpy(want, sp->diff ? base : content, sp->disk_size);
    uint64_t next = data0;
    for (uint64_t b = 0; b < nblk; b++) {
        unsigned st = sp->states ? sp->states[b] : VHDX_PB_FULLY_PRESENT;
        uint64_t doff = b * bs, n = sp->disk_size - doff < bs ? sp->disk_size - doff : bs;
        uint64_t e = st;
        if (st == VHDX_PB_FULLY_PRESENT || st == VHDX_PB_PARTIALLY_PRESENT) {
            e |= next;
            memcpy(f + next, content + doff, n);
            if (st == VHDX_PB_FULLY_PRESENT)
                memcpy(want + doff, content + doff, n);
            else
                for (uint64_t s = 0; s < n / sp->lsec; s++)
                    if ((doff / sp->lsec + s) % 3 == 0)
                        memcpy(want + doff + s * sp->lsec,
                               content + doff + s * sp->lsec, sp->lsec);
            next += bs;
        } else if (!sp->diff || st != VHDX_PB_NOT_PRESENT) {
            memset(want + doff, 0, n);
        }
        put64(bat + 8 * vhdx_bat_index(&g, b), e);
    }
    if (sp->diff)
        for (uint64_t c = 0; c < g.bitmap_blocks; c++) {
            uint8_t *bm = f + next;
            for (uint64_t s = 0; s < VHDX_SECTORS_PER_CHUNK; s++)
                if ((c * VHDX_SECTORS_PER_CHUNK + s) % 3 == 0)
                    bm[s / 8] |= (uint8_t) (1 << s % 8);
            put64(bat + 8 * vhdx_bat_bitmap_index(&g, c), next | VHDX_SB_PRESENT);
            next += MiB;
        }
    *len = flen;
    return f;
}

#endif /* NBDFERRY_VHDX_BUILD_H */
