/* fs/ops.c: FUSE low-level handlers.  Each turns a kernel request into
 * pool calls and replies; file semantics are
 * the raw file's contract in docs/design.md.
 *
 * THREAD MODEL
 * libfuse's worker threads (fuse_session_loop_mt) call these handlers
 * concurrently.  fs->lock protects the apparent size and times; it is never
 * held across a pool call that can wait, nor across fuse_reply_*().
 */
#include "fs/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>

#include "common/log.h"
#include "fs/digest.h"
#include "fs/readback.h"
#include "fs/progress.h"
#include "fs/readahead.h"
#include "fs/vhdview.h"
#include "fs/vmdkview.h"

#define FS_BLKSIZE (1u << 20)     /* st_blksize: cp and dd use it as their
                                   * buffer size, so writes arrive large */

static struct fs *fs_of(fuse_req_t req) { return fuse_req_userdata(req); }

/* fh->wrote: several worker threads may use one handle at once. */
static void mark_wrote(struct fs_fh *fh)
{
    if (fh)
        __atomic_store_n(&fh->wrote, true, __ATOMIC_RELAXED);
}

static bool has_written(struct fs_fh *fh)
{
    return __atomic_load_n(&fh->wrote, __ATOMIC_RELAXED);
}

static uint64_t apparent_size(struct fs *fs)
{
    pthread_mutex_lock(&fs->lock);
    uint64_t s = fs->apparent_size;
    pthread_mutex_unlock(&fs->lock);
    return s;
}

/* ---- attributes ------------------------------------------------------ */

static void fill_attr(struct fs *fs, fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    st->st_atim = st->st_ctim = st->st_mtim = fs->started;
    st->st_blksize = FS_BLKSIZE;
    switch (ino) {
    case FS_INO_ROOT:
        st->st_mode = S_IFDIR | (fs->allow_other ? 0755 : 0700);
        st->st_nlink = 2;
        break;
    case FS_INO_RAW: {
        uint64_t size;
        pthread_mutex_lock(&fs->lock);
        size = fs->apparent_size;
        st->st_mtim = st->st_ctim = fs->mtime;
        pthread_mutex_unlock(&fs->lock);
        st->st_mode = S_IFREG | (fs->readonly ? 0400 : 0600);
        st->st_nlink = 1;
        st->st_size = (off_t) size;
        /* From the zero maps, so sparse-aware readers (cp --sparse=auto
         * wants st_blocks < st_size / 512) look for holes. */
        st->st_blocks = (blkcnt_t) ((pool_allocated(fs->pool, size) + 511) / 512);
        break;
    }
    case FS_INO_VHD:
        st->st_mode = S_IFREG | (fs->readonly ? 0400 : 0600);
        st->st_nlink = 1;
        st->st_size = (off_t) vhdview_size(fs);
        st->st_blocks = (st->st_size + 511) / 512;
        break;
    case FS_INO_VMDK:
        st->st_mode = S_IFREG | (fs->readonly ? 0400 : 0600);
        st->st_nlink = 1;
        st->st_size = (off_t) vmdkview_size(fs);
        st->st_blocks = (st->st_size + 511) / 512;
        break;
    case FS_INO_STATUS:
        st->st_mode = S_IFREG | 0400;
        st->st_nlink = 1;
        st->st_size = 0;          /* generated at open; read until EOF */
        break;
    }
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
    if (strcmp(name, fs->filename) == 0)
        return FS_INO_RAW;
    if (strcmp(name, FS_STATUS_NAME) == 0)
        return FS_INO_STATUS;
    if (strcmp(name, fs->vhd_name) == 0)
        return FS_INO_VHD;
    if (strcmp(name, fs->vmdk_name) == 0)
        return FS_INO_VMDK;
    return 0;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
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
    reply_attr(req, ino);
}

