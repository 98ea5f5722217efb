/* vmdk/stream.c: forward-only decoder, VMDK file bytes in file order to
 * raw-disk writes.  See the contract in vmdk/vmdk.h.
 *
 * The file is consumed by a state machine, one step at a time:
 *
 *   HEADER   collect sector 0, validate it.
 *   PRE      [512, overhead): collect the descriptor and, for
 *            monolithicSparse and for a streamOptimized header whose grain
 *            directory lies in the overhead (qemu-img's), the grain
 *            directory and then each grain table (sorted by file offset);
 *            skip everything else.  At the overhead's end the grain map is
 *            complete and checked.
 *   GRAINS   monolithicSparse: bytes inside an allocated grain go to its
 *            LBA, other bytes are dropped.
 *   MARKER   streamOptimized: a 12-byte marker head; size != 0 is a grain
 *            (GRAIN: collect size bytes, inflate, place at its LBA; PAD to
 *            the next sector), size == 0 a metadata sector (META: GT/GD
 *            payloads skipped, FOOTER checked, EOS ends the stream).
 *   END      after the end-of-stream marker: only zeros may follow.
 *
 * Where a streamOptimized file ends: with an end-of-stream marker, or, when
 * its header's grain tables were read (s->tables), at any marker boundary
 * once every grain those tables list has arrived (qemu-img writes no EOS
 * marker and no footer).
 *
 * Input may be "zeros" (buf == NULL) for gaps and holes; they are never
 * materialized except into the small collection buffers.
 *
 * This file holds the entry points: the state dispatch, feed, hole and
 * finish.  HEADER and PRE are in vmdk/stream-head.c, the states after the
 * overhead in vmdk/stream-grains.c, the shared state in
 * vmdk/stream-internal.h.
 */
#include "vmdk/stream-internal.h"

int vmdk_stream_new(const struct nbdf_sink *sink, void *opaque,
                    struct vmdk_stream **out)
{
    struct vmdk_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->sink = sink;
    s->opaque = opaque;
    s->st = ST_HEADER;
    *out = s;
    return 0;
}

void vmdk_stream_free(struct vmdk_stream *s)
{
    if (!s)
        return;
    free(s->descbuf);
    free(s->gd);
    free(s->gts);
    free(s->gtbuf);
    grain_vector_reset(&s->grains);
    free(s->cbuf);
    free(s->gbuf);
    free(s->seen);
    free(s->listed);
    vmdk_inflater_free(s->z);
    free(s);
}

const char *vmdk_stream_error(const struct vmdk_stream *s) { return s->e.msg; }
enum image_kind vmdk_stream_first_kind(const struct vmdk_stream *s)
{
    return s->first_kind;
}
uint64_t vmdk_stream_position(const struct vmdk_stream *s) { return s->pos; }

enum vmdk_kind vmdk_stream_kind(const struct vmdk_stream *s)
{
    if (!s->began)
        return 0;
    return vmdk_kind_of(s);
}

uint64_t vmdk_stream_capacity(const struct vmdk_stream *s)
{
    return s->began ? s->capacity : 0;
}

const struct vmdk_header *vmdk_stream_header(const struct vmdk_stream *s)
{
    return s->st == ST_HEADER ? NULL : &s->h;
}

const struct vmdk_desc *vmdk_stream_desc(const struct vmdk_stream *s)
{
    return s->desc_done ? &s->desc : NULL;
}

void vmdk_stream_stats(const struct vmdk_stream *s,
                       struct vmdk_stream_stats *out)
{
    *out = s->stats;
}

/* ---- driving ------------------------------------------------------------------ */

static int64_t step(struct vmdk_stream *s, const uint8_t *buf, uint64_t len)
{
    switch (s->st) {
    case ST_HEADER: return vmdk_step_header(s, buf, len);
    case ST_PRE:    return vmdk_step_pre(s, buf, len);
    case ST_GRAINS: return vmdk_step_grains(s, buf, len);
    case ST_MARKER: return vmdk_step_marker(s, buf, len);
    case ST_GRAIN:  return vmdk_step_grain(s, buf, len);
    case ST_SKIP:   return vmdk_step_skip(s, len);
    case ST_META:
    case ST_FOOTER: return vmdk_step_sector(s, buf, len);
    case ST_END:    return vmdk_step_end(s, buf, len);
    }
    return fail(s, -EINVAL, "internal: bad state");
}

