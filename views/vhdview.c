/* views/vhdview.c: FILENAME.vhd, the disk seen as a VHD, on the format-view
 * skeleton (views/imageview.h: open, write, holes, truncate, close, the
 * shared synthesizers, the decoder's sink) over vhd/'s row of the format
 * contract (common/format.h).  This file holds what only a VHD says: the
 * synthesized VHD's identity and how a fixed VHD gets in.
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
 * are taken (--vhd-fixed; the skeleton's stream options), so that anything that does not begin like a
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

#include "common/uuid.h"
#include "views/imageview.h"
#include "vhd/vhd.h"

/* The synthesized VHD's identity, per mount: re-reads agree. */
struct vhd_ident {
    uint8_t uuid[16];
    uint32_t timestamp;
};

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

/* The synthesizer's identity: per mount. */
static void vhd_synth_opts(struct imageview *iv, struct nbdf_synth_opts *o)
{
    const struct vhd_ident *id = imageview_priv(iv);

    o->uuid = id->uuid;
    o->timestamp = id->timestamp;
}

/* Not a known format: how a fixed VHD gets in. */
static const char *vhd_refusal_hint(struct fs_disk *d)
{
    return d->cfg->vhd_fixed ? "" : " (a fixed VHD needs the mount option "
                                "--vhd-fixed, -o vhd_fixed)";
}

static const struct imageview_format vhd_view = {
    .lib = &vhd_format,
    .ino = FS_INO_VHD, .status_name = "the VHD view",
    .readahead = true,
    .init = vhd_init,
    .synth_opts = vhd_synth_opts,
    .refusal_hint = vhd_refusal_hint,
};

IMAGEVIEW_DEFINE(fs_vhd_view, vhd_view, ".vhd");
