/* vhdx/stream.c: forward-only decoder, VHDX file bytes in file order to
 * raw-disk writes.  See the contract in vhdx/vhdx.h.
 *
 * Phases:
 *   HEAD   collect [0, 320 KiB): file identifier, both headers, both
 *          region tables; pick the current header.
 *   LOG    a header with a log GUID: the log is collected (it must lie
 *          before the metadata and the BAT), its active sequence found
 *          (vhdx/log.c), and from its end on every byte fed is patched
 *          with the log's writes before anything else sees it; a write
 *          aimed at bytes already passed is refused, before begin().
 *   BODY   every byte past the header section is one of: the log (skipped:
 *          empty for a file closed cleanly), the metadata region or the
 *          BAT (collected), or blocks.  Until the metadata and the BAT have
 *          both arrived nothing can be placed, so block bytes are spooled
 *          (zeros of the file are only remembered).  Once both are in, the
 *          BAT is checked and turned into a map of present blocks sorted by
 *          file offset, begin() is called, the spool is replayed, and from
 *          then on bytes are placed as they pass.
 *   A partially present block (differencing files) needs its chunk's
 *   sector bitmap: bytes that arrive before it are spooled too and
 *   replayed when the bitmap is complete.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhdx/vhdx-internal.h"

#define HEAD_BYTES (VHDX_REGION2_OFF + VHDX_REGION_BYTES)     /* 320 KiB */
#define META_MAX   (32ull << 20)        /* metadata region we collect */
#define REPLAY_BUF (1u << 20)
#define NO_CHUNK   UINT64_MAX

enum blk_kind { BLK_FULL, BLK_PARTIAL, BLK_BITMAP };

struct blk {                            /* a present block in the file */
    uint64_t file_off;
    uint64_t len;                       /* bytes of the file it spans */
    uint64_t index;                     /* payload block, or chunk */
    enum blk_kind kind;
};

struct spooled {                        /* a range handed to the spool */
    uint64_t file_off, len;
    uint64_t chunk;                     /* waiting for this bitmap, or
                                         * NO_CHUNK: for the BAT/metadata */
    bool zero;                          /* file zeros: nothing was put */
    bool done;
};

struct bitmap {                         /* a sector bitmap being collected */
    uint8_t *bits;                      /* VHDX_BITMAP_BYTES */
    uint64_t got;
    bool complete;
};

struct vhdx_stream {
    const struct vhdx_sink *sink;
    void *opaque;
    struct vhdx_stream_config cfg;
    int err;                            /* sticky, negative */
    struct nbdf_err e;
    uint64_t pos;                       /* next file byte expected */

    uint8_t *head;                      /* HEAD_BYTES, freed after */
    bool id_checked, head_done;
    struct vhdx_info info;
    uint64_t log_off, log_len;
    uint8_t *log;                       /* the log, while collected */
    bool log_done;
    struct vhdx_log_plan plan;          /* its writes, once log_done */

    uint8_t *meta;                      /* the metadata region */
    uint64_t meta_len, meta_got;
    uint8_t *bat;                       /* the BAT's first bat_need bytes */
    uint64_t bat_need, bat_got;
    bool ready;                         /* begin() called */

    struct blk *blks;                   /* sorted by file_off */
    size_t nblks;
    size_t cur;                         /* search hint */
    struct bitmap *bitmaps;             /* per chunk, differencing only */
    uint64_t nchunks;

    struct spooled *sp;
    size_t nsp, capsp;
    uint64_t spool_held;                /* bytes in the spool and bitmaps */
    struct vhdx_stream_stats stats;
};

/* The first error (sticky) with its message; returns it. */
#define fail(s, ...) nbdf_latchf(&(s)->err, &(s)->e, __VA_ARGS__)

static int sink_fail(struct vhdx_stream *s, int r, const char *what)
{
    return fail(s, r, "%s: the sink failed: %s", what, strerror(-r));
}

/* ---- the spool ------------------------------------------------------------ */

static int spool_hold(struct vhdx_stream *s, uint64_t n)
{
    if (s->spool_held + n > s->cfg.spool_max)
        return fail(s, -EFBIG,
                    "this file needs more than %" PRIu64 " bytes spooled "
                    "(blocks that arrive before the table that places "
                    "them); raise %s", s->cfg.spool_max,
                    s->cfg.spool_option ? s->cfg.spool_option :
                                          "the spool bound");
    s->spool_held += n;
    if (s->spool_held > s->stats.spool_peak)
        s->stats.spool_peak = s->spool_held;
    return 0;
}

