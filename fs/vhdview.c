/* fs/vhdview.c: FILENAME.vhd, the disk seen as a VHD.
 *
 * Writing: a copy tool writes a VHD file in file order (cp, dd, cat).  Each
 * write feeds vhd/'s forward-only stream decoder, whose sink places the
 * decoded bytes on the disk through the pool.  Opening with O_TRUNC does
 * not touch the disk: the decoder's begin() says what arrives, and only
 * then a fixed or dynamic VHD replaces the disk (lazy zeroing, so blocks
 * the VHD does not carry read as zero at the cost of write-zeroes only
 * where the disk is not known zero), while a differencing VHD is applied
 * over what the disk holds.  close() finishes the stream: a VHD that
 * ended early or whose footer is wrong fails there with EINVAL.
 *
 * Reading: the allocation of the disk (from the zero maps: block status
 * and everything written since) is frozen into a synthesizer that
 * produces a dynamic VHD; block data is read through the pool.  One
 * synthesizer serves every open and stat of one disk state, and at most
 * SYNTHCACHE_MAX distinct ones live (fs/synthcache.h), so memory does not
 * grow with the number of readers nor with changes between opens.
 * Handles keep the one they opened (a consistent file) until they close.
 *
 * Refusal: the decoder is told the export's size and whether fixed VHDs
 * are taken (--vhd-fixed), so that anything that does not begin like a
 * dynamic or differencing VHD, or describes a disk larger than the
 * export, is refused at the write that completes the first sector,
 * before the disk is touched.
 *
 * THREAD MODEL
 * view->lock serializes everything about the ingest (the decoder is not
 * thread-safe, and its input must stay in order).  It is held across
 * pool_write() (which may wait for a buffer: the writer is throttled, as
 * on the raw file) but never across fuse_reply_*().  The synthesizers
 * have their own lock (fs/synthcache.c), never taken with view->lock
 * held nor the other way round.  The disk is changed through
 * fs/rawfile.c, whose size lock is taken after view->lock (the decoder's
 * sink runs under it), never the other way round.  The kernel sends a
 * writer's requests in order because async direct I/O is off (fs/ops.c).
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

#include "common/log.h"
#include "common/uuid.h"
#include "fs/foreign.h"
#include "fs/rawfile.h"
#include "fs/readahead.h"
#include "fs/synthcache.h"
#include "vhd/vhd.h"

struct vhdview {
    struct synthcache *synths;    /* the read side's, shared */

    pthread_mutex_t lock;
    struct vhd_stream *stream;    /* the ingest in progress, or NULL */
    struct fs_fh *writer;         /* the handle that owns it */
    pid_t writer_pid;             /* the process that opened it */
    int err;                      /* its sticky error (positive errno) */
    bool logged;                  /* the sink already logged the error */
    uint64_t file_size;           /* high-water mark of the VHD written */
    uint8_t uuid[16];             /* of the synthesized VHD, per mount */
    uint32_t timestamp;
};

static struct vhd_sink sink;
static const struct synthcache_ops synth_ops;

static struct vhdview *vhd_of(struct fs *fs)
{
    return fs->view_state[FS_INO_VHD];
}

static int vhdview_init(struct fs *fs)
{
    struct vhdview *v = calloc(1, sizeof *v);

    if (!v)
        return -ENOMEM;
    int r = synthcache_new(&synth_ops, fs->view_name[FS_INO_VHD],
                           &v->synths);
    if (r < 0) {
        free(v);
        return r;
    }
    pthread_mutex_init(&v->lock, NULL);
    /* A per-mount identity: re-reads of the view agree within a mount. */
    uuid_v4(v->uuid);
    v->timestamp = (uint32_t) (time(NULL) - VHD_EPOCH_UNIX);
    fs->view_state[FS_INO_VHD] = v;
    return 0;
}

static void vhdview_fini(struct fs *fs)
{
    struct vhdview *v = vhd_of(fs);

    if (!v)
        return;
    vhd_stream_free(v->stream);
    synthcache_free(v->synths);
    pthread_mutex_destroy(&v->lock);
    free(v);
    fs->view_state[FS_INO_VHD] = NULL;
}

/* ---- the synthesized (read) side -------------------------------------- */

/* Freeze the disk's allocation into a synthesizer: the disk up to the raw
 * file's apparent size (what `cp src.img MNT/nbd` made it), as the raw
 * file shows it.  -EFBIG past the VHD size limit; -EINVAL for size 0. */
