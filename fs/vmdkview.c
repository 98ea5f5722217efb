/* fs/vmdkview.c: FILENAME.vmdk, the disk seen as a VMDK.
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
 * (sink.grain) and inflater threads, helped by the writing thread,
 * inflate and place them, so inflating uses several cores.  Every grain
 * queued by a write is placed before that write is answered: no job
 * outlives a FUSE request, and a damaged grain fails the write that
 * completed it (and every later one, and close()).
 *
 * Reading: a synthesizer produces a streamOptimized VMDK of stored
 * deflate blocks (size known at open; see docs/vmdk-format.md); grain
 * data is read through the pool.
 *
 * The rest (open, holes, truncate, close, the shared synthesizers) is the
 * format-view skeleton's (fs/imageview.h); this file is the glue to
 * vmdk/ and the inflater threads.
 *
 * THREAD MODEL
 * The skeleton's lock (fs/imageview.h) serializes the ingest.
 * v->read_lock serializes reads of synthesizers (each caches a grain,
 * and handles share them); it is taken without the ingest lock held.
 * Inflater threads take jobs from v->q under q.lock (a leaf: held only
 * to move jobs and counters, never across inflate or a pool write).  The
 * writing FUSE thread, holding the ingest lock, runs queued jobs itself
 * when the queue is full or must drain (the skeleton's drain hook, after
 * every request), then waits on q.cond for the jobs inflaters still run.
 * Inflaters never take the ingest lock, so that wait cannot deadlock.
 * The disk is changed through fs/rawfile.c, whose size lock is taken
 * only around one placement, never across a wait for the queue.
 */
#include "fs/view.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/iszero.h"
#include "common/log.h"
#include "fs/imageview.h"
#include "fs/rawfile.h"
#include "vmdk/vmdk.h"

#define QMAX 8                    /* compressed grains waiting (bounded memory) */
#define INFLATERS_MAX 4

struct job {
    struct vmdk_grain g;          /* g.cdata points at data */
    uint8_t *data;                /* owned copy of the compressed grain */
};

struct inflaters {
    pthread_mutex_t lock;
    pthread_cond_t cond;          /* broadcast on every change below */
    struct job jobs[QMAX];        /* ring */
    unsigned head, count;         /* jobs queued */
    unsigned busy;                /* jobs being inflated */
    int err;                      /* first inflate/place error (negative) */
    bool quit;
    unsigned nthreads;
    pthread_t threads[INFLATERS_MAX];
};

/* The format's state beside the skeleton's (imageview_priv()). */
struct vmdkview {
    pthread_mutex_t read_lock;
    uint32_t cid;                 /* of the synthesized VMDK, per mount */
    struct fs_disk *d;
    struct imageview *iv;
    struct inflaters q;
    struct vmdk_inflater *z;      /* the writer's own, under the ingest lock */
    uint8_t *zout;                /* its output, a maximal grain */
};

static const struct vmdk_sink sink;

static struct vmdkview *vmdk_of(struct imageview *iv)
{
    return imageview_priv(iv);
}

static const char *vmdk_name(struct fs_disk *d)
{
    return d->view_name[FS_INO_VMDK];
}

/* ---- inflater threads ------------------------------------------------ */

static int place(struct fs_disk *d, uint64_t off, const void *buf, size_t len);

static void run_job(struct vmdkview *v, struct job *j,
                    struct vmdk_inflater *z, uint8_t *out)
{
    struct vmdk_err e = { "" };
    int64_t n = vmdk_grain_inflate(z, &j->g, out, &e);
    int r = n < 0 ? (int) n : place(v->d, j->g.disk_off, out, (size_t) n);

    free(j->data);
    pthread_mutex_lock(&v->q.lock);
    if (r < 0 && !v->q.err) {
        v->q.err = r;
        log_err("%s: %s", vmdk_name(v->d),
                e.msg[0] ? e.msg : strerror(-r));
    }
    v->q.busy--;
    pthread_cond_broadcast(&v->q.cond);
    pthread_mutex_unlock(&v->q.lock);
}

