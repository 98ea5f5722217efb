/* views/imageview.c: the skeleton every format view shares (views/imageview.h).
 * The format's decoder and synthesizer are reached through its library's
 * row of the contract (common/format.h) only; the decoder's sink, one for
 * every format, is views/imagesink.c's. */
#include "views/imageview.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "fs/foreign.h"
#include "fs/rawfile.h"
#include "transport/readahead.h"
#include "views/spool.h"
#include "views/unpackers.h"
#include "fs/view.h"
#include "fs/writers.h"
#include "views/imageview-internal.h"

struct imageview *imageview_of(struct fs_disk *d, enum fs_ino ino)
{
    return d->view_state[ino];
}

struct fs_disk *imageview_fs(const struct imageview *iv) { return iv->d; }
void *imageview_priv(const struct imageview *iv) { return iv->priv; }
void imageview_set_priv(struct imageview *iv, void *p) { iv->priv = p; }

const char *imageview_name(const struct imageview *iv)
{
    return iv->d->view_name[iv->f->ino];
}

static struct imageview *iv_of_fh(struct fs_disk *d, struct fs_fh *fh)
{
    return imageview_of(d, fh->ino);
}

/* ---- the synthesized (read) side -------------------------------------- */

int imageview_each_data(struct fs_disk *d, uint64_t size,
                        int (*fn)(void *opaque, uint64_t off, uint64_t len),
                        void *opaque)
{
    uint64_t pos = 0;
    int r = 0;

    while (pos < size && r == 0) {
        int64_t data = pool_seek(d->pool, pos, SEEK_DATA, size);
        if (data < 0)
            break;                            /* -ENXIO: no more data */
        int64_t h = pool_seek(d->pool, (uint64_t) data, SEEK_HOLE, size);
        if (h <= data)
            h = (int64_t) size;
        r = fn(opaque, (uint64_t) data, (uint64_t) (h - data));
        pos = (uint64_t) h;
    }
    return r;
}

/* Units [first, last] of a data extent and their tables, less the ones
 * the previous extent already counted. */
struct unit_count {
    uint64_t unit, per;
    struct imageview_count n;
    uint64_t last_u, last_t;
};

static int count_extent(void *opaque, uint64_t off, uint64_t len)
{
    struct unit_count *c = opaque;
    uint64_t first = off / c->unit, last = (off + len - 1) / c->unit;

    if (first == c->last_u)
        first++;
    if (first <= last) {
        c->n.units += last - first + 1;
        uint64_t tfirst = first / c->per, tlast = last / c->per;
        c->n.tables += tlast - tfirst + 1 - (tfirst == c->last_t);
        c->last_u = last;
        c->last_t = tlast;
    }
    return 0;
}

struct imageview_count imageview_count_data(struct fs_disk *d, uint64_t size,
                                            uint64_t unit, uint64_t per)
{
    struct unit_count c = { .unit = unit, .per = per,
                            .last_u = UINT64_MAX, .last_t = UINT64_MAX };

    imageview_each_data(d, size, count_extent, &c);
    return c.n;
}

/* Freeze the disk's allocation into a synthesizer: the disk up to the raw
 * file's apparent size (what `cp src.img MNT/nbd` made it), as the raw
 * file shows it.  The format logs why it cannot make one. */
static int synth_build(void *opaque, struct fs_disk *d, void **out)
{
    struct imageview *iv = opaque;
    const struct nbdf_format *lib = iv->lib;
    struct nbdf_synth_opts o = { .name = imageview_name(iv) };
    struct nbdf_err e = { "" };
    uint64_t size = rawfile_size(d);
    void *s;

    iv->f->synth_opts(iv, &o);
    int r = lib->synth_new(size, &o, &s, &e);
    if (r < 0) {
        log_notice("%s: %s", imageview_name(iv),
                   e.msg[0] ? e.msg : strerror(-r));
        return r;
    }
    if (iv->f->synth_made)
        iv->f->synth_made(iv, size);
    r = imageview_each_data(d, size, lib->synth_allocate, s);
    if (r == 0)
        r = lib->synth_seal(s);               /* -ENOMEM */
    if (r < 0) {
        lib->synth_free(s);
        return r;
    }
    *out = s;
    return 0;
}

static void synth_free(void *opaque, void *synth)
{
    struct imageview *iv = opaque;
    iv->lib->synth_free(synth);
}

static const struct synthcache_ops synth_ops = { .build = synth_build,
                                                 .free = synth_free };

