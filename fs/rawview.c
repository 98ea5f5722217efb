/* fs/rawview.c: FILENAME, the export as a raw file (fs/view.h).  The file
 * semantics are the raw file's contract in docs/design/README.md; the size, the
 * time and every change live in fs/rawfile.c, which this view calls.
 *
 * THREAD MODEL: as fs/rawfile.c; reads reply from the read-ahead's chunks
 * (transport/readahead.c), whose references are dropped after the reply. */
#include "fs/view.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"
#include "fs/rawfile.h"
#include "transport/readahead.h"
#include "fs/readback.h"

static void raw_attr(struct fs_disk *d, struct stat *st)
{
    uint64_t size = rawfile_stat(d, st);

    st->st_mode = S_IFREG | (d->readonly ? 0400 : 0600);
    st->st_nlink = 1;
    st->st_size = (off_t) size;
    /* From the zero maps, so sparse-aware readers (cp --sparse=auto
     * wants st_blocks < st_size / 512) look for holes. */
    st->st_blocks = (blkcnt_t) ((pool_allocated(d->pool, size) + 511) / 512);
}

static int raw_open(struct fs_disk *d, struct fs_fh *fh, int flags, pid_t pid)
{
    bool writing = (flags & O_ACCMODE) != O_RDONLY;

    /* libfuse enables atomic O_TRUNC: the kernel sends no setattr.  The
     * writer's input file, if visible, is the progress's total. */
    if (writing) {
        int r = rawfile_open_writer(d, fh, pid, flags & O_TRUNC);
        if (r < 0)
            return r;
    }
    fh->ra = ra_stream_open(d->ra);    /* NULL: reads on demand */
    return 0;
}

/* The file's size; *size cut to what lies below it from off (0 past it). */
static uint64_t clip_read(struct fs_disk *d, uint64_t off, size_t *size)
{
    uint64_t end = rawfile_size(d);
    if (off >= end)
        *size = 0;
    else if (*size > end - off)
        *size = (size_t) (end - off);
    return end;
}

