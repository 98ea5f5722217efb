/* views/vhdxview.c: FILENAME.vhdx, the disk seen as a VHDX, on the
 * format-view skeleton (views/imageview.h).  This file is the glue to vhdx/.
 *
 * Writing: each write feeds vhdx/'s forward-only stream decoder.  Its
 * begin comes once the headers, the region table, the metadata and the
 * BAT have arrived and been checked, so a bad file is refused before the
 * disk changes; a fixed or dynamic VHDX then replaces the disk (blocks
 * it does not carry read as zero), a differencing VHDX is applied over
 * what the disk holds (its zero blocks become zero).  Blocks that arrive
 * before the BAT or the metadata that place them are kept in a spool
 * (views/spool.h: --spool-dir, --spool-max).  A file that is not a VHDX is
 * EMEDIUMTYPE with what to do instead; a cut file fails at close.
 *
 * Reading: vhdx/'s synthesizer produces a dynamic VHDX of the disk's
 * allocation (metadata and BAT first, then the allocated blocks); block
 * data is read through the handle's read-ahead stream.
 *
 * THREAD MODEL: the skeleton's; the decoder, its sink and the spool run
 * under the skeleton's lock; vhdx_synth_read() is reentrant (it reads a
 * sealed, const synthesizer).
 */
#include "fs/view.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/iszero.h"
#include "common/log.h"
#include "common/uuid.h"
#include "views/imageview.h"
#include "fs/rawfile.h"
#include "views/spool.h"
#include "vhdx/vhdx.h"

#define FIRST_BYTES 512           /* kept to name another format */
#define GAPS 32                   /* zero ranges remembered */

/* One ingest: the decoder, its spool, and what the skeleton's hooks need
 * that the decoder does not say. */
struct vhdx_ingest {
    struct vhdx_stream *s;
    struct spool *sp;
    bool overlay;                 /* differencing: over the disk */
    uint64_t end;                 /* the file's bytes fed, high-water */
    /* Ranges of the file that passed as zeros (skipped or punched), the
     * last GAPS: cp --sparse=always punches what it skipped after the
     * bytes that follow, which is no news. */
    struct { uint64_t off, end; } gap[GAPS];
    unsigned ngap;
    uint8_t first[FIRST_BYTES];
    size_t nfirst;
};

static const struct vhdx_sink sink;

/* The synthesized VHDX's identity, per mount: re-reads agree. */
static int vhdx_init(struct imageview *iv)
{
    uint8_t *guid = malloc(16);

    if (!guid)
        return -ENOMEM;
    uuid_v4(guid);
    imageview_set_priv(iv, guid);
    return 0;
}

/* ---- the synthesized (read) side -------------------------------------- */

static int vhdx_new_synth(struct imageview *iv, uint64_t size, void **out)
{
    struct nbdf_err e = { "" };

    int r = vhdx_synth_new(size, imageview_priv(iv),
                           (struct vhdx_synth **) out, &e);
    if (r < 0)
        log_notice("%s: %s", imageview_name(iv), e.msg);
    else if (size % 512)
        log_notice("%s: the disk is %" PRIu64 " bytes, not whole 512-byte "
                   "sectors: the VHDX's virtual size is rounded up to %"
                   PRIu64 ", its last %u bytes zeros", imageview_name(iv),
                   size, (size + 511) / 512 * 512, (unsigned) (512 - size % 512));
    return r;
}

IMAGEVIEW_SYNTH_GLUE(vhdx)

static uint64_t vhdx_file_size(const void *s)
{
    return vhdx_synth_file_size(s);
}

IMAGEVIEW_SYNTH_READ(vhdx)

/* ---- the ingest (write) side ------------------------------------------ */

static struct vhdx_ingest *ingest_of(void *opaque)
{
    return imageview_stream(opaque);
}

