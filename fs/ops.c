/* fs/ops.c: FUSE low-level handlers.  Each checks what is common to every
 * file of the mount (the inode, the access mode, the handle), dispatches
 * the rest to the file's view (fs/view.h) and replies.  The raw file's
 * semantics are its contract in docs/design/README.md (fs/rawview.c,
 * fs/rawfile.c).
 *
 * THREAD MODEL
 * The receive loop (fs/fuseloop.c) calls these handlers: writes (but a
 * durable one, O_DSYNC or O_SYNC), releases, init and destroy on its
 * receiving thread, in arrival order; everything else on its workers,
 * concurrently (with -s, libfuse's one thread serves everything).
 * fs->lock protects the list of open handles (and, in fs/rawfile.c, the
 * apparent size and times); it is never held across a view's hook nor
 * across fuse_reply_*().
 */
#include "fs/view.h"
#include "fs/warm.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include "config.h"
#include "common/cleanup.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/minmax.h"
#include "fs/fuseloop.h"
#include "fs/rawfile.h"
#include "fs/trace.h"
#include "fs/writers.h"

#define FS_BLKSIZE (1u << 20)     /* st_blksize: cp and dd use it as their
                                   * buffer size, so writes arrive large */

static struct fs *fs_of(fuse_req_t req) { return fuse_req_userdata(req); }

/* The disk an inode shows, and its view: NULL for an inode no disk has
 * (the root, or a number the mount never gave out). */
static struct fs_disk *disk_of(fuse_req_t req, fuse_ino_t ino)
{
    return fs_disk_of(fs_of(req), ino);
}

static const struct fs_view *view_of(struct fs *fs, fuse_ino_t ino)
{
    return fs_disk_of(fs, ino) ? fs_view_of(fs, ino) : NULL;
}

/* The disk of a handle's request (the raw file's or a view's), or of the
 * inode when there is no handle (a truncate by path). */
static struct fs_disk *fh_disk(fuse_req_t req, fuse_ino_t ino,
                               const struct fs_fh *fh)
{
    return fh ? fh->disk : disk_of(req, ino);
}

static struct fs_fh *fh_of(struct fuse_file_info *fi)
{
    return fi ? (struct fs_fh *) (uintptr_t) fi->fh : NULL;
}

/* ---- attributes ------------------------------------------------------ */

static void fill_attr(struct fs *fs, fuse_ino_t ino, struct stat *st)
{
    const struct fs_view *v = view_of(fs, ino);

    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_uid = fs->cfg.uid;
    st->st_gid = fs->cfg.gid;
    /* The directory's (and the status file's): the mount's start.  A
     * disk's files show the disk's (fs/rawfile.c, THE TIMES). */
    st->st_atim = st->st_ctim = st->st_mtim = fs->cfg.started;
    st->st_blksize = FS_BLKSIZE;
    if (ino == FS_INO_ROOT) {
        st->st_mode = S_IFDIR | (fs->cfg.allow_other ? 0755 : 0700);
        st->st_nlink = 2;
    } else if (v)
        v->attr(fs_disk_of(fs, ino), st);
}

static void reply_attr(fuse_req_t req, fuse_ino_t ino)
{
    struct stat st;
    fill_attr(fs_of(req), ino, &st);
    /* Timeout 0: the size changes under the kernel (truncate through the
     * VHD view, writes extending the file), never cache it. */
    fuse_reply_attr(req, &st, 0);
}

static fuse_ino_t ino_by_name(struct fs *fs, const char *name)
{
    for (unsigned d = 0; d < fs->ndisks; d++)
        for (unsigned i = 0; i < FS_INO_COUNT; i++) {
            fuse_ino_t ino = fs_ino_of(d, i);
            if (view_of(fs, ino) && fs->disks[d].view_name[i] &&
                strcmp(name, fs->disks[d].view_name[i]) == 0)
                return ino;
        }
    return 0;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    TRACE(req, "lookup parent=%" PRIu64 " name=%s", (uint64_t) parent, name);
    struct fuse_entry_param e = { 0 };
    fuse_ino_t ino = parent == FS_INO_ROOT ? ino_by_name(fs_of(req), name) : 0;

    if (!ino) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    e.ino = ino;
    e.generation = 1;
    fill_attr(fs_of(req), ino, &e.attr);
    e.attr_timeout = 0;
    e.entry_timeout = 3600;       /* the set of names never changes */
    fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
                       struct fuse_file_info *fi)
{
    TRACE(req, "getattr ino=%" PRIu64, (uint64_t) ino);
    reply_attr(req, ino);
}

