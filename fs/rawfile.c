/* fs/rawfile.c: the raw file: its size, its time and every change of the
 * disk, with the watchers notified here and nowhere else (fs/rawfile.h).
 *
 * THREAD MODEL: see fs/rawfile.h.  No lock is held across a
 * fuse_reply_*() (nothing here replies); d->size_lock may be held across
 * a pool call that waits for a buffer (the writer is throttled). */
#include "fs/rawfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <string.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "fs/digest.h"
#include "fs/foreign.h"
#include "fs/progress.h"
#include "transport/readahead.h"

uint64_t rawfile_size(struct fs_disk *d)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    uint64_t s = d->apparent_size;
    return s;
}

void rawfile_stat(struct fs_disk *d, uint64_t *size, struct timespec *mtime)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    *size = d->apparent_size;
    *mtime = d->mtime;
}

/* ---- the size ----------------------------------------------------------- */

/* Set the size and stamp the time; returns the old size.  Caller holds
 * size_lock exclusive. */
static uint64_t set_size(struct fs_disk *d, uint64_t size)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    uint64_t old = d->apparent_size;
    d->apparent_size = size;
    clock_gettime(CLOCK_REALTIME, &d->mtime);
    return old;
}

/* The disk changed up to end: grow the size to cover it (0: keep it) and
 * stamp the time, in one lock round (once per FUSE request). */
static void extend_to(struct fs_disk *d, uint64_t end)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    if (end > d->apparent_size)
        d->apparent_size = end;
    clock_gettime(CLOCK_REALTIME, &d->mtime);
}

/* Bytes [off, off + len) will read as zero, lazily; readers must not see
 * the old bytes from the read-ahead. */
static int cut(struct fs_disk *d, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 0;
    int r = pool_zero_lazy(d->pool, off, len);
    ra_invalidate(d->ra, off, len);
    return r;
}

/* Damage past the new size: zeroed again (the disk reads as zero there
 * once the zeroing lands, which repairs it). */
static int rezero_damage(struct fs_disk *d, uint64_t from)
{
    int r = pool_zero_damage(d->pool, from);
    ra_invalidate(d->ra, from, d->export_size - from);
    return r;
}

static int too_big(struct fs_disk *d, uint64_t size, const char *what)
{
    log_err("%s to %" PRIu64 " bytes refused: the export holds %" PRIu64,
               what, size, d->export_size);
    return -EFBIG;
}

int rawfile_truncate(struct fs_disk *d, uint64_t size)
{
    if (size > d->export_size)
        return too_big(d, size, "truncate");
    WRLOCK_FOR_SCOPE(&d->size_lock);
    uint64_t old = set_size(d, size);
    digest_truncate(d->digest, size, old);     /* size 0: a new pass */
    progress_truncate(d->progress, size);
    /* Bytes past the old size already read as zero, but where a zeroing
     * (or a write) failed: those are zeroed again. */
    int r = size < old ? cut(d, size, old - size) : 0;
    if (r == 0)
        r = rezero_damage(d, size);
    return r;
}

int rawfile_replace(struct fs_disk *d, uint64_t size)
{
    if (size > d->export_size)
        return too_big(d, size, "replacing the disk");
    WRLOCK_FOR_SCOPE(&d->size_lock);
    uint64_t old = set_size(d, size);
    /* A new pass over a disk of size bytes that reads as zero: the view's
     * decoded data and zeroes follow (rawfile_place*()). */
    digest_replace(d->digest, size);
    int r = cut(d, 0, old);
    if (r == 0)
        r = rezero_damage(d, 0);
    return r;
}

/* ---- the raw file's own writes ------------------------------------------ */

/* A raw write's size: -errno to fail it, shorter at the end of the
 * export. */
static ssize_t write_size(struct fs_disk *d, struct fs_fh *fh, size_t size,
                          uint64_t off)
{
    int refused = fh ? __atomic_load_n(&fh->refused, __ATOMIC_RELAXED) : 0;
    if (refused)
        return -refused;          /* said when refused */
    if (off >= d->export_size) {
        if (size == 0)
            return 0;
        log_err("write of %zu bytes at offset %" PRIu64 " is past the "
                   "end of the export (%" PRIu64 " bytes)", size, off,
                   d->export_size);
        return -ENOSPC;
    }
    /* A write that fails later is reported at close or fsync; once one
     * has failed, later writes through this handle fail at once. */
    int err = pool_error_peek(d->pool, &fh->err_seq);
    if (err)
        return -err;
    if (size > d->export_size - off)
        size = (size_t) (d->export_size - off);  /* short */
    return (ssize_t) size;
}

/* The content changed: drop read-ahead, cover it with the size.  Caller
 * holds size_lock shared. */
