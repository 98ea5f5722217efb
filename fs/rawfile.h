/* fs/rawfile.h: the raw file, the disk seen as one file of an apparent
 * size (fs/rawfile.c).  The only code that changes the disk, its size or
 * its times: every view (fs/view.h) goes through here.
 *
 * It owns d->apparent_size, d->times, d->changes and d->size_lock, and
 * notifies the watchers of each change from one place: the read-ahead
 * (its chunks of a changed range are dropped), the digest (the raw
 * file's inline hash, with blkpass under it) and the progress (the pass
 * of the file being written, which for the VHD and VMDK views is their
 * file, not the disk; the digest follows the disk, the views' decoded
 * data included).
 *
 * Errors, the same for every view: a size past the export (truncate, a
 * view's disk replacing the content) is EFBIG; data past the export's end
 * is ENOSPC (a write, a fallocate that would grow the file).
 *
 * THREAD MODEL: the receive loop's threads (fs/fuseloop.c: its receiving
 * thread for writes and landings, a worker for a durable write and the
 * rest) and the format views' unpack threads (views/unpackers.h), which
 * place decoded data.
 * d->fs->lock guards the size and times (a leaf, never held across a pool
 * call).  d->size_lock is held shared from a change's check until the
 * size it extends is set, exclusive by a truncate or replace from the new
 * size until the cut-off bytes are pending zero.  Views take it after
 * their own lock, never the other way round. */
#pragma once
#include "fs/fs.h"

uint64_t rawfile_size(struct fs_disk *d);

/* ---- the times (fs/rawfile.c, THE TIMES) -------------------------------- */

/* Before the mount: mtime and atime 0 (the epoch: not known), ctime the
 * mount's start. */
void rawfile_init_times(struct fs_disk *d);
/* The times into st (st_mtim, st_atim, st_ctim), and the size, read
 * together: what every file of the disk shows. */
uint64_t rawfile_stat(struct fs_disk *d, struct stat *st);
/* Counts the changes of the disk's size or bytes, never of its times
 * alone: an equal count is the same disk, whatever the times say. */
uint64_t rawfile_changes(struct fs_disk *d);
/* utimensat(2) on any file of the disk: mtime and atime set as given
 * (NULL: left as they are), ctime now.  The mtime counts as set until
 * the next change of the disk. */
void rawfile_set_times(struct fs_disk *d, const struct timespec *mtime,
                       const struct timespec *atime);
/* For a record of the disk kept across mounts (the manifest): *is_set,
 * the mtime utimensat set and no change came after; else *is_set false
 * and *mtime the last change's (0: none in this mount). */
void rawfile_stored_mtime(struct fs_disk *d, struct timespec *mtime,
                          bool *is_set);
/* Such a record's mtime, at mount before any change: shown, and set, as
 * if utimensat had set it (atime too).  Only from a record the caller
 * trusts (nobody else wrote the export since): else the time stays 0. */
void rawfile_set_mtime(struct fs_disk *d, const struct timespec *mtime);

/* ---- the size ----------------------------------------------------------- */

/* truncate(2) and O_TRUNC: every byte beyond size must read as zero; the
 * bytes [size, old size) become pending zero, done lazily at the next
 * drain for the parts not written again meanwhile.  Size 0 starts a new
 * pass.  -EFBIG past the export.  A truncate through a handle fh that
 * does not grow the file is deferred: the size is set, the disk is not
 * changed until the copy is known (fs/rawfile.c, THE DEFERRED
 * TRUNCATE); fh NULL (by path): carried out at once. */
int rawfile_truncate(struct fs_disk *d, struct fs_fh *fh, uint64_t size);
/* close(2) of fh: its deferred truncate is carried out, or dropped if a
 * request through fh failed (*dropped: the disk, its size and time are
 * as before it, logged).  0 or the zeroing's -errno. */
int rawfile_close_truncate(struct fs_disk *d, struct fs_fh *fh, bool *dropped);
/* The release of fh: a truncate of it still deferred (no close came) is
 * dropped. */
void rawfile_release_truncate(struct fs_disk *d, struct fs_fh *fh);
/* A view's file replaces the disk's content by a disk of size bytes that
 * reads as zero until written (lazy zeroing).  -EFBIG past the export. */
int rawfile_replace(struct fs_disk *d, uint64_t size);

/* ---- the raw file's own writes (fs/rawview.c) --------------------------- */

/* write(2) of the raw file: -ENOSPC at or past the export's end, short at
 * it; the handle's sticky pool error once one happened.  Returns the
 * bytes written; the digest copies them. */
ssize_t rawfile_write(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                      const void *buf, size_t size);
/* The same from a FUSE buffer vector, moved straight into reserved pool
 * buffers that the digest then reads in place.  -EAGAIN: nothing done,
 * take rawfile_write() with a copy. */
ssize_t rawfile_write_bufv(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                           struct fuse_bufvec *bufv);
/* fallocate(2) over [start, end): write-zeroes if zero, then grow the
 * size to end unless keep_size.  The caller checked the range. */