static int build_synth(struct fs *fs, struct vhd_synth **out)
{
    struct vhd_err e = { "" };
    struct vhd_synth *s;
    uint64_t size = rawfile_size(fs), pos = 0;

    struct vhdview *v = vhd_of(fs);
    int r = vhd_synth_new(size, v->uuid, v->timestamp, &s, &e);
    if (r < 0) {
        log_notice("%s.vhd: %s", fs->filename, e.msg);
        return r;
    }
    while (pos < size) {
        int64_t d = pool_seek(fs->pool, pos, SEEK_DATA, size);
        if (d < 0)
            break;                            /* -ENXIO: no more data */
        int64_t h = pool_seek(fs->pool, (uint64_t) d, SEEK_HOLE, size);
        if (h <= d)
            h = (int64_t) size;
        vhd_synth_allocate(s, (uint64_t) d, (uint64_t) (h - d));
        pos = (uint64_t) h;
    }
    if ((r = vhd_synth_seal(s)) < 0) {       /* -ENOMEM */
        vhd_synth_free(s);
        return r;
    }
    *out = s;
    return 0;
}

static int synth_build(struct fs *fs, void **out)
{
    return build_synth(fs, (struct vhd_synth **) out);
}

static void synth_free(void *synth)
{
    vhd_synth_free(synth);
}

static const struct synthcache_ops synth_ops = { .build = synth_build,
                                                 .free = synth_free };

static uint64_t vhdview_size(struct fs *fs)
{
    struct vhdview *v = vhd_of(fs);
    int err;

    pthread_mutex_lock(&v->lock);
    bool ingesting = v->stream != NULL;
    uint64_t written = v->file_size;
    pthread_mutex_unlock(&v->lock);
    if (ingesting)
        return written;
    /* At the cap, the newest synthesizer's size (an open says why). */
    struct vhd_synth *s = synthcache_get(v->synths, fs, true, &err);
    if (!s)
        return 0;
    uint64_t n = vhd_synth_file_size(s);
    synthcache_put(v->synths, s);
    return n;
}

/* Block data comes through the handle's read-ahead stream: a reader
 * copying the VHD out reads the disk's allocated blocks in disk order. */
struct disk_reader {
    struct fs *fs;
    struct fs_fh *fh;
};

static int read_disk(void *opaque, uint64_t off, void *buf, size_t len)
{
    struct disk_reader *d = opaque;
    return ra_read(d->fs->ra, d->fh->ra, off, buf, len, d->fs->export_size);
}

static ssize_t vhdview_read(struct fs *fs, struct fs_fh *fh, char *buf,
                            size_t size, uint64_t off)
{
    if (!fh->view_data)
        return -EBADF;
    struct disk_reader d = { .fs = fs, .fh = fh };
    int64_t n = vhd_synth_read(fh->view_data, off, buf, size, read_disk, &d);
    return (ssize_t) n;
}

/* ---- the ingest (write) side ------------------------------------------ */

static int sink_begin(void *opaque, enum vhd_kind kind, uint64_t size)
{
    struct fs *fs = opaque;
    static const char *names[] = { [VHD_FIXED] = "fixed",
                                   [VHD_DYNAMIC] = "dynamic",
                                   [VHD_DIFF] = "differencing" };

    if (size > fs->export_size) {
        log_err("%s.vhd: the VHD's disk is %" PRIu64 " bytes, larger than "
                "the export (%" PRIu64 "): nothing written", fs->filename,
                size, fs->export_size);
        vhd_of(fs)->logged = true;
        return -ENOSPC;
    }
    log_info("%s.vhd: receiving a %s VHD, disk size %" PRIu64, fs->filename,
             names[kind], size);
    /* Under view->lock (we are inside a feed): the stream is ours.  From
     * here on the copy is this one (its writer's input file the total). */
    struct vhdview *v = vhd_of(fs);
    rawfile_view_begin(fs, v->writer, v->writer_pid, "the VHD view");
    rawfile_view_length(fs, vhd_stream_expected_length(v->stream));
    if (kind == VHD_DIFF)
        return 0;                             /* applied over the parent */
    /* Fixed or dynamic: the VHD's disk replaces the export's content. */
    return rawfile_replace(fs, size);
}

/* A fixed VHD's size is known only at its end: its data can run past
 * the export.  (Dynamic ones were checked at begin.) */
static int past_export(struct fs *fs, uint64_t off, uint64_t len)
{
    if (off <= fs->export_size && len <= fs->export_size - off)
        return 0;
    log_err("%s.vhd: the VHD's disk is larger than the export (%" PRIu64
            " bytes): data at offset %" PRIu64 " does not fit", fs->filename,
            fs->export_size, off);
    vhd_of(fs)->logged = true;
    return -ENOSPC;
}

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    struct fs *fs = opaque;

    if (past_export(fs, off, len) < 0)
        return -ENOSPC;
    return rawfile_place(fs, off, buf, len);
}

