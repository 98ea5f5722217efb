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
 *
 * This file holds the entry points and the header section; the rest, one
 * job a file, is listed in vhdx/stream-internal.h.
 */
#include "vhdx/stream-internal.h"

static int feed_forward(struct vhdx_stream *s, uint64_t off,
                        const void *vbuf, size_t len);

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
    return end > s->pos ? feed_forward(s, end, NULL, 0) : 0;
}

/* ---- the header section ------------------------------------------------- */

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
    if ((r = vhdx_log_prepare(s)) < 0)
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

static int feed_forward(struct vhdx_stream *s, uint64_t off,
                        const void *vbuf, size_t len)
{
    const uint8_t *buf = vbuf;
    if (s->err)
        return s->err;
    if (off < s->pos)
        return fail(s, -EINVAL, "write at %" PRIu64 " goes back before %"
                    PRIu64 ": a VHDX must arrive in file order", off, s->pos);
    if (off > s->pos) {                 /* a gap: file zeros */
        int r = feed_forward(s, s->pos, NULL, off - s->pos);
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
                return s->err = -EMEDIUMTYPE;     /* not a VHDX at all */
        }
        if (s->pos == HEAD_BYTES && head_decode(s) < 0)
            return s->err;
    }
    if (!len)
        return s->err;
    int r = vhdx_feed_log(s, buf, len);
    return r < 0 ? r : s->err;
}

/* ---- the file order ------------------------------------------------------- */

/* The first bytes, to name what was written when it is not a VHDX. */
static void keep_first(struct vhdx_stream *s, uint64_t off, const void *buf,
                       uint64_t len)
{
    if (off >= FIRST_BYTES)
        return;
    size_t n = len < FIRST_BYTES - off ? (size_t) len
                                       : FIRST_BYTES - (size_t) off;
    if (buf)
        memcpy(s->first + off, buf, n);
    else
        memset(s->first + off, 0, n);
    if (off + n > s->nfirst)
        s->nfirst = (size_t) off + n;
}

/* [off, off+len) behind the furthest byte, inside a range that passed as
 * zeros, and zeros again: nothing to do (cp --sparse=always punches what
 * it skipped after the bytes that follow). */
static bool zeros_again(const struct vhdx_stream *s, uint64_t off,
                        const void *buf, uint64_t len)
{
    if (off + len > s->end || (buf && !is_zero(buf, (size_t) len)))
        return false;
    return fileorder_inside(&s->order, off, len);
}

static int accept_bytes(struct vhdx_stream *s, uint64_t off, const void *buf,
                        uint64_t len)
{
    if (s->err)
        return s->err;
    if (off < s->end && zeros_again(s, off, buf, len))
        return 0;
    keep_first(s, off, buf, len);
    if (off > s->end)
        fileorder_remember(&s->order, s->end, off - s->end);
    if (!buf && len)
        fileorder_remember(&s->order, off, len);
    if (off + len > s->end)
        s->end = off + len;
    return feed_forward(s, off, buf, (size_t) len);
}

int vhdx_stream_feed(struct vhdx_stream *s, uint64_t off, const void *buf,
                     size_t len)
{
    return accept_bytes(s, off, buf, len);
}

int vhdx_stream_hole(struct vhdx_stream *s, uint64_t off, uint64_t len)
{
    return accept_bytes(s, off, NULL, len);
}

enum image_kind vhdx_stream_first_kind(const struct vhdx_stream *s)
{
    return image_kind(s->first, s->nfirst);
}

int vhdx_stream_finish(struct vhdx_stream *s)
{
    if (!s->err && s->end > s->pos)
        feed_forward(s, s->end, NULL, 0);     /* a trailing hole: zeros */
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
    for (size_t i = 0; i < s->blks.len; i++) {
        const struct blk *b = &s->blks.ptr[i];
        uint64_t need = b->len;
        if (b->kind != BLK_BITMAP && size - b->index * bs < need)
            need = size - b->index * bs;      /* the disk's last block */
        if (b->file_off + need > s->pos)
            return fail(s, -EINVAL, "the file ends at %" PRIu64 ", cut short: "
                        "a block at %" PRIu64 " is missing", s->pos,
                        b->file_off);
    }
    for (size_t i = 0; i < s->sp.len; i++)
        if (!s->sp.ptr[i].done)
            return fail(s, -EINVAL, "bytes at %" PRIu64 " were never placed "
                        "(their sector bitmap never arrived)",
                        s->sp.ptr[i].file_off);
    return 0;
}

int vhdx_stream_new(const struct nbdf_sink *sink, void *opaque,
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
    blk_vector_reset(&s->blks);
    spooled_vector_reset(&s->sp);
    free(s->bat);
    free(s->log);
    vhdx_log_plan_free(&s->plan);
    free(s->meta);
    free(s->head);
    free(s);
}
