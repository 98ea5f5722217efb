/* vmdk/stream-grains.c: the decoder's states past the overhead.  GRAINS
 * (monolithicSparse) places the bytes of each allocated grain, in file
 * order, at its LBA.  For streamOptimized: MARKER reads a 12-byte marker
 * head, GRAIN collects and inflates a compressed grain (or hands it to the
 * sink), SKIP passes padding and GT/GD payloads, META and FOOTER check a
 * metadata sector and the footer, END accepts only zeros after the
 * end-of-stream marker.  See vmdk/stream.c for the whole state machine. */
#include "vmdk/stream-internal.h"

static int emit(struct vmdk_stream *s, uint64_t disk_off, const void *buf,
                uint64_t len)
{
    if (disk_off >= s->capacity)
        return 0;                     /* the last grain's tail */
    len = MIN(len, s->capacity - disk_off);
    int r = s->sink->data(s->opaque, disk_off, buf, (size_t) len);
    if (r < 0)
        return fail(s, r, "placing %" PRIu64 " bytes at disk offset %" PRIu64
                    ": %s", len, disk_off, strerror(-r));
    return 0;
}

/* ---- GRAINS (monolithicSparse) ---------------------------------------- */

int64_t vmdk_step_grains(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    if (s->a_cur == s->grains.len)
        return (int64_t) len;         /* after the last grain: dropped */
    const struct grain *g = &s->grains.ptr[s->a_cur];
    uint64_t start = (uint64_t) g->sector * VMDK_SECTOR;
    uint64_t end = start + s->grain_bytes;
    if (s->pos < start)
        return (int64_t) MIN(len, start - s->pos);
    uint64_t n = MIN(len, end - s->pos);
    if (buf) {
        uint64_t disk = (uint64_t) g->index * s->grain_bytes + (s->pos - start);
        int r = emit(s, disk, buf, n);
        if (r < 0)
            return r;
    }
    if (s->pos + n == end) {
        s->a_cur++;
        s->stats.grains++;
    }
    return (int64_t) n;
}

/* ---- MARKER, GRAIN, META, FOOTER (streamOptimized) --------------------- */

static int grain_marker(struct vmdk_stream *s, uint64_t lba, uint32_t size)
{
    uint64_t at = s->pos - VMDK_GRAIN_MARKER_SIZE;

    if (size > vmdk_compressed_max(s->grain_bytes))
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": %" PRIu32
                    " compressed bytes for a %" PRIu64 "-byte grain", at,
                    size, s->grain_bytes);
    if (lba % s->h.grain_size || lba >= s->h.capacity)
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": LBA %"
                    PRIu64 " is %s", at, lba, lba >= s->h.capacity
                    ? "past the capacity" : "not at a grain boundary");
    uint64_t g = lba / s->h.grain_size;
    if (s->seen[g / 64] & (1ull << (g % 64)))
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": LBA %"
                    PRIu64 " appears twice", at, lba);
    if (s->tables && !(s->listed[g / 64] & (1ull << (g % 64))))
        return fail(s, -EINVAL, "grain marker at byte %" PRIu64 ": LBA %"
                    PRIu64 " is not in the header's grain tables (a reader "
                    "that follows the tables would not see it)", at, lba);
    s->seen[g / 64] |= 1ull << (g % 64);
    s->glba = lba;
    s->gat = at;
    s->cneed = size;
    s->got = 0;
    s->st = ST_GRAIN;
    return 0;
}

static int marker_head(struct vmdk_stream *s)
{
    struct vmdk_marker_disk m;

    memcpy(&m, s->sect, VMDK_GRAIN_MARKER_SIZE);
    uint32_t size = le32toh(m.size);
    if (size) {
        int r = grain_marker(s, le64toh(m.lba), size);
        if (r < 0)
            return r;
    } else
        s->st = ST_META;              /* collect the rest of the sector */
    /* streamOptimized: header and descriptor are all there is to check up
     * front; waiting for the first marker, and checking it, also leaves
     * the disk alone when the file ends inside the overhead or its first
     * grain marker breaks a rule (past the capacity, say). */
    if (!s->began && begin(s) < 0)
        return s->err;
    return 0;
}

