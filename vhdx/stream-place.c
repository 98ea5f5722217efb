/* vhdx/stream-place.c: landing block bytes, after begin().  Each byte
 * past the header section is found in the block map: a fully present
 * block's bytes go to their disk offset, a partially present block's only
 * where its chunk's sector bitmap marks them (spooled until that bitmap is
 * complete), a sector bitmap's are collected; bytes outside every block
 * are dropped.  A completed bitmap, or begin(), replays what the spool
 * holds for it. */
#include "vhdx/stream-internal.h"

static const struct blk *find_blk(struct vhdx_stream *s, uint64_t off)
{
    /* Input mostly moves forward: try the hint, then search. */
    if (s->cur < s->blks.len && s->blks.ptr[s->cur].file_off <= off &&
        off < s->blks.ptr[s->cur].file_off + s->blks.ptr[s->cur].len)
        return &s->blks.ptr[s->cur];
    size_t lo = 0, hi = s->blks.len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->blks.ptr[mid].file_off + s->blks.ptr[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    s->cur = lo;
    return lo < s->blks.len && s->blks.ptr[lo].file_off <= off
           ? &s->blks.ptr[lo] : NULL;
}

/* Bytes up to the next block start after off (or UINT64_MAX). */
static uint64_t next_blk_start(struct vhdx_stream *s, uint64_t off)
{
    find_blk(s, off);
    size_t i = s->cur;
    while (i < s->blks.len && s->blks.ptr[i].file_off <= off)
        i++;
    return i < s->blks.len ? s->blks.ptr[i].file_off : UINT64_MAX;
}

int vhdx_emit(struct vhdx_stream *s, uint64_t disk_off, const uint8_t *buf,
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
            int r = vhdx_emit(s, disk, buf, n);
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
        return vhdx_emit(s, b->index * s->info.meta.block_size +
                                (off - b->file_off), buf, len);
    case BLK_PARTIAL: {
        uint64_t c = b->index / s->info.geom.chunk_ratio;
        if (!s->bitmaps[c].complete)
            return vhdx_spool(s, off, buf, len, c);
        return emit_partial(s, b, off, buf, len);
    }
    case BLK_BITMAP:
        return collect_bitmap(s, b, off, buf, len);
    }
    return 0;
}

/* Hand the spooled ranges waiting for 'chunk' back to vhdx_body_bytes(). */
int vhdx_replay(struct vhdx_stream *s, uint64_t chunk)
{
    uint8_t *tmp = NULL;
    int r = 0;
    /* vhdx_body_bytes() may spool again (s->sp may move) and replay another
     * chunk: work on a copy of each entry, by index. */
    for (size_t i = 0; i < s->sp.len && r == 0; i++) {
        if (s->sp.ptr[i].done || s->sp.ptr[i].chunk != chunk)
            continue;
        struct spooled sp = s->sp.ptr[i];
        s->sp.ptr[i].done = true;
        if (sp.zero) {
            r = vhdx_body_bytes(s, sp.file_off, NULL, sp.len);
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
            r = vhdx_body_bytes(s, sp.file_off + done, tmp, n);
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
        int r = vhdx_spool_hold(s, VHDX_BITMAP_BYTES);
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
    return vhdx_replay(s, b->index);
}

/* Bytes past the header section, after begin(): block bytes are placed,
 * the rest (regions, gaps between blocks) dropped. */
int vhdx_body_bytes(struct vhdx_stream *s, uint64_t off, const uint8_t *buf,
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
