/* views/vmdkview.c: FILENAME.vmdk, the disk seen as a VMDK.
 *
 * Writing: a copy tool writes a streamOptimized or monolithicSparse VMDK
 * in file order (cp, dd, cat, tar -xO of an OVA).  Each write feeds
 * vmdk/'s forward-only stream decoder, whose sink places the decoded
 * bytes on the disk through the pool.  Opening with O_TRUNC does not touch
 * the disk: only the decoder's begin(), called once the header and
 * descriptor (and for monolithicSparse the grain map) have been validated,
 * replaces the disk's content by a disk of the VMDK's capacity (lazy
 * zeroing: grains the VMDK does not carry read as zero, and write-zeroes
 * go only where nothing was written).  Decoded bytes that are all zero
 * are not sent: the disk already reads as zero there.  close() finishes
 * the stream: a VMDK that ended early fails there with EINVAL.
 * The progress counts bytes of the VMDK file written, as for a VHD.
 *
 * Compressed grains are independent: the decoder hands each one over
 * (the sink's compressed) to inflater threads (views/unpackers.h, with
 * vmdk/'s row's unpack hooks), helped by the writing thread; a damaged
 * grain fails the write that completed it (and every later one, and
 * close()).
 *
 * Reading: a synthesizer produces a streamOptimized VMDK of stored
 * deflate blocks (size known at open; see docs/design/format-vmdk.md); grain
 * data is read through the pool.
 *
 * The rest (open, holes, truncate, close, the shared synthesizers, the
 * decoder's sink) is the format-view skeleton's (views/imageview.h) over
 * vmdk/'s row of the format contract (common/format.h); this file holds
 * what only a VMDK says: the content id and the size without a
 * synthesizer.
 *
 * THREAD MODEL
 * The skeleton's lock (views/imageview.h) serializes the ingest; the
 * inflater threads are views/unpackers.h's and place grains on any thread.
 * The skeleton serializes reads of synthesizers (the row's synth_serial:
 * each caches a grain, and handles share them).
 * The disk is changed through fs/rawfile.c, whose size lock is taken
 * only around one placement, never across a wait for the queue.
 */
#include "fs/view.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "views/imageview.h"
#include "fs/rawfile.h"
#include "vmdk/vmdk.h"

/* The format's state beside the skeleton's (imageview_priv()). */
struct vmdkview {
    uint32_t cid;                 /* of the synthesized VMDK, per mount */
};

static int vmdk_init(struct imageview *iv)
{
    struct fs_disk *d = imageview_fs(iv);
    struct vmdkview *v = calloc(1, sizeof *v);
    struct timespec ts;

    if (!v)
        return -ENOMEM;
    /* A per-mount content id: re-reads of the view agree within a mount. */
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = ((uint64_t) ts.tv_sec * 1000000007u) ^
                    (uint64_t) ts.tv_nsec ^ d->export_size;
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v->cid = (uint32_t) (seed >> 32);
    if (v->cid == 0xffffffffu)
        v->cid = 1;                   /* "no parent" in a descriptor */
    imageview_set_priv(iv, v);
    return 0;
}

/* The synthesizer's content id and extent name (the view's file name). */
static void vmdk_synth_opts(struct imageview *iv, struct nbdf_synth_opts *o)
{
    const struct vmdkview *v = imageview_priv(iv);

    o->cid = v->cid;
}

/* The synthesized file's size from the zero maps, counting grains and
 * tables without a synthesizer (getattr is frequent; a synthesizer holds
 * 4 bytes per allocated grain). */
static uint64_t vmdk_size(struct imageview *iv)
{
    const uint64_t G = VMDK_SYNTH_GRAIN_SECTORS * VMDK_SECTOR;
    struct fs_disk *d = imageview_fs(iv);
    uint64_t size = rawfile_size(d);

    if (vmdk_synth_size(size, 0, 0) == 0)
        return 0;                     /* past the limit: open says why */
    struct imageview_count c =
        imageview_count_data(d, size, G, VMDK_SYNTH_TABLE_BYTES / G);
    return vmdk_synth_size(size, c.units, c.tables);
}

static const struct imageview_format vmdk_view = {
    .lib = &vmdk_format,
    .ino = FS_INO_VMDK, .status_name = "the VMDK view",
    .init = vmdk_init,
    .synth_opts = vmdk_synth_opts,
    .size = vmdk_size,                /* no synthesizer for a stat */
};

IMAGEVIEW_DEFINE(fs_vmdk_view, vmdk_view, ".vmdk");