/* utimensat(2) (rsync -a, cp -p, touch): the disk's times, whichever of
 * its files is named (fs/rawfile.c, THE TIMES).  The kernel asks a
 * truncate to set mtime and ctime to now too: that is the truncate's own
 * stamp, not a time set. */
static void set_times(struct fs_disk *d, const struct stat *attr, int to_set)
{
    struct timespec now;
    const struct timespec *m = NULL, *a = NULL;
    bool truncate = to_set & FUSE_SET_ATTR_SIZE;

    clock_gettime(CLOCK_REALTIME, &now);
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
        m = truncate ? NULL : &now;
    else if (to_set & FUSE_SET_ATTR_MTIME)
        m = &attr->st_mtim;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
        a = truncate ? NULL : &now;
    else if (to_set & FUSE_SET_ATTR_ATIME)
        a = &attr->st_atim;
    if (m || a)
        rawfile_set_times(d, m, a);
    if (m)
        warm_note_mtime(d, m);    /* kept across mounts (fs/warm.h) */
}

/* A size change goes to the view, times to the disk; chmod and chown are
 * accepted and ignored on a file that can be truncated, so rsync -a
 * --inplace and cp -p work (the disk has no such metadata).  All of it is
 * refused elsewhere (the status file). */
static int set_attr(struct fs *fs, fuse_ino_t ino, struct stat *attr,
                    int to_set, struct fuse_file_info *fi)
{
    const struct fs_view *v = view_of(fs, ino);
    struct fs_disk *d = fs_disk_of(fs, ino);
    const int times = FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME;

    if (!v || !v->truncate)
        return -EPERM;
    if (!(to_set & (FUSE_SET_ATTR_SIZE | times)))
        return 0;
    if (d->readonly)
        return -EROFS;
    if ((to_set & FUSE_SET_ATTR_SIZE) && attr->st_size < 0)
        return -EINVAL;
    int r = to_set & FUSE_SET_ATTR_SIZE
            ? v->truncate(d, fh_of(fi), (uint64_t) attr->st_size) : 0;
    if (r == 0)
        set_times(d, attr, to_set);
    return r;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
                       int to_set, struct fuse_file_info *fi)
{
    TRACE(req, "setattr ino=%" PRIu64 " to_set=%#x size=%jd mtime=%jd.%09ld",
          (uint64_t) ino, (unsigned) to_set, (intmax_t) attr->st_size,
          (intmax_t) attr->st_mtim.tv_sec, attr->st_mtim.tv_nsec);
    int r = set_attr(fs_of(req), ino, attr, to_set, fi);

    if (disk_of(req, ino))
        rawfile_failed(disk_of(req, ino), fh_of(fi), r);
    if (r < 0)
        fuse_reply_err(req, -r);
    else
        reply_attr(req, ino);
}

/* ---- directory ------------------------------------------------------- */

struct dirbuf {
    char *p;
    size_t size;
};

