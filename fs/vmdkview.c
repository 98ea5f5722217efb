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
 * Reading: at open, the allocation of the disk (from the zero maps) is
 * frozen into a synthesizer that produces a streamOptimized VMDK of
 * stored deflate blocks (size known at open; see docs/vmdk-format.md);
 * grain data is read through the pool.  Handles that see the same disk
 * state share one, and at most SYNTHCACHE_MAX distinct ones live
 * (fs/synthcache.h).
 *
 * THREAD MODEL
 * view->lock serializes everything about the ingest (the decoder is not
 * thread-safe and its input must stay in order).  It is held across
 * pool_write() (which may wait for a buffer: the writer is throttled, as
 * on the raw file) but never across fuse_reply_*().  The kernel sends a
 * writer's requests in order because async direct I/O is off (fs/ops.c).
 * view->read_lock serializes reads of synthesizers (each caches a grain,
 * and handles share them); it is taken without view->lock held.  Inflater threads take jobs from
 * view->q under q.lock (a leaf: held only to move jobs and counters, never
 * across inflate or pool_write()).  The writing FUSE thread, holding
 * view->lock, runs queued jobs itself when the queue is full or must
 * drain, then waits on q.cond for the jobs inflaters still run.
 * Inflaters never take view->lock, so that wait cannot deadlock.  The
 * disk is changed through fs/rawfile.c, whose size lock is taken after
 * view->lock and only around one placement, never across a wait for
 * the queue.
 */
#include "fs/view.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/iszero.h"
#include "common/log.h"
#include "fs/foreign.h"
#include "fs/rawfile.h"
#include "fs/synthcache.h"
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

struct vmdkview {
    pthread_mutex_t lock;
    pthread_mutex_t read_lock;
    struct vmdk_stream *stream;   /* the ingest in progress, or NULL */
    struct fs_fh *writer;         /* the handle that owns it */
    pid_t writer_pid;             /* the process that opened it */
    int err;                      /* its sticky error (positive errno) */
    bool logged;                  /* the sink already logged the error */
    uint64_t file_size;           /* high-water mark of the VMDK written */
    uint32_t cid;                 /* of the synthesized VMDK, per mount */
    struct fs *fs;
    struct inflaters q;
    struct vmdk_inflater *z;      /* the writer's own, under lock */
    uint8_t *zout;                /* its output, a maximal grain */
    struct synthcache *synths;    /* the read side's, shared */
};

static const struct vmdk_sink sink;
static const struct synthcache_ops synth_ops;

static struct vmdkview *vmdk_of(struct fs *fs)
{
    return fs->view_state[FS_INO_VMDK];
}

static const char *vmdk_name(struct fs *fs)
{
    return fs->view_name[FS_INO_VMDK];
}

/* ---- inflater threads ------------------------------------------------ */

static int place(struct fs *fs, uint64_t off, const void *buf, size_t len);
static void vmdkview_fini(struct fs *fs);

static void run_job(struct vmdkview *v, struct job *j,
                    struct vmdk_inflater *z, uint8_t *out)
{
    struct vmdk_err e = { "" };
    int64_t n = vmdk_grain_inflate(z, &j->g, out, &e);
    int r = n < 0 ? (int) n : place(v->fs, j->g.disk_off, out, (size_t) n);

