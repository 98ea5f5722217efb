/* fs/qcow2view.c: FILENAME.qcow2, the disk seen as a qcow2.
 *
 * Writing: a copy tool writes a qcow2 image in file order (cp, dd, cat, a
 * pipe).  Each write feeds qcow2/'s forward-only stream decoder, whose
 * sink places the decoded bytes on the disk through the pool.  Opening
 * with O_TRUNC does not touch the disk: only the decoder's begin(),
 * called once the header and the L1 table have been validated, changes
 * it.  An image without a backing file replaces the disk's content by a
 * disk of its virtual size (lazy zeroing: unallocated and zero clusters
 * read as zero, and all-zero data is not sent).  An image with a backing
 * file holds only what changed from it, so it is applied over what the
 * disk holds (land the backing chain first, base to top): its zero
 * clusters are written as zeros, its unallocated clusters left as they
 * are.  Clusters that arrive before the table that places them (a
 * cluster reused after a discard, a table written last) go to the
 * shared bounded spool (fs/spool.h).  close() finishes the stream: an
 * image that ended early fails there with EINVAL.
 *
 * Compressed clusters are independent: the decoder hands each one over
 * (sink.compressed) and decompressor threads, helped by the writing
 * thread, decompress (deflate or zstd) and place them.  Every cluster
 * queued by a write is placed before that write is answered: no job
 * outlives a FUSE request, and a damaged cluster fails the write that
 * completed it (and every later one, and close()).
 *
 * Reading: the library's synthesizer produces a qcow2 v3 of the disk in
 * one pass, metadata first (64 KiB clusters; unallocated clusters not
 * stored; size known at open, see docs/qcow2-format.md); cluster data is
 * read through the pool.
 *
 * The rest (open, holes, truncate, close, the shared synthesizers) is the
 * format-view skeleton's (fs/imageview.h); this file is the glue to
 * qcow2/ and the decompressor threads.
 *
 * THREAD MODEL
 * The skeleton's lock (fs/imageview.h) serializes the ingest: every
 * decoder call, the sink callbacks and the spool run under it.
 * v->read_lock serializes reads of synthesizers (each caches a table, and
 * handles share them); it is taken without the ingest lock held.
 * Decompressor threads take jobs from v->q under q.lock (a leaf: held
 * only to move jobs and counters, never across decompression or a pool
 * write).  The writing FUSE thread, holding the ingest lock, runs queued
 * jobs itself when the queue is full or must drain (the skeleton's drain
 * hook, after every request), then waits on q.cond for the jobs threads
 * still run.  Threads never take the ingest lock, so that wait cannot
 * deadlock.  v->overlay is written by begin (ingest lock) while no job is
 * queued and read by jobs of that stream only.
 */
#include "fs/view.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/imagekind.h"
#include "common/iszero.h"
#include "common/log.h"
#include "fs/imageview.h"
#include "fs/rawfile.h"
#include "fs/spool.h"
#include "qcow2/qcow2.h"

#define QMAX 8                    /* compressed clusters waiting (bounded memory) */
#define THREADS_MAX 4
#define SYNTH_CLUSTER_BITS 16     /* qemu's default */

struct job {
    struct qcow2_compressed c;    /* c.cdata points at data */
    uint8_t *data;                /* owned copy of the compressed bytes */
};

struct decompressors {
    pthread_mutex_t lock;
    pthread_cond_t cond;          /* broadcast on every change below */
    struct job jobs[QMAX];        /* ring */
    unsigned head, count;         /* jobs queued */
    unsigned busy;                /* jobs being decompressed */
    int err;                      /* first decompress/place error (negative) */
    bool quit;
    unsigned nthreads;
    pthread_t threads[THREADS_MAX];
};

/* The format's state beside the skeleton's (imageview_priv()). */
struct qcow2view {
    pthread_mutex_t read_lock;
    struct fs_disk *d;
    struct imageview *iv;
    struct decompressors q;
    struct qcow2_decompressor *z; /* the writer's own, under the ingest lock */
    uint8_t *zout;                /* its output, a largest cluster */
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

static void run_job(struct qcow2view *v, struct job *j,
                    struct qcow2_decompressor *z, uint8_t *out)
{
    struct qcow2_err e = { "" };
    int64_t n = qcow2_compressed_decode(z, &j->c, out, &e);
    int r = n < 0 ? (int) n : place(v, j->c.disk_off, out, (size_t) n);

