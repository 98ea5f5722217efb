/* vhd/stream.c: forward-only decoder for a VHD file written in file order.
 *
 * The decoder keeps one position, 'pos': every byte before it has been
 * consumed.  Input is cut into steps; each step consumes a prefix that lies
 * entirely in one region of the file (skipped bytes, metadata being
 * collected, a bitmap, a run of block data).  Skipped ranges (forward jumps,
 * holes) are fed through the same steps with buf == NULL meaning zeros.
 *
 * Memory: footer copy, header, the needed BAT entries, the used entries'
 * indices in file order, one block bitmap, a 512-byte ring holding the last 512
 * bytes of the file (the trailing footer; for a fixed disk also the
 * held-back tail), and a small ring of recent gaps.  Block data is never
 * buffered.
 */
#include <stdio.h>
#include <stdlib.h>

#include "vhd/vhd-internal.h"

/* Nothing a VHD can describe lies beyond a block starting at the last
 * 32-bit sector, plus the largest block and a footer. */
#define STREAM_MAX_OFFSET ((1ull << 41) + 2ull * VHD_BLOCK_SIZE_MAX)
#define GAP_RING 32

enum st { ST_FOOTER, ST_FIXED, ST_HEADER, ST_BAT, ST_BODY, ST_DONE, ST_FAILED };

struct gap {
    uint64_t off, end;
};

struct vhd_stream {
    const struct nbdf_sink *sink;       /* borrowed */
    void *opaque;                       /* borrowed */
    enum st state;
    int error;
    char msg[256];
    uint64_t pos;
    uint8_t ring[512];                  /* ring[x % 512]: file byte x, x in [pos-512, pos) */
    uint8_t copy[512];                  /* footer copy at 0 */
    bool have_copy;                     /* all 512 bytes of it arrived */
    uint8_t hdr[1024];
    struct vhd_footer f;
    struct vhd_header h;
    struct vhd_layout l;
    uint8_t *bat;                       /* owned; 4 * l.nblocks raw, then host order */
    uint32_t *order;                    /* owned; used BAT indices in file order */
    uint32_t nused, next;               /* next: index into order */
    uint8_t *bitmap;                    /* owned; l.bitmap_bytes */
    bool began;
    enum vhd_kind kind;
    uint64_t vsize;
    uint64_t max_size;                  /* vhd_stream_limit() */
    bool accept_fixed;
    uint64_t expected_len;              /* file length, once the BAT is in */
    struct gap gaps[GAP_RING];
    unsigned ngaps, gap_last;
};

/* ---- errors ------------------------------------------------------------- */

static int sfail(struct vhd_stream *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int sfail(struct vhd_stream *s, int code, const char *fmt, ...)
{
    if (s->state == ST_FAILED)
        return s->error;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->msg, sizeof s->msg, fmt, ap);
    va_end(ap);
    s->state = ST_FAILED;
    s->error = code;
    return code;
}

static int sfail_err(struct vhd_stream *s, int code, const struct nbdf_err *e,
                     const char *what)
{
    return sfail(s, code, "%s%s", what, e->msg);
}

static int sink_failed(struct vhd_stream *s, int r, const char *what,
                       uint64_t off, uint64_t len)
{
    return sfail(s, r, "destination %s of %llu bytes at disk offset %llu "
                 "failed: %s", what, (unsigned long long) len,
                 (unsigned long long) off, strerror(-r));
}

/* ---- lifecycle -------------------------------------------------------------- */

int vhd_stream_new(const struct nbdf_sink *sink, void *opaque,
                   struct vhd_stream **out)
{
    struct vhd_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->sink = sink;
    s->opaque = opaque;
    s->state = ST_FOOTER;
    s->max_size = VHD_MAX_SIZE;
    s->accept_fixed = true;
    *out = s;
    return 0;
}