    free(j->data);
    pthread_mutex_lock(&v->q.lock);
    if (r < 0 && !v->q.err) {
        v->q.err = r;
        log_err("%s: %s", vmdk_name(v->fs),
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
    struct fs *fs = opaque;
    struct vmdkview *v = vmdk_of(fs);
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
        v->logged = true;             /* the inflater said it */
    }
    return r;
}

static int vmdkview_init(struct fs *fs)
{
    struct vmdkview *v = calloc(1, sizeof *v);
    struct timespec ts;

    if (!v)
        return -ENOMEM;
    pthread_mutex_init(&v->lock, NULL);
    pthread_mutex_init(&v->read_lock, NULL);
    pthread_mutex_init(&v->q.lock, NULL);
    pthread_cond_init(&v->q.cond, NULL);
    v->fs = fs;
    /* A per-mount content id: re-reads of the view agree within a mount. */
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed = ((uint64_t) ts.tv_sec * 1000000007u) ^
                    (uint64_t) ts.tv_nsec ^ fs->export_size;
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v->cid = (uint32_t) (seed >> 32);
    if (v->cid == 0xffffffffu)
        v->cid = 1;                   /* "no parent" in a descriptor */
    fs->view_state[FS_INO_VMDK] = v;
    int r = synthcache_new(&synth_ops, vmdk_name(fs), &v->synths);
    if (r < 0) {
        vmdkview_fini(fs);
        return r;
    }
    r = start_inflaters(v);
    if (r < 0) {
        log_err("%s: cannot start inflater threads: %s", vmdk_name(fs),
                strerror(-r));
        vmdkview_fini(fs);
        return r;
    }
    return 0;
}

static void vmdkview_fini(struct fs *fs)
{
    struct vmdkview *v = vmdk_of(fs);

    if (!v)
        return;
    stop_inflaters(v);                /* nothing is queued between requests */
    vmdk_inflater_free(v->z);
    free(v->zout);
    vmdk_stream_free(v->stream);
    synthcache_free(v->synths);
    pthread_mutex_destroy(&v->lock);
    pthread_mutex_destroy(&v->read_lock);
    pthread_mutex_destroy(&v->q.lock);
    pthread_cond_destroy(&v->q.cond);
    free(v);
    fs->view_state[FS_INO_VMDK] = NULL;
}

/* ---- the synthesized (read) side -------------------------------------- */

/* Freeze the disk's allocation into a synthesizer: the disk up to the raw
 * file's apparent size, as the raw file shows it. */
static int build_synth(struct fs *fs, struct vmdk_synth **out)
{
    struct vmdk_err e = { "" };
    struct vmdk_synth *s;
    uint64_t size = rawfile_size(fs), pos = 0;

    int r = vmdk_synth_new(size, vmdk_of(fs)->cid, vmdk_name(fs), &s, &e);
    if (r < 0) {
        log_notice("%s: %s", vmdk_name(fs), e.msg);
        return r;
    }
    while (pos < size && r == 0) {
        int64_t d = pool_seek(fs->pool, pos, SEEK_DATA, size);
        if (d < 0)
            break;                            /* -ENXIO: no more data */
        int64_t h = pool_seek(fs->pool, (uint64_t) d, SEEK_HOLE, size);
        if (h <= d)
            h = (int64_t) size;
        r = vmdk_synth_allocate(s, (uint64_t) d, (uint64_t) (h - d));
        pos = (uint64_t) h;
    }
    if (r == 0)
        r = vmdk_synth_seal(s);
    if (r < 0) {
        vmdk_synth_free(s);
        return r;
    }
    *out = s;
    return 0;
}

static int synth_build(struct fs *fs, void **out)
{
    return build_synth(fs, (struct vmdk_synth **) out);
}

static void synth_free(void *synth)
{
    vmdk_synth_free(synth);
}

static const struct synthcache_ops synth_ops = { .build = synth_build,
                                                 .free = synth_free };

/* The synthesized file's size from the zero maps, counting grains and
 * tables without a synthesizer (getattr is frequent; a synthesizer holds
 * 4 bytes per allocated grain). */
static uint64_t synth_size(struct fs *fs)
{
    const uint64_t G = VMDK_SYNTH_GRAIN_SECTORS * VMDK_SECTOR;
    uint64_t size = rawfile_size(fs), pos = 0, grains = 0, tables = 0;
    uint64_t last_g = UINT64_MAX, last_t = UINT64_MAX;

    if (vmdk_synth_size(size, 0, 0) == 0)
        return 0;                     /* past the limit: open says why */
    while (pos < size) {
        int64_t d = pool_seek(fs->pool, pos, SEEK_DATA, size);
        if (d < 0)
            break;
        int64_t h = pool_seek(fs->pool, (uint64_t) d, SEEK_HOLE, size);
        if (h <= d)
            h = (int64_t) size;
        /* Grains [first, last] and their tables, less the ones the
         * previous extent already counted. */
        uint64_t first = (uint64_t) d / G, last = ((uint64_t) h - 1) / G;
        uint64_t per = VMDK_SYNTH_TABLE_BYTES / G;
        if (first == last_g)
            first++;
        if (first <= last) {
            grains += last - first + 1;
            uint64_t tfirst = first / per, tlast = last / per;
            tables += tlast - tfirst + 1 - (tfirst == last_t);
            last_g = last;
            last_t = tlast;
        }
        pos = (uint64_t) h;
    }
    return vmdk_synth_size(size, grains, tables);
}

static uint64_t vmdkview_size(struct fs *fs)
{
    struct vmdkview *v = vmdk_of(fs);

    pthread_mutex_lock(&v->lock);
    bool ingesting = v->stream != NULL;
    uint64_t written = v->file_size;
    pthread_mutex_unlock(&v->lock);
    return ingesting ? written : synth_size(fs);
}

static int read_disk(void *opaque, uint64_t off, void *buf, size_t len)
{
    struct fs *fs = opaque;
    return pool_read(fs->pool, off, buf, len);
}

static ssize_t vmdkview_read(struct fs *fs, struct fs_fh *fh, char *buf,
                             size_t size, uint64_t off)
{
    struct vmdkview *v = vmdk_of(fs);

    if (!fh->view_data)
        return -EBADF;
    pthread_mutex_lock(&v->read_lock);
    int64_t n = vmdk_synth_read(fh->view_data, off, buf, size, read_disk, fs);
    pthread_mutex_unlock(&v->read_lock);
    return (ssize_t) n;
}

/* ---- the ingest (write) side ------------------------------------------ */

static int sink_begin(void *opaque, enum vmdk_kind kind, uint64_t capacity)
{
    struct fs *fs = opaque;

    /* A capacity is whole sectors: an export whose size is not a multiple
     * of 512 takes a VMDK of itself back (place() checks the tail). */
    if (capacity > fs->export_size &&
        capacity - fs->export_size >= VMDK_SECTOR) {
        log_err("%s: the VMDK's disk is %" PRIu64 " bytes, larger than the "
                "export (%" PRIu64 "): nothing written", vmdk_name(fs),
                capacity, fs->export_size);
        vmdk_of(fs)->logged = true;
        return -ENOSPC;
    }
    if (capacity > fs->export_size)
        capacity = fs->export_size;
    log_info("%s: receiving a %s VMDK, disk size %" PRIu64, vmdk_name(fs),
             kind == VMDK_STREAM_OPTIMIZED ? "streamOptimized"
                                           : "monolithicSparse", capacity);
    /* Under view->lock (inside a feed): from here on the copy is this one
     * (its writer's input file the total). */
    struct vmdkview *v = vmdk_of(fs);
    rawfile_view_begin(fs, v->writer, v->writer_pid, "the VMDK view");
    /* The VMDK's disk replaces the export's content. */
    return rawfile_replace(fs, capacity);
}

/* Decoded bytes to the disk; any thread.  All-zero runs are skipped. */
static int place(struct fs *fs, uint64_t off, const void *buf, size_t len)
{
    if (off + len > fs->export_size) {
        /* The last sector's bytes past an export that ends mid-sector
         * (begin() allowed that): they must be zero. */
        size_t keep = off < fs->export_size ? (size_t) (fs->export_size - off)
                                            : 0;
        if (!is_zero((const char *) buf + keep, len - keep))
            return -ENOSPC;
        len = keep;
    }
    if (is_zero(buf, len))           /* reads as zero since begin() */
        return 0;
    return rawfile_place(fs, off, buf, len);
}

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    return place(opaque, off, buf, len);
}

