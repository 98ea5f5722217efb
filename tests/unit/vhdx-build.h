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

/* The log's GUID, and another log's. */
static const uint8_t G_LOG[16] = { 0x10, 0x0D, 0x5E, 0xED, 1, 2, 3, 4, 5, 6, 7, 8,
                                   9, 10, 11, 12 };
static const uint8_t G_LOG_OTHER[16] = { 0x01, 0xD0, 0x06, 0xD1, 1, 2, 3, 4, 5,
                                         6, 7, 8, 9, 10, 11, 12 };
static const uint8_t G_LOG_NEW[16] = { 0x4E, 0xE3, 0x10, 0x66, 1, 2, 3, 4, 5,
                                       6, 7, 8, 9, 10, 11, 12 };
/* How the log of a file with log_pending is spoiled (none: it replays). */
#define LOG_TORN      1u        /* the entry's data sector changed after its CRC */
#define LOG_OLD_GUID  2u        /* the header names a newer log */
#define LOG_BAD_TAIL  4u        /* the entry names a tail outside its run */
#define LOG_BEHIND    8u        /* the zero write aims at header 1 */
#define LOG_CUT      16u        /* the log says the file was longer */

struct spec {
    uint64_t disk_size;
    uint32_t block_size, lsec;
    bool diff;
    bool regions_last;          /* metadata and BAT after the blocks */
    bool log_pending;           /* a log to replay (see add_log) */
    unsigned log_flags;         /* LOG_*: how that log is spoiled */
    /* per payload block: state, and for PARTIAL a sector pattern */
    const uint8_t *states;      /* VHDX_PB_* per block (NULL: all FULL) */
};

static void fix_crc(uint8_t *p, size_t len)
{
    put32(p + 4, 0);
    put32(p + 4, vhdx_crc32c(0, p, len));
}

/* ---- the log ----------------------------------------------------------- */

#define LOG_OFF MiB             /* build() puts a 1 MiB log at 1 MiB */

struct ldesc {
    uint64_t file_off;
    const uint8_t *sector;      /* 4096 bytes to write, or NULL: zeros */
    uint64_t zero_len;
};

/* Write a log entry at byte 'at' of the log: sequence seq, tail (a byte
 * offset in the log), the descriptors d[0..n), and file offsets flushed
 * and last.  Returns its length. */
static uint32_t log_entry(uint8_t *f, uint32_t at, const uint8_t guid[16],
                          uint64_t seq, uint32_t tail, const struct ldesc *d,
                          unsigned n, uint64_t flushed, uint64_t last)
{
    uint8_t *e = f + LOG_OFF + at;
    uint32_t dsec = (64 + 32 * n + 4095) / 4096, ndata = 0;
    for (unsigned k = 0; k < n; k++)
        ndata += d[k].sector != NULL;
    uint32_t len = (dsec + ndata) * 4096;
    memset(e, 0, len);
    memcpy(e, "loge", 4);
    put32(e + 8, len);
    put32(e + 12, tail);
    put64(e + 16, seq);
    put32(e + 24, n);
    memcpy(e + 32, guid, 16);
    put64(e + 48, flushed);
    put64(e + 56, last);
    uint8_t *data = e + dsec * 4096;
    for (unsigned k = 0; k < n; k++) {
        uint8_t *ds = e + 64 + 32 * k;
        put64(ds + 16, d[k].file_off);
        put64(ds + 24, seq);
        if (!d[k].sector) {
            memcpy(ds, "zero", 4);
            put64(ds + 8, d[k].zero_len);
            continue;
        }
        memcpy(ds, "desc", 4);
        memcpy(ds + 4, d[k].sector + 4092, 4);      /* trailing bytes */
        memcpy(ds + 8, d[k].sector, 8);             /* leading bytes */
        memcpy(data, "data", 4);
        put32(data + 4, (uint32_t) (seq >> 32));
        memcpy(data + 8, d[k].sector + 8, 4084);
        put32(data + 4092, (uint32_t) seq);
        data += 4096;
    }
    fix_crc(e, len);
    return len;
}

/* A log as a host that crashed leaves it: the BAT's first sector in place
 * is all zeros (every block there not present) and the log's entry holds
 * the right one; the same entry zeros the first 64 KiB of the first
 * present block (want follows).  After it, entries that must be ignored:
 * a torn one (bad CRC) and one of an older log with a higher sequence
 * number, both writing garbage over the BAT.  sp->log_flags spoils the
 * good entry (see LOG_*). */
static void add_log(uint8_t *f, size_t flen, uint64_t bat_off,
                    const struct spec *sp, uint8_t *want)
{
    uint8_t bat0[4096], junk[4096];
    memcpy(bat0, f + bat_off, 4096);
    memset(junk, 0xA5, sizeof junk);
    struct vhdx_meta mt = { .block_size = sp->block_size,
                            .disk_size = sp->disk_size,
                            .logical_sector = sp->lsec };
    struct vhdx_geom g;
    vhdx_geom(&mt, &g);
    uint64_t first = 0, blk = 0;
    for (uint64_t i = 0; i < 512 && i < g.bat_entries && !first; i++) {
        uint64_t e = 0;
        for (int b = 7; b >= 0; b--)
            e = e << 8 | bat0[8 * i + b];
        if (!vhdx_bat_is_bitmap(&g, i) && (e & 7) == VHDX_PB_FULLY_PRESENT) {
            first = e >> 20 << 20;
            blk = i - i / (g.chunk_ratio + 1);
        }
    }
    memset(f + bat_off, 0, 4096);
    uint64_t flushed = sp->log_flags & LOG_CUT ? flen + MiB : flen;
    struct ldesc good[2] = {
        { bat_off, bat0, 0 },
        { sp->log_flags & LOG_BEHIND ? 64 * 1024 : first, NULL, 65536 },
    };
    unsigned ngood = first || (sp->log_flags & LOG_BEHIND) ? 2 : 1;
    uint32_t tail = sp->log_flags & LOG_BAD_TAIL ? 512 * 1024 : 0;
    uint32_t n = log_entry(f, 0, G_LOG, 5, tail, good, ngood, flushed, flen);
    if (sp->log_flags & LOG_TORN)
        f[LOG_OFF + n - 100] ^= 1;              /* in its data sector */
    struct ldesc bad = { bat_off, junk, 0 };
    uint32_t m = log_entry(f, n, G_LOG, 6, 0, &bad, 1, flen, flen);
    f[LOG_OFF + n + m - 100] ^= 1;              /* torn: its CRC fails */
    log_entry(f, 256 * 1024, G_LOG_OTHER, 100, 256 * 1024, &bad, 1, flen, flen);
    if (first && !sp->log_flags) {
        uint64_t bs = sp->block_size;
        uint64_t n0 = sp->disk_size - blk * bs < 65536 ? sp->disk_size - blk * bs
                                                      : 65536;
        memset(want + blk * bs, 0, n0);
    }
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
            memcpy(p + 48, sp->log_flags & LOG_OLD_GUID ? G_LOG_NEW : G_LOG, 16);
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
    if (sp->log_pending)
        add_log(f, flen, bat_off, sp, want);
    *len = flen;
    return f;
}

#endif /* NBDFERRY_VHDX_BUILD_H */