static int spool(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
                 uint64_t len, uint64_t chunk)
{
    /* Zeros of the file (padding between regions, zero sectors) are only
     * remembered: nothing is stored for them. */
    bool zero = buf == NULL ||
                (buf[0] == 0 && memcmp(buf, buf + 1, len - 1) == 0);
    if (zero)
        buf = NULL;
    if (!zero && (!s->sink->spool_put || !s->sink->spool_get))
        return fail(s, -ENOTSUP,
                    "block data at %" PRIu64 " arrives before the table "
                    "that places it, and this reader cannot spool", off);
    if (s->nsp == s->capsp) {
        size_t cap = s->capsp ? s->capsp * 2 : 64;
        struct spooled *n = realloc(s->sp, cap * sizeof *n);
        if (!n)
            return fail(s, -ENOMEM, "out of memory for the spool index");
        s->sp = n;
        s->capsp = cap;
    }
    if (!zero) {
        int r = spool_hold(s, len);
        if (r < 0)
            return r;
        r = s->sink->spool_put(s->opaque, off, buf, len);
        if (r < 0)
            return sink_fail(s, r, "spool");
        s->stats.spooled_bytes += len;
    }
    s->sp[s->nsp++] = (struct spooled){ .file_off = off, .len = len,
                                        .chunk = chunk, .zero = zero };
    return 0;
}

/* ---- placing bytes -------------------------------------------------------- */

