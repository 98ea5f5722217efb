/* fs/rawfile.c: the raw file: its size, its time and every change of the
 * disk, with the watchers notified here and nowhere else (fs/rawfile.h).
 *
 * THREAD MODEL: see fs/rawfile.h.  No lock is held across a
 * fuse_reply_*() (nothing here replies); d->size_lock may be held across
 * a pool call that waits for a buffer (the writer is throttled). */
#include "fs/rawfile-int.h"       /* every header this file uses */

uint64_t rawfile_size(struct fs_disk *d)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    uint64_t s = d->apparent_size;
    return s;
}

/* ---- the times ---------------------------------------------------------- */

/* THE TIMES
 * rsync -a's quick check skips a file whose size and mtime equal the
 * source's; cp -u copies only a newer source.  So the mtime must never
 * make a changed source look unchanged:
 * - Until the disk changes or a time is set, mtime and atime are 0, the
 *   epoch.  The mount does not know when the disk last changed (an
 *   earlier mount, another writer), and its own start is no answer: a
 *   source changed in the same second has that mtime, and on an export
 *   of the source's size rsync skipped it.  Only a source
 *   whose own mtime is the epoch matches.
 * - Every change of the disk's size or bytes, through any of its files
 *   (a write, a zeroing, a truncate, an image's decoded data), stamps
 *   mtime, atime and ctime with its time and counts in d->changes.
 * - utimensat(2) on any of its files (rsync -a, cp -p, touch: fs/ops.c)
 *   sets mtime and atime as asked (a time, now, or UTIME_OMIT: left as
 *   it is) and ctime to now, and marks the mtime set until the next
 *   change.  It changes nothing else, d->changes included: a cache of
 *   what the disk holds (views/synthcache.c) keys on d->changes, never on
 *   a time anyone can set back.
 * - ctime is the mount's start until then.  Reads are not tracked (as
 *   noatime): atime is the mtime unless utimensat set it since.
 * - A deferred truncate dropped puts back the times it stamped over.
 * The times last for the mount's life; rawfile_stored_mtime() and
 * rawfile_set_mtime() let a record kept across mounts carry a set one.
 * Under d->fs->lock. */

void rawfile_init_times(struct fs_disk *d)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    d->times = (struct fs_times) { .ctime = d->cfg->started };
}

/* The disk changed: now is its time.  Caller holds d->fs->lock. */
static void stamp_locked(struct fs_disk *d)
{
    struct timespec now;

    clock_gettime(CLOCK_REALTIME, &now);
    d->times = (struct fs_times) { .mtime = now, .atime = now, .ctime = now };
    d->changes++;
}

uint64_t rawfile_stat(struct fs_disk *d, struct stat *st)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    st->st_mtim = d->times.mtime;
    st->st_atim = d->times.atime;
    st->st_ctim = d->times.ctime;
    return d->apparent_size;
}

uint64_t rawfile_changes(struct fs_disk *d)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    return d->changes;
}

void rawfile_set_times(struct fs_disk *d, const struct timespec *mtime,
                       const struct timespec *atime)
{
    struct timespec now;

    clock_gettime(CLOCK_REALTIME, &now);
    LOCK_FOR_SCOPE(&d->fs->lock);
    if (mtime) {
        d->times.mtime = *mtime;
        d->times.set = true;
    }
    if (atime)
        d->times.atime = *atime;
    d->times.ctime = now;
}

void rawfile_stored_mtime(struct fs_disk *d, struct timespec *mtime,
                          bool *is_set)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    *mtime = d->times.mtime;
    *is_set = d->times.set;
}

void rawfile_set_mtime(struct fs_disk *d, const struct timespec *mtime)
{
    rawfile_set_times(d, mtime, mtime);
}

/* ---- the size ----------------------------------------------------------- */

/* Set the size and stamp the time; returns the old size.  Caller holds
 * size_lock exclusive. */
static uint64_t set_size(struct fs_disk *d, uint64_t size)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    uint64_t old = d->apparent_size;
    d->apparent_size = size;
    stamp_locked(d);
    return old;
}

/* The disk changed up to end: grow the size to cover it (0: keep it) and
 * stamp the time, in one lock round (once per FUSE request). */
void rf_extend_to(struct fs_disk *d, uint64_t end)
{
    LOCK_FOR_SCOPE(&d->fs->lock);
    if (end > d->apparent_size)
        d->apparent_size = end;
    stamp_locked(d);
}