static uint64_t view_size(struct imageview *iv)
{
    int err;

    bool ingesting;
    uint64_t written;
    {
        LOCK_FOR_SCOPE(&iv->lock);
        ingesting = iv->stream != NULL;
        written = iv->file_size;
    }
    if (ingesting)
        return written;
    if (iv->f->size)
        return iv->f->size(iv);
    /* At the cap, the newest synthesizer's size (an open says why). */
    void *s = synthcache_get(iv->synths, iv->d, true, &err, NULL);
    if (!s)
        return 0;
    uint64_t n = iv->lib->synth_file_size(s);
    synthcache_put(iv->synths, s);
    return n;
}

/* The synthesizer's disk reader. */
struct disk_reader {
    struct fs_disk *fs;
    struct fs_fh *fh;             /* its read-ahead stream, if any */
};

/* Block data comes through the handle's read-ahead stream, if it has
 * one: a reader copying the image out reads the allocated blocks in disk
 * order. */
static int read_disk(void *opaque, uint64_t off, void *buf, size_t len)
{
    struct disk_reader *d = opaque;

    if (d->fh && d->fh->ra)
        return ra_read(d->fs->ra, d->fh->ra, off, buf, len,
                       d->fs->export_size);
    return pool_read(d->fs->pool, off, buf, len);
}

/* THE SNAPSHOT
 * A reader's synthesizer freezes the disk's allocation at its open, not
 * its bytes: reading on while the disk is written (the raw file, another
 * view's landing, a truncate) would give an image that is neither the
 * disk at the open nor after the change (data written into a hole of
 * the map left out, a cluster half old, half new).  So every read checks
 * the disk's change count (fs/rawfile.h) against the one the
 * synthesizer was built at, after reading the disk: moved, the read
 * fails with EIO, logged with the reader and the fix, and so does every
 * later read through that open.  The copy tool reports the error; the
 * image is the disk at its open or nothing.  (Refusing writers while a
 * view is read instead would let a forgotten reader block a migration;
 * keeping the old bytes of every change would cost memory without
 * bound.)  A view's reader open while a change was in progress has no
 * snapshot: its first read fails. */
static bool snapshot_holds(struct imageview *iv, struct fs_fh *fh)
{
    if (!__atomic_load_n(&fh->snapshot_lost, __ATOMIC_RELAXED) &&
        !rawfile_changed_since(iv->d, fh->snapshot))
        return true;
    if (!__atomic_exchange_n(&fh->snapshot_lost, true, __ATOMIC_RELAXED))
        log_err_site(SITE(iv, SITE_STALE), "%s: the disk changed while "
                     "pid %d (%s) was reading this view (written through "
                     "the raw file or another view): its reads fail with "
                     "EIO rather than give an image of no one state of the "
                     "disk; read the view again once nothing writes the "
                     "disk", imageview_name(iv), (int) fh->tgid, fh->comm);
    return false;
}

ssize_t imageview_pread(struct fs_disk *d, struct fs_fh *fh, char *buf,
                        size_t size, uint64_t off)
{
    struct imageview *iv = iv_of_fh(d, fh);
    struct disk_reader r = { .fs = d, .fh = fh };
    int64_t n;

    if (!fh->view_data)
        return -EBADF;
    if (!snapshot_holds(iv, fh))
        return -EIO;
    if (!iv->lib->synth_serial) {
        n = iv->lib->synth_read(fh->view_data, off, buf, size, read_disk, &r);
    } else {
        LOCK_FOR_SCOPE(&iv->read_lock);
        n = iv->lib->synth_read(fh->view_data, off, buf, size, read_disk, &r);
    }
    if (n >= 0 && !snapshot_holds(iv, fh))   /* after the bytes were read */
        return -EIO;
    return (ssize_t) n;
}

/* ---- the ingest (write) side ------------------------------------------ */

/* For a refusal: the view or command for what was written instead, or
 * the format's own hint. */
static const char *refusal_hint(struct imageview *iv, int r, char *buf,
                                size_t n)
{
    if (r != -EMEDIUMTYPE)
        return "";
    const char *advice = foreign_advice(iv->d,
                                        iv->lib->stream_first_kind(iv->stream),
                                        iv->f->ino, buf + 2, n - 2);
    if (!advice) {
        const char *h = iv->f->refusal_hint ? iv->f->refusal_hint(iv->d)
                                            : NULL;
        return h ? h : "";
    }
    buf[0] = ':';
    buf[1] = ' ';
    return buf;
}