void vhd_stream_limit(struct vhd_stream *s, uint64_t max_size,
                      bool accept_fixed)
{
    s->max_size = max_size < VHD_MAX_SIZE ? max_size : VHD_MAX_SIZE;
    s->accept_fixed = accept_fixed;
}

uint64_t vhd_stream_expected_length(const struct vhd_stream *s)
{
    return s->expected_len;
}

void vhd_stream_free(struct vhd_stream *s)
{
    if (!s)
        return;
    free(s->bat);
    free(s->order);
    free(s->bitmap);
    free(s);
}

const char *vhd_stream_error(const struct vhd_stream *s)
{
    return s->msg;
}

uint64_t vhd_stream_position(const struct vhd_stream *s)
{
    return s->pos;
}

enum vhd_kind vhd_stream_kind(const struct vhd_stream *s)
{
    return s->began ? s->kind : 0;
}

uint64_t vhd_stream_virtual_size(const struct vhd_stream *s)
{
    return s->vsize;
}

/* ---- the ring of the last 512 bytes ------------------------------------------ */

static void ring_push(struct vhd_stream *s, const uint8_t *buf, uint64_t n)
{
    uint64_t at = s->pos;
    if (n > 512) {
        if (buf)
            buf += n - 512;
        at += n - 512;
        n = 512;
    }
    size_t i = at % 512, first = n < 512 - i ? n : 512 - i;
    if (buf) {
        memcpy(s->ring + i, buf, first);
        memcpy(s->ring, buf + first, n - first);
    } else {
        memset(s->ring + i, 0, first);
        memset(s->ring, 0, n - first);
    }
}

/* The last 512 consumed bytes in file order (pos >= 512). */
static void ring_read(const struct vhd_stream *s, uint8_t *out)
{
    size_t i = s->pos % 512;
    memcpy(out, s->ring + i, 512 - i);
    memcpy(out + 512 - i, s->ring, i);
}

/* ---- emission ------------------------------------------------------------------ */

static int emit(struct vhd_stream *s, uint64_t disk_off, const uint8_t *buf,
                uint64_t len)
{
    int r;
    if (len == 0)
        return 0;
    if (buf && !is_zero(buf, len)) {
        r = s->sink->data(s->opaque, disk_off, buf, len);
        if (r < 0)
            return sink_failed(s, r, "write", disk_off, len);
    } else {
        r = s->sink->zero(s->opaque, disk_off, len);
        if (r < 0)
            return sink_failed(s, r, "zero", disk_off, len);
    }
    return 0;
}

static int begin(struct vhd_stream *s, enum vhd_kind kind, uint64_t size)
{
    s->kind = kind;
    s->vsize = size;
    s->began = true;
    const char *name = kind == VHD_FIXED ? "fixed" : kind == VHD_DIFF ?
                       "differencing" : "dynamic";
    struct nbdf_begin b = { .kind = kind, .kind_name = name, .size = size,
                            .overlay = kind == VHD_DIFF,
                            .file_len = s->expected_len };
    int r = s->sink->begin(s->opaque, &b);
    if (r < 0)
        return sfail(s, r, "destination refused a %s disk of %llu bytes: %s",
                     name, (unsigned long long) size, strerror(-r));
    return 0;
}

/* ---- metadata collection --------------------------------------------------------- */

/* Consume up to len bytes towards the region [start, start+size) whose
 * bytes go to dst.  *done is set when the region is complete. */
static uint64_t collect(struct vhd_stream *s, uint64_t start, uint64_t size,
                        uint8_t *dst, const uint8_t *buf, uint64_t len,
                        bool *done)
{
    *done = false;
    if (s->pos < start)
        return len < start - s->pos ? len : start - s->pos;
    uint64_t at = s->pos - start, n = size - at;
    if (n > len)
        n = len;
    if (buf)
        memcpy(dst + at, buf, n);
    else
        memset(dst + at, 0, n);
    *done = at + n == size;
    return n;
}

