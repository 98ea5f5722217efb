/* fs/modes.c: the two nbdfuse-compatible mount modes, as a layer over
 * fs_ops (fs/ops.c) so that the file semantics stay in one place:
 *
 * file mode   the mountpoint is an existing regular file and the disk
 *             appears over it (nbdfuse 1.6+).  The kernel then addresses
 *             the disk as the root inode: it is mapped to the raw file's.
 *             No directory, so no FILENAME.vhd and no status file.
 * block_device  nbdfuse's block-device semantics: O_TRUNC and truncate
 *             leave the disk and the size alone (the file is always the
 *             whole export), for patching a sector in place with dd.
 *
 * THREAD MODEL: as fs/ops.c; these handlers only rewrite arguments. */
#include "fs/fs.h"

#include <errno.h>
#include <fcntl.h>

static fuse_ino_t map(fuse_req_t req, fuse_ino_t ino)
{
    const struct fs *fs = fuse_req_userdata(req);
    return fs->cfg.file_mode && ino == FS_INO_ROOT ? FS_INO_RAW : ino;
}

static void m_getattr(fuse_req_t req, fuse_ino_t ino,
                      struct fuse_file_info *fi)
{
    fs_ops.getattr(req, map(req, ino), fi);
}

static void m_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
                      int to_set, struct fuse_file_info *fi)
{
    const struct fs *fs = fuse_req_userdata(req);

    ino = map(req, ino);
    if (fs->cfg.block_device && fs_ino_slot(ino) == FS_INO_RAW)
        to_set &= ~FUSE_SET_ATTR_SIZE;    /* a disk keeps its size */
    fs_ops.setattr(req, ino, attr, to_set, fi);
}

static void m_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    const struct fs *fs = fuse_req_userdata(req);

    if (fs->cfg.file_mode)
        fuse_reply_err(req, ENOTDIR);
    else
        fs_ops.lookup(req, parent, name);
}

static void m_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    fs_ops.readdir(req, map(req, ino), size, off, fi);
}

static void m_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    const struct fs *fs = fuse_req_userdata(req);

    ino = map(req, ino);
    if (fs->cfg.block_device && fs_ino_slot(ino) == FS_INO_RAW)
        fi->flags &= ~O_TRUNC;            /* as nbdfuse: ignored */
    fs_ops.open(req, ino, fi);
}

static void m_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info *fi)
{
    fs_ops.read(req, map(req, ino), size, off, fi);
}

static void m_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
                    size_t size, off_t off, struct fuse_file_info *fi)
{
    fs_ops.write(req, map(req, ino), buf, size, off, fi);
}

static void m_write_buf(fuse_req_t req, fuse_ino_t ino,
                        struct fuse_bufvec *bufv, off_t off,
                        struct fuse_file_info *fi)
{
    fs_ops.write_buf(req, map(req, ino), bufv, off, fi);
}

static void m_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    fs_ops.flush(req, map(req, ino), fi);
}

static void m_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
                    struct fuse_file_info *fi)
{
    fs_ops.fsync(req, map(req, ino), datasync, fi);
}

static void m_release(fuse_req_t req, fuse_ino_t ino,
                      struct fuse_file_info *fi)
{
    fs_ops.release(req, map(req, ino), fi);
}

static void m_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
                        off_t len, struct fuse_file_info *fi)
{
    fs_ops.fallocate(req, map(req, ino), mode, off, len, fi);
}

static void m_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
                    struct fuse_file_info *fi)
{
    fs_ops.lseek(req, map(req, ino), off, whence, fi);
}

void fs_mode_ops(struct fuse_lowlevel_ops *out)
{
    *out = fs_ops;
    out->getattr = m_getattr;
    out->setattr = m_setattr;
    out->lookup = m_lookup;
    out->readdir = m_readdir;
    out->open = m_open;
    out->read = m_read;
    out->write = m_write;
    out->write_buf = m_write_buf;
    out->flush = m_flush;
    out->fsync = m_fsync;
    out->release = m_release;
    out->fallocate = m_fallocate;
    out->lseek = m_lseek;
}