static void dirbuf_add(fuse_req_t req, struct dirbuf *b, const char *name,
                       fuse_ino_t ino)
{
    struct stat st = { .st_ino = ino };
    size_t old = b->size;
    b->size += fuse_add_direntry(req, NULL, 0, name, NULL, 0);
    char *n = realloc(b->p, b->size);
    if (!n) {
        b->size = old;
        return;
    }
    b->p = n;
    fuse_add_direntry(req, b->p + old, b->size - old, name, &st,
                      (off_t) b->size);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    TRACE(req, "readdir ino=%" PRIu64 " off=%jd size=%zu", (uint64_t) ino,
          (intmax_t) off, size);
    struct fs *fs = fs_of(req);
    struct dirbuf b = { 0 };

    if (ino != FS_INO_ROOT) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    dirbuf_add(req, &b, ".", FS_INO_ROOT);
    dirbuf_add(req, &b, "..", FS_INO_ROOT);
    for (unsigned d = 0; d < fs->ndisks; d++)
        for (unsigned i = 0; i < FS_INO_COUNT; i++)
            if (view_of(fs, fs_ino_of(d, i)))
                dirbuf_add(req, &b, fs->disks[d].view_name[i],
                           fs_ino_of(d, i));
    if ((size_t) off < b.size) {
        size_t n = b.size - (size_t) off;
        fuse_reply_buf(req, b.p + off, MIN(n, size));
    } else
        fuse_reply_buf(req, NULL, 0);
    free(b.p);
}

/* Names cannot be made, removed or renamed: the mount holds a fixed set
 * of files.  Tools that want a temporary file (plain rsync) are told. */
static void refuse(fuse_req_t req, const char *what, const char *name)
{
    log_notice("%s '%s' refused: this mount holds only its disk file; "
               "write to it in place (rsync: use --inplace)", what, name);
    fuse_reply_err(req, EPERM);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
                     mode_t mode, dev_t rdev)
{
    refuse(req, "creating", name);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
                     mode_t mode)
{
    refuse(req, "creating directory", name);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    refuse(req, "removing", name);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    refuse(req, "removing", name);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
                      fuse_ino_t newparent, const char *newname,
                      unsigned int flags)
{
    refuse(req, "renaming", name);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
                    const char *newname)
{
    refuse(req, "linking", newname);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
                       const char *name)
{
    refuse(req, "creating symlink", name);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
                      mode_t mode, struct fuse_file_info *fi)
{
    TRACE(req, "create name=%s mode=%#o", name, (unsigned) mode);
    refuse(req, "creating", name);
}

/* ---- open and close -------------------------------------------------- */

static void remember_fh_locked(struct fs *fs, struct fs_fh *fh)
{
    fh->next = fs->h.open_files;
    if (fh->next)
        fh->next->prev = fh;
    fs->h.open_files = fh;
}

static void remember_fh(struct fs *fs, struct fs_fh *fh)
{
    LOCK_FOR_SCOPE(&fs->lock);
    remember_fh_locked(fs, fh);
}

static void forget_fh(struct fs *fs, struct fs_fh *fh)
{
    LOCK_FOR_SCOPE(&fs->lock);
    if (fh->prev)
        fh->prev->next = fh->next;
    else
        fs->h.open_files = fh->next;
    if (fh->next)
        fh->next->prev = fh->prev;
    pthread_cond_broadcast(&fs->h.released);      /* fs/writers.h */
}

/* The end of a handle that was remembered: the view lets go of it. */
static void close_fh(struct fs *fs, struct fs_fh *fh)
{
    const struct fs_view *v = fs_view_of(fs, fh->ino);

    if (v->release)
        v->release(fh->disk, fh);
    forget_fh(fs, fh);
    free(fh);
}

/* A writer joins the open handles before its view opens it (so that two
 * opens at once cannot both be admitted), if fs/writers.c admits it.  A
 * writer that only closed (its release still on the way) is waited for,
 * up to WRITERS_RELEASE_WAIT_MS. */
static int admit_writer(struct fs *fs, struct fs_fh *fh)
{
    struct nbdf_err why = { "" };
    struct timespec deadline =
        mono_deadline_ns(WRITERS_RELEASE_WAIT_MS * NS_PER_MS);
    int r;

    {
        LOCK_FOR_SCOPE(&fs->lock);
        while ((r = writers_admit_locked(fs, fh, &why)) == -EAGAIN)
            if (pthread_cond_timedwait(&fs->h.released, &fs->lock,
                                       &deadline) == ETIMEDOUT) {
                r = writers_admit_locked(fs, fh, &why);
                break;
            }
        if (r == -EAGAIN)
            r = -EBUSY;           /* still open elsewhere (a dup of it) */
        if (r == 0)
            remember_fh_locked(fs, fh);
    }
    if (r < 0)
        log_err("%s", why.msg);
    return r;
}