/* Set the raw file's size.  Every byte beyond the new size must read as
 * zero: the bytes [size, old size) become pending zero, done lazily at
 * the next drain (close, fsync, unmount) for the parts not written again
 * meanwhile.  Bytes beyond the old size already read as zero. */
static int truncate_to(struct fs *fs, uint64_t size)
{
    int r = 0;

    if (size > fs->export_size)
        return -EFBIG;
    pthread_rwlock_wrlock(&fs->size_lock);
    pthread_mutex_lock(&fs->lock);
    uint64_t old = fs->apparent_size;
    fs->apparent_size = size;
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
    pthread_mutex_unlock(&fs->lock);
    digest_truncate(fs->digest, size, old);     /* size 0: a new pass */
    progress_truncate(fs->progress, size);
    if (size < old) {
        r = pool_zero_lazy(fs->pool, size, old - size);
        ra_invalidate(fs->ra, size, old - size);
    }
    pthread_rwlock_unlock(&fs->size_lock);
    return r;
}

/* The disk changed up to end: grow the apparent size to cover it (0:
 * keep the size) and stamp the time, in one lock round (the write path
 * runs once per FUSE request). */
static void extend_to(struct fs *fs, uint64_t end)
{
    pthread_mutex_lock(&fs->lock);
    if (end > fs->apparent_size)
        fs->apparent_size = end;
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
    pthread_mutex_unlock(&fs->lock);
}

void fs_raw_extend(struct fs *fs, uint64_t end) { extend_to(fs, end); }

int fs_raw_replace(struct fs *fs, uint64_t size)
{
    if (size > fs->export_size)
        return -ENOSPC;
    pthread_rwlock_wrlock(&fs->size_lock);
    pthread_mutex_lock(&fs->lock);
    uint64_t old = fs->apparent_size;
    fs->apparent_size = size;
    clock_gettime(CLOCK_REALTIME, &fs->mtime);
    pthread_mutex_unlock(&fs->lock);
    /* Bytes past the old apparent size already read as zero. */
    int r = pool_zero_lazy(fs->pool, 0, old);
    ra_invalidate(fs->ra, 0, old);
    pthread_rwlock_unlock(&fs->size_lock);
    return r;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
                       int to_set, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);

    if (ino == FS_INO_VHD || ino == FS_INO_VMDK) {
        int r = !(to_set & FUSE_SET_ATTR_SIZE) ? 0
                : fs->readonly ? -EROFS
                : attr->st_size < 0 ? -EINVAL
                : ino == FS_INO_VMDK
                ? vmdkview_truncate(fs, (uint64_t) attr->st_size)
                : vhdview_truncate(fs, (uint64_t) attr->st_size);
        if (r < 0)
            fuse_reply_err(req, -r);
        else
            reply_attr(req, ino);
        return;
    }
    if (ino != FS_INO_RAW) {
        fuse_reply_err(req, EPERM);
        return;
    }
    if (to_set & FUSE_SET_ATTR_SIZE) {
        if (fs->readonly) {
            fuse_reply_err(req, EROFS);
            return;
        }
        if (attr->st_size < 0) {
            fuse_reply_err(req, EINVAL);
            return;
        }
        int r = truncate_to(fs, (uint64_t) attr->st_size);
        if (fi)
            mark_wrote((struct fs_fh *) (uintptr_t) fi->fh);
        if (r < 0) {
            if (r == -EFBIG)
                log_notice("truncate to %jd bytes refused: the export holds "
                           "%" PRIu64, (intmax_t) attr->st_size,
                           fs->export_size);
            fuse_reply_err(req, -r);
            return;
        }
    }
    /* chmod, chown, utimes: accepted and ignored, so rsync -a --inplace
     * and cp -p work.  The disk has no such metadata. */
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
    struct fs *fs = fs_of(req);
    struct dirbuf b = { 0 };

    if (ino != FS_INO_ROOT) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    dirbuf_add(req, &b, ".", FS_INO_ROOT);
    dirbuf_add(req, &b, "..", FS_INO_ROOT);
    dirbuf_add(req, &b, fs->filename, FS_INO_RAW);
    dirbuf_add(req, &b, fs->vhd_name, FS_INO_VHD);
    dirbuf_add(req, &b, fs->vmdk_name, FS_INO_VMDK);
    dirbuf_add(req, &b, FS_STATUS_NAME, FS_INO_STATUS);
    if ((size_t) off < b.size) {
        size_t n = b.size - (size_t) off;
        fuse_reply_buf(req, b.p + off, n < size ? n : size);
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
    refuse(req, "creating", name);
}