static void changed(struct fs_disk *d, uint64_t off, uint64_t len, bool grow)
{
    ra_invalidate(d->ra, off, len);
    extend_to(d, grow ? off + len : 0);
}

/* Where the next sequential write will start, and whether the next
 * landing should be a whole buffer, which takes a write anywhere, rather
 * than the tail of this write's buffer, which takes only the write right
 * after it.  A writer skipping holes (cp --sparse on a disk of scattered
 * data) jumps again soon, so a whole buffer follows a jump, and the
 * write after a jump too: the kernel splits a write from a buffer that
 * is not page-aligned into a large piece and a small one, and the small
 * one, though sequential, is still the end of the jump.  A guess only
 * (whoever served the write: fs.h), so relaxed atomics. */
static void land_note(struct fs_disk *d, uint64_t off, uint64_t end)
{
    uint64_t prev = __atomic_load_n(&d->land_next, __ATOMIC_RELAXED);
    bool jumped = off != prev;
    bool before = __atomic_exchange_n(&d->land_jumped, jumped,
                                      __ATOMIC_RELAXED);
    __atomic_store_n(&d->land_whole, jumped || before, __ATOMIC_RELAXED);
    __atomic_store_n(&d->land_next, end, __ATOMIC_RELAXED);
    __atomic_store_n(&d->land_skip, false, __ATOMIC_RELAXED);
}

ssize_t rawfile_write(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                      const void *buf, size_t size)
{
    ssize_t n;
    {
        RDLOCK_FOR_SCOPE(&d->size_lock);
        n = write_size(d, fh, size, off);
        if (n > 0 && foreign_raw_check(d, fh, off, buf, (size_t) n) < 0)
            n = -EMEDIUMTYPE;     /* an image file: nothing queued */
        if (n > 0) {
            ssize_t r = pool_write(d->pool, off, buf, (size_t) n);
            if (r < 0)
                n = r;
        }
        if (n > 0)
            changed(d, off, (uint64_t) n, true);
    }
    if (n > 0) {
        land_note(d, off, off + (uint64_t) n);
        foreign_raw_write(d, off, buf, (size_t) n);
        digest_write(d->digest, off, buf, (size_t) n);   /* copies */
        progress_write(d->progress, off, (uint64_t) n);
    }
    return n;
}

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
static void digest_holds(struct fs_disk *d, const struct pool_fill *f)
{
    for (unsigned i = 0; i < f->nhold; i++)
        digest_write_held(d->digest, f->hold[i].off, f->hold[i].mem,
                          f->hold[i].len, pool_hold_release, f->hold[i].ref);
}

void *rawfile_land_begin(struct fs_disk *d, size_t *room)
{
    if (d->readonly || __atomic_load_n(&d->land_skip, __ATOMIC_RELAXED) ||
        pool_land_begin(d->pool,
                        __atomic_load_n(&d->land_whole, __ATOMIC_RELAXED)
                            ? UINT64_MAX  /* no tail: a whole buffer */
                            : __atomic_load_n(&d->land_next, __ATOMIC_RELAXED),
                        FS_MAX_WRITE, d->land_streak, &d->land) < 0)
        return NULL;
    *room = d->land.room;
    return d->land.mem;
}

void rawfile_land_end(struct fs_disk *d)
{
    d->land_streak = d->land.used;
    pool_land_end(d->pool, &d->land);
}

void rawfile_land_skip(struct fs_disk *d)
{
    __atomic_store_n(&d->land_skip, true, __ATOMIC_RELAXED);
}

ssize_t rawfile_write_landed(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                             size_t size)
{
    struct pool_fill f;

    ssize_t n;
    {
        RDLOCK_FOR_SCOPE(&d->size_lock);
        n = write_size(d, fh, size, off);
        if (n >= 0 && (size_t) n != size)
            n = -EAGAIN;          /* short or empty: the usual path says so */
        if (n > 0 && foreign_raw_check(d, fh, off, d->land.mem,
                                       (size_t) n) < 0)
            n = -EMEDIUMTYPE;     /* not committed: the disk keeps it */
        if (n > 0)
            foreign_raw_write(d, off, d->land.mem, (size_t) n);
        if (n > 0)
            n = pool_land_commit(d->pool, &d->land, off, (size_t) n,
                                 d->digest != NULL, &f);
        if (n > 0)
            changed(d, off, (uint64_t) n, true);
    }
    if (n > 0) {
        land_note(d, off, off + (uint64_t) n);
        digest_holds(d, &f);
        progress_write(d->progress, off, (uint64_t) n);
    }
    return n;
}