/* A new handle, opened by its view; NULL and -errno in *err. */
static struct fs_fh *open_fh(fuse_req_t req, fuse_ino_t ino, int flags,
                             int *err)
{
    struct fs *fs = fs_of(req);
    const struct fs_view *v = view_of(fs, ino);
    struct fs_disk *d = fs_disk_of(fs, ino);
    bool writing = (flags & O_ACCMODE) != O_RDONLY;

    *err = !v ? (ino == FS_INO_ROOT ? -EISDIR : -ENOENT)
           : writing && d->readonly ? -EROFS
           : writing && !v->writable ? -EACCES : 0;
    struct fs_fh *fh = *err ? NULL : calloc(1, sizeof *fh);
    if (!fh) {
        *err = *err ? *err : -ENOMEM;
        return NULL;
    }
    pid_t pid = fuse_req_ctx(req)->pid;
    fh->ino = (enum fs_ino) fs_ino_slot(ino);
    fh->disk = d;
    fh->writer = writing;
    fh->err_seq = pool_error_seq(d->pool);
    fh->serial = __atomic_add_fetch(&fs->h.fh_serial, 1, __ATOMIC_RELAXED);
    if (writing && (flags & O_TRUNC))
        fh->wrote = fh->trunc = true;
    if (writing) {
        writers_identify(fh, pid);
        if ((*err = admit_writer(fs, fh)) < 0) {
            free(fh);
            return NULL;
        }
    }
    *err = v->open ? v->open(d, fh, flags, pid) : 0;
    if (*err < 0) {               /* the view undid its part */
        if (writing)
            forget_fh(fs, fh);
        free(fh);
        return NULL;
    }
    if (!writing)
        remember_fh(fs, fh);
    return fh;
}

/* Which transport brought req (the status's "fuse_transport").  Once
 * libfuse has started its rings every request but INIT, FORGET and
 * INTERRUPT comes through them, so an open (the status file's own
 * included) is enough to know. */
static void note_transport(fuse_req_t req)
{
#if HAVE_FUSE_URING
    if (fuse_req_is_uring(req))
        __atomic_store_n(&fs_of(req)->uring_seen, true, __ATOMIC_RELAXED);
#else
    (void) req;
#endif
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    TRACE(req, "open ino=%" PRIu64 " flags=%#x", (uint64_t) ino, (unsigned) fi->flags);
    int err;
    note_transport(req);
    /* A mount whose server was given up on tries it again here, so that
     * a new copy finds it healed.  The open succeeds either way: the
     * handle's writes and reads report a server still gone. */
    if (view_of(fs_of(req), ino) && fs_view_of(fs_of(req), ino) != &fs_status_view)
        pool_heal(disk_of(req, ino)->pool);
    struct fs_fh *fh = open_fh(req, ino, fi->flags, &err);

    if (!fh) {
        fuse_reply_err(req, -err);
        return;
    }
    fi->fh = (uintptr_t) fh;
    fi->direct_io = 1;        /* our semantics, not the page cache's */
    fi->keep_cache = 0;
    fi->nonseekable = 0;
    if (fuse_reply_open(req, fi) != 0)      /* interrupted: no release */
        close_fh(fs_of(req), fh);
}

/* close(2): every write is acknowledged before close returns, and the
 * first error since this handle last reported one is returned. */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    TRACE(req, "flush ino=%" PRIu64 " fh=%#" PRIx64, (uint64_t) ino, (uint64_t) fi->fh);
    const struct fs_view *v = view_of(fs_of(req), ino);
    struct fs_fh *fh = fh_of(fi);

    /* A handle that changed nothing has nothing to wait for: its close
     * (head -c1 while cp writes) must not drain the pool nor send the
     * pending zeroes the writer's own close will send. */
    bool wrote = fh && fs_fh_has_written(fh);
    int r = v && v->flush ? v->flush(fh_disk(req, ino, fh), fh, wrote) : 0;
    /* Closed: unless it writes again (another descriptor of the same open
     * file), its copy is over once its process is (fs/writers.h). */
    if (fh && fh->writer)
        __atomic_store_n(&fh->idle, true, __ATOMIC_RELAXED);
    if (fh)
        rawfile_close_failed(fh->disk, fh, r);
    fuse_reply_err(req, -r);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
                     struct fuse_file_info *fi)
{
    TRACE(req, "fsync ino=%" PRIu64 " datasync=%d", (uint64_t) ino, datasync);
    const struct fs_view *v = view_of(fs_of(req), ino);
    struct fs_fh *fh = fh_of(fi);
    int r = v && v->fsync ? v->fsync(fh_disk(req, ino, fh), fh) : 0;