static const struct blk *find_blk(struct vhdx_stream *s, uint64_t off)
{
    /* Input mostly moves forward: try the hint, then search. */
    if (s->cur < s->nblks && s->blks[s->cur].file_off <= off &&
        off < s->blks[s->cur].file_off + s->blks[s->cur].len)
        return &s->blks[s->cur];
    size_t lo = 0, hi = s->nblks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->blks[mid].file_off + s->blks[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    s->cur = lo;
    return lo < s->nblks && s->blks[lo].file_off <= off ? &s->blks[lo] : NULL;
}

/* Bytes up to the next block start after off (or UINT64_MAX). */
static uint64_t next_blk_start(struct vhdx_stream *s, uint64_t off)
{
    find_blk(s, off);
    size_t i = s->cur;
    while (i < s->nblks && s->blks[i].file_off <= off)
        i++;
    return i < s->nblks ? s->blks[i].file_off : UINT64_MAX;
}

static int emit(struct vhdx_stream *s, uint64_t disk_off, const uint8_t *buf,
                uint64_t len)
{
    uint64_t size = s->info.meta.disk_size;
    if (disk_off >= size)
        return 0;
    if (len > size - disk_off)
        len = size - disk_off;
    int r;
    if (buf) {
        r = s->sink->data(s->opaque, disk_off, buf, len);
        s->stats.data_bytes += len;
    } else if (s->info.meta.has_parent) {
        r = s->sink->zero ? s->sink->zero(s->opaque, disk_off, len) : 0;
        s->stats.zero_bytes += len;
    } else
        r = 0;                          /* the disk was zeroed at begin() */
    return r < 0 ? sink_fail(s, r, "data") : 0;
}

static bool bit(const uint8_t *bits, uint64_t i)
{
    return bits[i / 8] >> (i % 8) & 1;
}

/* Bytes of a partially present block whose bitmap is complete: only the
 * sectors it marks. */
static int emit_partial(struct vhdx_stream *s, const struct blk *b,
                        uint64_t off, const uint8_t *buf, uint64_t len)
{
    uint64_t bs = s->info.meta.block_size, ls = s->info.meta.logical_sector;
    uint64_t chunk_base = b->index / s->info.geom.chunk_ratio *
                          s->info.geom.chunk_ratio * bs;
    const uint8_t *bits = s->bitmaps[b->index / s->info.geom.chunk_ratio].bits;
    uint64_t disk = b->index * bs + (off - b->file_off);
    uint64_t rel = disk - chunk_base;             /* offset in the chunk */
    while (len) {
        bool on = bit(bits, rel / ls);
        uint64_t n = ls - rel % ls;               /* to the sector's end */
        while (n < len && bit(bits, (rel + n) / ls) == on)
            n += ls;
        if (n > len)
            n = len;
        if (on) {
            int r = emit(s, disk, buf, n);
            if (r < 0)
                return r;
        }
        disk += n;
        rel += n;
        len -= n;
        if (buf)
            buf += n;
    }
    return 0;
}

static int collect_bitmap(struct vhdx_stream *s, const struct blk *b,
                          uint64_t off, const uint8_t *buf, uint64_t len);

/* Place [off, off+len) of the file, all inside block b. */
static int place(struct vhdx_stream *s, const struct blk *b, uint64_t off,
                 const uint8_t *buf, uint64_t len)
{
    switch (b->kind) {
    case BLK_FULL:
        return emit(s, b->index * s->info.meta.block_size +
                           (off - b->file_off), buf, len);
    case BLK_PARTIAL: {
        uint64_t c = b->index / s->info.geom.chunk_ratio;
        if (!s->bitmaps[c].complete)
            return spool(s, off, buf, len, c);
        return emit_partial(s, b, off, buf, len);
    }
    case BLK_BITMAP:
        return collect_bitmap(s, b, off, buf, len);
    }
    return 0;
}

static int body_bytes(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
                      uint64_t len);

/* Hand the spooled ranges waiting for 'chunk' back to body_bytes(). */
static int replay(struct vhdx_stream *s, uint64_t chunk)
{
    uint8_t *tmp = NULL;
    int r = 0;
    /* body_bytes() may spool again (s->sp may move) and replay another
     * chunk: work on a copy of each entry, by index. */
    for (size_t i = 0; i < s->nsp && r == 0; i++) {
        if (s->sp[i].done || s->sp[i].chunk != chunk)
            continue;
        struct spooled sp = s->sp[i];
        s->sp[i].done = true;
        if (sp.zero) {
            r = body_bytes(s, sp.file_off, NULL, sp.len);
            continue;
        }
        if (!tmp && !(tmp = malloc(REPLAY_BUF)))
            return fail(s, -ENOMEM, "out of memory replaying the spool");
        for (uint64_t done = 0; done < sp.len && r == 0;) {
            uint64_t n = sp.len - done < REPLAY_BUF ? sp.len - done : REPLAY_BUF;
            r = s->sink->spool_get(s->opaque, sp.file_off + done, tmp, n);
            if (r < 0) {
                r = sink_fail(s, r, "spool");
                break;
            }
            s->spool_held -= n;
            r = body_bytes(s, sp.file_off + done, tmp, n);
            done += n;
        }
    }
    free(tmp);
    return r;
}

static int collect_bitmap(struct vhdx_stream *s, const struct blk *b,
                          uint64_t off, const uint8_t *buf, uint64_t len)
{
    struct bitmap *bm = &s->bitmaps[b->index];
    uint64_t at = off - b->file_off;
    if (!bm->bits) {
        int r = spool_hold(s, VHDX_BITMAP_BYTES);
        if (r < 0)
            return r;
        if (!(bm->bits = calloc(1, VHDX_BITMAP_BYTES)))
            return fail(s, -ENOMEM, "out of memory for a sector bitmap");
    }
    if (buf)
        memcpy(bm->bits + at, buf, len);
    bm->got += len;
    if (bm->got < VHDX_BITMAP_BYTES)
        return 0;
    bm->complete = true;
    return replay(s, b->index);
}

/* Bytes past the header section, after begin(): block bytes are placed,
 * the rest (regions, gaps between blocks) dropped. */
static int body_bytes(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
                      uint64_t len)
{
    while (len) {
        const struct blk *b = find_blk(s, off);
        uint64_t n;
        int r = 0;
        if (b) {
            n = b->file_off + b->len - off;
            n = n < len ? n : len;
            r = place(s, b, off, buf, n);
        } else {
            uint64_t next = next_blk_start(s, off);
            n = next - off < len ? next - off : len;
        }
        if (r < 0)
            return r;
        off += n;
        len -= n;
        if (buf)
            buf += n;
    }
    return 0;
}

/* ---- the BAT ---------------------------------------------------------------- */

static bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return blen && alen && a < b + blen && b < a + alen;
}

static int blk_cmp(const void *a, const void *b)
{
    const struct blk *x = a, *y = b;
    return x->file_off < y->file_off ? -1 : x->file_off > y->file_off;
}

/* A present block must lie past the header section, outside the log, the
 * metadata and the BAT. */
static int check_place(struct vhdx_stream *s, uint64_t i, uint64_t off,
                       uint64_t len)
{
    const struct vhdx_regions *rg = &s->info.regions;
    const char *what = NULL;
    if (off < VHDX_HEADER_SECTION || off % VHDX_MiB)
        what = "the header section (or is not 1 MiB aligned)";
    else if (overlaps(off, len, s->log_off, s->log_len))
        what = "the log";
    else if (overlaps(off, len, rg->meta.off, rg->meta.len))
        what = "the metadata region";
    else if (overlaps(off, len, rg->bat.off, rg->bat.len))
        what = "the BAT";
    else if (off + len < off)
        what = "the end of the address space";
    if (what)
        return fail(s, -EINVAL, "BAT entry %" PRIu64 ": block at %" PRIu64
                    " overlaps %s", i, off, what);
    return 0;
}

