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
 * (sink.grain) to inflater threads (views/unpackers.h), helped by the
 * writing thread; a damaged grain fails the write that completed it (and
 * every later one, and close()).
 *
 * Reading: a synthesizer produces a streamOptimized VMDK of stored
 * deflate blocks (size known at open; see docs/design/format-vmdk.md); grain
 * data is read through the pool.
 *
 * The rest (open, holes, truncate, close, the shared synthesizers) is the
 * format-view skeleton's (views/imageview.h); this file is the glue to
 * vmdk/, its inflaters and its synthesizer.
 *
 * THREAD MODEL
 * The skeleton's lock (views/imageview.h) serializes the ingest; the
 * inflater threads are views/unpackers.h's and place grains on any thread.
 * The skeleton serializes reads of synthesizers (serial_read: each
 * caches a grain, and handles share them).
 * The disk is changed through fs/rawfile.c, whose size lock is taken
 * only around one placement, never across a wait for the queue.
 */
#include "fs/view.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/iszero.h"
#include "common/log.h"
#include "views/imageview.h"
#include "fs/rawfile.h"
#include "views/unpackers.h"
#include "vmdk/vmdk.h"

/* The format's state beside the skeleton's (imageview_priv()). */
struct vmdkview {
    uint32_t cid;                 /* of the synthesized VMDK, per mount */
};

static const struct vmdk_sink sink;

static struct vmdkview *vmdk_of(struct imageview *iv)
{
    return imageview_priv(iv);
}

/* ---- inflater threads ------------------------------------------------ */

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len);

UNPACKERS_OPS(inflaters, "inflater", struct vmdk_grain, struct vmdk_inflater,
              vmdk_inflater_new, vmdk_inflater_free, vmdk_grain_inflate,
              VMDK_GRAIN_MAX_SECTORS * VMDK_SECTOR, sink_data);

/* sink.grain, on the FUSE thread under view->lock: queue a copy. */
static int sink_grain(void *opaque, const struct vmdk_grain *g)
{
    return imageview_unpack(opaque, g, g->cdata, g->clen);
}

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

/* ---- the synthesized (read) side -------------------------------------- */

static int vmdk_new_synth(struct imageview *iv, uint64_t size, void **out)
{
    struct nbdf_err e = { "" };

    int r = vmdk_synth_new(size, vmdk_of(iv)->cid, imageview_name(iv),
                           (struct vmdk_synth **) out, &e);
    if (r < 0)
        log_notice("%s: %s", imageview_name(iv), e.msg);
    return r;
}

IMAGEVIEW_SYNTH_GLUE(vmdk)

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

/* Each synthesizer caches a grain, and handles share them: serial_read. */
IMAGEVIEW_SYNTH_READ(vmdk)

/* ---- the ingest (write) side ------------------------------------------ */

static int sink_begin(void *opaque, enum vmdk_kind kind, uint64_t capacity)
{
    struct imageview *iv = opaque;
    struct fs_disk *d = imageview_fs(iv);

    /* A capacity is whole sectors: an export whose size is not a multiple
     * of 512 takes a VMDK of itself back (place() checks the tail). */
    if (capacity > d->export_size &&
        capacity - d->export_size < VMDK_SECTOR)
        capacity = d->export_size;
    return imageview_take(iv, kind == VMDK_STREAM_OPTIMIZED
                                  ? "streamOptimized" : "monolithicSparse",
                          capacity, false, 0);
}

/* Decoded bytes to the disk; any thread.  All-zero runs are skipped. */
static int place(struct fs_disk *d, uint64_t off, const void *buf, size_t len)
{
    if (off + len > d->export_size) {
        /* The last sector's bytes past an export that ends mid-sector
         * (begin() allowed that): they must be zero. */
        size_t keep = off < d->export_size ? (size_t) (d->export_size - off)
                                            : 0;
        if (!is_zero((const char *) buf + keep, len - keep))
            return -ENOSPC;
        len = keep;
    }
    if (is_zero(buf, len))           /* reads as zero since begin() */
        return 0;
    return rawfile_place(d, off, buf, len);
}

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    return place(imageview_fs(opaque), off, buf, len);
}

static const struct vmdk_sink sink = {
    .begin = sink_begin,
    .data = sink_data,
    .grain = sink_grain,
};

static int vmdk_new_stream(struct imageview *iv, void **out)
{
    return vmdk_stream_new(&sink, iv, (struct vmdk_stream **) out);
}

IMAGEVIEW_STREAM_GLUE(vmdk)
IMAGEVIEW_STREAM_HOLE(vmdk)
static bool vmdk_started(const void *s) { return vmdk_stream_position(s); }

static enum image_kind vmdk_first_kind(const void *s)
{
    return vmdk_stream_first_kind(s);
}

static void vmdk_received(struct imageview *iv, char *buf, size_t n)
{
    struct vmdk_stream_stats st;

    vmdk_stream_stats(imageview_stream(iv), &st);
    snprintf(buf, n, ", %" PRIu64 " grains", st.grains);
}

static const struct imageview_format vmdk_format = {
    IMAGEVIEW_FORMAT_HOOKS(vmdk),
    .ino = FS_INO_VMDK, .what = "VMDK", .status_name = "the VMDK view",
    .init = vmdk_init,
    .hole = vmdk_glue_hole,
    .received = vmdk_received,
    .unpack = &inflaters, .serial_read = true,
    .size = vmdk_size,                /* no synthesizer for a stat */
};

IMAGEVIEW_DEFINE(fs_vmdk_view, vmdk_format, ".vmdk");