    if (fh)
        rawfile_close_failed(fh->disk, fh, r);
    fuse_reply_err(req, -r);
}

/* Free the handles still open when the session ends (the kernel sends no
 * release for them after SIGTERM or a lazy unmount). */
void fs_close_all(struct fs *fs)
{
    while (fs->h.open_files)
        close_fh(fs, fs->h.open_files);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
                       struct fuse_file_info *fi)
{
    TRACE(req, "release ino=%" PRIu64 " fh=%#" PRIx64, (uint64_t) ino,
          (uint64_t) fi->fh);
    close_fh(fs_of(req), fh_of(fi));
    fuse_reply_err(req, 0);
}

/* ---- data ------------------------------------------------------------ */

/* A view that reads into a buffer: reply with it. */
static void read_copied(fuse_req_t req, const struct fs_view *v,
                        struct fs_fh *fh, size_t size, off_t off)
{
    char *buf = off >= 0 ? malloc(size ? size : 1) : NULL;
    if (!buf) {
        fuse_reply_err(req, off < 0 ? EINVAL : ENOMEM);
        return;
    }
    ssize_t n = v->pread(fh->disk, fh, buf, size, (uint64_t) off);
    if (n < 0)
        fuse_reply_err(req, (int) -n);
    else
        fuse_reply_buf(req, buf, (size_t) n);
    free(buf);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    TRACE(req, "read ino=%" PRIu64 " off=%jd len=%zu", (uint64_t) ino, (intmax_t) off,
          size);
    const struct fs_view *v = fh_of(fi) ? view_of(fs_of(req), ino) : NULL;

    if (v && v->read)
        v->read(req, fh_of(fi)->disk, fh_of(fi), size, off);
    else if (v && v->pread)
        read_copied(req, v, fh_of(fi), size, off);
    else
        fuse_reply_err(req, EINVAL);
}

/* O_DSYNC or O_SYNC (the open's flags, or pwritev2()'s RWF_DSYNC and
 * RWF_SYNC: the kernel passes both in each write's flags): the write is
 * durable before it is answered, as fdatasync() would make it (every
 * write drained, then an NBD flush).  fs/fuseloop.c serves such writes
 * on a worker.  An error of the drain or the flush is the write's. */
static ssize_t write_synced(struct fs_fh *fh, int flags, ssize_t n)
{
    if (n < 0 || !(flags & O_DSYNC))
        return n;
    int r = rawfile_fsync(fh->disk, fh);
    return r < 0 ? r : n;
}

static ssize_t drained_at_end(struct fs_fh *fh, uint64_t off, ssize_t n)
{
    if (n <= 0 || !fs_fh_ends_copy(fh, off, (uint64_t) n))
        return n;
    int r = rawfile_drain_end(fh->disk);
    return r < 0 ? r : n;
}

static void reply_written(fuse_req_t req, struct fs_fh *fh, ssize_t n)
{
    if (fh)
        rawfile_failed(fh->disk, fh, n < 0 ? (int) n : 0);
    if (n < 0)
        fuse_reply_err(req, (int) -n);
    else
        fuse_reply_write(req, (size_t) n);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
                     size_t size, off_t off, struct fuse_file_info *fi)
{
    TRACE(req, "write ino=%" PRIu64 " off=%jd len=%zu", (uint64_t) ino,
          (intmax_t) off, size);
    struct fs_fh *fh = fh_of(fi);
    const struct fs_view *v = fh ? view_of(fs_of(req), ino) : NULL;

    fs_fh_mark_wrote(fh);
    ssize_t n = v && v->write ? v->write(fh->disk, fh, buf, size, off)
                              : -EBADF;
    if (fh && fh->ino == FS_INO_RAW)
        n = drained_at_end(fh, (uint64_t) off, n);
    reply_written(req, fh, fh ? write_synced(fh, fi->flags, n) : n);
}