static int64_t step_cb(void *s, const uint8_t *buf, uint64_t len)
{
    return step(s, buf, len);
}

static int accept(struct vmdk_stream *s, uint64_t off, const uint8_t *buf,
                  uint64_t len)
{
    struct fileorder_decoder d = { &s->pos, step_cb, s, &s->err, &s->e };
    return fileorder_accept(&s->order, &d, "a VMDK", off, buf, len);
}

int vmdk_stream_feed(struct vmdk_stream *s, uint64_t file_off,
                     const void *buf, size_t len)
{
    return accept(s, file_off, buf, len);
}

int vmdk_stream_hole(struct vmdk_stream *s, uint64_t file_off, uint64_t len)
{
    return accept(s, file_off, NULL, len);
}

static const char *where(const struct vmdk_stream *s)
{
    switch (s->st) {
    case ST_GRAIN: return "inside a compressed grain";
    case ST_SKIP:  return "inside grain padding or a metadata payload";
    case ST_META:  return "inside a marker";
    case ST_FOOTER: return "inside the footer";
    default:       return "between markers";
    }
}

/* streamOptimized whose header's grain tables were read (qemu-img writes
 * them, and no EOS marker or footer): the stream may end at any marker
 * boundary, or after an EOS marker, once every grain the tables list has
 * arrived.  A file cut short loses a grain the tables list, or stops
 * inside a grain, marker or padding. */
static int finish_tables(struct vmdk_stream *s)
{
    bool boundary = s->st == ST_END || (s->st == ST_MARKER && s->got == 0) ||
                    (s->st == ST_SKIP && s->pos >= s->skip_end);
    if (!boundary)
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " %s",
                    s->pos, where(s));
    if (s->stats.grains != s->nlisted)
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " with %"
                    PRIu64 " of the %" PRIu64 " grains its grain tables list "
                    "still missing", s->pos, s->nlisted - s->stats.grains,
                    s->nlisted);
    if (!s->began && begin(s) < 0)      /* no marker at all: an empty disk */
        return s->err;
    return 0;
}

int vmdk_stream_finish(struct vmdk_stream *s)
{
    if (s->err)
        return s->err;
    if (s->st == ST_HEADER)
        return fail(s, -EINVAL, "the file ended after %" PRIu64 " bytes, "
                    "inside the sparse header", s->pos);
    if (s->st == ST_PRE) {
        bool sparse = !(s->h.flags & VMDK_FLAG_MARKERS);
        if (s->pos >= s->overhead ||
            (sparse && s->desc_done && s->gd_done && s->gt_cur == s->ngtlocs &&
             s->grains.len == 0)) {
            if (vmdk_pre_done(s) < 0)
                return s->err;
        } else
            return fail(s, -EINVAL, "the file ended at byte %" PRIu64
                        ", inside the metadata (%s)", s->pos,
                        !s->desc_done ? "descriptor" : !sparse ? "overhead"
                        : !s->gd_done ? "grain directory" : "grain tables");
    }
    if (s->st == ST_GRAINS && s->a_cur < s->grains.len) {
        const struct grain *g = &s->grains.ptr[s->a_cur];
        return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " but grain "
                    "%" PRIu32 " lies at byte %" PRIu64 " (%" PRIu64 " of %"
                    PRIu64 " grains missing)", s->pos, g->index,
                    (uint64_t) g->sector * VMDK_SECTOR,
                    (uint64_t) s->grains.len - s->a_cur,
                    (uint64_t) s->grains.len);
    }
    if (s->tables)
        return finish_tables(s);
    if (s->h.flags & VMDK_FLAG_MARKERS) {
        if (s->st != ST_END)
            return fail(s, -EINVAL, "the file ended at byte %" PRIu64 " %s, "
                        "without an end-of-stream marker", s->pos, where(s));
        if (s->h.gd_offset == VMDK_GD_AT_END && !s->stats.footer)
            return fail(s, -EINVAL, "no footer, but the header defers the "
                        "grain directory to it (GD_AT_END)");
    }
    return 0;
}
