/* views/synthcache.h: the synthesizers of a format view (FILENAME.vhd,
 * FILENAME.vmdk), shared between handles and bounded in number.
 *
 * A read-only open of a view freezes the disk's allocation into a
 * synthesizer (its memory grows with the disk: 4 bytes per 2 MiB block
 * for VHD, per allocated 64 KiB grain for VMDK, about 2.3 MiB for a
 * 1 TiB VHD), kept by the handle until it closes so that it reads one
 * consistent file (and fails once the disk changes: views/imageview.c,
 * THE SNAPSHOT).  Opens and stats that see the same disk state share
 * one; a new one is built only once the disk has changed.  At most
 * SYNTHCACHE_MAX distinct ones live at once: an open that needs another
 * while that many are held by open handles (a reader left open across
 * each change of the disk) fails with EMFILE, logged, instead of growing
 * the daemon's memory without bound.
 *
 * THREAD MODEL
 * c->lock protects the synthesizers and their counts; building one holds
 * it, so concurrent opens and stats wait for one build rather than make
 * several.  build() may take the pool's lock and d->fs->lock (never c->lock
 * the other way round); no other lock is held while taking c->lock.
 */
#pragma once
#include "fs/fs.h"

#define SYNTHCACHE_MAX 8

struct synthcache_ops {
    /* Freeze the disk as it is now.  0 and *out, or -errno (logged by
     * build; the failure is kept, and returned, until the disk changes). */
    int  (*build)(void *opaque, struct fs_disk *d, void **out);
    void (*free)(void *opaque, void *synth);
};

struct synthcache;

/* opaque: passed to ops; name: the view's file name, for messages; both
 * borrowed for c's life. */
int  synthcache_new(const struct synthcache_ops *ops, void *opaque,
                    const char *name, struct synthcache **out);
/* Frees every synthesizer, held or not (the handles are gone). */
void synthcache_free(struct synthcache *c);

/* The synthesizer of the disk as it is now, with a reference for the
 * caller (synthcache_put()); NULL and -errno: the build failed, or
 * -EMFILE at the cap.  stale_ok (a stat): at the cap, the newest one
 * instead, however old.  snapshot (may be NULL): the disk's change
 * count it was built at (fs/rawfile.h, rawfile_change_count()), or
 * SYNTHCACHE_NO_SNAPSHOT if a change was in progress then. */
#define SYNTHCACHE_NO_SNAPSHOT UINT64_MAX
void *synthcache_get(struct synthcache *c, struct fs_disk *d, bool stale_ok,
                     int *err, uint64_t *snapshot);
void synthcache_put(struct synthcache *c, void *synth);   /* NULL: no-op */