static int add_blk(struct vhdx_stream *s, size_t *cap, struct blk b)
{
    if (s->nblks == *cap) {
        size_t n = *cap ? *cap * 2 : 256;
        struct blk *v = realloc(s->blks, n * sizeof *v);
        if (!v)
            return fail(s, -ENOMEM, "out of memory for the block map");
        s->blks = v;
        *cap = n;
    }
    s->blks[s->nblks++] = b;
    return 0;
}

static int bat_payload(struct vhdx_stream *s, uint64_t i, uint64_t blk,
                       uint64_t e, size_t *cap)
{
    const struct vhdx_meta *m = &s->info.meta;
    unsigned st = vhdx_bat_state(e);
    switch (st) {
    case VHDX_PB_NOT_PRESENT:
        return 0;
    case VHDX_PB_UNDEFINED: case VHDX_PB_ZERO:
    case VHDX_PB_UNMAPPED: case VHDX_PB_UNMAPPED_QEMU:
        s->info.zero_blocks++;
        return 0;
    case VHDX_PB_PARTIALLY_PRESENT:
        if (!m->has_parent)
            return fail(s, -EINVAL, "BAT entry %" PRIu64 ": a partially "
                        "present block in a file without a parent", i);
        /* fall through */
    case VHDX_PB_FULLY_PRESENT: {
        int r = check_place(s, i, vhdx_bat_offset(e), m->block_size);
        if (r < 0)
            return r;
        s->info.present_blocks++;
        return add_blk(s, cap, (struct blk){
            .file_off = vhdx_bat_offset(e), .len = m->block_size,
            .index = blk,
            .kind = st == VHDX_PB_FULLY_PRESENT ? BLK_FULL : BLK_PARTIAL });
    }
    default:
        return fail(s, -EINVAL, "BAT entry %" PRIu64 ": unknown block "
                    "state %u", i, st);
    }
}

static int bat_bitmap(struct vhdx_stream *s, uint64_t i, uint64_t chunk,
                      uint64_t e, size_t *cap)
{
    unsigned st = vhdx_bat_state(e);
    if (st == VHDX_SB_NOT_PRESENT || !s->info.meta.has_parent)
        return 0;                       /* not used without a parent */
    if (st != VHDX_SB_PRESENT)
        return fail(s, -EINVAL, "BAT entry %" PRIu64 ": unknown sector "
                    "bitmap state %u", i, st);
    int r = check_place(s, i, vhdx_bat_offset(e), VHDX_BITMAP_BYTES);
    if (r < 0)
        return r;
    return add_blk(s, cap, (struct blk){ .file_off = vhdx_bat_offset(e),
                                         .len = VHDX_BITMAP_BYTES,
                                         .index = chunk, .kind = BLK_BITMAP });
}

static int bat_decode(struct vhdx_stream *s)
{
    const struct vhdx_geom *g = &s->info.geom;
    size_t cap = 0;
    for (uint64_t i = 0, blk = 0; i < g->bat_entries; i++) {
        uint64_t e = vhdx_le64(s->bat + 8 * i);
        int r = vhdx_bat_is_bitmap(g, i)
            ? bat_bitmap(s, i, i / (g->chunk_ratio + 1), e, &cap)
            : blk < g->payload_blocks ? bat_payload(s, i, blk++, e, &cap) : 0;
        if (r < 0)
            return r;
    }
    if (s->nblks)                       /* blks is NULL without blocks */
        qsort(s->blks, s->nblks, sizeof *s->blks, blk_cmp);
    for (size_t i = 1; i < s->nblks; i++)
        if (s->blks[i - 1].file_off + s->blks[i - 1].len > s->blks[i].file_off)
            return fail(s, -EINVAL, "BAT: two blocks overlap at %" PRIu64,
                        s->blks[i].file_off);
    return 0;
}

/* Partially present blocks whose chunk has no present bitmap cannot be
 * decoded. */
