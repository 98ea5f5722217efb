/* views/vhdxview.c: FILENAME.vhdx, the disk seen as a VHDX, on the
 * format-view skeleton (views/imageview.h: open, write, holes, truncate,
 * close, the shared synthesizers, the decoder's sink and spool) over
 * vhdx/'s row of the format contract (common/format.h).  This file holds
 * what only a VHDX says: the synthesized VHDX's GUID, its rounding to
 * whole sectors, a replayed log.
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
#include <stdlib.h>

#include "common/log.h"
#include "common/uuid.h"
#include "views/imageview.h"
#include "vhdx/vhdx.h"

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

static void vhdx_synth_opts(struct imageview *iv, struct nbdf_synth_opts *o)
{
    o->uuid = imageview_priv(iv);
}

static void vhdx_synth_made(struct imageview *iv, uint64_t size)
{
    if (size % 512)
        log_notice("%s: the disk is %" PRIu64 " bytes, not whole 512-byte "
                   "sectors: the VHDX's virtual size is rounded up to %"
                   PRIu64 ", its last %u bytes zeros", imageview_name(iv),
                   size, (size + 511) / 512 * 512, (unsigned) (512 - size % 512));
}

static void vhdx_begun(struct imageview *iv, const struct nbdf_begin *b)
{
    const struct vhdx_info *info = b->info;

    if (info->log_entries)
        log_notice("%s: the file was not closed cleanly: log entries "
                   "replayed: %" PRIu64 " (%" PRIu64 " writes)",
                   imageview_name(iv), info->log_entries, info->log_writes);
}

static const struct imageview_format vhdx_view = {
    .lib = &vhdx_format,
    .ino = FS_INO_VHDX, .status_name = "the VHDX view",
    .readahead = true, .spool = true,
    .init = vhdx_init,
    .synth_opts = vhdx_synth_opts,
    .synth_made = vhdx_synth_made,
    .begun = vhdx_begun,
};

IMAGEVIEW_DEFINE(fs_vhdx_view, vhdx_view, ".vhdx");