/* ---- step: the first sector -------------------------------------------------------- */

/* A fixed VHD starts with disk data, which any byte may begin.  But a
 * first sector whose fields after the cookie are those of a dynamic or
 * differencing footer (features with the reserved bit, version 1.0, data
 * offset 512, disk type 3 or 4) is a footer copy with a damaged cookie:
 * taking it for disk data would replace the disk with the file's bytes. */
static bool looks_like_footer(const uint8_t *sec)
{
    const struct vhd_footer_disk *d = (const void *) sec;
    uint32_t features = be32toh(d->features), version = be32toh(d->version);
    uint64_t data_off = be64toh(d->data_offset);
    uint32_t type = be32toh(d->disk_type);
    return (features & ~1u) == 2 && version == 0x00010000 &&
           data_off == 512 && (type == VHD_DYNAMIC || type == VHD_DIFF);
}

/* What a first sector that is no footer copy probably is, for the
 * refusal's message (the known formats: common/imagekind.h). */
static const char *guess_content(const uint8_t *sec)
{
    const char *known = image_kind_name(image_kind(sec, 512));
    if (known)
        return known;
    if (sec[510] == 0x55 && sec[511] == 0xAA)
        return "a raw disk (it starts with a boot sector)";
    if (is_zero(sec, 512))
        return "zeros: a raw disk image, or a fixed VHD";
    return "not a VHD footer copy: a raw disk image, a fixed VHD or "
           "another format";
}

/* No dynamic or differencing footer copy at 0: a fixed VHD, if the caller
 * takes those, whose identity is known only at its last sector.  Even
 * then a first sector that is another known format's header is that
 * format written here by mistake, not a fixed VHD's disk data. */
static int take_fixed(struct vhd_stream *s)
{
    enum image_kind k = image_kind(s->copy, 512);
    if (!s->accept_fixed)
        return sfail(s, -EMEDIUMTYPE, "not a dynamic or differencing VHD: "
                     "its first sector is %s; nothing was written",
                     guess_content(s->copy));
    if (k != IMAGE_UNKNOWN && k != IMAGE_VHD)
        return sfail(s, -EMEDIUMTYPE, "not a VHD: its first sector is %s, "
                     "not a fixed VHD's disk data; nothing was written",
                     image_kind_name(k));
    s->state = ST_FIXED;
    return begin(s, VHD_FIXED, 0);
}

enum image_kind vhd_stream_first_kind(const struct vhd_stream *s)
{
    return s->have_copy ? image_kind(s->copy, 512) : IMAGE_UNKNOWN;
}

static int decide_kind(struct vhd_stream *s)
{
    struct nbdf_err e = { "" };
    bool cookie = memcmp(s->copy, VHD_COOKIE_FOOTER, 8) == 0 ||
                  memcmp(s->copy, VHD_COOKIE_POISON, 8) == 0;
    if (!cookie && looks_like_footer(s->copy))
        return sfail(s, -EINVAL, "footer copy at offset 0: bad cookie "
                     "(the rest of the sector is a dynamic or differencing "
                     "VHD footer)");
    if (!cookie)
        return take_fixed(s);
    int r = vhd_footer_decode(s->copy, &s->f, &e);
    if (r < 0)
        return sfail_err(s, r, &e, "footer copy at offset 0: ");
    if (s->f.disk_type == VHD_FIXED)
        return take_fixed(s);   /* no copy: disk data that looks like one */
    /* Before anything is allocated for the BAT. */
    if (s->f.current_size > s->max_size)
        return sfail(s, -ENOSPC, "the VHD's disk is %llu bytes, larger than "
                     "the export (%llu bytes): nothing was written",
                     (unsigned long long) s->f.current_size,
                     (unsigned long long) s->max_size);
    s->state = ST_HEADER;
    return 0;
}