static int check_bitmaps(struct vhdx_stream *s)
{
    if (!s->info.meta.has_parent)
        return 0;
    s->nchunks = s->info.geom.bitmap_blocks;
    s->bitmaps = calloc(s->nchunks, sizeof *s->bitmaps);
    if (!s->bitmaps)
        return fail(s, -ENOMEM, "out of memory for the bitmap index");
    bool *have = calloc(s->nchunks, 1);
    if (!have)
        return fail(s, -ENOMEM, "out of memory for the bitmap index");
    for (size_t i = 0; i < s->nblks; i++)
        if (s->blks[i].kind == BLK_BITMAP)
            have[s->blks[i].index] = true;
    int r = 0;
    for (size_t i = 0; i < s->nblks && r == 0; i++)
        if (s->blks[i].kind == BLK_PARTIAL &&
            !have[s->blks[i].index / s->info.geom.chunk_ratio])
            r = fail(s, -EINVAL, "payload block %" PRIu64 " is partially "
                     "present but its chunk has no sector bitmap",
                     s->blks[i].index);
    free(have);
    return r;
}

/* The metadata and the BAT are both in: check, begin(), replay. */
static int get_ready(struct vhdx_stream *s)
{
    int r = vhdx_metadata_decode(s->meta, s->meta_len, &s->info.meta, &s->e);
    if (r < 0)
        return s->err = r;
    vhdx_geom(&s->info.meta, &s->info.geom);
    if (s->info.geom.bat_entries * 8 > s->bat_need)
        return fail(s, -EINVAL, "BAT region of %" PRIu64 " bytes holds fewer "
                    "than the %" PRIu64 " entries the disk needs (or "
                    "more than %llu bytes of BAT)", s->info.regions.bat.len,
                    s->info.geom.bat_entries, VHDX_BAT_MAX_BYTES);
    if ((r = bat_decode(s)) < 0 || (r = check_bitmaps(s)) < 0)
        return r;
    free(s->meta);
    s->meta = NULL;
    s->ready = true;
    r = s->sink->begin(s->opaque, &s->info);
    if (r < 0)
        return sink_fail(s, r, "begin");
    /* Blocks in state ZERO of a differencing file hide the parent. */
    if (s->info.meta.has_parent) {
        const struct vhdx_geom *g = &s->info.geom;
        for (uint64_t blk = 0; blk < g->payload_blocks && r == 0; blk++) {
            unsigned st = vhdx_bat_state(vhdx_le64(s->bat +
                                                   8 * vhdx_bat_index(g, blk)));
            if (st == VHDX_PB_ZERO || st == VHDX_PB_UNDEFINED ||
                st == VHDX_PB_UNMAPPED || st == VHDX_PB_UNMAPPED_QEMU)
                r = emit(s, blk * s->info.meta.block_size, NULL,
                         s->info.meta.block_size);
        }
        if (r < 0)
            return r;
    }
    return replay(s, NO_CHUNK);
}

/* ---- the log ------------------------------------------------------------------ */

#define LOG_CLEAN "open it once in Hyper-V, or run qemu-img check -r all " \
    "on it (or qemu-img convert it), then copy it again"

/* A header with a log GUID: collect the log, which must come before what
 * it may update (the metadata, the BAT): a one-pass stream cannot go back. */
static int log_prepare(struct vhdx_stream *s)
{
    const struct vhdx_regions *rg = &s->info.regions;
    if (!s->info.header.log_pending)
        return 0;
    uint64_t end = s->log_off + s->log_len;
    if (end > rg->meta.off || end > rg->bat.off)
        return fail(s, -ENOTSUP, "a log to replay (not closed cleanly) at %"
                    PRIu64 ", after the metadata or BAT it may update: "
                    LOG_CLEAN, s->log_off);
    if (s->log_len > VHDX_LOG_MAX)
        return fail(s, -EFBIG, "a log to replay (the file was not closed "
                    "cleanly) of %" PRIu64 " bytes, more than %llu: "
                    LOG_CLEAN, s->log_len, VHDX_LOG_MAX);
    if (!(s->log = calloc(1, s->log_len)))
        return fail(s, -ENOMEM, "out of memory for the log");
    return 0;
}

/* The log is in: plan its replay; every write must land at or past the
 * log's end (bytes not yet passed). */
static int log_ready(struct vhdx_stream *s)
{
    struct vhdx_log_plan *p = &s->plan;
    int r = vhdx_log_plan(s->log, s->log_len, s->info.header.log_guid, p,
                          &s->e);
    free(s->log);
    s->log = NULL;
    s->log_done = true;
    if (r < 0)
        return s->err = r;
    uint64_t end = s->log_off + s->log_len;
    if (p->npatches && p->lo < end)
        return fail(s, -ENOTSUP, "a log to replay (the file was not closed "
                    "cleanly) writes at %" PRIu64 ", before the log's end at %"
                    PRIu64 ", which a one-pass copy has passed: " LOG_CLEAN,
                    p->lo, end);
    s->info.log_entries = p->entries;
    s->info.log_writes = p->npatches;
    return 0;
}