/* ---- open and close -------------------------------------------------- */

static void forget_fh(struct fs *fs, struct fs_fh *fh);

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    bool writing = (fi->flags & O_ACCMODE) != O_RDONLY;

    if (ino == FS_INO_ROOT) {
        fuse_reply_err(req, EISDIR);
        return;
    }
    if (writing && (fs->readonly || ino == FS_INO_STATUS)) {
        fuse_reply_err(req, fs->readonly ? EROFS : EACCES);
        return;
    }
    struct fs_fh *fh = calloc(1, sizeof *fh);
    if (!fh) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    fh->ino = (enum fs_ino) ino;
    fh->writer = writing;
    fh->err_seq = pool_error_seq(fs->pool);
    if (ino == FS_INO_VHD) {
        int r = vhdview_open(fs, fh, fi->flags);
        if (r < 0) {
            free(fh);
            fuse_reply_err(req, -r);
            return;
        }
    }
    if (ino == FS_INO_VMDK) {
        int r = vmdkview_open(fs, fh, fi->flags);
        if (r < 0) {
            free(fh);
            fuse_reply_err(req, -r);
            return;
        }
    }
    if (ino == FS_INO_STATUS) {
        fh->snapshot = fs_status_json(fs, &fh->snapshot_len);
        if (!fh->snapshot) {
            free(fh);
            fuse_reply_err(req, ENOMEM);
            return;
        }
    }
    if (writing && (fi->flags & O_TRUNC))
        fh->wrote = true;
    /* libfuse enables atomic O_TRUNC: the kernel sends no setattr. */
    if (ino == FS_INO_RAW && writing && (fi->flags & O_TRUNC)) {
        int r = truncate_to(fs, 0);
        if (r < 0) {
            free(fh);
            fuse_reply_err(req, -r);
            return;
        }
    }
    /* The writer's input file, if visible, is the progress's total. */
    if (writing && (ino == FS_INO_RAW || ino == FS_INO_VHD))
        progress_writer(fs->progress, fuse_req_ctx(req)->pid);
    if (ino == FS_INO_RAW || ino == FS_INO_VHD)
        fh->ra = ra_stream_open(fs->ra);    /* NULL: reads on demand */
    pthread_mutex_lock(&fs->lock);
    fh->next = fs->open_files;
    if (fh->next)
        fh->next->prev = fh;
    fs->open_files = fh;
    pthread_mutex_unlock(&fs->lock);
    fi->fh = (uintptr_t) fh;
    fi->direct_io = 1;        /* our semantics, not the page cache's */
    fi->keep_cache = 0;
    fi->nonseekable = 0;
    if (fuse_reply_open(req, fi) != 0) {    /* interrupted: no release */
        if (ino == FS_INO_VHD)
            vhdview_release(fs, fh);
        if (ino == FS_INO_VMDK)
            vmdkview_release(fs, fh);
        forget_fh(fs, fh);
        ra_stream_close(fh->ra);
        free(fh->snapshot);
        free(fh);
    }
}

static struct fs_fh *fh_of(struct fuse_file_info *fi)
{
    return (struct fs_fh *) (uintptr_t) fi->fh;
}

/* close(2): every write is acknowledged before close returns, and the
 * first error since this handle last reported one is returned. */