static int64_t step_footer(struct vhd_stream *s, const uint8_t *buf,
                           uint64_t len)
{
    bool done;
    uint64_t n = collect(s, 0, 512, s->copy, buf, len, &done);
    if (done) {
        s->have_copy = true;
        int r = decide_kind(s);
        if (r < 0)
            return r;
    }
    return n;
}

/* ---- step: fixed data (the last 512 bytes are held back) ---------------------- */

static int emit_ring(struct vhd_stream *s, uint64_t a, uint64_t b)
{
    while (a < b) {
        size_t i = a % 512;
        uint64_t n = b - a < 512 - i ? b - a : 512 - i;
        int r = emit(s, a, s->ring + i, n);
        if (r < 0)
            return r;
        a += n;
    }
    return 0;
}

static int64_t step_fixed(struct vhd_stream *s, const uint8_t *buf,
                          uint64_t len)
{
    uint64_t pos = s->pos, emit_end = pos + len - 512;   /* pos >= 512 */
    if (emit_end > VHD_MAX_SIZE)
        return sfail(s, -EFBIG, "fixed VHD holds more than the 2040 GiB "
                     "limit (%llu bytes)", (unsigned long long) VHD_MAX_SIZE);
    if (emit_end > s->max_size)
        return sfail(s, -ENOSPC, "fixed VHD: its data runs past the end "
                     "of the export (%llu bytes)",
                     (unsigned long long) s->max_size);
    uint64_t ring_end = emit_end < pos ? emit_end : pos;
    int r = emit_ring(s, pos - 512, ring_end);
    if (r == 0 && emit_end > pos)
        r = emit(s, pos, buf, emit_end - pos);
    return r < 0 ? r : (int64_t) len;
}

/* ---- step: dynamic header and BAT ---------------------------------------------- */

static int header_done(struct vhd_stream *s)
{
    struct nbdf_err e = { "" };
    /* qemu-img (convert -O vpc, create) writes the footer copy first and
     * the dynamic header after, seeking back: in file order it is still
     * zeros.  Say so, rather than "bad dynamic header cookie". */
    if (is_zero(s->hdr, VHD_HEADER_SIZE))
        return sfail(s, -EINVAL, "the dynamic header is empty (zeros): its "
                     "writer fills it in later, seeking back (qemu-img "
                     "does); a view takes a VHD in file order only: copy a "
                     "VHD file in, or qemu-img convert -n -O raw SRC "
                     "MNT/nbd");
    int r = vhd_header_decode(s->hdr, &s->h, &e);
    if (r == 0)
        r = vhd_header_check(&s->f, &s->h, &e);
    if (r < 0)
        return sfail_err(s, r, &e, "");
    vhd_layout_from(&s->f, &s->h, &s->l);
    if (s->l.bat_off < s->l.header_off + VHD_HEADER_SIZE)
        return sfail(s, -EINVAL, "BAT at %llu precedes the dynamic header at "
                     "%llu: cannot be decoded in one forward pass",
                     (unsigned long long) s->l.bat_off,
                     (unsigned long long) s->l.header_off);
    s->bat = malloc((size_t) s->l.nblocks * 4);
    s->bitmap = malloc(s->l.bitmap_bytes);
    if (!s->bat || !s->bitmap)
        return sfail(s, -ENOMEM, "out of memory for a BAT of %u entries",
                     s->l.nblocks);
    s->state = ST_BAT;
    return 0;
}

static int64_t step_header(struct vhd_stream *s, const uint8_t *buf,
                           uint64_t len)
{
    bool done;
    uint64_t n = collect(s, s->f.data_offset, VHD_HEADER_SIZE, s->hdr, buf,
                         len, &done);
    if (done) {
        int r = header_done(s);
        if (r < 0)
            return r;
    }
    return n;
}

