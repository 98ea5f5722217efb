/* vhdx/stream-bat.c: the metadata region and the BAT.  Until both have
 * arrived, bytes past the header section are collected into them or
 * spooled (vhdx/stream-spool.c); once both are in, the metadata is decoded,
 * the BAT checked and turned into a map of present blocks and sector
 * bitmaps sorted by file offset, begin() is called, and the spool is
 * replayed; from then on bytes go to vhdx/stream-place.c as they pass. */
#include "vhdx/stream-internal.h"

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

static int add_blk(struct vhdx_stream *s, struct blk b)
{
    if (blk_vector_append(&s->blks, b) < 0)
        return fail(s, -ENOMEM, "out of memory for the block map");
    return 0;
}

static int bat_payload(struct vhdx_stream *s, uint64_t i, uint64_t blk,
                       uint64_t e)
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
        return add_blk(s, (struct blk){
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
                      uint64_t e)
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
    return add_blk(s, (struct blk){ .file_off = vhdx_bat_offset(e),
                                    .len = VHDX_BITMAP_BYTES,
                                    .index = chunk, .kind = BLK_BITMAP });
}

static int bat_decode(struct vhdx_stream *s)
{
    const struct vhdx_geom *g = &s->info.geom;
    for (uint64_t i = 0, blk = 0; i < g->bat_entries; i++) {
        uint64_t e = vhdx_le64(s->bat + 8 * i);
        int r = vhdx_bat_is_bitmap(g, i)
            ? bat_bitmap(s, i, i / (g->chunk_ratio + 1), e)
            : blk < g->payload_blocks ? bat_payload(s, i, blk++, e) : 0;
        if (r < 0)
            return r;
    }
    const struct blk *b = s->blks.ptr;
    if (s->blks.len)                    /* ptr is NULL without blocks */
        qsort(s->blks.ptr, s->blks.len, sizeof *b, blk_cmp);
    for (size_t i = 1; i < s->blks.len; i++)
        if (b[i - 1].file_off + b[i - 1].len > b[i].file_off)
            return fail(s, -EINVAL, "BAT: two blocks overlap at %" PRIu64,
                        b[i].file_off);
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
    for (size_t i = 0; i < s->blks.len; i++)
        if (s->blks.ptr[i].kind == BLK_BITMAP)
            have[s->blks.ptr[i].index] = true;
    int r = 0;
    for (size_t i = 0; i < s->blks.len && r == 0; i++)
        if (s->blks.ptr[i].kind == BLK_PARTIAL &&
            !have[s->blks.ptr[i].index / s->info.geom.chunk_ratio])
            r = fail(s, -EINVAL, "payload block %" PRIu64 " is partially "
                     "present but its chunk has no sector bitmap",
                     s->blks.ptr[i].index);
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
    const struct vhdx_meta *m = &s->info.meta;
    struct nbdf_begin b = {
        .kind = m->has_parent ? VHDX_DIFF : m->leave_blocks_allocated
                                            ? VHDX_FIXED : VHDX_DYNAMIC,
        .kind_name = m->has_parent ? "differencing"
                     : m->leave_blocks_allocated ? "fixed" : "dynamic",
        .size = m->disk_size, .overlay = m->has_parent,
        .unit = m->logical_sector, .info = &s->info,
    };
    r = s->sink->begin(s->opaque, &b);
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
                r = vhdx_emit(s, blk * s->info.meta.block_size, NULL,
                              s->info.meta.block_size);
        }
        if (r < 0)
            return r;
    }
    return vhdx_replay(s, NO_CHUNK);
}

/* Copy the part of [off, off+len) inside region [roff, roff+rlen) into
 * dst (zeros for a NULL buf: dst is already zeroed). */
uint64_t vhdx_region_copy(uint64_t off, const uint8_t *buf, uint64_t len,
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
    s->meta_got += vhdx_region_copy(off, buf, len, rg->meta.off, s->meta_len,
                                    s->meta);
    s->bat_got += vhdx_region_copy(off, buf, len, rg->bat.off, s->bat_need,
                                   s->bat);
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
        int r = vhdx_spool(s, off, buf, stop - off, NO_CHUNK);
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

/* The bytes at s->pos past the header section, the log's writes made. */
int vhdx_feed_body(struct vhdx_stream *s, const uint8_t *buf, uint64_t len)
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
        r = vhdx_body_bytes(s, at, buf, len);
    return r < 0 ? r : s->err;
}
