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
 * (sink.compressed) to decompressor threads (views/unpackers.h), helped by
 * the writing thread, which decompress (deflate or zstd) and place them;
 * a damaged cluster fails the write that completed it (and every later
 * one, and close()).
 *
 * Reading: the library's synthesizer produces a qcow2 v3 of the disk in
 * one pass, metadata first (64 KiB clusters unless --qcow2-cluster-size
 * says otherwise; unallocated clusters not
 * stored; size known at open, see docs/design/format-qcow2.md); cluster data is
 * read through the pool.
 *
 * The rest (open, holes, truncate, close, the shared synthesizers) is the
 * format-view skeleton's (views/imageview.h); this file is the glue to
 * qcow2/, its decompressors and its synthesizer.
 *
 * THREAD MODEL
 * The skeleton's lock (views/imageview.h) serializes the ingest: every
 * decoder call, the sink callbacks and the spool run under it; the
 * decompressor threads are views/unpackers.h's and place clusters on any
 * thread.  The skeleton serializes reads of synthesizers (serial_read:
 * each caches a table, and handles share them).  v->overlay is written
 * by begin (ingest lock) while no job is queued and read by jobs of that
 * stream only.
 */
#include "fs/view.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/imagekind.h"
#include "common/iszero.h"
#include "common/log.h"
#include "views/imageview.h"
#include "fs/rawfile.h"
#include "views/spool.h"
#include "views/unpackers.h"
#include "qcow2/qcow2.h"


/* The format's state beside the skeleton's (imageview_priv()). */
struct qcow2view {
    struct fs_disk *d;
    bool overlay;                 /* the stream has a backing file */
};

/* One ingest: the decoder, its spool, and what its first bytes were (a
 * refusal names the format that was written instead). */
struct q2stream {
    struct qcow2_stream *s;
    struct spool *sp;
    enum image_kind first;
};

static const struct qcow2_sink sink;
static const struct qcow2_spool spool_cbs = { spool_cb_put, spool_cb_get,
                                              spool_cb_drop };

static struct qcow2view *qcow2_of(struct imageview *iv)
{
    return imageview_priv(iv);
}

/* ---- placing decoded bytes -------------------------------------------- */

/* Decoded bytes to the disk; any thread.  A standalone image's disk reads
 * as zero since begin(), so all-zero runs are skipped; an overlay's zeros
 * must cover what the backing chain put there. */
static int place(struct qcow2view *v, uint64_t off, const void *buf,
                 size_t len)
{
    if (is_zero(buf, len))
        return v->overlay ? rawfile_place_zero(v->d, off, len) : 0;
    return rawfile_place(v->d, off, buf, len);
}

/* ---- decompressor threads --------------------------------------------- */

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len);

UNPACKERS_OPS(decompressors, "decompressor", struct qcow2_compressed,
              struct qcow2_decompressor, qcow2_decompressor_new,
              qcow2_decompressor_free, qcow2_compressed_decode,
              1u << QCOW2_MAX_CLUSTER_BITS, sink_data);

/* sink.compressed, on the FUSE thread under the ingest lock: queue a
 * copy (c->cdata is valid during the call only). */
static int sink_compressed(void *opaque, const struct qcow2_compressed *c)
{
    return imageview_unpack(opaque, c, c->cdata, c->clen);
}

static int qcow2_init(struct imageview *iv)
{
    struct qcow2view *v = calloc(1, sizeof *v);

    if (!v)
        return -ENOMEM;
    v->d = imageview_fs(iv);
    imageview_set_priv(iv, v);
    return 0;
}

/* ---- the synthesized (read) side -------------------------------------- */

static int qcow2_new_synth(struct imageview *iv, uint64_t size, void **out)
{
    struct nbdf_err e = { "" };

    int r = qcow2_synth_new(size, imageview_fs(iv)->cfg->qcow2_cluster_bits,
                            (struct qcow2_synth **) out, &e);
    if (r < 0)
        log_notice("%s: %s", imageview_name(iv),
                   e.msg[0] ? e.msg : strerror(-r));
    return r;
}

static int qcow2_allocate(void *s, uint64_t off, uint64_t len)
{
    return qcow2_synth_allocate(s, off, len);
}

static int qcow2_seal(void *s) { return qcow2_synth_seal(s); }
static void qcow2_free_synth(void *s) { qcow2_synth_free(s); }

