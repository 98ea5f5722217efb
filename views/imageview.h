/* views/imageview.h: the skeleton of a format view (FILENAME.vhd, .vmdk, ...).
 *
 * A format view is a disk image seen as one file.  Writing it streams an
 * image file, in file order, through its format library's forward-only
 * decoder onto the disk; reading it produces an image of the disk from
 * the format library's synthesizer.  Everything around the two is the
 * same for every format and lives in views/imageview.c:
 *
 *   open      a reader gets the shared synthesizer of the disk as it is
 *             (views/synthcache.h), and its reads fail with EIO once the
 *             disk changes (views/imageview.c, THE SNAPSHOT); a writer
 *             starts a new stream (one at a
 *             time: EBUSY).  O_TRUNC does not touch the disk: only the
 *             decoder's begin, once the image's header says what arrives,
 *             replaces the disk's content (the sink's begin, views/imagesink.c).
 *   write     feeds the decoder; its first error is latched, logged once
 *             (with foreign_advice() for "not this format") and returned
 *             by every later write and by close.
 *   fallocate punch-hole and zero-range: zeros of the image file;
 *   truncate  extending likewise; shrinking a stream is EINVAL.
 *   flush     close(2) finishes the stream (a cut image fails here),
 *             except a close before anything was written (dd's dup2).
 *   release   drops the synthesizer and the stream.
 *
 * A format view fills a struct imageview_format: its library's row of the
 * format contract (common/format.h: the decoder, the synthesizer) and only
 * what that format says beyond it (its synthesizer's identity, what it
 * logs at begin, a size without a synthesizer), and defines its struct
 * fs_view with IMAGEVIEW_DEFINE().  The skeleton fills the decoder's sink
 * (one struct nbdf_sink for every format): begin replaces the disk (or
 * not, for an overlay) through fs/rawfile.h, data and zero place the
 * decoded bytes (all-zero data skipped where the disk reads as zero),
 * compressed units go to the unpack workers (views/unpackers.h), early
 * bytes to a spool (views/spool.h).
 *
 * THREAD MODEL
 * The ingest arrives on the receive loop's threads (fs/fuseloop.c):
 * writes on its receiving thread (a durable one on a worker), truncates,
 * fallocates and flushes on its workers; reads on its workers.
 * iv->lock serializes everything about the ingest (decoders are not
 * thread-safe and their input must stay in order); every decoder hook and
 * the sink callbacks run under it (the unpack workers' placements, which
 * run on any thread, excepted: they read iv->overlay, written at begin
 * while no unit is queued).  It is held across pool writes (the
 * writer is throttled, as on the raw file) but never across a FUSE reply.
 * The synthesizers have their own lock (views/synthcache.c), never taken
 * with iv->lock held nor the other way round.  The unpack workers
 * (views/unpackers.h) never take iv->lock: the writer waits for them with
 * it held.  fs/rawfile.c's size lock
 * is taken after iv->lock (inside the sink), never the other way round.
 * The kernel sends a writer's requests in order because async direct I/O
 * is off (fs/ops.c).  The synthesizer hooks (read) run without iv->lock,
 * several at once, unless the library's row says synth_serial.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/format.h"
#include "common/imagekind.h"
#include "fs/fs.h"
#include "fs/rawfile.h"        /* rawfile_fsync: IMAGEVIEW_DEFINE */
#include "views/synthcache.h"

struct imageview;

struct imageview_format {
    /* The library's row of the contract (common/format.h): its decoder,
     * its synthesizer, its name ("VHD": in messages) and, if it hands
     * compressed units over, their decoding (views/unpackers.h). */
    const struct nbdf_format *lib;
    enum fs_ino ino;
    const char *status_name;      /* "the VHD view": the status's copy */
    bool readahead;               /* handles read the disk ahead (ra) */
    bool spool;                   /* the decoder spools early bytes
                                   * (views/spool.h: --spool-dir, -max) */