/* Metadata extents that blocks must not overlap. */
static size_t meta_extents(const struct vhd_stream *s, struct vhd_extent *m)
{
    size_t n = 0;
    m[n++] = (struct vhd_extent) { 0, VHD_FOOTER_SIZE, 0, "footer copy" };
    m[n++] = (struct vhd_extent) { s->l.header_off, VHD_HEADER_SIZE, 0,
                                   "dynamic header" };
    m[n++] = (struct vhd_extent) { s->l.bat_off, s->l.bat_bytes, 0, "BAT" };
    return n + vhd_locator_extents(&s->h, m + n);
}

static uint64_t block_off(const struct vhd_stream *s, uint32_t k)
{
    return (uint64_t) ((uint32_t *) s->bat)[s->order[k]] * VHD_SECTOR;
}

/* The file's length once the BAT says where the last block ends. */
static uint64_t file_length(const struct vhd_stream *s)
{
    uint64_t end = s->l.meta_end;
    for (size_t i = 0; i < 8; i++)
        if (s->h.loc[i].code != VHD_PLAT_NONE &&
            s->h.loc[i].data_offset + s->h.loc[i].space_bytes > end)
            end = s->h.loc[i].data_offset + s->h.loc[i].space_bytes;
    if (s->nused) {
        uint64_t b = block_off(s, s->nused - 1) + s->l.bitmap_bytes +
                     s->l.block_size;
        if (b > end)
            end = b;
    }
    return end + VHD_FOOTER_SIZE;
}

static int bat_done(struct vhd_stream *s)
{
    struct nbdf_err e = { "" };
    struct vhd_extent meta[11];
    uint32_t *bat = (uint32_t *) s->bat;
    for (uint32_t i = 0; i < s->l.nblocks; i++) {
        uint32_t v;
        memcpy(&v, s->bat + 4ull * i, 4);
        bat[i] = be32toh(v);
    }
    int r = vhd_bat_order(&s->l, bat, meta, meta_extents(s, meta), &s->order,
                          &s->nused, &e);
    if (r < 0)
        return sfail_err(s, r, &e, "");
    s->state = ST_BODY;
    s->next = 0;
    s->expected_len = file_length(s);
    return begin(s, s->f.disk_type, s->f.current_size);
}

static int64_t step_bat(struct vhd_stream *s, const uint8_t *buf, uint64_t len)
{
    bool done;
    uint64_t n = collect(s, s->l.bat_off, 4ull * s->l.nblocks, s->bat, buf,
                         len, &done);
    if (done) {
        int r = bat_done(s);
        if (r < 0)
            return r;
    }
    return n;
}

/* ---- step: blocks ------------------------------------------------------------------ */

/* Emit the set-bit parts of block data [in_off, in_off+n) of block bi. */
static int emit_block_data(struct vhd_stream *s, uint32_t bi, uint64_t in_off,
                           const uint8_t *buf, uint64_t n)
{
    uint64_t base = (uint64_t) bi * s->l.block_size;
    if (base + in_off >= s->vsize)
        return 0;                       /* past the end of the last block */
    if (n > s->vsize - base - in_off)
        n = s->vsize - base - in_off;
    uint64_t a = in_off, end = in_off + n;
    while (a < end) {
        bool bit = vhd_bitmap_test(s->bitmap, a / VHD_SECTOR);
        uint64_t b = (a / VHD_SECTOR + 1) * VHD_SECTOR;
        while (b < end && vhd_bitmap_test(s->bitmap, b / VHD_SECTOR) == bit)
            b += VHD_SECTOR;
        if (b > end)
            b = end;
        if (bit) {
            int r = emit(s, base + a, buf ? buf + (a - in_off) : NULL, b - a);
            if (r < 0)
                return r;
        }
        a = b;
    }
    return 0;
}