/* Copy the payload into memory and take op_write()'s path (the VHD view,
 * write-through mode, writes spanning many buffers). */
static void write_buf_copied(fuse_req_t req, fuse_ino_t ino,
                             struct fuse_bufvec *bufv, off_t off,
                             struct fuse_file_info *fi)
{
    size_t size = fuse_buf_size(bufv);

    if (bufv->count == 1 && !(bufv->buf[0].flags & FUSE_BUF_IS_FD)) {
        op_write(req, ino, (const char *) bufv->buf[0].mem + bufv->off, size,
                 off, fi);
        return;
    }
    struct fuse_bufvec dst = FUSE_BUFVEC_INIT(size);
    dst.buf[0].mem = malloc(size ? size : 1);
    if (!dst.buf[0].mem) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    ssize_t n = fuse_buf_copy(&dst, bufv, 0);
    if (n < 0 || (size_t) n != size)
        fuse_reply_err(req, n < 0 ? (int) -n : EIO);
    else
        op_write(req, ino, dst.buf[0].mem, size, off, fi);
    free(dst.buf[0].mem);
}

static void op_write_buf(fuse_req_t req, fuse_ino_t ino,
                         struct fuse_bufvec *bufv, off_t off,
                         struct fuse_file_info *fi)
{
    TRACE(req, "write ino=%" PRIu64 " off=%jd len=%zu", (uint64_t) ino,
          (intmax_t) off, fuse_buf_size(bufv));
    struct fs_fh *fh = fh_of(fi);
    const struct fs_view *v = fh ? view_of(fs_of(req), ino) : NULL;

    fs_fh_mark_wrote(fh);
    ssize_t n = v && v->write_buf ? v->write_buf(fh->disk, fh, bufv, off)
                                  : -EAGAIN;
    if (n == -EAGAIN) {
        write_buf_copied(req, ino, bufv, off, fi);
        return;
    }
    if (fh->ino == FS_INO_RAW)
        n = drained_at_end(fh, (uint64_t) off, n);
    reply_written(req, fh, write_synced(fh, fi->flags, n));
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
                         off_t len, struct fuse_file_info *fi)
{
    TRACE(req, "fallocate ino=%" PRIu64 " mode=%#x off=%jd len=%jd",
          (uint64_t) ino, (unsigned) mode, (intmax_t) off, (intmax_t) len);
    struct fs_fh *fh = fh_of(fi);
    const struct fs_view *v = fh ? view_of(fs_of(req), ino) : NULL;

    fs_fh_mark_wrote(fh);
    int r = v && v->fallocate ? v->fallocate(fh->disk, fh, mode, off, len)
                              : -EINVAL;
    if (r == 0 && fh->ino == FS_INO_RAW && off >= 0 && len > 0 &&
        fs_fh_ends_copy(fh, (uint64_t) off, (uint64_t) len))
        r = rawfile_drain_end(fh->disk);            /* see fs_fh_ends_copy() */
    if (fh)
        rawfile_failed(fh->disk, fh, r);
    fuse_reply_err(req, -r);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
                     struct fuse_file_info *fi)
{
    TRACE(req, "lseek ino=%" PRIu64 " off=%jd whence=%d", (uint64_t) ino,
          (intmax_t) off, whence);
    struct fs_fh *fh = fh_of(fi);
    const struct fs_view *v = fh ? view_of(fs_of(req), ino) : NULL;
    int64_t r = v && v->lseek ? v->lseek(fh->disk, fh, off, whence)
                              : -EINVAL;
    if (r < 0)
        fuse_reply_err(req, (int) -r);
    else
        fuse_reply_lseek(req, (off_t) r);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    TRACE(req, "statfs");
    struct fs *fs = fs_of(req);
    struct statvfs sv = { 0 };
    uint64_t used = 0, size = 0;