/* The receive loop's landing (fs/fuseloop.h): where the next write's
 * payload goes, in the pool buffer it will be sent from.  begin returns
 * NULL when none is worth it; write serves a write whose payload landed
 * there (-EAGAIN: take rawfile_write_bufv() with a copy); end gives the
 * place back. */
void *rawfile_land_begin(struct fs_disk *d, size_t *room);
ssize_t rawfile_write_landed(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                             size_t size);
void rawfile_land_end(struct fs_disk *d);
/* A write to another view arrived: stop preparing landings until the raw
 * file is written again. */
void rawfile_land_skip(struct fs_disk *d);

int rawfile_zero(struct fs_disk *d, uint64_t start, uint64_t end, bool zero,
                 bool keep_size);
/* close(2) of a writer: the pass covers the file up to its size now. */
void rawfile_close_pass(struct fs_disk *d);

/* ---- other views' writes ------------------------------------------------ */

/* Decoded bytes of a view's file placed on the disk.  The caller checked
 * [off, off + len) lies within the export.  The digest reads the pool
 * buffers the bytes were copied into, or a copy of its own (after a
 * rawfile_replace() it is a pass over the decoded disk: blkhash in any
 * order, sha256 in disk order; rawfile_view_wrote() and _zeroed() end a
 * request: the digest's barrier). */
int rawfile_place(struct fs_disk *d, uint64_t off, const void *buf, size_t len);
int rawfile_place_zero(struct fs_disk *d, uint64_t off, uint64_t len);

/* The pass through a view's file (the progress counts its bytes; the
 * digest's pass over the raw file ends when the view's stream begins,
 * and a new one over the decoded disk starts if the image replaces the
 * disk, closed at close).
 * begin: the view's decoder accepted the stream (before the disk
 * changes; a stream refused before that leaves the digest, the progress
 * and the status of the last copy as they were); what names the view for
 * the status, pid is the writer (its input file is the pass's total).
 * wrote, zeroed: bytes of the view's file, counted once fh's stream
 * began.  length: the file's length, when its metadata tell it. */
void rawfile_view_begin(struct fs_disk *d, struct fs_fh *fh, pid_t pid,
                        const char *what);
void rawfile_view_wrote(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                        uint64_t len);
void rawfile_view_zeroed(struct fs_disk *d, struct fs_fh *fh, uint64_t off,
                         uint64_t len);
void rawfile_view_length(struct fs_disk *d, uint64_t len);
void rawfile_view_close(struct fs_disk *d, uint64_t len);

/* A process opened the raw file for writing (trunc: with O_TRUNC).  Its
 * input file, if one is visible, is the pass's total; one larger than the
 * export fails every change through fh with ENOSPC (logged here) and the
 * open does not truncate.  O_TRUNC is deferred (rawfile_truncate()).
 * 0 or the truncate's -errno. */
int rawfile_open_writer(struct fs_disk *d, struct fs_fh *fh, pid_t pid,
                        bool trunc);

/* A request through fh failed with err (< 0; else nothing): if fh is
 * writing the pass the progress counts, that copy failed; a truncate it
 * deferred is dropped at its close. */
void rawfile_failed(struct fs_disk *d, struct fs_fh *fh, int err);
/* The same for a close or fsync through fh.  Before fh wrote anything it
 * does not fail the copy: nothing of this pass can be lost, the error is
 * an earlier copy's damage still unrepaired (GNU dd closes a descriptor
 * of its output before the first write: fd_reopen). */
void rawfile_close_failed(struct fs_disk *d, struct fs_fh *fh, int err);

/* ---- the change count (fs/rawfile.c, THE CHANGE COUNT) ---------------- */

/* *count: the disk's changes so far; true if none is in progress (a
 * snapshot of the disk taken now holds while the count stays). */
bool rawfile_change_count(struct fs_disk *d, uint64_t *count);
/* A change of the disk (its bytes or its size) began since count. */
bool rawfile_changed_since(struct fs_disk *d, uint64_t count);

/* ---- handles ------------------------------------------------------------ */

/* close(2) and fsync(2) of any view of the disk: every write is
 * acknowledged (flushed) first.  -errno: the first pool error this handle
 * was not told of yet, else the damage left on the disk (pool_damage()),
 * which every close and fsync of every handle reports until repaired. */
int rawfile_drain(struct fs_disk *d, struct fs_fh *fh, bool wrote);
/* The end of a copy (fs/ops.c): drain, then -errno if the disk holds
 * damage (a failed range not yet repaired; a failed flush is fsync's to
 * report), else 0.  Unlike a close it
 * tells the handle nothing: failures already repaired do not fail the
 * write that ends the copy (its close still reports them, errseq). */
int rawfile_drain_end(struct fs_disk *d);
int rawfile_fsync(struct fs_disk *d, struct fs_fh *fh);