static int feed_body(struct vhdx_stream *s, const uint8_t *buf, uint64_t len);
static uint64_t region_copy(uint64_t off, const uint8_t *buf, uint64_t len,
                            uint64_t roff, uint64_t rlen, uint8_t *dst);

/* Bytes past the log's end, with the log's writes made on them: a piece
 * a write touches is copied and patched, the rest passes as it is.  Over
 * file zeros (buf NULL) only data writes matter. */
static int feed_patched(struct vhdx_stream *s, const uint8_t *buf,
                        uint64_t len)
{
    uint8_t *tmp = NULL;
    int r = 0;
    while (len && r == 0) {
        uint64_t off = s->pos, n;
        uint64_t next = vhdx_log_next(&s->plan, off, buf == NULL);
        if (next > off) {
            n = next - off < len ? next - off : len;
            r = feed_body(s, buf, n);
        } else {
            n = len < REPLAY_BUF ? len : REPLAY_BUF;
            if (!tmp && !(tmp = malloc(REPLAY_BUF))) {
                r = fail(s, -ENOMEM, "out of memory replaying the log");
                break;
            }
            if (buf)
                memcpy(tmp, buf, n);
            else
                memset(tmp, 0, n);
            vhdx_log_apply(&s->plan, off, tmp, n);
            r = feed_body(s, tmp, n);
        }
        len -= n;
        if (buf)
            buf += n;
    }
    free(tmp);
    return r;
}

/* Bytes past the header section: collect the log while it passes, then
 * replay it onto what follows. */
static int feed_log(struct vhdx_stream *s, const uint8_t *buf, uint64_t len)
{
    if (!s->info.header.log_pending)
        return feed_body(s, buf, len);
    if (!s->log_done) {
        uint64_t end = s->log_off + s->log_len;
        uint64_t n = end - s->pos < len ? end - s->pos : len;
        if (s->pos < s->log_off && s->log_off - s->pos < n)
            n = s->log_off - s->pos;            /* up to the log */
        region_copy(s->pos, buf, n, s->log_off, s->log_len, s->log);
        int r = feed_body(s, buf, n);
        if (r < 0 || (s->pos == end && (r = log_ready(s)) < 0))
            return r;
        len -= n;
        if (buf)
            buf += n;
        if (!len || !s->log_done)
            return len ? feed_log(s, buf, len) : 0;
    }
    return feed_patched(s, buf, len);
}

/* End of input with a replayed log: the file is at least as long as the
 * log says it was, and its writes past the end we saw still count. */
static int log_finish(struct vhdx_stream *s)
{
    const struct vhdx_log_plan *p = &s->plan;
    if (!s->log_done || !p->entries)
        return 0;
    if (s->pos < p->flushed_file_offset)
        return fail(s, -EINVAL, "the file ends at %" PRIu64 ", cut short: "
                    "its log says it was at least %" PRIu64 " bytes",
                    s->pos, p->flushed_file_offset);
    uint64_t end = p->last_file_offset > p->hi ? p->last_file_offset : p->hi;
    return end > s->pos ? vhdx_stream_feed(s, end, NULL, 0) : 0;
}

/* ---- the header section and the regions ------------------------------------- */