static uint64_t qcow2_file_size(const void *s)
{
    return qcow2_synth_file_size(s);
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

/* Each synthesizer caches a table, and handles share them: serial_read. */
IMAGEVIEW_SYNTH_READ(qcow2)

/* ---- the ingest (write) side ------------------------------------------ */

static int sink_begin(void *opaque, enum qcow2_kind kind, uint64_t size)
{
    struct imageview *iv = opaque;
    struct qcow2view *v = qcow2_of(iv);
    const struct q2stream *st = imageview_stream(iv);
    const struct qcow2_header *h = qcow2_stream_header(st->s);
    bool overlay = kind == QCOW2_OVERLAY;

    if (overlay)
        log_info("%s: the image's backing file is \"%s\": applied over "
                 "what the disk holds", imageview_name(iv), h->backing_file);
    /* A warning, so that the status shows it: the user may have meant
     * a snapshot (qemu-img convert -l takes one out first). */
    if (h->nb_snapshots)
        log_warn("%s: %" PRIu32 " internal snapshot%s not landed (only "
                 "the active disk is)", imageview_name(iv),
                 h->nb_snapshots, h->nb_snapshots == 1 ? "" : "s");
    /* No job of this stream is queued yet; the ones queued after this
     * see it (views/unpackers.h). */
    v->overlay = overlay;
    return imageview_take(iv, overlay ? "overlay" : "standalone", size,
                          overlay, 0);
}

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    return place(qcow2_of(opaque), off, buf, len);
}

/* Zero clusters of an overlay (a standalone disk reads as zero). */
static int sink_zero(void *opaque, uint64_t off, uint64_t len)
{
    return rawfile_place_zero(imageview_fs(opaque), off, len);
}

static const struct qcow2_sink sink = {
    .begin = sink_begin,
    .data = sink_data,
    .zero = sink_zero,
    .compressed = sink_compressed,
};

static int qcow2_new_stream(struct imageview *iv, void **out)
{
    struct fs_disk *d = imageview_fs(iv);
    struct q2stream *st = calloc(1, sizeof *st);
    struct spool_config cfg = {
        .dir = d->cfg->spool_dir, .mem_max = spool_mem_max(d->cfg->spool_max),
        .max = d->cfg->spool_max, .name = imageview_name(iv),
    };

    if (!st)
        return -ENOMEM;
    st->first = IMAGE_UNKNOWN;
    int r = spool_new(&cfg, &st->sp);
    struct qcow2_stream_opts opts = {
        .spool = &spool_cbs, .spool_opaque = st->sp,
        .spool_max = d->cfg->spool_max,
        /* Named in "... bytes of spool (raise %s)". */
        .spool_option = "--spool-max; past half of it the spool is a file "
                        "in --spool-dir",
    };
    if (r == 0)
        r = qcow2_stream_new(&sink, iv, &opts, &st->s);
    if (r < 0) {
        spool_free(st->sp);
        free(st);
        return r;
    }
    *out = st;
    return 0;
}

static int qcow2_glue_feed(void *p, uint64_t off, const void *buf, size_t len)
{
    struct q2stream *st = p;
    if (off == 0 && qcow2_stream_position(st->s) == 0)
        st->first = image_kind(buf, len);
    return qcow2_stream_feed(st->s, off, buf, len);
}

static int qcow2_glue_hole(void *p, uint64_t off, uint64_t len)
{
    return qcow2_stream_hole(((struct q2stream *) p)->s, off, len);
}

static int qcow2_glue_finish(void *p)
{
    return qcow2_stream_finish(((struct q2stream *) p)->s);
}

static void qcow2_glue_free(void *p)
{
    struct q2stream *st = p;
    if (!st)
        return;
    qcow2_stream_free(st->s);
    spool_free(st->sp);
    free(st);
}

static const char *qcow2_glue_error(const void *p)
{
    return qcow2_stream_error(((const struct q2stream *) p)->s);
}

static bool qcow2_started(const void *p)
{
    return qcow2_stream_position(((const struct q2stream *) p)->s) != 0;
}

static enum image_kind qcow2_first_kind(const void *p)
{
    return ((const struct q2stream *) p)->first;
}

static void qcow2_received(struct imageview *iv, char *buf, size_t n)
{
    const struct q2stream *st = imageview_stream(iv);
    struct qcow2_stream_stats s;

    qcow2_stream_stats(st->s, &s);
    snprintf(buf, n, ", %" PRIu64 " data clusters, %" PRIu64 " compressed, %"
             PRIu64 " spooled", s.data_clusters, s.compressed_clusters,
             s.spooled_clusters);
}

static const struct imageview_format qcow2_format = {
    .ino = FS_INO_QCOW2, .what = "qcow2", .status_name = "the qcow2 view",
    .init = qcow2_init,
    .new_stream = qcow2_new_stream,
    .feed = qcow2_glue_feed, .hole = qcow2_glue_hole,
    .finish = qcow2_glue_finish, .free_stream = qcow2_glue_free,
    .error = qcow2_glue_error,
    .started = qcow2_started, .first_kind = qcow2_first_kind,
    .received = qcow2_received,
    .unpack = &decompressors,
    .new_synth = qcow2_new_synth, .allocate = qcow2_allocate,
    .seal = qcow2_seal, .free_synth = qcow2_free_synth,
    .file_size = qcow2_file_size,
    .size = qcow2_size,               /* no synthesizer for a stat */
    .read = qcow2_read, .serial_read = true,
};

IMAGEVIEW_DEFINE(fs_qcow2_view, qcow2_format, ".qcow2");