static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_fh *fh = fh_of(fi);

    /* A handle that changed nothing has nothing to wait for: its close
     * (head -c1 while cp writes) must not drain the pool nor send the
     * pending zeroes the writer's own close will send. */
    bool wrote = has_written(fh);
    if (ino == FS_INO_VHD || ino == FS_INO_VMDK) {
        int r = ino == FS_INO_VMDK ? vmdkview_flush(fs, fh)
                                   : vhdview_flush(fs, fh);
        if (wrote)
            pool_drain(fs->pool);
        int err = wrote ? pool_error_take(fs->pool, &fh->err_seq) : 0;
        fuse_reply_err(req, r < 0 ? -r : err);
        return;
    }
    if (ino != FS_INO_RAW) {
        fuse_reply_err(req, 0);
        return;
    }
    if (wrote)
        pool_drain(fs->pool);
    /* The pass covers the file up to its size (cp's final ftruncate).  A
     * reader closing (sha256sum during a copy) ends nobody's pass. */
    if (fh->writer) {
        uint64_t size = apparent_size(fs);
        digest_close(fs->digest, size);
        progress_close(fs->progress, size);
    }
    int err = wrote ? pool_error_take(fs->pool, &fh->err_seq) : 0;
    if (fh->writer && err == 0)
        err = -readback_at_close(fs);       /* --verify-readback */
    fuse_reply_err(req, err);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
                     struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_fh *fh = fh_of(fi);

    if (ino != FS_INO_RAW && ino != FS_INO_VHD && ino != FS_INO_VMDK) {
        fuse_reply_err(req, 0);
        return;
    }
    int r = pool_flush(fs->pool);
    int err = pool_error_take(fs->pool, &fh->err_seq);
    if (err == 0 && r == 0 && ino == FS_INO_RAW)
        err = -readback_at_close(fs);       /* --verify-readback */
    fuse_reply_err(req, err ? err : r < 0 ? EIO : 0);
}

static void forget_fh(struct fs *fs, struct fs_fh *fh)
{
    pthread_mutex_lock(&fs->lock);
    if (fh->prev)
        fh->prev->next = fh->next;
    else
        fs->open_files = fh->next;
    if (fh->next)
        fh->next->prev = fh->prev;
    pthread_mutex_unlock(&fs->lock);
}

void fs_close_all(struct fs *fs)
{
    struct fs_fh *fh;

    while ((fh = fs->open_files) != NULL) {
        if (fh->ino == FS_INO_VHD && fs->vhd)
            vhdview_release(fs, fh);
        if (fh->ino == FS_INO_VMDK && fs->vmdk)
            vmdkview_release(fs, fh);
        forget_fh(fs, fh);
        ra_stream_close(fh->ra);
        free(fh->snapshot);
        free(fh);
    }
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
                       struct fuse_file_info *fi)
{
    struct fs_fh *fh = fh_of(fi);

    if (ino == FS_INO_VHD)
        vhdview_release(fs_of(req), fh);
    if (ino == FS_INO_VMDK)
        vmdkview_release(fs_of(req), fh);
    forget_fh(fs_of(req), fh);
    ra_stream_close(fh->ra);
    free(fh->snapshot);
    free(fh);
    fuse_reply_err(req, 0);
}

/* ---- data ------------------------------------------------------------ */

static void read_status(fuse_req_t req, struct fs_fh *fh, size_t size,
                        off_t off)
{
    if ((size_t) off >= fh->snapshot_len) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    /* Reply from a copy: the kernel completes the read inside writev(), so
     * the reader may close and op_release() free the snapshot before
     * fuse_reply_buf() returns (ASan checks the iovec after the call). */
    size_t n = fh->snapshot_len - (size_t) off;
    if (n > size)
        n = size;
    char *copy = malloc(n);
    if (!copy) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    memcpy(copy, fh->snapshot + off, n);
    fuse_reply_buf(req, copy, n);
    free(copy);
}

