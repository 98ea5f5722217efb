/* fs/rawfile-views.c: the raw file's changes made by the other views
 * (a format view's decoded data and zeroes, its pass, its writer): the
 * same rules as the raw file's own writes (fs/rawfile.c), the same
 * watchers.  THREAD MODEL: fs/rawfile.h. */
#include "fs/rawfile-int.h"

/* ---- other views' writes ------------------------------------------------ */

/* Copy len bytes of buf into the reserved segments. */
static void fill_copy(const struct pool_fill *f, const char *buf)
{
    for (unsigned i = 0; i < f->nseg; buf += f->seg[i++].len)
        memcpy(f->seg[i].mem, buf, f->seg[i].len);
}

/* The decoded bytes are copied once, into pool buffers, which the digest
 * then reads in place (as it does a raw write's); a write the pool cannot
 * reserve (write-through, too many buffers) goes through pool_write() and
 * the digest copies it. */
int rawfile_place(struct fs_disk *d, uint64_t off, const void *buf, size_t len)
{
    struct pool_fill f;
    int err = 0;
    ssize_t r;
    bool held;
    {
        SETTLED_RDLOCK_FOR_SCOPE(d, &err);
        r = err ? err : pool_fill_begin(d->pool, off, len, &f);
        held = r == 0;
        if (held) {
            fill_copy(&f, buf);
            r = pool_fill_commit(d->pool, &f, 0, d->digest != NULL);
        } else if (r == -EAGAIN)
            r = pool_write(d->pool, off, buf, len);
        if (r >= 0)
            rf_changed(d, off, len, true);
    }
    if (r >= 0 && held)
        rf_digest_holds(d, &f, NULL);
    else if (r >= 0)
        digest_write(d->digest, off, buf, len, NULL);    /* copies */
    return r < 0 ? (int) r : 0;
}

int rawfile_place_zero(struct fs_disk *d, uint64_t off, uint64_t len)
{
    int r = 0;
    {
        SETTLED_RDLOCK_FOR_SCOPE(d, &r);
        warm_zero_begin(d, off, len);
        r = r ? r : pool_zero(d->pool, off, len);
        warm_zero_end(d, off, len);
        ra_invalidate(d->ra, off, len);      /* even if it failed */
        if (r == 0)
            rf_extend_to(d, off + len);
    }
    if (r == 0)
        digest_zero(d->digest, off, len, rawfile_size(d));
    return r;
}

/* The handle whose copy the progress counts. */
static void set_pass(struct fs_disk *d, const struct fs_fh *fh)
{
    __atomic_store_n(&d->pass_fh, fh->serial, __ATOMIC_RELAXED);
}

static bool is_pass(struct fs_disk *d, const struct fs_fh *fh)
{
    return fh && fh->serial == __atomic_load_n(&d->pass_fh,
                                               __ATOMIC_RELAXED);
}

void rawfile_view_begin(struct fs_disk *d, struct fs_fh *fh, pid_t pid,
                        const char *what)
{
    /* The raw file's pass is over.  An image that replaces the disk
     * starts a new one (rawfile_replace()) that the decoded data feed; a
     * differencing image, applied over the old content, leaves it over.
     * A raw truncate still deferred (the same process) comes first. */
    rf_carry_out(d);                 /* its error: the next drain's */
    digest_foreign(d->digest, what);
    warm_forget_all(d);           /* views change blocks it does not follow */
    /* A new pass, counted in bytes of the view's file. */
    progress_truncate(d->progress, 0);
    progress_writer(d->progress, pid);
    set_pass(d, fh);
}

void rawfile_view_wrote(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                        uint64_t len)
{
    digest_barrier(d->digest);   /* the request's data are all placed */
    if (is_pass(d, fh))          /* not before begin: another's pass */
        progress_write(d->progress, off, len);
}

void rawfile_view_zeroed(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                         uint64_t len)
{
    digest_barrier(d->digest);
    if (is_pass(d, fh))
        progress_zero(d->progress, off, len);
}

void rawfile_view_length(struct fs_disk *d, uint64_t len)
{
    progress_vhd_length(d->progress, len);
}