    free(j->data);
    pthread_mutex_lock(&v->q.lock);
    if (r < 0 && !v->q.err) {
        v->q.err = r;
        log_err("%s: %s", imageview_name(v->iv),
                e.msg[0] ? e.msg : strerror(-r));
    }
    v->q.busy--;
    pthread_cond_broadcast(&v->q.cond);
    pthread_mutex_unlock(&v->q.lock);
}

/* Take the oldest job: the caller then runs it without q.lock. */
static struct job pop_locked(struct qcow2view *v)
{
    assert(v->q.count > 0);
    struct job j = v->q.jobs[v->q.head];
    v->q.head = (v->q.head + 1) % QMAX;
    v->q.count--;
    v->q.busy++;
    pthread_cond_broadcast(&v->q.cond);
    return j;
}

/* The writer runs a queued job itself (q.lock held on entry and exit). */
static void help_locked(struct qcow2view *v)
{
    struct job j = pop_locked(v);
    pthread_mutex_unlock(&v->q.lock);
    run_job(v, &j, v->z, v->zout);
    pthread_mutex_lock(&v->q.lock);
}

static void *decompressor(void *opaque)
{
    struct qcow2view *v = opaque;
    struct qcow2_decompressor *z = NULL;
    uint8_t *out = malloc(1u << QCOW2_MAX_CLUSTER_BITS);

    if (qcow2_decompressor_new(&z) < 0 || !out)
        abort();                      /* startup only; cannot recover */
    pthread_mutex_lock(&v->q.lock);
    for (;;) {
        while (!v->q.count && !v->q.quit)
            pthread_cond_wait(&v->q.cond, &v->q.lock);
        if (!v->q.count)
            break;                    /* quit, and nothing left */
        struct job j = pop_locked(v);
        pthread_mutex_unlock(&v->q.lock);
        run_job(v, &j, z, out);
        pthread_mutex_lock(&v->q.lock);
    }
    pthread_mutex_unlock(&v->q.lock);
    qcow2_decompressor_free(z);
    free(out);
    return NULL;
}

static int start_decompressors(struct qcow2view *v)
{
    /* One core is the writer's, which decompresses too. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN) - 1;
    unsigned n = cpus < 1 ? 1 : cpus > THREADS_MAX ? THREADS_MAX
                                                    : (unsigned) cpus;

    if (qcow2_decompressor_new(&v->z) < 0 ||
        !(v->zout = malloc(1u << QCOW2_MAX_CLUSTER_BITS)))
        return -ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        int r = pthread_create(&v->q.threads[i], NULL, decompressor, v);
        if (r)
            return -r;
        v->q.nthreads++;
    }
    return 0;
}

static void stop_decompressors(struct qcow2view *v)
{
    pthread_mutex_lock(&v->q.lock);
    v->q.quit = true;
    pthread_cond_broadcast(&v->q.cond);
    pthread_mutex_unlock(&v->q.lock);
    for (unsigned i = 0; i < v->q.nthreads; i++)
        pthread_join(v->q.threads[i], NULL);
    v->q.nthreads = 0;
}

/* sink.compressed, on the FUSE thread under the ingest lock: queue a
 * copy (c->cdata is valid during the call only). */
static int sink_compressed(void *opaque, const struct qcow2_compressed *c)
{
    struct imageview *iv = opaque;
    struct qcow2view *v = qcow2_of(iv);
    uint8_t *copy = malloc(c->clen ? c->clen : 1);

    if (!copy)
        return -ENOMEM;
    memcpy(copy, c->cdata, c->clen);
    pthread_mutex_lock(&v->q.lock);
    while (v->q.count == QMAX && !v->q.err)
        help_locked(v);
    int r = v->q.err;
    if (r == 0) {
        struct job *j = &v->q.jobs[(v->q.head + v->q.count) % QMAX];
        j->c = *c;
        j->c.cdata = copy;
        j->data = copy;
        v->q.count++;
        pthread_cond_broadcast(&v->q.cond);
    }
    pthread_mutex_unlock(&v->q.lock);
    if (r < 0) {
        free(copy);
        imageview_logged(iv);         /* the thread said it */
    }
    return r;
}

/* drain: every queued cluster placed (the writer helping); the first
 * error of the ingest (already logged), cleared for the next if asked. */
static int qcow2_drain(struct imageview *iv, bool clear)
{
    struct qcow2view *v = qcow2_of(iv);

    pthread_mutex_lock(&v->q.lock);
    while (v->q.count)
        help_locked(v);
    while (v->q.busy)
        pthread_cond_wait(&v->q.cond, &v->q.lock);
    int r = v->q.err;
    if (clear)
        v->q.err = 0;
    pthread_mutex_unlock(&v->q.lock);
    return r;
}

static void qcow2_fini(struct imageview *iv)
{
    struct qcow2view *v = qcow2_of(iv);

    if (!v)
        return;
    stop_decompressors(v);            /* nothing is queued between requests */
    qcow2_decompressor_free(v->z);
    free(v->zout);
    pthread_mutex_destroy(&v->read_lock);
    pthread_mutex_destroy(&v->q.lock);
    pthread_cond_destroy(&v->q.cond);
    free(v);
    imageview_set_priv(iv, NULL);
}

static int qcow2_init(struct imageview *iv)
{
    struct qcow2view *v = calloc(1, sizeof *v);

    if (!v)
        return -ENOMEM;
    pthread_mutex_init(&v->read_lock, NULL);
    pthread_mutex_init(&v->q.lock, NULL);
    pthread_cond_init(&v->q.cond, NULL);
    v->d = imageview_fs(iv);
    v->iv = iv;
    imageview_set_priv(iv, v);
    int r = start_decompressors(v);
    if (r < 0) {
        log_err("%s: cannot start decompressor threads: %s",
                imageview_name(iv), strerror(-r));
        qcow2_fini(iv);
    }
    return r;
}

/* ---- the synthesized (read) side -------------------------------------- */

static int qcow2_new_synth(struct imageview *iv, uint64_t size, void **out)
{
    struct qcow2_err e = { "" };

    int r = qcow2_synth_new(size, SYNTH_CLUSTER_BITS,
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

/* Clusters touched by the data extents and the L2 tables they need, the
 * ones the previous extent counted left out. */
struct cluster_count {
    uint64_t clusters, tables;
    uint64_t last_c, last_t;
};

static int count_extent(void *opaque, uint64_t off, uint64_t len)
{
    const unsigned cb = SYNTH_CLUSTER_BITS;
    const unsigned tb = cb - 3;       /* log2(entries per L2 table) */
    struct cluster_count *c = opaque;
    uint64_t first = off >> cb, last = (off + len - 1) >> cb;

    if (first == c->last_c)
        first++;
    if (first <= last) {
        c->clusters += last - first + 1;
        uint64_t tfirst = first >> tb, tlast = last >> tb;
        c->tables += tlast - tfirst + 1 - (tfirst == c->last_t);
        c->last_c = last;
        c->last_t = tlast;
    }
    return 0;
}

/* The synthesized file's size from the zero maps, without a synthesizer
 * (getattr is frequent). */
static uint64_t qcow2_size(struct imageview *iv)
{
    struct fs_disk *d = imageview_fs(iv);
    uint64_t size = rawfile_size(d);
    struct cluster_count c = { .last_c = UINT64_MAX, .last_t = UINT64_MAX };

    if (size == 0 || qcow2_synth_size(size, SYNTH_CLUSTER_BITS, 0, 0) == 0)
        return 0;                     /* empty, or past the limit: open says */
    imageview_each_data(d, size, count_extent, &c);
    return qcow2_synth_size(size, SYNTH_CLUSTER_BITS, c.clusters, c.tables);
}

/* Each synthesizer caches a table, and handles share them. */
static int64_t qcow2_read(struct imageview *iv, void *s, struct fs_fh *fh,
                          uint64_t off, char *buf, size_t size)
{
    struct qcow2view *v = qcow2_of(iv);
    struct imageview_reader d = { .fs = imageview_fs(iv), .fh = fh };

    pthread_mutex_lock(&v->read_lock);
    int64_t n = qcow2_synth_read(s, off, buf, size, imageview_read_disk, &d);
    pthread_mutex_unlock(&v->read_lock);
    return n;
}

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
    /* No job of this stream is queued yet: the threads see this. */
    pthread_mutex_lock(&v->q.lock);
    v->overlay = overlay;
    pthread_mutex_unlock(&v->q.lock);
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
        .dir = d->cfg->spool_dir, .mem_max = SPOOL_MEM_MAX_DEFAULT,
        .max = d->cfg->spool_max, .name = imageview_name(iv),
    };

    if (!st)
        return -ENOMEM;
    st->first = IMAGE_UNKNOWN;
    int r = spool_new(&cfg, &st->sp);
    struct qcow2_stream_opts opts = {
        .spool = &spool_cbs, .spool_opaque = st->sp,
        .spool_max = d->cfg->spool_max, .spool_option = "--spool-max",
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
    .init = qcow2_init, .fini = qcow2_fini,
    .new_stream = qcow2_new_stream,
    .feed = qcow2_glue_feed, .hole = qcow2_glue_hole,
    .finish = qcow2_glue_finish, .free_stream = qcow2_glue_free,
    .error = qcow2_glue_error,
    .started = qcow2_started, .first_kind = qcow2_first_kind,
    .received = qcow2_received,
    .drain = qcow2_drain,
    .new_synth = qcow2_new_synth, .allocate = qcow2_allocate,
    .seal = qcow2_seal, .free_synth = qcow2_free_synth,
    .file_size = qcow2_file_size,
    .size = qcow2_size,               /* no synthesizer for a stat */
    .read = qcow2_read,
};

IMAGEVIEW_DEFINE(fs_qcow2_view, qcow2_format, ".qcow2");