static void raw_read(fuse_req_t req, struct fs_disk *d, struct fs_fh *fh,
                     size_t size, off_t off)
{
    uint64_t end = off < 0 ? 0 : clip_read(d, (uint64_t) off, &size);
    if (off < 0 || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    /* Straight from the read-ahead's chunks when they hold the range. */
    struct ra_span span[RA_SPANS];
    unsigned n = 0;
    int r = ra_read_spans(d->ra, fh->ra, (uint64_t) off, size, end, span,
                          &n);
    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    /* fuse_reply_iov(): one writev() from the spans (fuse_reply_data()
     * would copy two of them into one buffer first). */
    struct iovec iov[RA_SPANS];
    for (unsigned i = 0; i < n; i++)
        iov[i] = (struct iovec) { .iov_base = (void *) span[i].mem,
                                  .iov_len = span[i].len };
    fuse_reply_iov(req, iov, (int) n);
    ra_put(d->ra, span, n);
}

int raw_read_ready(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                   size_t size, struct iovec *iov, unsigned *niov)
{
    uint64_t end = clip_read(d, off, &size);
    if (!fh->ra || size == 0)
        return 0;
    assert(d->ready_n == 0);
    unsigned n = 0;
    if (ra_try_spans(d->ra, fh->ra, off, size, end, d->ready_span,
                     &n) != 1)
        return 0;
    for (unsigned i = 0; i < n; i++)
        iov[i] = (struct iovec) { .iov_base = (void *) d->ready_span[i].mem,
                                  .iov_len = d->ready_span[i].len };
    d->ready_n = n;
    *niov = n;
    return 1;
}

void raw_read_ready_done(struct fs_disk *d)
{
    ra_put(d->ra, d->ready_span, d->ready_n);
    d->ready_n = 0;
}

static ssize_t raw_write(struct fs_disk *d, struct fs_fh *fh, const char *buf,
                         size_t size, off_t off)
{
    if (off < 0)
        return size ? -ENOSPC : 0;    /* as past the end */
    return rawfile_write(d, fh, (uint64_t) off, buf, size);
}

/* write_buf gets the payload where libfuse read it (memory; a pipe fd if
 * splicing were on) and fuse_buf_copy() moves it straight into the pool
 * buffers reserved for it: the only copy the daemon makes in user space.
 * The inline digest then hashes those pool buffers in place (holds)
 * instead of a copy of its own. */
static ssize_t raw_write_buf(struct fs_disk *d, struct fs_fh *fh,
                             struct fuse_bufvec *bufv, off_t off)
{
    if (off < 0)
        return fuse_buf_size(bufv) ? -ENOSPC : 0;
    return rawfile_write_bufv(d, fh, (uint64_t) off, bufv);
}

static int raw_fallocate(struct fs_disk *d, struct fs_fh *fh, int mode, off_t off,
                         off_t len)
{
    bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
    int kind = mode & ~FALLOC_FL_KEEP_SIZE;

    if (off < 0 || len <= 0)
        return -EINVAL;
    if (d->readonly)
        return -EROFS;
    int refused = fh ? __atomic_load_n(&fh->refused, __ATOMIC_RELAXED) : 0;
    if (refused)
        return -refused;
    if (kind != 0 && kind != FALLOC_FL_PUNCH_HOLE &&
        kind != FALLOC_FL_ZERO_RANGE)
        return -EOPNOTSUPP;
    uint64_t start = (uint64_t) off, end = start + (uint64_t) len;
    if (end < start || (!keep_size && end > d->export_size)) {
        log_err("fallocate of %jd bytes at offset %jd is past the end of "
                "the export (%" PRIu64 " bytes)", (intmax_t) len,
                (intmax_t) off, d->export_size);
        return -ENOSPC;
    }
    if (end > d->export_size)
        end = d->export_size;    /* keep-size: nothing exists past it */
    return rawfile_zero(d, start, end, kind != 0, keep_size);
}

static int raw_truncate(struct fs_disk *d, struct fs_fh *fh, uint64_t size)
{
    int refused = fh ? __atomic_load_n(&fh->refused, __ATOMIC_RELAXED) : 0;
    if (refused)
        return -refused;              /* said when refused */
    int r = rawfile_truncate(d, fh, size);
    fs_fh_mark_wrote(fh);
    /* A writer that sets the size first (qemu-img convert: the disk's
     * size) says where its copy ends (fs/ops.c, ends_copy()). */
    if (r == 0 && fh && size > 0 &&
        !__atomic_load_n(&fh->copy_end, __ATOMIC_RELAXED))
        __atomic_store_n(&fh->copy_end, size, __ATOMIC_RELAXED);
    return r;
}

int64_t raw_seek(struct fs_disk *d, struct fs_fh *fh, off_t off, int whence)
{
    if (whence != SEEK_DATA && whence != SEEK_HOLE)
        return -EINVAL;
    if (off < 0)
        return -ENXIO;
    return pool_seek(d->pool, (uint64_t) off, whence, rawfile_size(d));
}

/* close(2): every write is acknowledged before close returns, and the
 * first error since this handle last reported one is returned. */
static int raw_flush(struct fs_disk *d, struct fs_fh *fh, bool wrote)
{
    bool dropped;
    int z = rawfile_close_truncate(d, fh, &dropped);
    int r = rawfile_drain(d, fh, wrote);
    if (r == 0)
        r = z;
    /* The pass covers the file up to its size (cp's final ftruncate).  A
     * reader closing (sha256sum during a copy) ends nobody's pass, nor
     * does a writer that was refused (its source did not fit, an image
     * file) or whose truncate was dropped (the disk holds the last copy
     * still). */
    bool passed = fh->writer &&
                  !__atomic_load_n(&fh->refused, __ATOMIC_RELAXED) && !dropped;
    if (passed)
        rawfile_close_pass(d);
    if (passed && r == 0)
        r = readback_at_close(d);          /* --verify-readback */
    return r;
}

/* fsync(2): everything written is on stable storage, and, with
 * --verify-readback, read back and compared with the inline digest. */
static int raw_fsync(struct fs_disk *d, struct fs_fh *fh)
{
    int r = rawfile_fsync(d, fh);
    return r == 0 ? readback_at_close(d) : r;
}

static void raw_release(struct fs_disk *d, struct fs_fh *fh)
{
    rawfile_release_truncate(d, fh);
    ra_stream_close(fh->ra);
    fh->ra = NULL;
}

const struct fs_view fs_raw_view = {
    .suffix = "",
    .writable = true,
    .attr = raw_attr,
    .open = raw_open,
    .read = raw_read,
    .write = raw_write,
    .write_buf = raw_write_buf,
    .fallocate = raw_fallocate,
    .truncate = raw_truncate,
    .lseek = raw_seek,
    .flush = raw_flush,
    .fsync = raw_fsync,
    .release = raw_release,
};