static void read_vhd(fuse_req_t req, struct fs_fh *fh, size_t size, off_t off)
{
    char *buf = off >= 0 ? malloc(size ? size : 1) : NULL;
    if (!buf) {
        fuse_reply_err(req, off < 0 ? EINVAL : ENOMEM);
        return;
    }
    ssize_t n = fh->ino == FS_INO_VMDK
                    ? vmdkview_read(fuse_req_userdata(req), fh, buf, size,
                                    (uint64_t) off)
                    : vhdview_read(fuse_req_userdata(req), fh, buf, size,
                                   (uint64_t) off);
    if (n < 0)
        fuse_reply_err(req, (int) -n);
    else
        fuse_reply_buf(req, buf, (size_t) n);
    free(buf);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);

    if (ino == FS_INO_STATUS) {
        read_status(req, fh_of(fi), size, off);
        return;
    }
    if (ino == FS_INO_VHD || ino == FS_INO_VMDK) {
        read_vhd(req, fh_of(fi), size, off);
        return;
    }
    uint64_t end = apparent_size(fs);
    if (off < 0 || (uint64_t) off >= end) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > end - (uint64_t) off)
        size = (size_t) (end - (uint64_t) off);
    /* Straight from the read-ahead's chunks when they hold the range. */
    struct ra_span span[RA_SPANS];
    unsigned n = 0;
    int r = ra_read_spans(fs->ra, fh_of(fi)->ra, (uint64_t) off, size, end,
                          span, &n);
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
    ra_put(fs->ra, span, n);
}

/* A raw write's size: -errno to fail it, shorter at the end of the
 * export. */
static ssize_t raw_write_size(struct fs *fs, struct fs_fh *fh, size_t size,
                              off_t off)
{
    if (off < 0 || (uint64_t) off >= fs->export_size) {
        if (size == 0)
            return 0;
        log_notice("write of %zu bytes at offset %jd is past the end of the "
                   "export (%" PRIu64 " bytes)", size, (intmax_t) off,
                   fs->export_size);
        return -ENOSPC;
    }
    /* A write that fails later is reported at close or fsync; once one
     * has failed, later writes through this handle fail at once. */
    int err = pool_error_peek(fs->pool, &fh->err_seq);
    if (err)
        return -err;
    if (size > fs->export_size - (uint64_t) off)
        size = (size_t) (fs->export_size - (uint64_t) off);  /* short */
    return (ssize_t) size;
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
                     size_t size, off_t off, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_fh *fh = fh_of(fi);

    mark_wrote(fh);
    if (ino == FS_INO_VHD || ino == FS_INO_VMDK) {
        ssize_t n = off < 0 ? -EINVAL
                    : ino == FS_INO_VMDK
                    ? vmdkview_write(fs, fh, buf, size, (uint64_t) off)
                    : vhdview_write(fs, fh, buf, size, (uint64_t) off);
        if (n < 0)
            fuse_reply_err(req, (int) -n);
        else
            fuse_reply_write(req, (size_t) n);
        return;
    }
    pthread_rwlock_rdlock(&fs->size_lock);
    ssize_t n = raw_write_size(fs, fh, size, off);
    if (n <= 0) {
        pthread_rwlock_unlock(&fs->size_lock);
        if (n < 0)
            fuse_reply_err(req, (int) -n);
        else
            fuse_reply_write(req, 0);
        return;
    }
    size = (size_t) n;
    ssize_t r = pool_write(fs->pool, (uint64_t) off, buf, size);
    if (r < 0) {
        pthread_rwlock_unlock(&fs->size_lock);
        fuse_reply_err(req, (int) -r);
        return;
    }
    ra_invalidate(fs->ra, (uint64_t) off, size);
    extend_to(fs, (uint64_t) off + size);
    pthread_rwlock_unlock(&fs->size_lock);
    digest_write(fs->digest, (uint64_t) off, buf, size);   /* copies */
    progress_write(fs->progress, (uint64_t) off, size);
    fuse_reply_write(req, size);
}