static const struct vmdk_sink sink = {
    .begin = sink_begin,
    .data = sink_data,
    .grain = sink_grain,
};

/* Log the decoder's error once and latch it; a refusal names the view
 * or command for what was written instead. */
static int fail_locked(struct fs *fs, struct vmdkview *v, int r)
{
    char advice[256];

    if (!v->err) {
        v->err = -r;
        if (v->logged)                        /* the sink said it */
            return r;
        const char *a = r != -EMEDIUMTYPE ? NULL
                        : foreign_advice(fs, vmdk_stream_first_kind(v->stream),
                                         FS_INO_VMDK, advice, sizeof advice);
        log_err("%s: %s%s%s", vmdk_name(fs),
                vmdk_stream_error(v->stream)[0] ? vmdk_stream_error(v->stream)
                                                : strerror(-r),
                a ? ": " : "", a ? a : "");
    }
    return -v->err;
}

static int vmdkview_open(struct fs *fs, struct fs_fh *fh, int flags,
                         pid_t pid)
{
    struct vmdkview *v = vmdk_of(fs);
    bool writing = (flags & O_ACCMODE) != O_RDONLY;

    if (!writing) {
        int err;
        fh->view_data = synthcache_get(v->synths, fs, false, &err);
        return fh->view_data ? 0 : err;
    }
    pthread_mutex_lock(&v->lock);
    if (v->stream && v->writer) {
        pthread_mutex_unlock(&v->lock);
        log_notice("%s: a VMDK is already being written", vmdk_name(fs));
        return -EBUSY;
    }
    vmdk_stream_free(v->stream);
    v->stream = NULL;
    drain_inflaters(v, true);
    int r = vmdk_stream_new(&sink, fs, &v->stream);
    if (r == 0) {
        v->writer = fh;
        v->writer_pid = pid;
        v->err = 0;
        v->logged = false;
        v->file_size = 0;
    }
    pthread_mutex_unlock(&v->lock);
    return r;
}

