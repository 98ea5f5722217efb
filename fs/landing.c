/* fs/landing.c: the receive loop's landing (fs/fuseloop.h): raw-file
 * writes whose payload the loop reads straight into a pool buffer, and
 * raw-file reads it answers from arrived read-ahead chunks, and the
 * raw file's SEEK_DATA / SEEK_HOLE, without a worker.  What
 * op_write_buf(), op_read() and op_lseek() (fs/ops.c) would do, for those
 * requests only; anything else goes to libfuse.
 *
 * THREAD MODEL: every hook runs on the loop's receiving thread. */
#include "fs/view.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>

#include "common/log.h"
#include "fs/fuseloop.h"
#include "fs/rawfile.h"

/* The loop prepares one pool buffer before it reads a request: in the
 * pool of the disk the last raw-file write went to (fs->land_disk), the
 * likeliest next; fs->land_cur is the disk it was prepared in, until
 * end().  A write to another disk's raw file takes the usual path once,
 * and the next buffer is prepared in its pool.  All on the receiving
 * thread. */
static void *land_begin(void *opaque, size_t *room)
{
    struct fs *fs = opaque;

    fs->land_cur = fs->land_disk;
    return rawfile_land_begin(fs->land_cur, room);
}

/* The inode a request the loop serves itself is for (in file mode the
 * mountpoint is the raw file), and the trace line op_*() would print. */
static fuse_ino_t loop_ino(const struct fs *fs, uint64_t nodeid)
{
    return fs->cfg.file_mode && nodeid == FS_INO_ROOT ? FS_INO_RAW : nodeid;
}

static void loop_trace(const char *what, uint32_t pid, fuse_ino_t ino,
                       uint64_t off, uint32_t size)
{
    if (__builtin_expect(log_verbosity >= 1, 0))
        log_trace("pid %d: %s ino=%" PRIu64 " off=%jd len=%zu", (int) pid,
                  what, (uint64_t) ino, (intmax_t) off, (size_t) size);
}

/* Is the request for a disk's raw file? */
static bool loop_is_raw(struct fs *fs, uint64_t nodeid)
{
    fuse_ino_t ino = loop_ino(fs, nodeid);

    return fs_ino_slot(ino) == FS_INO_RAW && fs_disk_of(fs, ino);
}

/* The raw file's handle a request the loop may serve is for, or NULL. */
static struct fs_fh *loop_raw_fh(struct fs *fs, uint64_t nodeid,
                                 uint64_t fhv)
{
    return loop_is_raw(fs, nodeid) ? (struct fs_fh *) (uintptr_t) fhv : NULL;
}

/* What op_write_buf() does for the raw file, with the payload already in
 * its pool buffer.  Anything else: -EAGAIN, and libfuse gets the request
 * (the loop makes no reply, so nothing may have happened yet). */
static ssize_t land_write(void *opaque, uint64_t nodeid, uint64_t fhv,
                          uint64_t off, uint32_t size, uint32_t pid)
{
    struct fs *fs = opaque;
    struct fs_fh *fh = loop_raw_fh(fs, nodeid, fhv);

    if (!loop_is_raw(fs, nodeid)) {
        rawfile_land_skip(fs->land_cur);  /* a view's write: never lands */
        return -EAGAIN;
    }
    if (off > INT64_MAX || !fh)
        return -EAGAIN;
    if (fh->disk != fs->land_cur) {
        fs->land_disk = fh->disk;         /* prepare there next time */
        return -EAGAIN;
    }
    ssize_t n = rawfile_write_landed(fh->disk, fh, off, size);
    if (n == -EAGAIN)
        return n;
    fs_fh_mark_wrote(fh);
    rawfile_failed(fh->disk, fh, n < 0 ? (int) n : 0);
    loop_trace("write", pid, loop_ino(fs, nodeid), off, size);
    return n;
}

static bool land_waits(void *opaque, uint64_t nodeid, uint64_t fhv,
                       uint64_t off, uint32_t size)
{
    struct fs_fh *fh = loop_raw_fh(opaque, nodeid, fhv);
    return fh && fs_fh_ends_copy(fh, off, size);
}

static void land_end(void *opaque)
{
    struct fs *fs = opaque;
    rawfile_land_end(fs->land_cur);
}

/* What op_read() does for the raw file, when the read-ahead already holds
 * the bytes; 0: op_read() on a worker. */
static int land_read(void *opaque, uint64_t nodeid, uint64_t fhv,
                     uint64_t off, uint32_t size, uint32_t pid,
                     struct iovec *iov, unsigned *niov)
{
    struct fs *fs = opaque;
    struct fs_fh *fh = loop_raw_fh(fs, nodeid, fhv);

    if (!fh || off > INT64_MAX)
        return 0;
    int r = raw_read_ready(fh->disk, fh, off, size, iov, niov);
    if (r == 1) {
        fs->ready_disk = fh->disk;
        loop_trace("read", pid, loop_ino(fs, nodeid), off, size);
    }
    return r;
}

static void land_read_done(void *opaque)
{
    struct fs *fs = opaque;
    raw_read_ready_done(fs->ready_disk);
}

/* What op_lseek() does for the raw file: its lseek reads the pool's map
 * of holes under the pool's lock and never waits for the server. */
static int land_seek(void *opaque, uint64_t nodeid, uint64_t fhv,
                     uint64_t off, uint32_t whence, uint32_t pid,
                     int64_t *res)
{
    struct fs *fs = opaque;
    struct fs_fh *fh = loop_raw_fh(fs, nodeid, fhv);

    if (!fh)
        return 0;
    if (__builtin_expect(log_verbosity >= 1, 0))
        log_trace("pid %d: lseek ino=%" PRIu64 " off=%jd whence=%d",
                  (int) pid, (uint64_t) loop_ino(fs, nodeid),
                  (intmax_t) off, (int) whence);
    *res = off > INT64_MAX ? -ENXIO
                           : raw_seek(fh->disk, fh, (off_t) off, (int) whence);
    return 1;
}

void fs_landing(struct fs *fs, struct fuseloop_landing *out)
{
    fs->land_disk = fs->land_cur = &fs->disks[0];
    fs->ready_disk = &fs->disks[0];
    *out = (struct fuseloop_landing) { .begin = land_begin,
                                       .write = land_write,
                                       .waits = land_waits,
                                       .end = land_end,
                                       .read = land_read,
                                       .read_done = land_read_done,
                                       .seek = land_seek,
                                       .opaque = fs };
}