/* ---- writes into reserved pool buffers -------------------------------
 * write_buf gets the payload where libfuse read it (memory; a pipe fd if
 * splicing were on) and fuse_buf_copy() moves it straight into the pool
 * buffers reserved for it: the only copy the daemon makes in user space.
 * The inline digest then hashes those pool buffers in place (holds)
 * instead of a copy of its own. */

/* Move size bytes of src into the reserved segments.  0 or -errno. */
static int fill_from(struct pool_fill *f, struct fuse_bufvec *src)
{
    union {                       /* a bufvec of POOL_FILL_SEGS buffers */
        struct fuse_bufvec v;
        char room[sizeof(struct fuse_bufvec) +
                  (POOL_FILL_SEGS - 1) * sizeof(struct fuse_buf)];
    } dst = { .v = { .count = f->nseg } };
    size_t done = 0;
    /* buf[] is declared with one element and used as a flexible array:
     * index it through a pointer (an index on the array type is out of
     * bounds for UBSan). */
    struct fuse_buf *b = dst.v.buf;

    for (unsigned i = 0; i < f->nseg; i++)
        b[i] = (struct fuse_buf) { .size = f->seg[i].len,
                                   .mem = f->seg[i].mem };
    /* fuse_buf_copy() stops at a short read; it advances both vectors,
     * so calling it again goes on where it stopped. */
    while (done < f->len) {
        ssize_t n = fuse_buf_copy(&dst.v, src, 0);
        if (n < 0)
            return (int) n;
        if (n == 0)
            return -EIO;
        done += (size_t) n;
    }
    return 0;
}