/* End of a write request: its grains are placed before it is answered.
 * An inflater's error fails this request and latches for the ingest. */
static int settle_locked(struct vmdkview *v, int r)
{
    int qerr = drain_inflaters(v, false);
    if (qerr && !v->err) {
        v->err = -qerr;
        v->logged = true;             /* the inflater said it */
    }
    return r < 0 ? r : v->err ? -v->err : r;
}

static ssize_t vmdkview_write(struct fs *fs, struct fs_fh *fh, const char *buf,
                              size_t size, uint64_t off)
{
    struct vmdkview *v = vmdk_of(fs);
    int r;

    pthread_mutex_lock(&v->lock);
    if (v->writer != fh || !v->stream)
        r = -EBADF;
    else if (v->err)
        r = -v->err;
    else if ((r = vmdk_stream_feed(v->stream, off, buf, size)) < 0)
        r = fail_locked(fs, v, r);
    else if (off + size > v->file_size)
        v->file_size = off + size;
    if (v->writer == fh && v->stream)
        r = settle_locked(v, r);
    pthread_mutex_unlock(&v->lock);
    if (r >= 0)
        rawfile_view_wrote(fs, fh, off, size);
    return r < 0 ? r : (ssize_t) size;
}

/* Punch-hole, zero-range and truncate-extend on the VMDK file: zeros of
 * the file.  A truncate that shrinks cannot be decoded. */
static int vmdkview_hole(struct fs *fs, struct fs_fh *fh, uint64_t off,
                         uint64_t len)
{
    struct vmdkview *v = vmdk_of(fs);
    int r;

    pthread_mutex_lock(&v->lock);
    struct fs_fh *writer = v->writer;
    if (!v->stream || (fh && v->writer != fh))
        r = -EBADF;
    else if (v->err)
        r = -v->err;
    else if ((r = vmdk_stream_hole(v->stream, off, len)) < 0)
        r = fail_locked(fs, v, r);
    else if (off + len > v->file_size)
        v->file_size = off + len;
    if (v->stream)
        r = settle_locked(v, r);
    pthread_mutex_unlock(&v->lock);
    if (r >= 0)
        rawfile_view_zeroed(fs, writer, off, len);
    return r;
}

static int vmdkview_truncate(struct fs *fs, struct fs_fh *fh,
                             uint64_t size)
{
    struct vmdkview *v = vmdk_of(fs);

    pthread_mutex_lock(&v->lock);
    bool active = v->stream != NULL;
    uint64_t cur = v->file_size;
    pthread_mutex_unlock(&v->lock);
    if (!active)
        return size == 0 ? 0 : -EINVAL;   /* O_TRUNC-style: nothing yet */
    if (size < cur) {
        log_err("%s: cannot shrink a VMDK being written (%" PRIu64 " < %"
                PRIu64 ")", vmdk_name(fs), size, cur);
        return -EINVAL;
    }
    return size > cur ? vmdkview_hole(fs, NULL, cur, size - cur) : 0;
}