ssize_t rawfile_write_bufv(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                           struct fuse_bufvec *bufv)
{
    struct pool_fill f;

    ssize_t size;
    int r;
    {
        RDLOCK_FOR_SCOPE(&d->size_lock);
        size = write_size(d, fh, fuse_buf_size(bufv), off);
        r = size <= 0 ? (int) size
                : pool_fill_begin(d->pool, off, (size_t) size, &f);
        if (r == 0 && size > 0) {
            int filled = fill_from(&f, bufv);
            /* An image file: the reservation is undone, nothing sent. */
            if (filled == 0 && f.nseg &&
                foreign_raw_check(d, fh, off, f.seg[0].mem, f.seg[0].len) < 0)
                filled = -EMEDIUMTYPE;
            if (filled == 0 && f.nseg)
                foreign_raw_write(d, off, f.seg[0].mem, f.seg[0].len);
            r = (int) pool_fill_commit(d->pool, &f, filled,
                                       d->digest != NULL);
            if (r == -EAGAIN)
                r = -EIO;         /* not the caller's cue: bufv is spent */
        }
        if (r >= 0 && size > 0)
            changed(d, off, (uint64_t) size, true);
    }
    if (r < 0)
        return r;                 /* -EAGAIN: the caller copies */
    if (size > 0) {
        land_note(d, off, off + (uint64_t) size);
        digest_holds(d, &f);
        progress_write(d->progress, off, (uint64_t) size);
    }
    return size;
}

int rawfile_zero(struct fs_disk *d, uint64_t start, uint64_t end, bool zero,
                 bool keep_size)
{
    int r = 0;

    {
        RDLOCK_FOR_SCOPE(&d->size_lock);
        if (zero && start < end) {
            r = pool_zero(d->pool, start, end - start);     /* write-zeroes */
            ra_invalidate(d->ra, start, end - start); /* even if it failed */
        }
        if (r == 0)
            extend_to(d, keep_size ? 0 : end);
    }
    if (r == 0 && zero && start < end) {
        digest_zero(d->digest, start, end - start, rawfile_size(d));
        progress_zero(d->progress, start, end - start);
    }
    return r;
}

void rawfile_close_pass(struct fs_disk *d)
{
    uint64_t size = rawfile_size(d);
    digest_close(d->digest, size);
    progress_close(d->progress, size);
}

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
    ssize_t r;
    bool held;
    {
        RDLOCK_FOR_SCOPE(&d->size_lock);
        r = pool_fill_begin(d->pool, off, len, &f);
        held = r == 0;
        if (held) {
            fill_copy(&f, buf);
            r = pool_fill_commit(d->pool, &f, 0, d->digest != NULL);
        } else if (r == -EAGAIN)
            r = pool_write(d->pool, off, buf, len);
        if (r >= 0)
            changed(d, off, len, true);
    }
    if (r >= 0 && held)
        digest_holds(d, &f);
    else if (r >= 0)
        digest_write(d->digest, off, buf, len);          /* copies */
    return r < 0 ? (int) r : 0;
}

int rawfile_place_zero(struct fs_disk *d, uint64_t off, uint64_t len)
{
    int r;
    {
        RDLOCK_FOR_SCOPE(&d->size_lock);
        r = pool_zero(d->pool, off, len);
        ra_invalidate(d->ra, off, len);      /* even if it failed */
        if (r == 0)
            extend_to(d, off + len);
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
     * differencing image, applied over the old content, leaves it over. */
    digest_foreign(d->digest, what);
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
    int r = trunc ? rawfile_truncate(d, 0) : 0;
    if (r < 0)
        return r;
    set_pass(d, fh);
    progress_set_source(d->progress, pid, src, fdnum);
    foreign_raw_pass(d);
    return 0;
}

void rawfile_failed(struct fs_disk *d, struct fs_fh *fh, int err)
{
    if (err < 0 && fh && fh->writer && is_pass(d, fh))
        progress_fail(d->progress);
}

/* ---- handles ------------------------------------------------------------ */

/* Every close and fsync of every handle (of the raw file and of the
 * views) fails while the disk holds damage (pool_damage()): a failure
 * told once is lost to a close nobody checks, such as the one a shell's
 * redirection or dd's dup2 makes.  A handle is first told of the
 * failures since it was last told (errseq), then of the damage left. */
static int told(struct fs_disk *d, struct fs_fh *fh)
{
    int err = pool_error_take(d->pool, &fh->err_seq);
    if (!err)
        err = pool_damage(d->pool);
    return err;
}

int rawfile_drain_end(struct fs_disk *d)
{
    pool_drain(d->pool);
    return -pool_range_damage(d->pool);
}

int rawfile_drain(struct fs_disk *d, struct fs_fh *fh, bool wrote)
{
    if (wrote)
        pool_drain(d->pool);
    return -told(d, fh);
}

int rawfile_fsync(struct fs_disk *d, struct fs_fh *fh)
{
    int r = pool_flush(d->pool);
    int err = told(d, fh);
    return err ? -err : r < 0 ? -EIO : 0;
}