static int sink_zero(void *opaque, uint64_t off, uint64_t len)
{
    struct fs *fs = opaque;

    if (past_export(fs, off, len) < 0)
        return -ENOSPC;
    return rawfile_place_zero(fs, off, len);  /* < 0: fails the write */
}

static struct vhd_sink sink = {
    .begin = sink_begin,
    .data = sink_data,
    .zero = sink_zero,
};

/* For a refusal: the view or command for what was written instead, or,
 * when it is no known format, how a fixed VHD gets in. */
static const char *refusal_hint(struct fs *fs, struct vhdview *v, int r,
                                char *buf, size_t n)
{
    if (r != -EMEDIUMTYPE)
        return "";
    const char *advice = foreign_advice(fs, vhd_stream_first_kind(v->stream),
                                        FS_INO_VHD, buf + 2, n - 2);
    if (!advice)
        return fs->vhd_fixed ? "" : " (a fixed VHD needs the mount option "
                                    "--vhd-fixed, -o vhd_fixed)";
    buf[0] = ':';
    buf[1] = ' ';
    return buf;
}

/* Log the decoder's error once and latch it. */
static int fail_locked(struct fs *fs, struct vhdview *v, int r)
{
    char hint[256];

    if (!v->err) {
        v->err = -r;
        if (v->logged)                        /* the sink said it */
            return r;
        log_err("%s: %s%s", fs->view_name[FS_INO_VHD],
                vhd_stream_error(v->stream)[0] ? vhd_stream_error(v->stream)
                                               : strerror(-r),
                refusal_hint(fs, v, r, hint, sizeof hint));
    }
    return -v->err;
}

static int vhdview_open(struct fs *fs, struct fs_fh *fh, int flags,
                        pid_t pid)
{
    struct vhdview *v = vhd_of(fs);
    bool writing = (flags & O_ACCMODE) != O_RDONLY;

    if (!writing) {
        int err;
        fh->view_data = synthcache_get(v->synths, fs, false, &err);
        if (fh->view_data)
            fh->ra = ra_stream_open(fs->ra);  /* NULL: reads on demand */
        return fh->view_data ? 0 : err;
    }
    pthread_mutex_lock(&v->lock);
    if (v->stream && v->writer) {
        pthread_mutex_unlock(&v->lock);
        log_notice("%s.vhd: a VHD is already being written", fs->filename);
        return -EBUSY;
    }
    vhd_stream_free(v->stream);
    v->stream = NULL;
    int r = vhd_stream_new(&sink, fs, &v->stream);
    if (r == 0)
        vhd_stream_limit(v->stream, fs->export_size, fs->vhd_fixed);
    if (r == 0) {
        v->writer = fh;
        v->writer_pid = pid;
        v->err = 0;
        v->logged = false;
        v->file_size = 0;
    }
    pthread_mutex_unlock(&v->lock);
    if (r == 0)
        fh->ra = ra_stream_open(fs->ra);
    return r;
}

static ssize_t vhdview_write(struct fs *fs, struct fs_fh *fh, const char *buf,
                             size_t size, uint64_t off)
{
    struct vhdview *v = vhd_of(fs);
    int r;

    pthread_mutex_lock(&v->lock);
    if (v->writer != fh || !v->stream)
        r = -EBADF;
    else if (v->err)
        r = -v->err;
    else if ((r = vhd_stream_feed(v->stream, off, buf, size)) < 0)
        r = fail_locked(fs, v, r);
    else if (off + size > v->file_size)
        v->file_size = off + size;
    pthread_mutex_unlock(&v->lock);
    if (r >= 0)
        rawfile_view_wrote(fs, fh, off, size);
    return r < 0 ? r : (ssize_t) size;
}

/* Punch-hole, zero-range and truncate-extend on the VHD file: zeros of the
 * VHD file.  A truncate that shrinks cannot be decoded. */
static int vhdview_hole(struct fs *fs, struct fs_fh *fh, uint64_t off,
                        uint64_t len)
{
    struct vhdview *v = vhd_of(fs);
    int r;

    pthread_mutex_lock(&v->lock);
    struct fs_fh *writer = v->writer;
    if (!v->stream || (fh && v->writer != fh))
        r = -EBADF;
    else if (v->err)
        r = -v->err;
    else if ((r = vhd_stream_hole(v->stream, off, len)) < 0)
        r = fail_locked(fs, v, r);
    else if (off + len > v->file_size)
        v->file_size = off + len;
    pthread_mutex_unlock(&v->lock);
    if (r >= 0)
        rawfile_view_zeroed(fs, writer, off, len);
    return r;
}