    for (unsigned i = 0; i < fs->ndisks; i++) {
        used += rawfile_size(&fs->disks[i]);
        size += fs->disks[i].export_size;
    }
    sv.f_bsize = FS_BLKSIZE;
    sv.f_frsize = 4096;
    sv.f_blocks = size / 4096;
    sv.f_bfree = sv.f_bavail = (size - used) / 4096;
    sv.f_files = 2;
    sv.f_ffree = 0;
    sv.f_namemax = 255;
    fuse_reply_statfs(req, &sv);
}

/* Ask for a feature (on) if the kernel offers it, or turn it off.
 * libfuse 3.17 keeps the flags in 64-bit want_ext and only converts the
 * 32-bit conn->want after init (in 3.17.0 and 3.17.1 without applying
 * cleared bits); fuse_{set,unset}_feature_flag() is its API for them.
 * Chosen at build time by libfuse's version (CMakeLists.txt). */
static void conn_want(struct fuse_conn_info *conn, uint64_t flag, bool on)
{
#if HAVE_FUSE_FEATURE_FLAGS
    if (on)
        fuse_set_feature_flag(conn, flag);    /* only if capable */
    else
        fuse_unset_feature_flag(conn, flag);
#else
    if (on && (conn->capable & flag))
        conn->want |= flag;
    else if (!on)
        conn->want &= ~flag;
#endif
}

/* --fuse-io-uring: libfuse starts its rings after this callback if the
 * kernel offers them (FUSE_CAP_OVER_IO_URING, on by default then); say
 * so when it does not, so the log names the transport's reason. */
static void uring_init(struct fs *fs, struct fuse_conn_info *conn)
{
#if HAVE_FUSE_URING
    if (!fs->cfg.fuse_io_uring)
        return;
    if (conn->capable_ext & FUSE_CAP_OVER_IO_URING)
        log_info("fuse: the kernel offers io_uring: libfuse starts its "
                 "rings");
    else
        log_notice("fuse: the kernel does not offer io_uring: "
                   "serving through /dev/fuse");
#else
    (void) fs;
    (void) conn;
#endif
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    /* 1 MiB requests (libfuse negotiates max_pages to match). */
    conn->max_write = FS_MAX_WRITE;
    conn->max_readahead = 1u << 20;
    conn_want(conn, FUSE_CAP_ATOMIC_O_TRUNC, true);
    /* No async direct I/O: the kernel would split one large write into
     * requests served in parallel, out of file order, and the VHD view's
     * decoder needs file order. */
    conn_want(conn, FUSE_CAP_ASYNC_DIO, false);
    conn_want(conn, FUSE_CAP_WRITEBACK_CACHE, false);  /* we are the write-back */
    /* No splice (libfuse asks for SPLICE_READ by default once write_buf
     * exists).  Our writes are direct I/O, and the kernel copies
     * direct-I/O pages into the pipe ("can't control lifetime of pipe
     * buffers"): splicing trades read()'s copy for the kernel's copy
     * into the pipe plus a pipe read, measured no cheaper.  It also
     * needs a pipe of a whole request (1 MiB + header), more than
     * pipe-max-size allows without CAP_SYS_RESOURCE, so it would run
     * only for some users: one path, the tested one.  SPLICE_MOVE only
     * moves pages of replies; SPLICE_WRITE is for reads. */
    conn_want(conn, FUSE_CAP_SPLICE_READ, false);
    conn_want(conn, FUSE_CAP_SPLICE_MOVE, false);
    uring_init(userdata, conn);
}

const struct fuse_lowlevel_ops fs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .readdir = op_readdir,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .link = op_link,
    .symlink = op_symlink,
    .create = op_create,
    .open = op_open,
    .read = op_read,
    .write = op_write,
    .write_buf = op_write_buf,
    .flush = op_flush,
    .fsync = op_fsync,
    .release = op_release,
    .fallocate = op_fallocate,
    .lseek = op_lseek,
    .statfs = op_statfs,
};
