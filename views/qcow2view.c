/* views/qcow2view.c: FILENAME.qcow2, the disk seen as a qcow2.
 *
 * Writing: a copy tool writes a qcow2 image in file order (cp, dd, cat, a
 * pipe).  Each write feeds qcow2/'s forward-only stream decoder, whose
 * sink places the decoded bytes on the disk through the pool.  Opening
 * with O_TRUNC does not touch the disk: only the decoder's begin(),
 * called just before its first write (after the header, the L1 table and
 * every L2 table before the first data have been validated), changes
 * it.  An image without a backing file replaces the disk's content by a
 * disk of its virtual size (lazy zeroing: unallocated and zero clusters
 * read as zero, and all-zero data is not sent).  An image with a backing
 * file holds only what changed from it, so it is applied over what the
 * disk holds (land the backing chain first, base to top): its zero
 * clusters are written as zeros, its unallocated clusters left as they
 * are.  Clusters that arrive before the table that places them (a
 * cluster reused after a discard, a table written last) go to the
 * shared bounded spool (views/spool.h).  close() finishes the stream: an
 * image that ended early fails there with EINVAL.
 *
 * Compressed clusters are independent: the decoder hands each one over
 * (the sink's compressed) to decompressor threads (views/unpackers.h, with
 * qcow2/'s row's unpack hooks), helped by the writing thread, which decompress (deflate or zstd) and place them;
 * a damaged cluster fails the write that completed it (and every later
 * one, and close()).
 *
 * Reading: the library's synthesizer produces a qcow2 v3 of the disk in
 * one pass, metadata first (64 KiB clusters unless --qcow2-cluster-size
 * says otherwise; unallocated clusters not
 * stored; size known at open, see docs/design/format-qcow2.md); cluster data is
 * read through the pool.
 *
 * The rest (open, holes, truncate, close, the shared synthesizers, the
 * decoder's sink and spool) is the format-view skeleton's
 * (views/imageview.h) over qcow2/'s row of the format contract
 * (common/format.h); this file holds what only a qcow2 says: its backing
 * file and snapshots at begin, the cluster size, the size without a
 * synthesizer.
 *
 * THREAD MODEL
 * The skeleton's lock (views/imageview.h) serializes the ingest: every
 * decoder call, the sink callbacks and the spool run under it; the
 * decompressor threads are views/unpackers.h's and place clusters on any
 * thread.  The skeleton serializes reads of synthesizers (the row's
 * synth_serial: each caches a table, and handles share them).
 */
#include "fs/view.h"

#include <inttypes.h>

#include "common/log.h"
#include "views/imageview.h"
#include "fs/rawfile.h"
#include "qcow2/qcow2.h"

/* The cluster size the synthesizer uses (--qcow2-cluster-size). */
static void qcow2_synth_opts(struct imageview *iv, struct nbdf_synth_opts *o)
{
    o->cluster_bits = imageview_fs(iv)->cfg->qcow2_cluster_bits;
}

/* The synthesized file's size from the zero maps, without a synthesizer
 * (getattr is frequent): the clusters the data touches and the L2 tables
 * (of cluster / 8 entries) they need. */
static uint64_t qcow2_size(struct imageview *iv)
{
    struct fs_disk *d = imageview_fs(iv);
    uint64_t size = rawfile_size(d);
    const unsigned cb = d->cfg->qcow2_cluster_bits;

    if (size == 0 || qcow2_synth_size(size, cb, 0, 0) == 0)
        return 0;                     /* empty, or past the limit: open says */
    struct imageview_count c = imageview_count_data(d, size, 1ull << cb,
                                                    1ull << (cb - 3));
    return qcow2_synth_size(size, cb, c.units, c.tables);
}

/* What the header says beyond the contract: the backing file, and
 * internal snapshots (not landed). */
static void qcow2_begun(struct imageview *iv, const struct nbdf_begin *b)
{
    const struct qcow2_header *h = b->info;

    if (b->overlay)
        log_info("%s: the image's backing file is \"%s\": applied over "
                 "what the disk holds", imageview_name(iv), h->backing_file);
    /* A warning, so that the status shows it: the user may have meant
     * a snapshot (qemu-img convert -l takes one out first). */
    if (h->nb_snapshots)
        log_warn("%s: %" PRIu32 " internal snapshot%s not landed (only "
                 "the active disk is)", imageview_name(iv),
                 h->nb_snapshots, h->nb_snapshots == 1 ? "" : "s");
}

static const struct imageview_format qcow2_view = {
    .lib = &qcow2_format,
    .ino = FS_INO_QCOW2, .status_name = "the qcow2 view",
    .spool = true,
    .synth_opts = qcow2_synth_opts,
    .begun = qcow2_begun,
    .size = qcow2_size,               /* no synthesizer for a stat */
};

IMAGEVIEW_DEFINE(fs_qcow2_view, qcow2_view, ".qcow2");