void rawfile_view_close(struct fs_disk *d, uint64_t len)
{
    digest_close(d->digest, rawfile_size(d));  /* the disk that landed */
    progress_close(d->progress, len);
}

/* The source is larger than the export: every change through this handle
 * fails with ENOSPC, and the disk is not touched (not even truncated). */
static void refuse_source(struct fs_disk *d, struct fs_fh *fh, pid_t pid,
                          const char *path, uint64_t size, long fdnum)
{
    log_err("%s: the writer, pid %d (%s), reads %s, %" PRIu64 " bytes, "
            "larger than the export (%" PRIu64 " bytes): its writes fail "
            "with ENOSPC and the disk is left as it was",
            d->view_name[FS_INO_RAW], (int) fh->tgid, fh->comm, path, size,
            d->export_size);
    __atomic_store_n(&fh->refused, ENOSPC, __ATOMIC_RELAXED);
    progress_truncate(d->progress, 0);       /* this copy's pass, failed */
    progress_set_source(d->progress, pid, size, fdnum);
    set_pass(d, fh);
    progress_fail(d->progress);
}

/* A source in an image format (qcow2 with snapshots, a compressed or
 * sparse container) may be larger than the disk it holds: its size says
 * nothing, the tool converts it.  Only a raw source is judged by size. */
static bool is_container(const char *path, uint64_t *disk_size)
{
    unsigned char sec[512];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    *disk_size = 0;
    if (fd == -1)
        return true;              /* cannot tell: do not refuse */
    ssize_t n = pread(fd, sec, sizeof sec, 0);
    close(fd);
    if (n < 0)
        return true;
    enum image_kind k = image_kind(sec, (size_t) n);
    if (k == IMAGE_QCOW2 && n >= 32)  /* its disk's size: big-endian, at 24 */
        for (int i = 24; i < 32; i++)
            *disk_size = *disk_size << 8 | sec[i];
    return k != IMAGE_UNKNOWN;
}

int rawfile_open_writer(struct fs_disk *d, struct fs_fh *fh, pid_t pid,
                        bool trunc)
{
    char path[PATH_MAX];
    /* Before the open's truncate: the source decides whether there is
     * one.  Tools that open their input first (cp, dd, qemu-img) have it
     * open now; a shell redirection opens the file before the tool runs,
     * so the truncate has happened by the time the tool's writes fail. */
    long fdnum;
    uint64_t src = progress_source(d->progress, pid, path, sizeof path,
                                   &fdnum);
    uint64_t disk = 0;
    bool container = src && is_container(path, &disk);
    if (src > d->export_size && !container) {
        refuse_source(d, fh, pid, path, src, fdnum);
        return 0;
    }
    /* Where the copy ends (fs/ops.c, ends_copy()): a raw source's size,
     * a qcow2 source's disk size; other containers: unknown. */
    uint64_t end = container ? disk : src;
    if (end && end <= d->export_size)
        __atomic_store_n(&fh->copy_end, end, __ATOMIC_RELAXED);
    int r = trunc ? rawfile_truncate(d, fh, 0) : 0;     /* deferred */
    if (r < 0)
        return r;
    if (!trunc)
        progress_open(d->progress);
    set_pass(d, fh);
    progress_set_source(d->progress, pid, src, fdnum);
    foreign_raw_pass(d);
    return 0;
}


static void drop_deferred(struct fs_disk *d, struct fs_fh *fh, int err);

void rawfile_failed(struct fs_disk *d, struct fs_fh *fh, int err)
{
    if (err < 0 && fh && fh->writer && is_pass(d, fh))
        progress_fail(d->progress);
    drop_deferred(d, fh, err);
}

void rawfile_close_failed(struct fs_disk *d, struct fs_fh *fh, int err)
{
    if (fh && fs_fh_has_written(fh))
        rawfile_failed(d, fh, err);
    else
        drop_deferred(d, fh, err);
}

static void drop_deferred(struct fs_disk *d, struct fs_fh *fh, int err)
{
    if (err < 0 && fh && __atomic_load_n(&d->trunc_owner, __ATOMIC_ACQUIRE)
                             == fh->serial)
        __atomic_store_n(&d->trunc_failed, true, __ATOMIC_RELAXED);
}

