/* views/imageview-internal.h: what views/imageview.c (the skeleton's
 * handles) and views/imagesink.c (the decoder's sink) share; no other file
 * includes it.  The locks and threads are views/imageview.h's THREAD
 * MODEL. */
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/format.h"
#include "views/imageview.h"
#include "views/unpackers.h"

struct spool;

struct imageview {
    const struct imageview_format *f;
    const struct nbdf_format *lib;  /* f->lib */
    struct fs_disk *d;
    void *priv;                   /* the format's */
    struct synthcache *synths;    /* the read side's, shared */
    struct unpackers_ops unpack_ops;  /* lib->unpack, placed by sink_data */
    struct unpackers *unpack;     /* the format's unpack workers, or NULL */
    pthread_mutex_t read_lock;    /* lib->synth_serial: one read at a time */

    pthread_mutex_t lock;
    void *stream;                 /* the ingest in progress, or NULL */
    struct spool *spool;          /* its spool (f->spool), or NULL */
    bool overlay;                 /* begin: applied over the disk (read by
                                   * the unpack workers' placements too) */
    bool clamped;                 /* begin: the image's last unit runs past
                                   * the export; bytes there must be zero */
    struct fs_fh *writer;         /* the handle that owns it */
    pid_t writer_pid;             /* the process that opened it */
    int err;                      /* its sticky error (positive errno) */
    bool logged;                  /* the sink already logged the error */
    bool begun;                   /* the disk is being replaced (or the
                                   * overlay applied): no refusal after
                                   * this leaves it as it was */
    uint64_t file_size;           /* high-water mark of the image written */
};

/* The log's rate limit is per call site; these are shared by every
 * format, so each view's messages are limited apart (common/log.h):
 * distinct addresses inside the view's own struct. */
enum { SITE_TAKE, SITE_FITS, SITE_FAIL, SITE_SHRINK, SITE_BUSY,
       SITE_RECEIVING, SITE_RECEIVED, SITE_STALE };
#define SITE(iv, k) ((const char *) (iv) + (k))

/* imageview_name() for imagesink.c, which imageview.c's objects call: no
 * call goes back up. */
static inline const char *iv_name(const struct imageview *iv)
{
    return iv->d->view_name[iv->f->ino];
}

/* imagesink.c: the sink every format's decoder gets (opaque: the struct
 * imageview *), without and with a spool (iv->spool), under iv->lock. */
extern const struct nbdf_sink imagesink, imagesink_spooling;
/* The unpack workers' placement of decoded bytes; any thread. */
int imagesink_unpacked(void *opaque, uint64_t off, const void *buf,
                       size_t len);