    /* Format state beside the skeleton's (imageview_priv(): malloc()ed,
     * freed by the skeleton after fini); both optional. */
    int  (*init)(struct imageview *iv);
    void (*fini)(struct imageview *iv);
    /* The synthesizer's identity and layout, per mount. */
    void (*synth_opts)(struct imageview *iv, struct nbdf_synth_opts *o);
    /* Optional: what to say once a synthesizer of a disk of size bytes is
     * made. */
    void (*synth_made)(struct imageview *iv, uint64_t size);
    /* Optional: what the format says at its decoder's begin, before the
     * disk changes (a backing file, a replayed log). */
    void (*begun)(struct imageview *iv, const struct nbdf_begin *b);
    /* Optional: what to say about a refusal foreign_advice() has no
     * advice for ("" or NULL: nothing). */
    const char *(*refusal_hint)(struct fs_disk *d);
    /* Optional: the file's size without a synthesizer (stat is frequent);
     * NULL: the synthesizer's, built (and shared) for it. */
    uint64_t (*size)(struct imageview *iv);
};

struct fs_disk *imageview_fs(const struct imageview *iv);
const char *imageview_name(const struct imageview *iv);  /* "disk.vhd" */
void *imageview_priv(const struct imageview *iv);
void imageview_set_priv(struct imageview *iv, void *priv);
struct imageview *imageview_of(struct fs_disk *d, enum fs_ino ino);

/* Calls fn for each data extent of the disk in [0, size) (the zero maps:
 * block status and what was written since), in order, until fn fails. */
int imageview_each_data(struct fs_disk *d, uint64_t size,
                        int (*fn)(void *opaque, uint64_t off, uint64_t len),
                        void *opaque);

/* For a size hook: the units of 'unit' bytes that the disk's data extents
 * in [0, size) touch, and the tables of 'per' units each that map them
 * (a synthesizer stores and maps only those). */
struct imageview_count {
    uint64_t units, tables;
};
struct imageview_count imageview_count_data(struct fs_disk *d, uint64_t size,
                                            uint64_t unit, uint64_t per);

/* The skeleton's hooks (fs/view.h); IMAGEVIEW_DEFINE() wires them. */
int  imageview_init(struct fs_disk *d, const struct imageview_format *f);
void imageview_fini(struct fs_disk *d, enum fs_ino ino);
void imageview_attr(struct fs_disk *d, enum fs_ino ino, struct stat *st);
int  imageview_truncate(struct fs_disk *d, enum fs_ino ino, uint64_t size);
int  imageview_open(struct fs_disk *d, struct fs_fh *fh, int flags, pid_t pid);
ssize_t imageview_pread(struct fs_disk *d, struct fs_fh *fh, char *buf,
                        size_t size, uint64_t off);
ssize_t imageview_write(struct fs_disk *d, struct fs_fh *fh, const char *buf,
                        size_t size, off_t off);
int  imageview_fallocate(struct fs_disk *d, struct fs_fh *fh, int mode,
                         off_t off, off_t len);
int  imageview_flush(struct fs_disk *d, struct fs_fh *fh, bool wrote);
void imageview_release(struct fs_disk *d, struct fs_fh *fh);

/* const struct fs_view var: the view of format fmt, named FILENAME sfx.
 * The hooks that get no handle (init, fini, attr, truncate) need the
 * inode, hence the wrappers. */
#define IMAGEVIEW_DEFINE(var, fmt, sfx)                                      \
    static int var##_init(struct fs_disk *d) { return imageview_init(d, &fmt); }\
    static void var##_fini(struct fs_disk *d) { imageview_fini(d, fmt.ino); }   \
    static void var##_attr(struct fs_disk *d, struct stat *st)                   \
    {                                                                        \
        imageview_attr(d, fmt.ino, st);                                     \
    }                                                                        \
    static int var##_truncate(struct fs_disk *d, struct fs_fh *fh, uint64_t n)   \
    {                                                                        \
        (void) fh;                                                           \
        return imageview_truncate(d, fmt.ino, n);                           \
    }                                                                        \
    const struct fs_view var = {                                             \
        .suffix = sfx,                                                       \
        .writable = true,                                                    \
        .init = var##_init,                                                  \
        .fini = var##_fini,                                                  \
        .attr = var##_attr,                                                  \
        .open = imageview_open,                                              \
        .pread = imageview_pread,                                            \
        .write = imageview_write,                                            \
        .fallocate = imageview_fallocate,                                    \
        .truncate = var##_truncate,                                          \
        .flush = imageview_flush,                                            \
        .fsync = rawfile_fsync,                                              \
        .release = imageview_release,                                        \
    }