static int sink_begin(void *opaque, const struct vhdx_info *info)
{
    struct imageview *iv = opaque;
    const struct vhdx_meta *m = &info->meta;

    uint64_t size = m->disk_size, export = imageview_fs(iv)->export_size;

    ingest_of(iv)->overlay = m->has_parent;
    /* A virtual size is whole sectors: an export whose size is not takes
     * a VHDX of itself back (sink_data() checks the tail is zero). */
    if (size > export && size - export < m->logical_sector)
        size = export;
    if (info->log_entries)
        log_notice("%s: the file was not closed cleanly: log entries "
                   "replayed: %" PRIu64 " (%" PRIu64 " writes)",
                   imageview_name(iv), info->log_entries, info->log_writes);
    return imageview_take(iv, m->has_parent ? "differencing"
                              : m->leave_blocks_allocated ? "fixed"
                                                          : "dynamic",
                          size, m->has_parent, 0);
}

/* The part of [off, off+len) inside the export (begin() allowed a last
 * sector past an export that ends mid-sector). */
static size_t inside(struct imageview *iv, uint64_t off, size_t len)
{
    uint64_t export = imageview_fs(iv)->export_size;

    if (off + len <= export)
        return len;
    return off < export ? (size_t) (export - off) : 0;
}

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    struct imageview *iv = opaque;
    size_t keep = inside(iv, off, len);

    if (!is_zero((const char *) buf + keep, len - keep))
        return -ENOSPC;               /* data past the export's end */
    if ((len = keep) == 0)
        return 0;
    if (imageview_fits(iv, off, len) < 0)
        return -ENOSPC;
    /* Without a parent the disk reads as zero since begin. */
    if (!ingest_of(iv)->overlay && is_zero(buf, len))
        return 0;
    return rawfile_place(imageview_fs(iv), off, buf, len);
}

static int sink_zero(void *opaque, uint64_t off, uint64_t len)
{
    struct imageview *iv = opaque;

    if ((len = inside(iv, off, (size_t) len)) == 0)
        return 0;
    if (imageview_fits(iv, off, len) < 0)
        return -ENOSPC;
    return rawfile_place_zero(imageview_fs(iv), off, len);
}

static int sink_spool_put(void *opaque, uint64_t off, const void *buf,
                          size_t len)
{
    return spool_put(ingest_of(opaque)->sp, off, buf, len);
}

static int sink_spool_get(void *opaque, uint64_t off, void *buf, size_t len)
{
    return spool_get(ingest_of(opaque)->sp, off, buf, len);
}

static const struct vhdx_sink sink = {
    .begin = sink_begin,
    .data = sink_data,
    .zero = sink_zero,
    .spool_put = sink_spool_put,
    .spool_get = sink_spool_get,
};

static void vhdx_free_stream(void *st)
{
    struct vhdx_ingest *in = st;

    vhdx_stream_free(in->s);
    spool_free(in->sp);
    free(in);
}

static int vhdx_new_stream(struct imageview *iv, void **out)
{
    struct fs_disk *d = imageview_fs(iv);
    struct vhdx_ingest *in = calloc(1, sizeof *in);
    struct spool_config sc = {
        .dir = d->cfg->spool_dir, .max = d->cfg->spool_max,
        .mem_max = spool_mem_max(d->cfg->spool_max),
        .name = imageview_name(iv),
    };
    struct vhdx_stream_config cfg = { .spool_max = d->cfg->spool_max,
                                      .spool_option = "--spool-max" };

    if (!in)
        return -ENOMEM;
    int r = spool_new(&sc, &in->sp);
    if (r == 0)
        r = vhdx_stream_new(&sink, iv, &cfg, &in->s);
    if (r < 0) {
        vhdx_free_stream(in);
        return r;
    }
    *out = in;
    return 0;
}

