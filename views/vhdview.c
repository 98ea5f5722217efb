/* views/vhdview.c: FILENAME.vhd, the disk seen as a VHD, on the format-view
 * skeleton (views/imageview.h: open, write, holes, truncate, close, the
 * shared synthesizers).  This file is the glue to vhd/.
 *
 * Writing: each write feeds vhd/'s forward-only stream decoder, whose
 * sink places the decoded bytes on the disk.  A fixed or dynamic VHD
 * replaces the disk (lazy zeroing, so blocks the VHD does not carry read
 * as zero at the cost of write-zeroes only where the disk is not known
 * zero), while a differencing VHD is applied over what the disk holds.
 * A VHD that ended early or whose footer is wrong fails at close.
 *
 * Reading: a synthesizer produces a dynamic VHD of the disk's allocation;
 * block data is read through the handle's read-ahead stream.
 *
 * Refusal: the decoder is told the export's size and whether fixed VHDs
 * are taken (--vhd-fixed), so that anything that does not begin like a
 * dynamic or differencing VHD, or describes a disk larger than the
 * export, is refused at the write that completes the first sector,
 * before the disk is touched.
 *
 * THREAD MODEL: the skeleton's (views/imageview.h); the decoder and its sink
 * run under the skeleton's lock; vhd_synth_read() is reentrant.
 */
#include "fs/view.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"
#include "common/uuid.h"
#include "views/imageview.h"
#include "fs/rawfile.h"
#include "vhd/vhd.h"

/* The synthesized VHD's identity, per mount: re-reads agree. */
struct vhd_ident {
    uint8_t uuid[16];
    uint32_t timestamp;
};

static const struct vhd_sink sink;

static int vhd_init(struct imageview *iv)
{
    struct vhd_ident *id = calloc(1, sizeof *id);

    if (!id)
        return -ENOMEM;
    uuid_v4(id->uuid);
    id->timestamp = (uint32_t) (time(NULL) - VHD_EPOCH_UNIX);
    imageview_set_priv(iv, id);
    return 0;
}

/* ---- the synthesized (read) side -------------------------------------- */

/* -EFBIG past the VHD size limit; -EINVAL for size 0. */
static int vhd_new_synth(struct imageview *iv, uint64_t size, void **out)
{
    struct vhd_ident *id = imageview_priv(iv);
    struct nbdf_err e = { "" };

    int r = vhd_synth_new(size, id->uuid, id->timestamp,
                          (struct vhd_synth **) out, &e);
    if (r < 0)
        log_notice("%s: %s", imageview_name(iv), e.msg);
    return r;
}

static int vhd_allocate(void *s, uint64_t off, uint64_t len)
{
    vhd_synth_allocate(s, off, len);
    return 0;
}

static int vhd_seal(void *s) { return vhd_synth_seal(s); }
static void vhd_free_synth(void *s) { vhd_synth_free(s); }
static uint64_t vhd_file_size(const void *s) { return vhd_synth_file_size(s); }

IMAGEVIEW_SYNTH_READ(vhd)

/* ---- the ingest (write) side ------------------------------------------ */

static int sink_begin(void *opaque, enum vhd_kind kind, uint64_t size)
{
    struct imageview *iv = opaque;
    static const char *names[] = { [VHD_FIXED] = "fixed",
                                   [VHD_DYNAMIC] = "dynamic",
                                   [VHD_DIFF] = "differencing" };

    return imageview_take(iv, names[kind], size, kind == VHD_DIFF,
                          vhd_stream_expected_length(imageview_stream(iv)));
}

/* A fixed VHD's size is known only at its end: its data can run past
 * the export.  (Dynamic ones were checked at begin.) */
static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    struct imageview *iv = opaque;

    if (imageview_fits(iv, off, len) < 0)
        return -ENOSPC;
    return rawfile_place(imageview_fs(iv), off, buf, len);
}

static int sink_zero(void *opaque, uint64_t off, uint64_t len)
{
    struct imageview *iv = opaque;

    if (imageview_fits(iv, off, len) < 0)
        return -ENOSPC;
    return rawfile_place_zero(imageview_fs(iv), off, len);  /* < 0: fails */
}

static const struct vhd_sink sink = {
    .begin = sink_begin,
    .data = sink_data,
    .zero = sink_zero,
};

static int vhd_new_stream(struct imageview *iv, void **out)
{
    struct fs_disk *d = imageview_fs(iv);
    struct vhd_stream *s;

    int r = vhd_stream_new(&sink, iv, &s);
    if (r == 0) {
        vhd_stream_limit(s, d->export_size, d->cfg->vhd_fixed);
        *out = s;
    }
    return r;
}

IMAGEVIEW_STREAM_GLUE(vhd)
IMAGEVIEW_STREAM_HOLE(vhd)

static bool vhd_started(const void *s)
{
    return vhd_stream_position(s) != 0 || vhd_stream_kind(s) != 0;
}

static enum image_kind vhd_first_kind(const void *s)
{
    return vhd_stream_first_kind(s);
}

/* Not a known format: how a fixed VHD gets in. */
static const char *vhd_refusal_hint(struct fs_disk *d)
{
    return d->cfg->vhd_fixed ? "" : " (a fixed VHD needs the mount option "
                                "--vhd-fixed, -o vhd_fixed)";
}

static const struct imageview_format vhd_format = {
    IMAGEVIEW_FORMAT_HOOKS(vhd),
    .ino = FS_INO_VHD, .what = "VHD", .status_name = "the VHD view",
    .readahead = true,
    .init = vhd_init,
    .hole = vhd_glue_hole,
    .refusal_hint = vhd_refusal_hint,
    .file_size = vhd_file_size,
};

IMAGEVIEW_DEFINE(fs_vhd_view, vhd_format, ".vhd");