/* The digest reads each pool buffer in place until it lets go. */
static void digest_holds(struct fs *fs, const struct pool_fill *f)
{
    for (unsigned i = 0; i < f->nhold; i++)
        digest_write_held(fs->digest, f->hold[i].off, f->hold[i].mem,
                          f->hold[i].len, pool_hold_release, f->hold[i].ref);
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
    struct fs *fs = fs_of(req);
    struct pool_fill f;

    mark_wrote(fh_of(fi));
    if (ino != FS_INO_RAW) {
        write_buf_copied(req, ino, bufv, off, fi);
        return;
    }
    pthread_rwlock_rdlock(&fs->size_lock);
    ssize_t size = raw_write_size(fs, fh_of(fi), fuse_buf_size(bufv), off);
    if (size <= 0) {
        pthread_rwlock_unlock(&fs->size_lock);
        if (size < 0)
            fuse_reply_err(req, (int) -size);
        else
            fuse_reply_write(req, 0);
        return;
    }
    int r = pool_fill_begin(fs->pool, (uint64_t) off, (size_t) size, &f);
    if (r == -EAGAIN) {
        pthread_rwlock_unlock(&fs->size_lock);  /* op_write() takes it */
        write_buf_copied(req, ino, bufv, off, fi);
        return;
    }
    if (r == 0)
        r = (int) pool_fill_commit(fs->pool, &f, fill_from(&f, bufv),
                                   fs->digest != NULL);
    if (r < 0) {
        pthread_rwlock_unlock(&fs->size_lock);
        fuse_reply_err(req, -r);
        return;
    }
    ra_invalidate(fs->ra, (uint64_t) off, (uint64_t) size);
    extend_to(fs, (uint64_t) off + (uint64_t) size);
    pthread_rwlock_unlock(&fs->size_lock);
    digest_holds(fs, &f);
    progress_write(fs->progress, (uint64_t) off, (size_t) size);
    fuse_reply_write(req, (size_t) size);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
                         off_t len, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    bool keep_size = mode & FALLOC_FL_KEEP_SIZE;
    int kind = mode & ~FALLOC_FL_KEEP_SIZE;

    mark_wrote(fh_of(fi));

    if ((ino == FS_INO_VHD || ino == FS_INO_VMDK) && off >= 0 && len > 0 &&
        (mode & ~FALLOC_FL_KEEP_SIZE) != 0) {
        /* cp --sparse=always punches the holes it skipped: zeros of the
         * VHD or VMDK file. */
        int r = ino == FS_INO_VMDK
                ? vmdkview_hole(fs, fh_of(fi), (uint64_t) off, (uint64_t) len)
                : vhdview_hole(fs, fh_of(fi), (uint64_t) off, (uint64_t) len);
        fuse_reply_err(req, r < 0 ? -r : 0);
        return;
    }
    if (ino != FS_INO_RAW || off < 0 || len <= 0) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (fs->readonly) {
        fuse_reply_err(req, EROFS);
        return;
    }
    if (kind != 0 && kind != FALLOC_FL_PUNCH_HOLE &&
        kind != FALLOC_FL_ZERO_RANGE) {
        fuse_reply_err(req, EOPNOTSUPP);
        return;
    }
    uint64_t start = (uint64_t) off, end = start + (uint64_t) len;
    if (end < start || (!keep_size && end > fs->export_size)) {
        fuse_reply_err(req, ENOSPC);
        return;
    }
    if (end > fs->export_size)
        end = fs->export_size;    /* keep-size: nothing exists past it */
    pthread_rwlock_rdlock(&fs->size_lock);
    if (kind != 0 && start < end) {
        int r = pool_zero(fs->pool, start, end - start);   /* write-zeroes */
        ra_invalidate(fs->ra, start, end - start);  /* even if it failed */
        if (r < 0) {
            pthread_rwlock_unlock(&fs->size_lock);
            fuse_reply_err(req, -r);
            return;
        }
    }
    extend_to(fs, keep_size ? 0 : end);
    pthread_rwlock_unlock(&fs->size_lock);
    if (kind != 0 && start < end) {
        digest_zero(fs->digest, start, end - start, apparent_size(fs));
        progress_zero(fs->progress, start, end - start);
    }
    fuse_reply_err(req, 0);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
                     struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);

    if (ino != FS_INO_RAW || (whence != SEEK_DATA && whence != SEEK_HOLE)) {
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (off < 0) {
        fuse_reply_err(req, ENXIO);
        return;
    }
    int64_t r = pool_seek(fs->pool, (uint64_t) off, whence, apparent_size(fs));
    if (r < 0)
        fuse_reply_err(req, (int) -r);
    else
        fuse_reply_lseek(req, (off_t) r);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    struct fs *fs = fs_of(req);
    struct statvfs sv = { 0 };
    uint64_t used = apparent_size(fs);

    sv.f_bsize = FS_BLKSIZE;
    sv.f_frsize = 4096;
    sv.f_blocks = fs->export_size / 4096;
    sv.f_bfree = sv.f_bavail = (fs->export_size - used) / 4096;
    sv.f_files = 2;
    sv.f_ffree = 0;
    sv.f_namemax = 255;
    fuse_reply_statfs(req, &sv);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    /* 1 MiB requests (libfuse negotiates max_pages to match). */
    conn->max_write = 1u << 20;
    conn->max_readahead = 1u << 20;
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
        conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    /* No async direct I/O: the kernel would split one large write into
     * requests served in parallel, out of file order, and the VHD view's
     * decoder needs file order. */
    conn->want &= ~FUSE_CAP_ASYNC_DIO;
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;  /* we are the write-back */
    /* No splice (libfuse asks for SPLICE_READ by default once write_buf
     * exists).  Our writes are direct I/O, and the kernel copies
     * direct-I/O pages into the pipe ("can't control lifetime of pipe
     * buffers"): splicing trades read()'s copy for the kernel's copy
     * into the pipe plus a pipe read, measured no cheaper.  It also
     * needs a pipe of a whole request (1 MiB + header), more than
     * pipe-max-size allows without CAP_SYS_RESOURCE, so it would run
     * only for some users: one path, the tested one.  SPLICE_MOVE only
     * moves pages of replies; SPLICE_WRITE is for reads. */
    conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_MOVE);
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