static int head_decode(struct vhdx_stream *s)
{
    struct nbdf_err e1 = { "" }, e2 = { "" };
    struct vhdx_header h1, h2;
    int r = vhdx_file_id_check(s->head, HEAD_BYTES, &s->e);
    if (r < 0)
        return s->err = r;
    bool ok1 = vhdx_header_decode(s->head + VHDX_HEADER1_OFF, &h1, &e1) == 0;
    bool ok2 = vhdx_header_decode(s->head + VHDX_HEADER2_OFF, &h2, &e2) == 0;
    if (!ok1 && !ok2)
        return fail(s, -EINVAL, "both headers are bad: %s", e1.msg);
    int pick = vhdx_header_pick(ok1 ? &h1 : NULL, ok2 ? &h2 : NULL, &s->e);
    s->info.header = pick == 1 ? h1 : h2;
    s->log_off = s->info.header.log_offset;
    s->log_len = s->info.header.log_length;
    struct nbdf_err re = { "" };
    r = vhdx_region_table_decode(s->head + VHDX_REGION1_OFF,
                                 &s->info.regions, &re);
    if (r == -EINVAL)       /* the second copy is the fallback */
        r = vhdx_region_table_decode(s->head + VHDX_REGION2_OFF,
                                     &s->info.regions, &re);
    if (r < 0)
        return fail(s, r, "%s", re.msg);
    const struct vhdx_regions *rg = &s->info.regions;
    if (overlaps(s->log_off, s->log_len, rg->bat.off, rg->bat.len) ||
        overlaps(s->log_off, s->log_len, rg->meta.off, rg->meta.len))
        return fail(s, -EINVAL, "the log overlaps the BAT or the metadata");
    if ((r = log_prepare(s)) < 0)
        return r;
    if (rg->meta.len > META_MAX)
        return fail(s, -EFBIG, "metadata region of %" PRIu64 " bytes (at "
                    "most %llu)", rg->meta.len, META_MAX);
    s->meta_len = rg->meta.len;
    /* The BAT region may be longer than the entries: collect what a disk
     * of at most 64 TiB can use, bounded. */
    s->bat_need = rg->bat.len < VHDX_BAT_MAX_BYTES ? rg->bat.len
                                                   : VHDX_BAT_MAX_BYTES;
    if (!(s->meta = calloc(1, s->meta_len)) || !(s->bat = calloc(1, s->bat_need)))
        return fail(s, -ENOMEM, "out of memory for the metadata and BAT");
    free(s->head);
    s->head = NULL;
    s->head_done = true;
    return 0;
}

/* Copy the part of [off, off+len) inside region [roff, roff+rlen) into
 * dst (zeros for a NULL buf: dst is already zeroed). */
static uint64_t region_copy(uint64_t off, const uint8_t *buf, uint64_t len,
                            uint64_t roff, uint64_t rlen, uint8_t *dst)
{
    uint64_t a = off > roff ? off : roff;
    uint64_t b = off + len < roff + rlen ? off + len : roff + rlen;
    if (a >= b)
        return 0;
    if (buf)
        memcpy(dst + (a - roff), buf + (a - off), b - a);
    return b - a;
}

/* Before begin(): regions are collected, everything else spooled. */
static int early_bytes(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
                       uint64_t len)
{
    const struct vhdx_regions *rg = &s->info.regions;
    s->meta_got += region_copy(off, buf, len, rg->meta.off, s->meta_len, s->meta);
    s->bat_got += region_copy(off, buf, len, rg->bat.off, s->bat_need, s->bat);
    /* Spool what lies outside the header section and every region. */
    uint64_t end = off + len;
    while (off < end) {
        uint64_t stop = end, skip_to = 0;
        const struct vhdx_region rs[3] = { rg->meta, rg->bat,
                                           { s->log_off, s->log_len } };
        for (int i = 0; i < 3; i++) {
            if (!rs[i].len)
                continue;
            if (off >= rs[i].off && off < rs[i].off + rs[i].len)
                skip_to = rs[i].off + rs[i].len;
            else if (rs[i].off > off && rs[i].off < stop)
                stop = rs[i].off;
        }
        if (off < VHDX_HEADER_SECTION)
            skip_to = VHDX_HEADER_SECTION;
        if (skip_to) {
            uint64_t n = (skip_to < end ? skip_to : end) - off;
            off += n;
            if (buf)
                buf += n;
            continue;
        }
        int r = spool(s, off, buf, stop - off, NO_CHUNK);
        if (r < 0)
            return r;
        if (buf)
            buf += stop - off;
        off = stop;
    }
    if (s->meta_got == s->meta_len && s->bat_got == s->bat_need)
        return get_ready(s);
    return 0;
}

int vhdx_stream_feed(struct vhdx_stream *s, uint64_t off, const void *vbuf,
                     size_t len)
{
    const uint8_t *buf = vbuf;
    if (s->err)
        return s->err;
    if (off < s->pos)
        return fail(s, -EINVAL, "write at %" PRIu64 " goes back before %"
                    PRIu64 ": a VHDX must arrive in file order", off, s->pos);
    if (off > s->pos) {                 /* a gap: file zeros */
        int r = vhdx_stream_feed(s, s->pos, NULL, off - s->pos);
        if (r < 0)
            return r;
    }
    while (len && !s->head_done) {
        uint64_t n = HEAD_BYTES - s->pos < len ? HEAD_BYTES - s->pos : len;
        if (buf)
            memcpy(s->head + s->pos, buf, n);
        s->pos += n;
        len -= n;
        if (buf)
            buf += n;
        /* Not a VHDX: refuse at the first write, not 320 KiB later. */
        if (!s->id_checked && s->pos >= 8) {
            s->id_checked = true;
            if (vhdx_file_id_check(s->head, s->pos, &s->e) < 0)
                return s->err = -EINVAL;
        }
        if (s->pos == HEAD_BYTES && head_decode(s) < 0)
            return s->err;
    }
    if (!len)
        return s->err;
    int r = feed_log(s, buf, len);
    return r < 0 ? r : s->err;
}

