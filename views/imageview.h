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
 *             replaces the disk's content (imageview_take()).
 *   write     feeds the decoder; its first error is latched, logged once
 *             (with foreign_advice() for "not this format") and returned
 *             by every later write and by close.
 *   fallocate punch-hole and zero-range: zeros of the image file;
 *   truncate  extending likewise; shrinking a stream is EINVAL.
 *   flush     close(2) finishes the stream (a cut image fails here),
 *             except a close before anything was written (dd's dup2).
 *   release   drops the synthesizer and the stream.
 *
 * A format fills a struct imageview_format (decoder, synthesizer, names)
 * and defines its struct fs_view with IMAGEVIEW_DEFINE().  The decoder's
 * sink callbacks get the struct imageview * as their opaque and use the
 * helpers below.
 *
 * THREAD MODEL
 * The ingest arrives on the receive loop's threads (fs/fuseloop.c):
 * writes on its receiving thread (a durable one on a worker), truncates,
 * fallocates and flushes on its workers; reads on its workers.
 * iv->lock serializes everything about the ingest (decoders are not
 * thread-safe and their input must stay in order); every decoder hook and
 * the sink callbacks run under it.  It is held across pool writes (the
 * writer is throttled, as on the raw file) but never across a FUSE reply.
 * The synthesizers have their own lock (views/synthcache.c), never taken
 * with iv->lock held nor the other way round.  The unpack workers
 * (views/unpackers.h) never take iv->lock: the writer waits for them with
 * it held.  fs/rawfile.c's size lock
 * is taken after iv->lock (inside the sink), never the other way round.
 * The kernel sends a writer's requests in order because async direct I/O
 * is off (fs/ops.c).  The synthesizer hooks (read) run without iv->lock,
 * several at once, unless the format asks for serial_read.
 */
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/imagekind.h"
#include "fs/fs.h"
#include "views/synthcache.h"

struct imageview;
struct unpackers_ops;

struct imageview_format {
    enum fs_ino ino;
    const char *what;             /* "VHD": in messages */
    const char *status_name;      /* "the VHD view": the status's copy */
    bool readahead;               /* handles read the disk ahead (ra) */

    /* Format state beside the skeleton's (imageview_priv(): malloc()ed,
     * freed by the skeleton after fini); both optional. */
    int  (*init)(struct imageview *iv);
    void (*fini)(struct imageview *iv);

    /* The decoder.  new_stream: a stream whose sink's opaque is iv. */
    int  (*new_stream)(struct imageview *iv, void **out);
    int  (*feed)(void *st, uint64_t off, const void *buf, size_t len);
    int  (*hole)(void *st, uint64_t off, uint64_t len);
    int  (*finish)(void *st);
    void (*free_stream)(void *st);
    const char *(*error)(const void *st);         /* "" when none */
    /* Something has been decoded: a close is the end of this stream. */
    bool (*started)(const void *st);
    enum image_kind (*first_kind)(const void *st); /* what arrived first */
    /* Optional: what to say about a refusal foreign_advice() has no
     * advice for ("" or NULL: nothing). */
    const char *(*refusal_hint)(struct fs_disk *d);
    /* Optional: ", 12 grains" after "VMDK received, N bytes". */
    void (*received)(struct imageview *iv, char *buf, size_t n);
    /* Optional: compressed units that worker threads decompress and
     * place (views/unpackers.h); the sink queues them with
     * imageview_unpack().  The skeleton starts the threads after init,
     * stops them before fini, and waits for the queue after every write
     * and hole, and at open, close and release: its first error fails
     * the request and latches for the ingest. */
    const struct unpackers_ops *unpack;

    /* The synthesizer: the disk's allocation is frozen by new_synth,
     * allocate (each data extent) and seal; free_synth frees it. */
    int  (*new_synth)(struct imageview *iv, uint64_t disk_size, void **out);
    int  (*allocate)(void *synth, uint64_t off, uint64_t len);
    int  (*seal)(void *synth);
    void (*free_synth)(void *synth);
    uint64_t (*file_size)(const void *synth);
    /* Optional: the file's size without a synthesizer (stat is frequent);
     * NULL: the synthesizer's, built (and shared) for it. */
    uint64_t (*size)(struct imageview *iv);
    /* The file's bytes; read the disk through imageview_read_disk(). */
    int64_t (*read)(struct imageview *iv, void *synth, struct fs_fh *fh,
                    uint64_t off, char *buf, size_t size);
    /* The synthesizers keep a cache that handles share: the skeleton
     * serializes read (its read lock, a leaf). */
    bool serial_read;
};

struct fs_disk *imageview_fs(const struct imageview *iv);
const char *imageview_name(const struct imageview *iv);  /* "disk.vhd" */
void *imageview_priv(const struct imageview *iv);
void imageview_set_priv(struct imageview *iv, void *priv);
void *imageview_stream(const struct imageview *iv);      /* under iv->lock */
struct imageview *imageview_of(struct fs_disk *d, enum fs_ino ino);

/* Sink helpers, under iv->lock. */
/* The sink logged its error itself: the skeleton does not log it again. */
void imageview_logged(struct imageview *iv);
/* The decoder accepted the image: a disk of size bytes (kind: "dynamic",
 * in the log).  Larger than the export: logged, -ENOSPC, nothing
 * touched.  Else the copy is this one (file_len: the image file's
 * length when known, else 0) and, unless overlay (applied over what the
 * disk holds), the disk's content is replaced by size bytes of zeros. */
int imageview_take(struct imageview *iv, const char *kind, uint64_t size,
                   bool overlay, uint64_t file_len);
/* Data the decoder places at [off, off+len) must fit the export: else
 * logged, -ENOSPC. */
int imageview_fits(struct imageview *iv, uint64_t off, uint64_t len);
/* Queue a compressed unit for the format's unpack workers (see
 * unpackers_queue()). */
int imageview_unpack(struct imageview *iv, const void *desc,
                     const void *cdata, size_t clen);

/* The synthesizer's disk reader: opaque is a struct imageview_reader. */
struct imageview_reader {
    struct fs_disk *fs;
    struct fs_fh *fh;             /* its read-ahead stream, if any */
};
int imageview_read_disk(void *opaque, uint64_t off, void *buf, size_t len);

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

/* The decoder hooks of a library whose stream is struct P_stream with
 * P_stream_feed/_finish/_free/_error (and P_stream_hole): defines the
 * adapters; IMAGEVIEW_STREAM_HOOKS(P) fills them in a format. */
#define IMAGEVIEW_STREAM_GLUE(P)                                             \
    static int P##_glue_feed(void *s, uint64_t o, const void *b, size_t n)   \
    {                                                                        \
        return P##_stream_feed(s, o, b, n);                                  \
    }                                                                        \
    static int P##_glue_finish(void *s) { return P##_stream_finish(s); }     \
    static void P##_glue_free(void *s) { P##_stream_free(s); }               \
    static const char *P##_glue_error(const void *s)                         \
    {                                                                        \
        return P##_stream_error(s);                                          \
    }
#define IMAGEVIEW_STREAM_HOLE(P)                                             \
    static int P##_glue_hole(void *s, uint64_t o, uint64_t n)                \
    {                                                                        \
        return P##_stream_hole(s, o, n);                                     \
    }
#define IMAGEVIEW_STREAM_HOOKS(P)                                            \
    .feed = P##_glue_feed, .finish = P##_glue_finish,                        \
    .free_stream = P##_glue_free, .error = P##_glue_error
/* The synthesizer hooks of a library with P_synth_allocate (returning an
 * int), P_synth_seal and P_synth_free. */
#define IMAGEVIEW_SYNTH_GLUE(P)                                              \
    static int P##_allocate(void *s, uint64_t off, uint64_t len)             \
    {                                                                        \
        return P##_synth_allocate(s, off, len);                              \
    }                                                                        \
    static int P##_seal(void *s) { return P##_synth_seal(s); }               \
    static void P##_free_synth(void *s) { P##_synth_free(s); }

/* The read hook of a library with P_synth_read: the disk read through
 * imageview_read_disk(), with the handle's read-ahead. */
#define IMAGEVIEW_SYNTH_READ(P)                                              \
    static int64_t P##_read(struct imageview *iv, void *s, struct fs_fh *fh, \
                            uint64_t off, char *buf, size_t size)            \
    {                                                                        \
        struct imageview_reader d = { .fs = imageview_fs(iv), .fh = fh };    \
        return P##_synth_read(s, off, buf, size, imageview_read_disk, &d);   \
    }

/* The hooks a format P names by convention: P_new_stream, P_started,
 * P_first_kind, P_new_synth, P_allocate, P_seal, P_free_synth, P_read,
 * and the stream glue above. */
#define IMAGEVIEW_FORMAT_HOOKS(P)                                            \
    IMAGEVIEW_STREAM_HOOKS(P), .new_stream = P##_new_stream,                 \
    .started = P##_started, .first_kind = P##_first_kind,                    \
    .new_synth = P##_new_synth, .allocate = P##_allocate, .seal = P##_seal,  \
    .free_synth = P##_free_synth, .read = P##_read