/* Take the oldest job: the caller then runs it without q.lock. */
static struct job pop_locked(struct vmdkview *v)
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
static void help_locked(struct vmdkview *v)
{
    struct job j = pop_locked(v);
    pthread_mutex_unlock(&v->q.lock);
    run_job(v, &j, v->z, v->zout);
    pthread_mutex_lock(&v->q.lock);
}

static void *inflater(void *opaque)
{
    struct vmdkview *v = opaque;
    struct vmdk_inflater *z = NULL;
    uint8_t *out = malloc(VMDK_GRAIN_MAX_SECTORS * VMDK_SECTOR);

    if (vmdk_inflater_new(&z) < 0 || !out)
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
    vmdk_inflater_free(z);
    free(out);
    return NULL;
}

static int start_inflaters(struct vmdkview *v)
{
    /* One core is the writer's, which inflates too. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN) - 1;
    unsigned n = cpus < 1 ? 1 : cpus > INFLATERS_MAX ? INFLATERS_MAX
                                                      : (unsigned) cpus;

    if (vmdk_inflater_new(&v->z) < 0 ||
        !(v->zout = malloc(VMDK_GRAIN_MAX_SECTORS * VMDK_SECTOR)))
        return -ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        int r = pthread_create(&v->q.threads[i], NULL, inflater, v);
        if (r)
            return -r;
        v->q.nthreads++;
    }
    return 0;
}

static void stop_inflaters(struct vmdkview *v)
{
    pthread_mutex_lock(&v->q.lock);
    v->q.quit = true;
    pthread_cond_broadcast(&v->q.cond);
    pthread_mutex_unlock(&v->q.lock);
    for (unsigned i = 0; i < v->q.nthreads; i++)
        pthread_join(v->q.threads[i], NULL);
    v->q.nthreads = 0;
}

/* The writer, under view->lock: place every queued grain (helping), and
 * return the first error of the ingest (already logged); clear it for
 * the next ingest if asked. */
static int drain_inflaters(struct vmdkview *v, bool clear)
{
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

/* sink.grain, on the FUSE thread under view->lock: queue a copy. */
static int sink_grain(void *opaque, const struct vmdk_grain *g)
{
    struct imageview *iv = opaque;
    struct vmdkview *v = vmdk_of(iv);
    uint8_t *copy = malloc(g->clen ? g->clen : 1);

    if (!copy)
        return -ENOMEM;
    memcpy(copy, g->cdata, g->clen);
    pthread_mutex_lock(&v->q.lock);
    while (v->q.count == QMAX && !v->q.err)
        help_locked(v);
    int r = v->q.err;
    if (r == 0) {
        struct job *j = &v->q.jobs[(v->q.head + v->q.count) % QMAX];
        j->g = *g;
        j->g.cdata = copy;
        j->data = copy;
        v->q.count++;
        pthread_cond_broadcast(&v->q.cond);
    }
    pthread_mutex_unlock(&v->q.lock);
    if (r < 0) {
        free(copy);
        imageview_logged(iv);         /* the inflater said it */
    }
    return r;
}

/* drain: every queued grain placed (the writer helping); the first error
 * of the ingest (already logged), cleared for the next ingest if asked. */
static int vmdk_drain(struct imageview *iv, bool clear)
{
    return drain_inflaters(vmdk_of(iv), clear);
}

static void vmdk_fini(struct imageview *iv)
{
    struct vmdkview *v = vmdk_of(iv);

    if (!v)
        return;
    stop_inflaters(v);                /* nothing is queued between requests */
    vmdk_inflater_free(v->z);
    free(v->zout);
    pthread_mutex_destroy(&v->read_lock);
    pthread_mutex_destroy(&v->q.lock);
    pthread_cond_destroy(&v->q.cond);
    free(v);
    imageview_set_priv(iv, NULL);
}

static int vmdk_init(struct imageview *iv)
{
    struct fs_disk *d = imageview_fs(iv);
    struct vmdkview *v = calloc(1, sizeof *v);
    struct timespec ts;

    if (!v)
        return -ENOMEM;
    pthread_mutex_init(&v->read_lock, NULL);
    pthread_mutex_init(&v->q.lock, NULL);
    pthread_cond_init(&v->q.cond, NULL);
    v->d = d;
    v->iv = iv;
    /* A per-mount content id: re-reads of the view agree within a mount. */
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = ((uint64_t) ts.tv_sec * 1000000007u) ^
                    (uint64_t) ts.tv_nsec ^ d->export_size;
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v->cid = (uint32_t) (seed >> 32);
    if (v->cid == 0xffffffffu)
        v->cid = 1;                   /* "no parent" in a descriptor */
    imageview_set_priv(iv, v);
    int r = start_inflaters(v);
    if (r < 0) {
        log_err("%s: cannot start inflater threads: %s", vmdk_name(d),
                strerror(-r));
        vmdk_fini(iv);
    }
    return r;
}

/* ---- the synthesized (read) side -------------------------------------- */

static int vmdk_new_synth(struct imageview *iv, uint64_t size, void **out)
{
    struct vmdk_err e = { "" };

    int r = vmdk_synth_new(size, vmdk_of(iv)->cid, imageview_name(iv),
                           (struct vmdk_synth **) out, &e);
    if (r < 0)
        log_notice("%s: %s", imageview_name(iv), e.msg);
    return r;
}

IMAGEVIEW_SYNTH_GLUE(vmdk)

/* Grains [first, last] of a data extent and their tables, less the ones
 * the previous extent already counted. */
struct grain_count {
    uint64_t grains, tables;
    uint64_t last_g, last_t;
};

static int count_extent(void *opaque, uint64_t off, uint64_t len)
{
    const uint64_t G = VMDK_SYNTH_GRAIN_SECTORS * VMDK_SECTOR;
    const uint64_t per = VMDK_SYNTH_TABLE_BYTES / G;
    struct grain_count *c = opaque;
    uint64_t first = off / G, last = (off + len - 1) / G;

    if (first == c->last_g)
        first++;
    if (first <= last) {
        c->grains += last - first + 1;
        uint64_t tfirst = first / per, tlast = last / per;
        c->tables += tlast - tfirst + 1 - (tfirst == c->last_t);
        c->last_g = last;
        c->last_t = tlast;
    }
    return 0;
}

/* The synthesized file's size from the zero maps, counting grains and
 * tables without a synthesizer (getattr is frequent; a synthesizer holds
 * 4 bytes per allocated grain). */
static uint64_t vmdk_size(struct imageview *iv)
{
    struct fs_disk *d = imageview_fs(iv);
    uint64_t size = rawfile_size(d);
    struct grain_count c = { .last_g = UINT64_MAX, .last_t = UINT64_MAX };

    if (vmdk_synth_size(size, 0, 0) == 0)
        return 0;                     /* past the limit: open says why */
    imageview_each_data(d, size, count_extent, &c);
    return vmdk_synth_size(size, c.grains, c.tables);
}

/* Each synthesizer caches a grain, and handles share them. */
static int64_t vmdk_read(struct imageview *iv, void *s, struct fs_fh *fh,
                         uint64_t off, char *buf, size_t size)
{
    struct vmdkview *v = vmdk_of(iv);
    struct imageview_reader d = { .fs = imageview_fs(iv), .fh = fh };

    pthread_mutex_lock(&v->read_lock);
    int64_t n = vmdk_synth_read(s, off, buf, size, imageview_read_disk, &d);
    pthread_mutex_unlock(&v->read_lock);
    return n;
}

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
    .init = vmdk_init, .fini = vmdk_fini,
    .hole = vmdk_glue_hole,
    .received = vmdk_received,
    .drain = vmdk_drain,
    .size = vmdk_size,                /* no synthesizer for a stat */
};

IMAGEVIEW_DEFINE(fs_vmdk_view, vmdk_format, ".vmdk");