/* The bytes at s->pos past the header section, the log's writes made. */
static int feed_body(struct vhdx_stream *s, const uint8_t *buf, uint64_t len)
{
    uint64_t at = s->pos;
    s->pos += len;
    int r = 0;
    if (!s->ready) {
        /* Up to where the metadata and the BAT are complete, collect and
         * spool; past it, place (so nothing is spooled needlessly). */
        const struct vhdx_regions *rg = &s->info.regions;
        uint64_t ready_at = rg->meta.off + s->meta_len;
        if (rg->bat.off + s->bat_need > ready_at)
            ready_at = rg->bat.off + s->bat_need;
        uint64_t n = ready_at > at && ready_at - at < len ? ready_at - at : len;
        r = early_bytes(s, at, buf, n);
        at += n;
        len -= n;
        if (buf)
            buf += n;
    }
    if (r == 0 && len)
        r = body_bytes(s, at, buf, len);
    return r < 0 ? r : s->err;
}

int vhdx_stream_finish(struct vhdx_stream *s)
{
    if (s->err || log_finish(s) < 0)
        return s->err;
    if (!s->head_done)
        return fail(s, -EINVAL, "the file ends at %" PRIu64 ", inside the "
                    "header section", s->pos);
    if (!s->ready)
        return fail(s, -EINVAL, "the file ends at %" PRIu64 " before its %s "
                    "arrived", s->pos,
                    s->meta_got < s->meta_len ? "metadata" : "BAT");
    uint64_t bs = s->info.meta.block_size, size = s->info.meta.disk_size;
    for (size_t i = 0; i < s->nblks; i++) {
        const struct blk *b = &s->blks[i];
        uint64_t need = b->len;
        if (b->kind != BLK_BITMAP && size - b->index * bs < need)
            need = size - b->index * bs;      /* the disk's last block */
        if (b->file_off + need > s->pos)
            return fail(s, -EINVAL, "the file ends at %" PRIu64 ", cut short: "
                        "a block at %" PRIu64 " is missing", s->pos,
                        b->file_off);
    }
    for (size_t i = 0; i < s->nsp; i++)
        if (!s->sp[i].done)
            return fail(s, -EINVAL, "bytes at %" PRIu64 " were never placed "
                        "(their sector bitmap never arrived)",
                        s->sp[i].file_off);
    return 0;
}

int vhdx_stream_new(const struct vhdx_sink *sink, void *opaque,
                    const struct vhdx_stream_config *cfg,
                    struct vhdx_stream **out)
{
    struct vhdx_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->head = calloc(1, HEAD_BYTES))) {
        free(s);
        return -ENOMEM;
    }
    s->sink = sink;
    s->opaque = opaque;
    if (cfg)
        s->cfg = *cfg;
    *out = s;
    return 0;
}

const char *vhdx_stream_error(const struct vhdx_stream *s)
{
    return s->e.msg;
}

uint64_t vhdx_stream_position(const struct vhdx_stream *s)
{
    return s->pos;
}

const struct vhdx_info *vhdx_stream_info(const struct vhdx_stream *s)
{
    return s->ready ? &s->info : NULL;
}

int vhdx_stream_block(const struct vhdx_stream *s, uint64_t blk,
                      unsigned *state, uint64_t *file_off)
{
    if (!s->ready || blk >= s->info.geom.payload_blocks)
        return -EINVAL;
    uint64_t e = vhdx_le64(s->bat + 8 * vhdx_bat_index(&s->info.geom, blk));
    *state = vhdx_bat_state(e);
    *file_off = vhdx_bat_offset(e);
    return 0;
}

void vhdx_stream_stats(const struct vhdx_stream *s,
                       struct vhdx_stream_stats *out)
{
    *out = s->stats;
}

void vhdx_stream_free(struct vhdx_stream *s)
{
    if (!s)
        return;
    for (uint64_t i = 0; s->bitmaps && i < s->nchunks; i++)
        free(s->bitmaps[i].bits);
    free(s->bitmaps);
    free(s->blks);
    free(s->sp);
    free(s->bat);
    free(s->log);
    vhdx_log_plan_free(&s->plan);
    free(s->meta);
    free(s->head);
    free(s);
}