/* A refusal before the disk changed says so, and how to get the image
 * in when nothing else did: through qemu-img into the raw file. */
static void refusal_tail(struct imageview *iv, const char *said, char *buf,
                         size_t n)
{
    char raw[PATH_MAX + 8];

    buf[0] = '\0';
    if (iv->begun)
        return;
    foreign_place(iv->d, "MNT/nbd", raw, sizeof raw);
    bool fixed = strstr(said, "qemu-img") || strstr(said, "write it into") ||
                 strstr(said, "--vhd-fixed") || strstr(said, "tar -xOf") ||
                 strstr(said, "decompress");
    snprintf(buf, n, "%s%s%s%s", strstr(said, "nothing was written") ? ""
             : "; nothing was written", fixed ? "" : "; to land it anyway, "
             "if qemu-img reads it: qemu-img convert -n -O raw FILE ",
             fixed ? "" : raw, fixed ? "" : " (it goes through the raw file)");
}

/* Log the decoder's error once and latch it. */
static int fail_locked(struct imageview *iv, int r)
{
    char hint[PATH_MAX + 256], said[1024], tail[PATH_MAX + 160];

    if (!iv->err) {
        iv->err = -r;
        if (iv->logged)                       /* the sink said it */
            return r;
        const char *e = iv->lib->stream_error(iv->stream);
        char msg[sizeof said];
        snprintf(msg, sizeof msg, "%s%s", e[0] ? e : strerror(-r),
                 refusal_hint(iv, r, hint, sizeof hint));
        foreign_place(iv->d, msg, said, sizeof said);
        refusal_tail(iv, said, tail, sizeof tail);
        log_err_site(SITE(iv, SITE_FAIL), "%s: %s%s", imageview_name(iv),
                     said, tail);
    }
    return -iv->err;
}

/* After a write or hole: the sink's background work is done, and its
 * error fails this request and latches for the ingest. */
static int settle_locked(struct imageview *iv, int r)
{
    if (!iv->unpack)
        return r;
    int qerr = unpackers_drain(iv->unpack, false);
    if (qerr && !iv->err) {
        iv->err = -qerr;
        iv->logged = true;                    /* the drain said it */
    }
    return r < 0 ? r : iv->err ? -iv->err : r;
}

static void drop_stream_locked(struct imageview *iv)
{
    if (iv->unpack)
        unpackers_drain(iv->unpack, true);
    if (iv->stream)
        iv->lib->stream_free(iv->stream);
    iv->stream = NULL;
    spool_free(iv->spool);
    iv->spool = NULL;
}

/* A new ingest, fh its writer. */
static int new_stream_locked(struct imageview *iv, struct fs_fh *fh,
                             pid_t pid)
{
    struct fs_disk *d = iv->d;
    struct nbdf_stream_opts o = {
        .max_size = d->export_size, .accept_fixed = d->cfg->vhd_fixed,
        .spool_max = d->cfg->spool_max,
        /* Named in "... bytes of spool (raise %s)". */
        .spool_option = "--spool-max; past half of it the spool is a file "
                        "in --spool-dir",
    };
    struct spool_config sc = {
        .dir = d->cfg->spool_dir, .max = d->cfg->spool_max,
        .mem_max = spool_mem_max(d->cfg->spool_max),
        .name = imageview_name(iv),
    };
    int r = 0;

    drop_stream_locked(iv);
    if (iv->f->spool)
        r = spool_new(&sc, &iv->spool);
    if (r == 0)
        r = iv->lib->stream_new(iv->f->spool ? &imagesink_spooling
                                             : &imagesink, iv, &o, &iv->stream);
    if (r == 0) {
        iv->writer = fh;
        iv->writer_pid = pid;
        iv->err = 0;
        iv->logged = false;
        iv->begun = false;
        iv->overlay = false;
        iv->clamped = false;
        iv->file_size = 0;
    } else {
        iv->stream = NULL;
        spool_free(iv->spool);
        iv->spool = NULL;
    }
    return r;
}

static int open_writer(struct imageview *iv, struct fs_fh *fh, pid_t pid)
{
    bool busy;
    int r = -EBUSY;

    {
        LOCK_FOR_SCOPE(&iv->lock);
        busy = iv->stream && iv->writer;
        if (!busy)
            r = new_stream_locked(iv, fh, pid);
    }
    if (busy)                     /* logged without iv->lock */
        log_notice_site(SITE(iv, SITE_BUSY), "%s: a %s is already being "
                        "written", imageview_name(iv), iv->lib->name);
    return r;
}