static int vhdview_truncate(struct fs *fs, struct fs_fh *fh,
                            uint64_t size)
{
    struct vhdview *v = vhd_of(fs);

    pthread_mutex_lock(&v->lock);
    bool active = v->stream != NULL;
    uint64_t cur = v->file_size;
    pthread_mutex_unlock(&v->lock);
    if (!active)
        return size == 0 ? 0 : -EINVAL;   /* O_TRUNC-style: nothing yet */
    if (size < cur) {
        log_err("%s.vhd: cannot shrink a VHD being written (%" PRIu64
                " < %" PRIu64 ")", fs->filename, size, cur);
        return -EINVAL;
    }
    return size > cur ? vhdview_hole(fs, NULL, cur, size - cur) : 0;
}

/* close(): finish the stream and wait for what it wrote.  Returns the
 * decoder's error, or the first write error. */
static int vhdview_flush(struct fs *fs, struct fs_fh *fh)
{
    struct vhdview *v = vhd_of(fs);
    int r = 0;

    pthread_mutex_lock(&v->lock);
    if (v->writer == fh && v->stream && !v->err &&
        vhd_stream_position(v->stream) == 0 &&
        vhd_stream_kind(v->stream) == 0) {
        /* Nothing written yet: a close of a duplicate (dd does
         * dup2(fd, 1); close(fd) before writing).  Keep the ingest. */
    } else if (v->writer == fh && v->stream) {
        if (v->err)
            r = -v->err;
        else if ((r = vhd_stream_finish(v->stream)) < 0)
            r = fail_locked(fs, v, r);
        else {
            log_info("%s.vhd: VHD received, %" PRIu64 " bytes", fs->filename,
                     v->file_size);
            rawfile_view_close(fs, v->file_size);
        }
        vhd_stream_free(v->stream);
        v->stream = NULL;
        v->writer = NULL;
    }
    pthread_mutex_unlock(&v->lock);
    return r;
}

static void vhdview_release(struct fs *fs, struct fs_fh *fh)
{
    struct vhdview *v = vhd_of(fs);

    pthread_mutex_lock(&v->lock);
    if (v->writer == fh) {
        /* Closed without a flush reaching us (cannot normally happen). */
        vhd_stream_free(v->stream);
        v->stream = NULL;
        v->writer = NULL;
    }
    pthread_mutex_unlock(&v->lock);
    synthcache_put(v->synths, fh->view_data);
    fh->view_data = NULL;
    ra_stream_close(fh->ra);
    fh->ra = NULL;
}

/* ---- the view ---------------------------------------------------------- */

static void vhd_attr(struct fs *fs, struct stat *st)
{
    st->st_mode = S_IFREG | (fs->readonly ? 0400 : 0600);
    st->st_nlink = 1;
    st->st_size = (off_t) vhdview_size(fs);
    st->st_blocks = (st->st_size + 511) / 512;
}

static ssize_t vhd_write(struct fs *fs, struct fs_fh *fh, const char *buf,
                         size_t size, off_t off)
{
    return off < 0 ? -EINVAL
                   : vhdview_write(fs, fh, buf, size, (uint64_t) off);
}

/* cp --sparse=always punches the holes it skipped: zeros of the VHD file. */
static int vhd_fallocate(struct fs *fs, struct fs_fh *fh, int mode, off_t off,
                         off_t len)
{
    if (off < 0 || len <= 0 || (mode & ~FALLOC_FL_KEEP_SIZE) == 0)
        return -EINVAL;
    return vhdview_hole(fs, fh, (uint64_t) off, (uint64_t) len);
}

/* close(2): the decoder's error first, else the first write error. */
static int vhd_flush(struct fs *fs, struct fs_fh *fh, bool wrote)
{
    int r = vhdview_flush(fs, fh);
    int err = rawfile_drain(fs, fh, wrote);
    return r < 0 ? r : err;
}

const struct fs_view fs_vhd_view = {
    .suffix = ".vhd",
    .writable = true,
    .init = vhdview_init,
    .fini = vhdview_fini,
    .attr = vhd_attr,
    .open = vhdview_open,
    .pread = vhdview_read,
    .write = vhd_write,
    .fallocate = vhd_fallocate,
    .truncate = vhdview_truncate,
    .flush = vhd_flush,
    .fsync = rawfile_fsync,
    .release = vhdview_release,
};