/* close(): finish the stream.  Returns the decoder's error. */
static int vmdkview_flush(struct fs *fs, struct fs_fh *fh)
{
    struct vmdkview *v = vmdk_of(fs);
    int r = 0;

    pthread_mutex_lock(&v->lock);
    if (v->writer == fh && v->stream && !v->err &&
        vmdk_stream_position(v->stream) == 0) {
        /* Nothing written yet: a close of a duplicate (dd does
         * dup2(fd, 1); close(fd) before writing).  Keep the ingest. */
    } else if (v->writer == fh && v->stream) {
        int qerr = drain_inflaters(v, true);   /* logged by the inflater */
        if (v->err)
            r = -v->err;
        else if (qerr)
            r = qerr;
        else if ((r = vmdk_stream_finish(v->stream)) < 0)
            r = fail_locked(fs, v, r);
        else {
            struct vmdk_stream_stats st;
            vmdk_stream_stats(v->stream, &st);
            log_info("%s: VMDK received, %" PRIu64 " bytes, %" PRIu64
                     " grains", vmdk_name(fs), v->file_size, st.grains);
            rawfile_view_close(fs, v->file_size);
        }
        vmdk_stream_free(v->stream);
        v->stream = NULL;
        v->writer = NULL;
    }
    pthread_mutex_unlock(&v->lock);
    return r;
}

static void vmdkview_release(struct fs *fs, struct fs_fh *fh)
{
    struct vmdkview *v = vmdk_of(fs);

    pthread_mutex_lock(&v->lock);
    if (v->writer == fh) {
        /* Closed without a flush reaching us (cannot normally happen). */
        drain_inflaters(v, true);
        vmdk_stream_free(v->stream);
        v->stream = NULL;
        v->writer = NULL;
    }
    pthread_mutex_unlock(&v->lock);
    synthcache_put(v->synths, fh->view_data);
    fh->view_data = NULL;
}

/* ---- the view ---------------------------------------------------------- */

static void vmdk_attr(struct fs *fs, struct stat *st)
{
    st->st_mode = S_IFREG | (fs->readonly ? 0400 : 0600);
    st->st_nlink = 1;
    st->st_size = (off_t) vmdkview_size(fs);
    st->st_blocks = (st->st_size + 511) / 512;
}

static ssize_t vmdk_write(struct fs *fs, struct fs_fh *fh, const char *buf,
                          size_t size, off_t off)
{
    return off < 0 ? -EINVAL
                   : vmdkview_write(fs, fh, buf, size, (uint64_t) off);
}

/* cp --sparse=always punches the holes it skipped: zeros of the VMDK
 * file. */
static int vmdk_fallocate(struct fs *fs, struct fs_fh *fh, int mode,
                          off_t off, off_t len)
{
    if (off < 0 || len <= 0 || (mode & ~FALLOC_FL_KEEP_SIZE) == 0)
        return -EINVAL;
    return vmdkview_hole(fs, fh, (uint64_t) off, (uint64_t) len);
}

/* close(2): the decoder's error first, else the first write error. */
static int vmdk_flush(struct fs *fs, struct fs_fh *fh, bool wrote)
{
    int r = vmdkview_flush(fs, fh);
    int err = rawfile_drain(fs, fh, wrote);
    return r < 0 ? r : err;
}

const struct fs_view fs_vmdk_view = {
    .suffix = ".vmdk",
    .writable = true,
    .init = vmdkview_init,
    .fini = vmdkview_fini,
    .attr = vmdk_attr,
    .open = vmdkview_open,
    .pread = vmdkview_read,
    .write = vmdk_write,
    .fallocate = vmdk_fallocate,
    .truncate = vmdkview_truncate,
    .flush = vmdk_flush,
    .fsync = rawfile_fsync,
    .release = vmdkview_release,
};