static int64_t step_block(struct vhd_stream *s, const uint8_t *buf,
                          uint64_t len)
{
    uint64_t start = block_off(s, s->next);
    uint64_t bm_end = start + s->l.bitmap_bytes;
    uint64_t data_end = bm_end + s->l.block_size;
    if (s->pos < bm_end) {
        bool done;
        return collect(s, start, s->l.bitmap_bytes, s->bitmap, buf, len,
                       &done);
    }
    uint64_t n = data_end - s->pos < len ? data_end - s->pos : len;
    int r = emit_block_data(s, s->order[s->next], s->pos - bm_end, buf, n);
    if (r < 0)
        return r;
    if (s->pos + n == data_end)
        s->next++;
    return n;
}

static int64_t step_body(struct vhd_stream *s, const uint8_t *buf,
                         uint64_t len)
{
    if (s->next == s->nused)
        return len;                     /* trailing footer (kept in the ring) */
    return step_block(s, buf, len);
}

/* ---- input ---------------------------------------------------------------------------- */

static int64_t step(struct vhd_stream *s, const uint8_t *buf, uint64_t len)
{
    switch (s->state) {
    case ST_FOOTER: return step_footer(s, buf, len);
    case ST_FIXED:  return step_fixed(s, buf, len);
    case ST_HEADER: return step_header(s, buf, len);
    case ST_BAT:    return step_bat(s, buf, len);
    case ST_BODY:   return step_body(s, buf, len);
    case ST_DONE:
        return sfail(s, -EINVAL, "input after the end of the VHD stream");
    case ST_FAILED:
        break;
    }
    return s->error;
}

static int advance(struct vhd_stream *s, const uint8_t *buf, uint64_t len)
{
    if (len > STREAM_MAX_OFFSET - s->pos)
        return sfail(s, -EFBIG, "file offset %llu is beyond the largest "
                     "possible VHD", (unsigned long long) (s->pos + len));
    while (len) {
        int64_t n = step(s, buf, len);
        if (n < 0)
            return n;
        ring_push(s, buf, n);
        s->pos += n;
        len -= n;
        if (buf)
            buf += n;
    }
    return 0;
}

static void gap_record(struct vhd_stream *s, uint64_t off, uint64_t end)
{
    struct gap *last = &s->gaps[s->gap_last];
    if (s->ngaps && last->end == off) {
        last->end = end;
        return;
    }
    s->gap_last = s->ngaps ? (s->gap_last + 1) % GAP_RING : 0;
    s->gaps[s->gap_last] = (struct gap) { off, end };
    if (s->ngaps < GAP_RING)
        s->ngaps++;
}

static bool gap_covers(const struct vhd_stream *s, uint64_t off, uint64_t end)
{
    for (unsigned i = 0; i < s->ngaps; i++)
        if (s->gaps[i].off <= off && end <= s->gaps[i].end)
            return true;
    return false;
}

static int gap(struct vhd_stream *s, uint64_t len)
{
    uint64_t off = s->pos;
    int r = advance(s, NULL, len);
    if (r == 0)
        gap_record(s, off, off + len);
    return r;
}

static int consume(struct vhd_stream *s, uint64_t off, const uint8_t *buf,
                   uint64_t len)
{
    if (s->state == ST_FAILED)
        return s->error;
    if (len == 0)
        return 0;
    if (off + len < off || off + len > STREAM_MAX_OFFSET)
        return sfail(s, -EFBIG, "file range %llu+%llu is beyond the largest "
                     "possible VHD", (unsigned long long) off,
                     (unsigned long long) len);
    if (off < s->pos) {
        uint64_t back_end = off + len < s->pos ? off + len : s->pos;
        bool zeros = !buf || is_zero(buf, back_end - off);
        if (!zeros || !gap_covers(s, off, back_end))
            return sfail(s, -EINVAL, "write at file offset %llu goes "
                         "backwards: the decoder has consumed up to %llu "
                         "(a VHD must be written in file order)",
                         (unsigned long long) off,
                         (unsigned long long) s->pos);
        if (buf)
            buf += back_end - off;      /* re-punch of a gap: no-op */
        len -= back_end - off;
        off = back_end;
        if (len == 0)
            return 0;
    }
    int r = 0;
    if (off > s->pos)
        r = gap(s, off - s->pos);
    if (r == 0)
        r = buf ? advance(s, buf, len) : gap(s, len);
    return r;
}