int imageview_open(struct fs_disk *d, struct fs_fh *fh, int flags, pid_t pid)
{
    struct imageview *iv = iv_of_fh(d, fh);
    int r;

    if ((flags & O_ACCMODE) == O_RDONLY) {
        fh->view_data = synthcache_get(iv->synths, d, false, &r,
                                       &fh->snapshot);
        if (!fh->view_data)
            return r;
        writers_identify(fh, pid);        /* named if its reads fail */
        r = 0;
    } else if ((r = open_writer(iv, fh, pid)) < 0) {
        return r;
    }
    if (iv->f->readahead)
        fh->ra = ra_stream_open(d->ra);      /* NULL: reads on demand */
    return 0;
}

ssize_t imageview_write(struct fs_disk *d, struct fs_fh *fh, const char *buf,
                        size_t size, off_t soff)
{
    struct imageview *iv = iv_of_fh(d, fh);
    uint64_t off = (uint64_t) soff;
    int r;

    if (soff < 0)
        return -EINVAL;
    {
        LOCK_FOR_SCOPE(&iv->lock);
        if (iv->writer != fh || !iv->stream)
            r = -EBADF;
        else if (iv->err)
            r = -iv->err;
        else if ((r = iv->lib->stream_feed(iv->stream, off, buf, size)) < 0)
            r = fail_locked(iv, r);
        else if (off + size > iv->file_size)
            iv->file_size = off + size;
        if (iv->writer == fh && iv->stream)
            r = settle_locked(iv, r);
    }
    if (r >= 0)
        rawfile_view_wrote(d, fh, off, size);
    return r < 0 ? r : (ssize_t) size;
}

/* Punch-hole, zero-range and truncate-extend on the image file: zeros of
 * the image file.  fh NULL: a truncate, by whoever holds the stream. */
static int view_hole(struct imageview *iv, struct fs_fh *fh, uint64_t off,
                     uint64_t len)
{
    int r;

    struct fs_fh *writer;
    {
        LOCK_FOR_SCOPE(&iv->lock);
        writer = iv->writer;
        if (!iv->stream || (fh && iv->writer != fh))
            r = -EBADF;
        else if (iv->err)
            r = -iv->err;
        else if ((r = iv->lib->stream_hole(iv->stream, off, len)) < 0)
            r = fail_locked(iv, r);
        else if (off + len > iv->file_size)
            iv->file_size = off + len;
        if (iv->stream)
            r = settle_locked(iv, r);
    }
    if (r >= 0)
        rawfile_view_zeroed(iv->d, writer, off, len);
    return r;
}

/* cp --sparse=always punches the holes it skipped: zeros of the file. */
int imageview_fallocate(struct fs_disk *d, struct fs_fh *fh, int mode, off_t off,
                        off_t len)
{
    if (off < 0 || len <= 0 || (mode & ~FALLOC_FL_KEEP_SIZE) == 0)
        return -EINVAL;
    return view_hole(iv_of_fh(d, fh), fh, (uint64_t) off, (uint64_t) len);
}

/* A truncate that shrinks cannot be decoded. */
int imageview_truncate(struct fs_disk *d, enum fs_ino ino, uint64_t size)
{
    struct imageview *iv = imageview_of(d, ino);

    bool active;
    uint64_t cur;
    {
        LOCK_FOR_SCOPE(&iv->lock);
        active = iv->stream != NULL;
        cur = iv->file_size;
    }
    if (!active)
        return size == 0 ? 0 : -EINVAL;   /* O_TRUNC-style: nothing yet */
    if (size < cur) {
        log_err_site(SITE(iv, SITE_SHRINK), "%s: cannot shrink a %s being "
                     "written (%" PRIu64 " < %" PRIu64 ")", imageview_name(iv),
                     iv->lib->name, size, cur);
        return -EINVAL;
    }
    return size > cur ? view_hole(iv, NULL, cur, size - cur) : 0;
}