/* Bytes [off, off + len) will read as zero, lazily; readers must not see
 * the old bytes from the read-ahead. */
static int cut(struct fs_disk *d, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 0;
    warm_cut(d, off, len);        /* entries kept until the drain */
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

/* THE DEFERRED TRUNCATE
 * A truncate that shrinks the file (O_TRUNC, qemu-img's ftruncate to 0)
 * sets the size at once, but the disk is not changed until what replaces
 * its content is known: a failed copy must leave a disk that had landed
 * as it was (qemu-img truncates to 0, then to the image's size, which
 * may be past the export).  The handle that truncated owns the deferred
 * truncate; it is carried out (the old bytes past the size pending
 * zero, the digest's new pass) by the first change of the disk (a
 * write, a fallocate, a view's data: whoever makes it), a truncate that
 * grows the file or comes from another handle, an fsync of the owner, or
 * the owner's clean close; it is dropped (the size and time restored,
 * logged) by the owner's close once a request through it failed (EFBIG,
 * ENOSPC: rawfile_failed()), or its release without a close.  Reads
 * never see the old bytes: they end at the size.  A truncate with no
 * handle (truncate(2) by path) is carried out at once, as is one that
 * grows the file (the bytes between must read as zero).  The progress
 * starts the copy's pass at once: it counts the copy, not the disk.
 * With a manifest that holds data (a warm migration's later pass,
 * fs/warm.h), the owner's clean close keeps it deferred (dd closes its
 * first descriptor right after the open; carried out then, its zeroing
 * would destroy what the copy's unchanged writes need not send), and
 * the owner's release carries it out instead of dropping it. */

static void drain_zeroes(struct fs_disk *d);

static bool deferred(struct fs_disk *d)
{
    return __atomic_load_n(&d->trunc_owner, __ATOMIC_ACQUIRE) != 0;
}

/* Carry out the deferred truncate, if any.  Caller holds size_lock
 * exclusive. */
static int carry_out_locked(struct fs_disk *d)
{
    if (!d->trunc_owner)
        return 0;
    __atomic_store_n(&d->trunc_owner, 0, __ATOMIC_RELEASE);
    uint64_t size = rawfile_size(d), old = d->trunc_old;
    digest_truncate(d->digest, size, old);     /* size 0: a new pass */
    /* Bytes past the old size already read as zero, but where a zeroing
     * (or a write) failed: those are zeroed again. */
    int r = size < old ? cut(d, size, old - size) : 0;
    if (r == 0)
        r = rezero_damage(d, size);
    return r;
}

/* THE CHANGE COUNT
 * A reader of a format view reads the disk as it was at its open, or
 * fails (views/imageview.c, THE SNAPSHOT): it keeps the disk's allocation,
 * not its bytes, so it must know whether the disk changed since.  Every
 * change of the disk, its size included, holds size_lock (shared or
 * exclusive) for as long as it lasts, so taking it for a change counts
 * one more begun (d->changes_begun, before the change can be seen) and
 * releasing it one more done (d->changes_done, once it can).  A
 * snapshot taken while begun equals done (no change in progress) holds
 * while begun has not moved: a read whose bytes include a change sees
 * begun moved when it checks after reading them (sequentially
 * consistent atomics, and the pool's lock between the change and the
 * read).  Counted generously: a change that fails after taking the lock
 * counts too, which fails a view reader that did not need to. */

static void change_begin(struct fs_disk *d)
{
    __atomic_add_fetch(&d->changes_begun, 1, __ATOMIC_SEQ_CST);
}

static void change_end(struct fs_disk *d)
{
    __atomic_add_fetch(&d->changes_done, 1, __ATOMIC_SEQ_CST);
}

bool rawfile_change_count(struct fs_disk *d, uint64_t *count)
{
    uint64_t done = __atomic_load_n(&d->changes_done, __ATOMIC_SEQ_CST);
    *count = __atomic_load_n(&d->changes_begun, __ATOMIC_SEQ_CST);
    return *count == done;
}

bool rawfile_changed_since(struct fs_disk *d, uint64_t count)
{
    return __atomic_load_n(&d->changes_begun, __ATOMIC_SEQ_CST) != count;
}

/* size_lock exclusive for a change (the scope's end: done, unlocked). */
struct fs_disk *rf_change_wrlock(struct fs_disk *d)
{
    pthread_rwlock_wrlock(&d->size_lock);
    change_begin(d);
    return d;
}

void rf_change_unlock(struct fs_disk **d)
{
    if (!*d)
        return;
    change_end(*d);
    pthread_rwlock_unlock(&(*d)->size_lock);
}


int rf_carry_out(struct fs_disk *d)
{
    if (!deferred(d))
        return 0;
    CHANGE_WRLOCK_FOR_SCOPE(d);
    return carry_out_locked(d);
}

/* size_lock shared for a change, with no truncate deferred (a change
 * carries it out first; one deferred meanwhile is carried out too).
 * *err: the zeroing's -errno, else untouched; the lock is held either
 * way. */
struct fs_disk *rf_settled_rdlock(struct fs_disk *d, int *err)
{
    for (;;) {
        cleanup_rdlock(&d->size_lock);
        if (!deferred(d)) {
            change_begin(d);
            return d;
        }
        pthread_rwlock_unlock(&d->size_lock);
        int r = rf_carry_out(d);
        if (r < 0)
            *err = r;
    }
}


/* Drop the owner's deferred truncate: the disk was not changed.  Caller
 * holds size_lock exclusive and checked the owner. */
static void drop_locked(struct fs_disk *d, struct fs_fh *fh, const char *why)
{
    uint64_t size;
    {
        LOCK_FOR_SCOPE(&d->fs->lock);
        size = d->apparent_size;
        d->apparent_size = d->trunc_old;
        d->times = d->trunc_times;
        d->changes++;             /* the size changed back */
    }
    __atomic_store_n(&d->trunc_owner, 0, __ATOMIC_RELEASE);
    log_notice("%s: the truncate to %" PRIu64 " bytes by pid %d (%s) was "
               "not carried out (%s, nothing written): the disk is left as "
               "it was (%" PRIu64 " bytes)", d->view_name[FS_INO_RAW], size,
               (int) fh->tgid, fh->comm, why, d->trunc_old);
}

/* Defer a truncate to size (no larger than the size now) by fh. */
static void defer_locked(struct fs_disk *d, struct fs_fh *fh, uint64_t size)
{
    if (!d->trunc_owner) {
        LOCK_FOR_SCOPE(&d->fs->lock);
        d->trunc_old = d->apparent_size;
        d->trunc_times = d->times;
    }
    __atomic_store_n(&d->trunc_failed, false, __ATOMIC_RELAXED);
    __atomic_store_n(&d->trunc_owner, fh->serial, __ATOMIC_RELEASE);
    set_size(d, size);
}

int rawfile_truncate(struct fs_disk *d, struct fs_fh *fh, uint64_t size)
{
    if (size > d->export_size)
        return too_big(d, size, "truncate");
    CHANGE_WRLOCK_FOR_SCOPE(d);
    bool defer = fh && size <= rawfile_size(d);
    /* Another's deferred truncate, or one this truncate grows past (the
     * bytes between must read as zero): carried out first. */
    int r = defer && d->trunc_owner == fh->serial ? 0 : carry_out_locked(d);
    if (r < 0)
        return r;
    progress_truncate(d->progress, size);   /* size 0: the copy's pass */
    if (defer) {
        defer_locked(d, fh, size);
        return 0;
    }
    uint64_t old = set_size(d, size);
    digest_truncate(d->digest, size, old);
    r = size < old ? cut(d, size, old - size) : 0;
    if (r == 0)
        r = rezero_damage(d, size);
    return r;
}

int rawfile_replace(struct fs_disk *d, uint64_t size)
{
    if (size > d->export_size)
        return too_big(d, size, "replacing the disk");
    CHANGE_WRLOCK_FOR_SCOPE(d);
    int r = carry_out_locked(d);
    if (r < 0)
        return r;
    uint64_t old = set_size(d, size);
    /* A new pass over a disk of size bytes that reads as zero: the view's
     * decoded data and zeroes follow (rawfile_place*()). */
    digest_replace(d->digest, size);
    r = cut(d, 0, old);
    if (r == 0)
        r = rezero_damage(d, 0);
    return r;
}

int rawfile_close_truncate(struct fs_disk *d, struct fs_fh *fh, bool *dropped)
{
    *dropped = false;
    if (!fh || __atomic_load_n(&d->trunc_owner, __ATOMIC_ACQUIRE) !=
               fh->serial)
        return 0;
    CHANGE_WRLOCK_FOR_SCOPE(d);
    if (d->trunc_owner != fh->serial)
        return 0;
    /* Nothing written through this handle at all, and the manifest
     * holds data the copy may find unchanged (dd closes its first
     * descriptor right after the open): still deferred; the release
     * carries it out.  A handle that wrote and then truncated (rsync
     * --inplace's ftruncate at the end) is done: carried out now, so the
     * close's drain zeroes what lies past the new size. */
    if (!__atomic_load_n(&d->trunc_failed, __ATOMIC_RELAXED) &&
        !__atomic_load_n(&fh->wrote_data, __ATOMIC_RELAXED) &&
        warm_keeps_truncate(d)) {
        fh->trunc_kept = true;
        return 0;
    }
    if (!__atomic_load_n(&d->trunc_failed, __ATOMIC_RELAXED))
        return carry_out_locked(d);
    drop_locked(d, fh, "a request of the same copy failed");
    *dropped = true;
    return 0;
}

void rawfile_release_truncate(struct fs_disk *d, struct fs_fh *fh)
{
    if (__atomic_load_n(&d->trunc_owner, __ATOMIC_ACQUIRE) != fh->serial)
        return;
    bool carried = false;
    {
        CHANGE_WRLOCK_FOR_SCOPE(d);
        if (d->trunc_owner != fh->serial)
            return;
        if (fh->trunc_kept && !__atomic_load_n(&d->trunc_failed,
                                               __ATOMIC_RELAXED))
            carried = carry_out_locked(d) == 0;
        else
            drop_locked(d, fh, "released without a close");
    }
    /* Closed cleanly: carried out and sent now (outside the size lock),
     * not left pending until somebody's next drain.  An error of it is
     * damage, which every later close and fsync reports (told()). */
    if (carried)
        drain_zeroes(d);
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
void rf_changed(struct fs_disk *d, uint64_t off, uint64_t len, bool grow)
{
    ra_invalidate(d->ra, off, len);
    rf_extend_to(d, grow ? off + len : 0);
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
    struct digest_known known = { .n = 0 };
    /* A refused write (past the end, an image file: nothing queued)
     * leaves a deferred truncate alone. */
    ssize_t n = write_size(d, fh, size, off);
    if (n > 0 && foreign_raw_check(d, fh, off, buf, (size_t) n) < 0)
        n = -EMEDIUMTYPE;
    if (n <= 0)
        return n;
    {
        int err = 0;
        SETTLED_RDLOCK_FOR_SCOPE(d, &err);
        n = err ? err : write_size(d, fh, size, off);
        if (n > 0) {
            /* Only what changed is sent (fs/warm.c, THE SKIP). */
            ssize_t r = warm_write(d, off, buf, (size_t) n, &known);
            if (r < 0)
                n = r;
        }
        if (n > 0)
            rf_changed(d, off, (uint64_t) n, true);
    }
    if (n > 0) {
        land_note(d, off, off + (uint64_t) n);
        foreign_raw_write(d, off, buf, (size_t) n);
        digest_write(d->digest, off, buf, (size_t) n, &known);   /* copies */
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

/* The digest reads each pool buffer in place until it lets go; known:
 * the digests warm_record() is making of the write's blocks. */
void rf_digest_holds(struct fs_disk *d, const struct pool_fill *f,
                     const struct digest_known *known)
{
    for (unsigned i = 0; i < f->nhold; i++)
        digest_write_held(d->digest, f->hold[i].off, f->hold[i].mem,
                          f->hold[i].len, pool_hold_release, f->hold[i].ref,
                          known);
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

    ssize_t n = write_size(d, fh, size, off);
    if (n >= 0 && (size_t) n != size)
        n = -EAGAIN;              /* short or empty: the usual path says so */
    if (n > 0 && foreign_raw_check(d, fh, off, d->land.mem, (size_t) n) < 0)
        n = -EMEDIUMTYPE;         /* not committed: the disk keeps it */
    if (n > 0 && !warm_zero_copy_ok(d, off, (size_t) n))
        n = -EAGAIN;              /* the manifest's blocks: copied, hashed */
    if (n <= 0)
        return n;                 /* a deferred truncate left alone */
    {
        int err = 0;
        SETTLED_RDLOCK_FOR_SCOPE(d, &err);
        n = err ? err : write_size(d, fh, size, off);
        if (n >= 0 && (size_t) n != size)
            n = -EAGAIN;
        if (n > 0)
            foreign_raw_write(d, off, d->land.mem, (size_t) n);
        if (n > 0)
            n = pool_land_commit(d->pool, &d->land, off, (size_t) n,
                                 d->digest != NULL || warm_wants_holds(d),
                                 &f);
        if (n > 0)
            rf_changed(d, off, (uint64_t) n, true);
    }
    if (n > 0) {
        land_note(d, off, off + (uint64_t) n);
        struct digest_known known = { .later =
                                            warm_record(d, off, (uint64_t) n, &f) };
        rf_digest_holds(d, &f, &known);
        if (known.later)
            known.later->put(known.later);
        progress_write(d->progress, off, (uint64_t) n);
    }
    return n;
}

ssize_t rawfile_write_bufv(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                           struct fuse_bufvec *bufv)
{
    struct pool_fill f;

    /* The write at offset 0 is judged (an image file?) before anything
     * changes the disk, a deferred truncate included: that needs its
     * bytes, so it takes the copying path (once per copy). */
    if (off == 0 && !d->cfg->raw_images)
        return -EAGAIN;
    /* Blocks the manifest knows: hashed before anything is sent, on the
     * copying path (fs/warm.c, THE SKIP). */
    if (!warm_zero_copy_ok(d, off, fuse_buf_size(bufv)))
        return -EAGAIN;
    ssize_t size = write_size(d, fh, fuse_buf_size(bufv), off);
    int r = 0;
    if (size <= 0)
        return size;              /* a deferred truncate left alone */
    {
        SETTLED_RDLOCK_FOR_SCOPE(d, &r);
        size = r ? r : write_size(d, fh, fuse_buf_size(bufv), off);
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
                                       d->digest != NULL ||
                                       warm_wants_holds(d));
            if (r == -EAGAIN)
                r = -EIO;         /* not the caller's cue: bufv is spent */
        }
        if (r >= 0 && size > 0)
            rf_changed(d, off, (uint64_t) size, true);
    }
    if (r < 0)
        return r;                 /* -EAGAIN: the caller copies */
    if (size > 0) {
        land_note(d, off, off + (uint64_t) size);
        struct digest_known known = { .later =
                                            warm_record(d, off, (uint64_t) size, &f) };
        rf_digest_holds(d, &f, &known);
        if (known.later)
            known.later->put(known.later);
        progress_write(d->progress, off, (uint64_t) size);
    }
    return size;
}

int rawfile_zero(struct fs_disk *d, uint64_t start, uint64_t end, bool zero,
                 bool keep_size)
{
    int r = 0;

    {
        SETTLED_RDLOCK_FOR_SCOPE(d, &r);
        if (r == 0 && zero && start < end) {
            warm_zero_begin(d, start, end - start);
            r = pool_zero(d->pool, start, end - start);     /* write-zeroes */
            warm_zero_end(d, start, end - start);
            ra_invalidate(d->ra, start, end - start); /* even if it failed */
        }
        if (r == 0)
            rf_extend_to(d, keep_size ? 0 : end);
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

/* A drain that sends the truncates' pending zeroes: the manifest's cut
 * blocks become zero changes around it (fs/warm.h). */
static void drain_zeroes(struct fs_disk *d)
{
    warm_settle_begin(d);
    pool_drain(d->pool);
    warm_settle_end(d);
}

int rawfile_drain_end(struct fs_disk *d)
{
    drain_zeroes(d);
    return -pool_range_damage(d->pool);
}

int rawfile_drain(struct fs_disk *d, struct fs_fh *fh, bool wrote)
{
    if (wrote)
        drain_zeroes(d);
    return -told(d, fh);
}

int rawfile_fsync(struct fs_disk *d, struct fs_fh *fh)
{
    /* The owner's fsync makes its truncate durable (THE DEFERRED
     * TRUNCATE), unless a request of it failed: its close drops it. */
    int z = 0;
    if (fh && __atomic_load_n(&d->trunc_owner, __ATOMIC_ACQUIRE) ==
              fh->serial && !__atomic_load_n(&d->trunc_failed,
                                             __ATOMIC_RELAXED)) {
        CHANGE_WRLOCK_FOR_SCOPE(d);
        if (d->trunc_owner == fh->serial)
            z = carry_out_locked(d);
    }
    warm_settle_begin(d);
    int r = pool_flush(d->pool);
    warm_settle_end(d);
    if (z < 0)
        return z;
    int err = told(d, fh);
    return err ? -err : r < 0 ? -EIO : 0;
}
