/* fs/warm.h: warm migration: the mount's use of the manifest
 * (manifest/manifest.h), the record of what the export holds for good.
 *
 * At mount the manifest of the export is loaded from the state
 * directory and checked against the server (THE TRUST CHECK, warm.c);
 * every raw write then goes through warm_write(), which hashes its whole
 * blocks and does not send those the server already holds (same digest,
 * durable, not changed since), and records every other change as
 * pending; the pool's on_durable hook (warm_on_durable()) makes them
 * durable after each good flush.  Truncates (O_TRUNC) are followed
 * lazily (warm_cut(), warm_settle_*()): a truncate then the same bytes
 * cost nothing.
 *
 * Every function accepts a disk without a manifest (d->warm NULL:
 * --no-manifest, a read-only mount, an export without a stable name)
 * and then does what the mount did before: pool calls only.
 *
 * THREAD MODEL: warm_write() and the change hooks run on the FUSE
 * threads (the size lock held shared or exclusive, as rawfile.c's
 * callers hold it); warm_on_durable() on whatever thread flushed; the
 * status on the status thread.  struct warm's counters are atomics; the
 * manifest has its own lock. */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "digest/known.h"
#include "fs/fs.h"
#include "transport/nbdx.h"

struct warm;

struct warm_config {
    bool off;                 /* --no-manifest */
    const char *state_dir;    /* --state-dir, or NULL: the default */
};

/* The default state directory: $NBDFERRY_STATE_DIR if set (absolute),
 * else /var/lib/nbdferry for root, else $XDG_STATE_HOME/nbdferry or
 * ~/.local/state/nbdferry.  malloc'd. */
char *warm_default_state_dir(void);

/* The pool's cfg.on_durable (opaque: the disk). */
void warm_on_durable(void *disk, uint64_t gen);

/* After the pool exists, before the mount: load the export's manifest,
 * check it against the server, start its journal; d->warm is set (NULL
 * when off, logged).  key: the export's name for records kept across
 * server restarts (the daemon's: daemon/mountlock.h), NULL when it has
 * none (no manifest then).  Never fails the mount: a manifest that cannot
 * be kept is reported and the copy is a full one. */
void warm_open(struct fs_disk *d, const struct warm_config *c,
               const char *key);
/* After the final flush: compact the manifest on disk, free. */
/* mtime, set: what rawfile_stored_mtime() says at the end: stored. */
void warm_close(struct fs_disk *d, const struct timespec *mtime, bool set);

/* pool_write() of a raw write, sending only the blocks that changed.
 * Returns len or -errno, as pool_write().  known (may be NULL) gets the
 * digests of the write's whole blocks, hashed to decide: the inline
 * digest takes them rather than hash the bytes again (digest/known.h). */
ssize_t warm_write(struct fs_disk *d, uint64_t off, const void *buf,
                   size_t len, struct digest_known *known);

/* The zero-copy paths (a landed write, a write filled into pool
 * buffers: fs/rawfile.c) commit first and tell after: allowed only when
 * the manifest holds nothing about [off, off+len) (a first pass).  Then
 * warm_record() records the committed blocks as changed, their digests
 * made from the holds on the hasher workers (fs/warm-later.c, THE LATER
 * DIGEST): it returns them for the inline digest (known.later, before
 * the holds are given to it), one count of them the caller's to put, or
 * NULL. */
bool warm_zero_copy_ok(struct fs_disk *d, uint64_t off, uint64_t len);
bool warm_wants_holds(struct fs_disk *d);
struct digest_later *warm_record(struct fs_disk *d, uint64_t off, uint64_t len,
                                 const struct pool_fill *f);

/* [off, off+len) is about to be zeroed now (fallocate, a view's zero):
 * _begin before the pool call, _end after it returned. */
void warm_zero_begin(struct fs_disk *d, uint64_t off, uint64_t len);
void warm_zero_end(struct fs_disk *d, uint64_t off, uint64_t len);
/* [off, off+len) now reads as zero lazily (pool_zero_lazy()). */
void warm_cut(struct fs_disk *d, uint64_t off, uint64_t len);
/* Around every drain that sends pending zeroes (close, fsync, unmount). */
void warm_settle_begin(struct fs_disk *d);
void warm_settle_end(struct fs_disk *d);
/* The disk is changed another way (an image view): forget everything. */
void warm_forget_all(struct fs_disk *d);

/* A close that would carry out a truncate nothing was written after
 * (dd's dup2 closes its first descriptor at once) keeps it deferred when
 * this is true (fs/rawfile.c): the manifest holds data the copy's
 * writes may find unchanged, which the truncate's zeroing would destroy. */
bool warm_keeps_truncate(struct fs_disk *d);

/* The inline digest's filler (digest/blkpass.h, THE FILLER; disk: the
 * fs_disk): block b's durable entry, 1 zero, 2 data (SHA-256 in
 * digest), 0 unknown (no manifest, or a change of it pending). */
int warm_fill(void *disk, uint64_t b, unsigned char *digest);

/* THE STORED TIME (rsync's quick check across mounts): utimensat(2)
 * set the disk's mtime: kept in the manifest (journaled).  At mount, a
 * trusted manifest's stored mtime (true), which the caller shows as if
 * set again (rawfile_set_mtime()); a distrusted one keeps none. */
void warm_note_mtime(struct fs_disk *d, const struct timespec *mtime);
bool warm_stored_mtime(struct fs_disk *d, struct timespec *mtime);

/* Bytes of writes not sent because the server held them already. */
uint64_t warm_skipped(struct fs_disk *d);

/* The status document's "manifest" key (a line, with its comma). */
void warm_put_status(FILE *f, struct fs_disk *d);

/* nbdferry --forget MNT|URI: drop the export's manifest.  A mountpoint
 * names its manifest in its status; a URI by key, the export's record
 * key (the daemon connects and asks daemon/mountlock.h; NULL: none).
 * Exit status. */
int warm_forget(const char *target, const struct warm_config *c,
                const char *key);