/* The end of the stream, under iv->lock. */
static int finish_locked(struct imageview *iv)
{
    int qerr = iv->unpack ? unpackers_drain(iv->unpack, true) : 0; /* logged */
    int r;

    if (iv->err)
        return -iv->err;
    if (qerr)
        return qerr;
    if ((r = iv->lib->stream_finish(iv->stream)) < 0)
        return fail_locked(iv, r);
    /* finish may hand over the last compressed units (a qcow2 that ends
     * inside the padding of its last compressed cluster): placed, and
     * their errors known, before the pass closes. */
    if (iv->unpack && (qerr = unpackers_drain(iv->unpack, true)) != 0) {
        iv->err = -qerr;
        iv->logged = true;                    /* the drain said it */
        return qerr;
    }
    char more[128] = "";
    if (iv->lib->stream_summary)
        iv->lib->stream_summary(iv->stream, more, sizeof more);
    log_info_site(SITE(iv, SITE_RECEIVED), "%s: %s received, %" PRIu64
                  " bytes%s", imageview_name(iv), iv->lib->name, iv->file_size,
                  more);
    rawfile_view_close(iv->d, iv->file_size);
    return 0;
}

/* close(2): the decoder's error first, else the first write error. */
int imageview_flush(struct fs_disk *d, struct fs_fh *fh, bool wrote)
{
    struct imageview *iv = iv_of_fh(d, fh);
    int r = 0;

    {
        LOCK_FOR_SCOPE(&iv->lock);
        if (iv->writer == fh && iv->stream && !iv->err &&
            iv->lib->stream_position(iv->stream) == 0) {
            /* Nothing written yet: a close of a duplicate (dd does
             * dup2(fd, 1); close(fd) before writing).  Keep the ingest. */
        } else if (iv->writer == fh && iv->stream) {
            r = finish_locked(iv);
            drop_stream_locked(iv);
            iv->writer = NULL;
        }
    }
    int err = rawfile_drain(d, fh, wrote);
    return r < 0 ? r : err;
}

void imageview_release(struct fs_disk *d, struct fs_fh *fh)
{
    struct imageview *iv = iv_of_fh(d, fh);

    {
        LOCK_FOR_SCOPE(&iv->lock);
        if (iv->writer == fh) {
            /* Closed without a flush reaching us (cannot normally happen). */
            drop_stream_locked(iv);
            iv->writer = NULL;
        }
    }
    synthcache_put(iv->synths, fh->view_data);
    fh->view_data = NULL;
    ra_stream_close(fh->ra);
    fh->ra = NULL;
}

/* ---- the view ---------------------------------------------------------- */

/* The disk's times (fs/rawfile.c, THE TIMES): one disk, one time. */
void imageview_attr(struct fs_disk *d, enum fs_ino ino, struct stat *st)
{
    rawfile_stat(d, st);
    st->st_mode = S_IFREG | (d->readonly ? 0400 : 0600);
    st->st_nlink = 1;
    st->st_size = (off_t) view_size(imageview_of(d, ino));
    st->st_blocks = (st->st_size + 511) / 512;
}

int imageview_init(struct fs_disk *d, const struct imageview_format *f)
{
    struct imageview *iv = calloc(1, sizeof *iv);

    if (!iv)
        return -ENOMEM;
    iv->f = f;
    iv->lib = f->lib;
    iv->d = d;
    pthread_mutex_init(&iv->lock, NULL);
    pthread_mutex_init(&iv->read_lock, NULL);
    d->view_state[f->ino] = iv;
    int r = synthcache_new(&synth_ops, iv, d->view_name[f->ino],
                           &iv->synths);
    if (r == 0 && f->init)
        r = f->init(iv);
    if (r == 0 && f->lib->unpack) {
        const struct nbdf_unpack *u = f->lib->unpack;
        iv->unpack_ops = (struct unpackers_ops) {
            .what = u->what, .desc_size = u->desc_size,
            .disk_off_at = u->disk_off_at, .cdata_at = u->cdata_at,
            .out_max = u->out_max, .new_ctx = u->new_ctx,
            .free_ctx = u->free_ctx, .decode = u->decode,
            .place = imagesink_unpacked,
        };
        r = unpackers_start(imageview_name(iv), iv, &iv->unpack_ops,
                            &iv->unpack);
    }
    if (r < 0)
        imageview_fini(d, f->ino);
    return r;
}

void imageview_fini(struct fs_disk *d, enum fs_ino ino)
{
    struct imageview *iv = imageview_of(d, ino);

    if (!iv)
        return;
    if (iv->stream)
        iv->lib->stream_free(iv->stream);
    spool_free(iv->spool);
    unpackers_stop(iv->unpack);       /* nothing is queued between requests */
    if (iv->f->fini)
        iv->f->fini(iv);
    free(iv->priv);
    synthcache_free(iv->synths);
    pthread_mutex_destroy(&iv->read_lock);
    pthread_mutex_destroy(&iv->lock);
    free(iv);
    d->view_state[ino] = NULL;
}