int64_t vmdk_step_marker(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    size_t n = (size_t) MIN(len, VMDK_GRAIN_MARKER_SIZE - s->got);
    take(s->sect + s->got, buf, n);
    s->got += n;
    if (s->got == VMDK_GRAIN_MARKER_SIZE) {
        s->pos += n;
        int r = marker_head(s);
        s->pos -= n;
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

static void skip_to(struct vmdk_stream *s, uint64_t end)
{
    s->skip_end = end;
    s->st = ST_SKIP;
}

static int grain_done(struct vmdk_stream *s, const uint8_t *cdata)
{
    struct vmdk_grain g;

    vmdk_grain_init(&g, &s->h, s->glba, s->gat, cdata, (size_t) s->cneed);
    s->stats.grains++;
    s->stats.compressed_bytes += s->cneed;
    if (s->sink->compressed) {        /* the caller inflates */
        int r = s->sink->compressed(s->opaque, &g, g.cdata, g.clen);
        if (r < 0)
            return fail(s, r, "grain for LBA %" PRIu64 " (marker at byte %"
                        PRIu64 "): %s", s->glba, s->gat, strerror(-r));
        return 0;
    }
    struct nbdf_err e = { "" };
    int64_t n = vmdk_grain_inflate(s->z, &g, s->gbuf, &e);
    if (n < 0)
        return fail(s, (int) n, "%s", e.msg);
    return n ? emit(s, g.disk_off, s->gbuf, (uint64_t) n) : 0;
}

int64_t vmdk_step_grain(struct vmdk_stream *s, const uint8_t *buf,
                        uint64_t len)
{
    uint64_t n = MIN(len, s->cneed - s->got);
    const uint8_t *whole = NULL;

    if (s->got == 0 && n == s->cneed && buf)
        whole = buf;                  /* all there: inflate in place */
    else
        take(s->cbuf + s->got, buf, (size_t) n);
    s->got += n;
    if (s->got == s->cneed) {
        s->got = 0;
        int r = grain_done(s, whole ? whole : s->cbuf);
        if (r < 0)
            return r;
        uint64_t end = s->pos + n;
        skip_to(s, vmdk_div_up(end, VMDK_SECTOR) * VMDK_SECTOR);
    }
    return (int64_t) n;
}

static int footer_done(struct vmdk_stream *s)
{
    struct vmdk_header f;
    struct nbdf_err e;
    const struct vmdk_header *h = &s->h;
    uint64_t at = s->pos - VMDK_SECTOR;

    int r = vmdk_header_decode(s->sect, &f, &e);
    if (r < 0)
        return fail(s, r, "footer at byte %" PRIu64 ": %s", at, e.msg);
    if (f.capacity != h->capacity || f.grain_size != h->grain_size ||
        f.gtes_per_gt != h->gtes_per_gt || f.flags != h->flags ||
        f.desc_offset != h->desc_offset || f.desc_size != h->desc_size ||
        f.overhead != h->overhead || f.compress != h->compress)
        return fail(s, -EINVAL, "footer at byte %" PRIu64 " does not match "
                    "the header (capacity %" PRIu64 "/%" PRIu64 ", grain %"
                    PRIu64 "/%" PRIu64 ", flags 0x%" PRIx32 "/0x%" PRIx32 ")",
                    at, f.capacity, h->capacity, f.grain_size, h->grain_size,
                    f.flags, h->flags);
    if (f.gd_offset == VMDK_GD_AT_END)
        return fail(s, -EINVAL, "footer at byte %" PRIu64 " has no grain "
                    "directory offset (GD_AT_END)", at);
    s->stats.footer = true;
    s->st = ST_MARKER;
    return 0;
}

static int meta_done(struct vmdk_stream *s)
{
    struct vmdk_marker_disk m;
    uint64_t at = s->pos - VMDK_SECTOR;
    memcpy(&m, s->sect, sizeof m);
    uint64_t nsec = le64toh(m.lba);
    uint32_t type = le32toh(m.type);

    switch (type) {
    case VMDK_MARKER_EOS:
        if (nsec != 0)
            return fail(s, -EINVAL, "end-of-stream marker at byte %" PRIu64
                        " claims %" PRIu64 " sectors", at, nsec);
        s->stats.eos = true;
        s->st = ST_END;
        return 0;
    case VMDK_MARKER_GT:
    case VMDK_MARKER_GD:
        if (nsec == 0 || nsec > VMDK_META_MAX_SECTORS)
            return fail(s, -EINVAL, "%s marker at byte %" PRIu64 " claims %"
                        PRIu64 " sectors", type == VMDK_MARKER_GT ? "grain "
                        "table" : "grain directory", at, nsec);
        if (type == VMDK_MARKER_GT)
            s->stats.gt_markers++;
        else
            s->stats.gd_markers++;
        skip_to(s, s->pos + nsec * VMDK_SECTOR);
        return 0;
    case VMDK_MARKER_FOOTER:
        if (nsec != 1)
            return fail(s, -EINVAL, "footer marker at byte %" PRIu64
                        " claims %" PRIu64 " sectors (must be 1)", at, nsec);
        if (s->stats.footer)
            return fail(s, -EINVAL, "second footer at byte %" PRIu64, at);
        s->st = ST_FOOTER;
        return 0;
    default:
        return fail(s, -EINVAL, "unknown marker type %" PRIu32 " at byte %"
                    PRIu64, type, at);
    }
}

/* ST_META and ST_FOOTER: fill the sector buffer up to 512 bytes. */
int64_t vmdk_step_sector(struct vmdk_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    size_t n = (size_t) MIN(len, VMDK_SECTOR - s->got);
    take(s->sect + s->got, buf, n);
    s->got += n;
    if (s->got == VMDK_SECTOR) {
        s->got = 0;
        s->pos += n;
        int r = s->st == ST_META ? meta_done(s) : footer_done(s);
        s->pos -= n;
        if (r < 0)
            return r;
    }
    return (int64_t) n;
}

int64_t vmdk_step_skip(struct vmdk_stream *s, uint64_t len)
{
    if (s->pos >= s->skip_end) {
        s->st = ST_MARKER;
        s->got = 0;
        return 0;
    }
    return (int64_t) MIN(len, s->skip_end - s->pos);
}

/* After the end-of-stream marker only zeros may follow (qemu-img pads its
 * files): anything else means a zero sector was taken for the EOS marker
 * in the middle of the grains, and the grains after it would be lost. */
int64_t vmdk_step_end(struct vmdk_stream *s, const uint8_t *buf,
                      uint64_t len)
{
    if (buf && !is_zero(buf, (size_t) len)) {
        const uint8_t *p = buf;
        while (!*p)
            p++;
        return fail(s, -EINVAL, "data at byte %" PRIu64 " after the "
                    "end-of-stream marker", s->pos + (uint64_t) (p - buf));
    }
    return (int64_t) len;
}

