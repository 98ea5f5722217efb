/* fs/view.h: the interface every file of the mount implements.
 *
 * A view is one name in the mount's directory: the raw file (fs/rawview.c),
 * the status document (fs/status.c), the disk as a VHD (views/vhdview.c) or a
 * VMDK (views/vmdkview.c).  fs/ops.c owns what is common to all of them (the
 * handle, its place on fs->h.open_files, argument checks, the FUSE reply) and
 * dispatches the rest here through the view table (fs->views, handed
 * over by the daemon: daemon/viewtable.c), indexed by inode.  A new
 * view is a new file defining a struct fs_view, plus its inode number in
 * enum fs_ino and one line in the table (daemon/viewtable.c); a new image format
 * defines it on the format-view skeleton (views/imageview.h).
 *
 * Views change the disk only through the raw-file module (fs/rawfile.h),
 * never through fs/ops.c, so that the size, the times, the size lock and
 * the watchers (digest, progress, read-ahead) stay in one place.
 *
 * Every hook but attr may be NULL:
 *   open        NULL: nothing to set up.  Not called for a write open of a
 *               view that is not writable (fs/ops.c refuses with EACCES).
 *   read        replies itself (zero-copy views); else pread fills a buffer
 *               that fs/ops.c replies with; neither: EINVAL.
 *   write_buf   -EAGAIN: take the copying path through write.
 *   fallocate,
 *   truncate,
 *   lseek       NULL: EINVAL (truncate: EPERM, and chmod is refused too).
 *   flush       close(2) of a handle; wrote says whether the handle changed
 *               anything.  NULL: 0.
 *   fsync       NULL: 0.
 *   release     frees what open put in the handle; also called when
 *               fuse_reply_open() fails and at unmount for handles the
 *               kernel never released.
 * Hooks return 0, a count, or a negative errno; fs/ops.c replies.
 *
 * THREAD MODEL: hooks run on the receive loop's threads (fs/fuseloop.c):
 * write and release on its receiving thread (a durable write on a
 * worker), the others on its workers, several at once (also for one
 * handle); with -s, all on libfuse's one thread.  Each view locks its own
 * state. */
#pragma once
#include <sys/uio.h>

#include "fs/fs.h"

struct fs_view {
    const char *suffix;       /* its name: FILENAME + suffix, */
    const char *fixed_name;   /* or this one */
    bool writable;            /* may be opened for writing */
    int  (*init)(struct fs_disk *d);              /* before the mount */
    void (*fini)(struct fs_disk *d);              /* after fs_close_all() */
    /* st arrives with owner, times and st_blksize set; set the rest. */
    void (*attr)(struct fs_disk *d, struct stat *st);
    int  (*open)(struct fs_disk *d, struct fs_fh *fh, int flags, pid_t pid);
    void (*read)(fuse_req_t req, struct fs_disk *d, struct fs_fh *fh, size_t size,
                 off_t off);
    ssize_t (*pread)(struct fs_disk *d, struct fs_fh *fh, char *buf, size_t size,
                     uint64_t off);
    ssize_t (*write)(struct fs_disk *d, struct fs_fh *fh, const char *buf,
                     size_t size, off_t off);
    ssize_t (*write_buf)(struct fs_disk *d, struct fs_fh *fh,
                         struct fuse_bufvec *bufv, off_t off);
    int  (*fallocate)(struct fs_disk *d, struct fs_fh *fh, int mode, off_t off,
                      off_t len);
    int  (*truncate)(struct fs_disk *d, struct fs_fh *fh, uint64_t size);
    int64_t (*lseek)(struct fs_disk *d, struct fs_fh *fh, off_t off, int whence);
    int  (*flush)(struct fs_disk *d, struct fs_fh *fh, bool wrote);
    int  (*fsync)(struct fs_disk *d, struct fs_fh *fh);
    void (*release)(struct fs_disk *d, struct fs_fh *fh);
};

/* The view of an inode (fs_ino_of()) in the table the daemon handed the
 * mount (fs->views, by slot; NULL: not a file, e.g. the root); the
 * status file is the mount's, disk 0's slot only.  The caller checks the
 * disk exists (fs_disk_of()). */
static inline const struct fs_view *fs_view_of(const struct fs *fs,
                                               fuse_ino_t ino)
{
    unsigned slot = fs_ino_slot(ino);
    return ino >= FS_INO_COUNT && slot == FS_INO_STATUS ? NULL
                                                        : fs->views[slot];
}

/* Names every view (d->view_name[]) and runs the init hooks; on failure
 * what was set up is undone.  fini: the reverse; safe after a failed or
 * absent init. */
int  fs_views_init(struct fs_disk *d);
void fs_views_fini(struct fs_disk *d);

/* The views each define one. */
/* fs/rawview.c, for the receiving thread: a read of the raw file whose
 * bytes have all arrived in the read-ahead (nothing to wait for): 1 and
 * iov[0..*niov) (at most RA_SPANS) to reply with, held until
 * raw_read_ready_done(); 0: serve it the usual way (nothing changed). */
int raw_read_ready(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                   size_t size, struct iovec *iov, unsigned *niov);
void raw_read_ready_done(struct fs_disk *d);
/* The raw file's lseek (SEEK_DATA, SEEK_HOLE): from the pool's map of
 * holes, never waiting, so the receiving thread may answer it too. */
int64_t raw_seek(struct fs_disk *d, struct fs_fh *fh, off_t off, int whence);

extern const struct fs_view fs_raw_view, fs_status_view, fs_vhd_view,
                            fs_vmdk_view, fs_qcow2_view, fs_vhdx_view;

/* fh->wrote: several threads may use one handle at once. */
static inline void fs_fh_mark_wrote(struct fs_fh *fh)
{
    if (fh) {
        __atomic_store_n(&fh->wrote, true, __ATOMIC_RELAXED);
        __atomic_store_n(&fh->wrote_data, true, __ATOMIC_RELAXED);
        __atomic_store_n(&fh->idle, false, __ATOMIC_RELAXED);
    }
}

static inline bool fs_fh_has_written(struct fs_fh *fh)
{
    return __atomic_load_n(&fh->wrote, __ATOMIC_RELAXED);
}

/* The end of a copy: a write or zeroing of the raw file that reaches,
 * from below, where the writer's copy ends (fh->copy_end: its source's
 * size, or the size it set).  Some copy tools never fsync and ignore close()'s error
 * (qemu-img convert, whose output cache mode "unsafe" sends no flush and
 * whose close is unchecked): for them the reply to their last write is
 * the only place a failure of the writes before it can show.  So that
 * reply waits until everything before it is acknowledged, and carries
 * the failure.  Served by a worker (fs/fuseloop.c asks waits(),
 * fs/landing.c). */
static inline bool fs_fh_ends_copy(const struct fs_fh *fh, uint64_t off, uint64_t len)
{
    uint64_t end = fh ? __atomic_load_n(&fh->copy_end, __ATOMIC_RELAXED) : 0;
    return end && fh->writer && off < end && off + len >= end;
}