int vhd_stream_feed(struct vhd_stream *s, uint64_t file_off, const void *buf,
                    size_t len)
{
    if (!buf && len)
        return sfail(s, -EINVAL, "feed without a buffer");
    return consume(s, file_off, buf, len);
}

int vhd_stream_hole(struct vhd_stream *s, uint64_t file_off, uint64_t len)
{
    return consume(s, file_off, NULL, len);
}

/* ---- end of input ------------------------------------------------------------------------ */

static int finish_fixed(struct vhd_stream *s)
{
    uint8_t tail[512];
    struct vhd_footer f;
    struct nbdf_err e = { "" };
    ring_read(s, tail);
    int r = vhd_footer_decode(tail, &f, &e);
    if (r < 0)
        return sfail(s, r, "fixed VHD: the last 512 bytes are not a valid "
                     "footer: %s", e.msg);
    if (f.disk_type != VHD_FIXED)
        return sfail(s, -EINVAL, "fixed VHD: trailing footer says disk type "
                     "%u, but no footer copy was at offset 0", f.disk_type);
    if (f.current_size != s->pos - 512)
        return sfail(s, -EINVAL, "fixed VHD: footer current size %llu but %llu "
                     "bytes precede the footer",
                     (unsigned long long) f.current_size,
                     (unsigned long long) (s->pos - 512));
    s->vsize = f.current_size;
    return 0;
}

static int finish_dynamic(struct vhd_stream *s)
{
    if (s->next < s->nused)
        return sfail(s, -EINVAL, "file ended at %llu before block %u (file "
                     "offset %llu) was complete: %u of %u blocks received",
                     (unsigned long long) s->pos, s->order[s->next],
                     (unsigned long long) block_off(s, s->next), s->next,
                     s->nused);
    uint64_t body_end = s->l.meta_end;
    if (s->nused) {
        uint64_t end = block_off(s, s->nused - 1) + s->l.bitmap_bytes +
                       s->l.block_size;
        if (end > body_end)
            body_end = end;
    }
    if (s->pos < body_end + 512)
        return sfail(s, -EINVAL, "file ended at %llu without a trailing "
                     "footer after the last block or metadata (ends at %llu)",
                     (unsigned long long) s->pos,
                     (unsigned long long) body_end);
    if (s->pos % 512)
        return sfail(s, -EINVAL, "file length %llu is not a multiple of 512",
                     (unsigned long long) s->pos);
    uint8_t tail[512];
    ring_read(s, tail);
    if (memcmp(tail, s->copy, 512) != 0)
        return sfail(s, -EINVAL, "trailing footer differs from the footer "
                     "copy at offset 0");
    return 0;
}

int vhd_stream_finish(struct vhd_stream *s)
{
    int r;
    switch (s->state) {
    case ST_FAILED:
        return s->error;
    case ST_DONE:
        return 0;
    case ST_FOOTER:
        return sfail(s, -EINVAL, "file ended after %llu bytes, before the "
                     "first sector was complete", (unsigned long long) s->pos);
    case ST_HEADER:
        return sfail(s, -EINVAL, "file ended at %llu before the dynamic "
                     "header at %llu was complete", (unsigned long long) s->pos,
                     (unsigned long long) s->f.data_offset);
    case ST_BAT:
        return sfail(s, -EINVAL, "file ended at %llu before the BAT at %llu "
                     "was complete", (unsigned long long) s->pos,
                     (unsigned long long) s->l.bat_off);
    case ST_FIXED:
        r = finish_fixed(s);
        break;
    case ST_BODY:
    default:
        r = finish_dynamic(s);
        break;
    }
    if (r == 0)
        s->state = ST_DONE;
    return r;
}
