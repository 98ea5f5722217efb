/* tests/fuzz/fuzz-vhdx-stream.c: libFuzzer target for the VHDX stream
 * decoder.
 *
 * A VHDX's structures sit at 1 MiB-aligned offsets of a file of several
 * MiB, so the input is not the file itself but a list of patches over a
 * small valid file built in memory (tests/unit/vhdx-build.h):
 *   byte 0: the base: bit 0 differencing, bit 1 regions after the blocks,
 *           bit 2 4096-byte sectors, bit 3 keep the CRCs as patched
 *           (else headers, region tables and the log's first entry are
 *           re-checksummed, so the fuzzer gets past them), bit 4 a log
 *           to replay (vhdx-build.h's: a BAT sector, a zero write, a torn
 *           entry, another log's entry);
 *   bytes 1-3: seed of the cutting into writes (1 byte to 256 KiB, zero
 *           pieces sent as gaps);
 *   then patches: 3 bytes of window offset, 1 byte length, the bytes.
 *   The windows are the structures' first 4 KiB: header 1 and 2, region
 *   tables 1 and 2, the metadata table, its items, the BAT, the first
 *   block, the log's first two sectors and its entry at 256 KiB.
 * With bit 5 of byte 0 the input is instead a log on its own (bytes 4 on,
 * padded to whole 4 KiB sectors, at most 64 KiB; entries that start a
 * sector get their CRC fixed unless bit 3 is set) for vhdx_log_plan():
 * every write 4 KiB aligned inside the span it reports, data writes one
 * sector, and applying the plan anywhere stays inside the buffer.
 * Oracles: begin() exactly once, before any data() or zero(); data() and
 * zero() only inside [0, disk_size); each of the first 2 MiB of the disk
 * placed at most once; every failure names its rule.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx.h"
#include "../unit/vhdx-build.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TRACK (2u << 20)               /* blocks 0 and 1: full, partial */

struct st {
    bool began;
    uint64_t disk_size;
    uint8_t *seen;                      /* TRACK bytes */
    uint64_t spooled;
};

static int s_begin(void *o, const struct nbdf_begin *b)
{
    const struct vhdx_info *info = b->info;
    struct st *st = o;
    if (st->began || info->meta.disk_size == 0)
        abort();
    st->began = true;
    st->disk_size = info->meta.disk_size;
    return 0;
}

static void mark(struct st *st, uint64_t off, uint64_t len)
{
    if (!st->began || len == 0 || off + len > st->disk_size || off + len < off)
        abort();
    for (uint64_t i = off; i < off + len && i < TRACK; i++)
        if (st->seen[i]++)
            abort();                    /* a disk byte placed twice */
}

static int s_data(void *o, uint64_t off, const void *buf, size_t len)
{
    (void) buf;
    mark(o, off, len);
    return 0;
}

static int s_zero(void *o, uint64_t off, uint64_t len)
{
    mark(o, off, len);
    return 0;
}

/* The spool keeps nothing: spool_get hands back zeros of the right size
 * (the oracles are about placement, not content). */
static int s_put(void *o, uint64_t off, const void *buf, size_t len)
{
    (void) off; (void) buf;
    ((struct st *) o)->spooled += len;
    return 0;
}

static int s_get(void *o, uint64_t off, void *buf, size_t len)
{
    (void) o; (void) off;
    memset(buf, 0, len);
    return 0;
}

static const struct nbdf_sink sink = { .begin = s_begin, .data = s_data,
                                       .zero = s_zero, .spool_put = s_put,
                                       .spool_get = s_get };