/* The first bytes, to name what was written when it is not a VHDX. */
static void keep_first(struct vhdx_ingest *in, uint64_t off, const void *buf,
                       uint64_t len)
{
    if (off >= FIRST_BYTES)
        return;
    size_t n = len < FIRST_BYTES - off ? (size_t) len
                                       : FIRST_BYTES - (size_t) off;
    if (buf)
        memcpy(in->first + off, buf, n);
    else
        memset(in->first + off, 0, n);
    if (off + n > in->nfirst)
        in->nfirst = (size_t) off + n;
}

static void remember_gap(struct vhdx_ingest *in, uint64_t off, uint64_t end)
{
    if (end > off) {
        in->gap[in->ngap % GAPS].off = off;
        in->gap[in->ngap % GAPS].end = end;
        in->ngap++;
    }
}

/* [off, off+len) behind the position, inside a range that passed as
 * zeros, and zeros again: nothing to do. */
static bool zeros_again(const struct vhdx_ingest *in, uint64_t off,
                        const void *buf, uint64_t len)
{
    if (off + len > in->end || (buf && !is_zero(buf, (size_t) len)))
        return false;
    for (unsigned i = 0; i < GAPS && i < in->ngap; i++)
        if (in->gap[i].off <= off && off + len <= in->gap[i].end)
            return true;
    return false;
}

static int feed(void *st, uint64_t off, const void *buf, uint64_t len)
{
    struct vhdx_ingest *in = st;

    if (off < in->end && zeros_again(in, off, buf, len))
        return 0;
    keep_first(in, off, buf, len);
    if (off > in->end)
        remember_gap(in, in->end, off);
    if (!buf)
        remember_gap(in, off, off + len);
    if (off + len > in->end)
        in->end = off + len;
    int r = vhdx_stream_feed(in->s, off, buf, (size_t) len);
    /* "vhdxfile" missing: not a VHDX at all, rather than a bad one. */
    if (r == -EINVAL && in->nfirst >= 8 && memcmp(in->first, "vhdxfile", 8))
        return -EMEDIUMTYPE;
    return r;
}

static int vhdx_glue_feed(void *st, uint64_t off, const void *buf, size_t n)
{
    return feed(st, off, buf, n);
}

static int vhdx_glue_hole(void *st, uint64_t off, uint64_t len)
{
    return feed(st, off, NULL, len);
}

/* The file's last bytes may be a hole that was never fed (cp --sparse
 * then ftruncate reaches us as a truncate, which is fed; this covers a
 * writer that only seeks): they count as zeros. */
static int vhdx_glue_finish(void *st)
{
    struct vhdx_ingest *in = st;
    int r = vhdx_stream_feed(in->s, in->end, NULL, 0);

    return r < 0 ? r : vhdx_stream_finish(in->s);
}

static void vhdx_glue_free(void *st) { vhdx_free_stream(st); }

static const char *vhdx_glue_error(const void *st)
{
    const struct vhdx_ingest *in = st;
    return vhdx_stream_error(in->s);
}

static bool vhdx_started(const void *st)
{
    const struct vhdx_ingest *in = st;
    return vhdx_stream_position(in->s) != 0;
}

static enum image_kind vhdx_first_kind(const void *st)
{
    const struct vhdx_ingest *in = st;
    return image_kind(in->first, in->nfirst);
}

static void vhdx_received(struct imageview *iv, char *buf, size_t n)
{
    struct vhdx_ingest *in = imageview_stream(iv);
    struct vhdx_stream_stats st;

    vhdx_stream_stats(in->s, &st);
    snprintf(buf, n, ", %" PRIu64 " bytes of data, %" PRIu64 " spooled",
             st.data_bytes, st.spooled_bytes);
}

static const struct imageview_format vhdx_format = {
    IMAGEVIEW_FORMAT_HOOKS(vhdx),
    .ino = FS_INO_VHDX, .what = "VHDX", .status_name = "the VHDX view",
    .readahead = true,
    .init = vhdx_init,
    .hole = vhdx_glue_hole,
    .received = vhdx_received,
    .file_size = vhdx_file_size,
};

IMAGEVIEW_DEFINE(fs_vhdx_view, vhdx_format, ".vhdx");