/* The log parser alone, on a small log (see the header). */
static int log_only(const uint8_t *data, size_t size)
{
    static uint8_t log[64 << 10];
    size_t n = size - 4 < sizeof log ? size - 4 : sizeof log;
    size_t len = (n + 4095) / 4096 * 4096;
    if (len == 0)
        return 0;
    memset(log, 0, len);
    memcpy(log, data + 4, n);
    for (size_t at = 0; at < len && !(data[0] & 8); at += 4096) {
        uint8_t *e = log + at;
        uint32_t elen = (uint32_t) e[8] | (uint32_t) e[9] << 8 |
                        (uint32_t) e[10] << 16 | (uint32_t) e[11] << 24;
        if (memcmp(e, "loge", 4) == 0 && elen >= 8 && elen <= len - at)
            fix_crc(e, elen);
    }
    struct vhdx_log_plan p;
    struct nbdf_err e = { "" };
    int r = vhdx_log_plan(log, len, G_LOG, &p, &e);
    if (r < 0 && e.msg[0] == 0)
        abort();
    for (size_t i = 0; r == 0 && i < p.npatches; i++) {
        const struct vhdx_log_patch *pt = &p.patches[i];
        if (pt->file_off % 4096 || pt->len % 4096 || pt->len == 0 ||
            (pt->data && pt->len != 4096) || pt->file_off < p.lo ||
            pt->file_off + pt->len > p.hi)
            abort();
    }
    if (r == 0 && p.npatches) {
        static uint8_t buf[3 * 4096];
        uint64_t at[] = { p.lo, p.hi - 1, p.lo + 2048, p.patches[0].file_off };
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
            uint64_t off = at[i] > 4096 ? at[i] - 4096 : 0;
            vhdx_log_apply(&p, off, buf, sizeof buf);
            (void) vhdx_log_next(&p, off, i % 2);
        }
    }
    vhdx_log_plan_free(&p);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    if (data[0] & 32)
        return log_only(data, size);
    /* The four bases (built once each: building is most of the cost). */
    static uint8_t *base[16];
    static size_t base_len[16];
    static uint8_t states[2][8] = {
        { VHDX_PB_FULLY_PRESENT, VHDX_PB_FULLY_PRESENT, VHDX_PB_ZERO,
          VHDX_PB_NOT_PRESENT, VHDX_PB_FULLY_PRESENT, VHDX_PB_UNMAPPED,
          VHDX_PB_FULLY_PRESENT, VHDX_PB_UNDEFINED },
        { VHDX_PB_FULLY_PRESENT, VHDX_PB_PARTIALLY_PRESENT, VHDX_PB_ZERO,
          VHDX_PB_NOT_PRESENT, VHDX_PB_FULLY_PRESENT, VHDX_PB_UNMAPPED,
          VHDX_PB_FULLY_PRESENT, VHDX_PB_UNDEFINED } };
    unsigned v = (data[0] & 7) | (data[0] & 16 ? 8 : 0);
    struct spec sp = { .disk_size = 8 * MiB - 4096, .block_size = MiB,
                       .lsec = v & 4 ? 4096 : 512, .diff = v & 1,
                       .regions_last = v & 2, .log_pending = v & 8,
                       .states = states[v & 1] };
    if (!base[v]) {
        uint8_t *content = calloc(1, sp.disk_size), *want = malloc(sp.disk_size);
        for (uint64_t i = 0; i < sp.disk_size; i += 4096)
            content[i] = (uint8_t) (i >> 12) | 1;
        base[v] = build(&sp, content, content, want, &base_len[v]);
        free(content);
        free(want);
    }
    size_t flen = base_len[v];
    uint8_t *f = malloc(flen);
    if (!f)
        abort();
    memcpy(f, base[v], flen);

    /* The windows, from the layout build() uses. */
    uint64_t meta = sp.regions_last ? 0 : 3 * MiB, bat = sp.regions_last ? 0 : 4 * MiB;
    if (sp.regions_last) {
        const uint8_t *rt = f + 192 * 1024;
        bat = (uint64_t) rt[32] | (uint64_t) rt[33] << 8 | (uint64_t) rt[34] << 16 |
              (uint64_t) rt[35] << 24;
        meta = (uint64_t) rt[64] | (uint64_t) rt[65] << 8 | (uint64_t) rt[66] << 16 |
               (uint64_t) rt[67] << 24;
    }
    uint64_t first_block = sp.regions_last ? 2 * MiB : 5 * MiB;
    const uint64_t win[] = { 64 << 10, 128 << 10, 192 << 10, 256 << 10, meta,
                             meta + 65536, bat, first_block, LOG_OFF,
                             LOG_OFF + 4096, LOG_OFF + (256 << 10) };
    const size_t nwin = sizeof win / sizeof win[0];
    size_t p = 4;
    while (p + 4 <= size) {
        uint32_t w = (uint32_t) data[p] | (uint32_t) data[p + 1] << 8 |
                     (uint32_t) data[p + 2] << 16;
        size_t n = data[p + 3];
        p += 4;
        if (n > size - p)
            n = size - p;
        uint64_t off = win[(w >> 12) % nwin] + (w & 4095);
        if (off + n <= flen)
            memcpy(f + off, data + p, n);
        p += n;
    }
    if (!(data[0] & 8)) {
        fix_crc(f + (64 << 10), 4096);
        fix_crc(f + (128 << 10), 4096);
        fix_crc(f + (192 << 10), 65536);
        fix_crc(f + (256 << 10), 65536);
        uint32_t elen = (uint32_t) f[LOG_OFF + 8] | (uint32_t) f[LOG_OFF + 9] << 8 |
                        (uint32_t) f[LOG_OFF + 10] << 16 |
                        (uint32_t) f[LOG_OFF + 11] << 24;
        if (sp.log_pending && elen >= 8 && elen <= MiB)
            fix_crc(f + LOG_OFF, elen);
    }

    struct st st = { .seen = calloc(1, TRACK) };
    struct vhdx_stream *s;
    struct vhdx_stream_config cfg = { 64 * MiB, "--spool-max" };
    if (!st.seen || vhdx_stream_new(&sink, &st, &cfg, &s) != 0)
        abort();
    unsigned seed = data[1] | data[2] << 8 | data[3] << 16;
    int r = 0;
    for (uint64_t off = 0; off < flen && r == 0;) {
        uint64_t n = 1 + rand_r(&seed) % (256 * 1024);
        if (n > flen - off)
            n = flen - off;
        bool zero = f[off] == 0 && memcmp(f + off, f + off + 1, n - 1) == 0;
        if (!zero || rand_r(&seed) % 2)
            r = vhdx_stream_feed(s, off, f + off, n);
        off += n;
    }
    if (r == 0)
        r = vhdx_stream_feed(s, flen, NULL, 0);
    if (r == 0)
        r = vhdx_stream_finish(s);
    if (r != 0 && vhdx_stream_error(s)[0] == 0)
        abort();                        /* a failure without its rule */
    vhdx_stream_free(s);
    free(st.seen);
    free(f);
    return 0;
}
