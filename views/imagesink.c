/* views/imagesink.c: the sink of every format view's decoder (struct
 * nbdf_sink, common/format.h; opaque: the struct imageview *): begin
 * replaces the disk (or, for an overlay, leaves it) once the image is
 * known to be valid, data and zero place the decoded bytes through
 * fs/rawfile.h, compressed units go to the unpack workers, early bytes
 * to the stream's spool.  One for every format: what differs (an overlay,
 * a last sector past the export) comes from begin's struct nbdf_begin.
 *
 * THREAD MODEL: views/imageview.h's.  Every callback runs under iv->lock
 * on the thread feeding the decoder, but imagesink_unpacked(), which the
 * unpack workers call on any thread: it reads iv->overlay and
 * iv->clamped, written by begin while no unit of the stream is queued,
 * and logs nothing (the workers report its error). */
#include <errno.h>
#include <inttypes.h>

#include "common/iszero.h"
#include "common/log.h"
#include "fs/rawfile.h"
#include "views/imageview-internal.h"
#include "views/spool.h"

/* The decoder accepted the image: a disk of size bytes (kind: "dynamic",
 * in the log).  Larger than the export: logged, -ENOSPC, nothing
 * touched.  Else the copy is this one (file_len: the image file's
 * length when known, else 0) and, unless overlay (applied over what the
 * disk holds), the disk's content is replaced by size bytes of zeros. */
static int take(struct imageview *iv, const char *kind, uint64_t size,
                bool overlay, uint64_t file_len)
{
    struct fs_disk *d = iv->d;

    if (size > d->export_size) {
        log_err_site(SITE(iv, SITE_TAKE), "%s: the %s's disk is %" PRIu64
                     " bytes, larger than the export (%" PRIu64 "): nothing "
                     "written", iv_name(iv), iv->lib->name, size,
                     d->export_size);
        iv->logged = true;
        return -ENOSPC;
    }
    log_info_site(SITE(iv, SITE_RECEIVING), "%s: receiving a %s %s, disk "
                  "size %" PRIu64, iv_name(iv), kind, iv->lib->name,
                  size);
    /* Under iv->lock (inside a feed): the stream is ours.  From here on
     * the copy is this one (its writer's input file the total). */
    iv->begun = true;
    rawfile_view_begin(d, iv->writer, iv->writer_pid, iv->f->status_name);
    if (file_len)
        rawfile_view_length(d, file_len);
    if (overlay)
        return 0;                             /* applied over the parent */
    return rawfile_replace(d, size);
}

/* Data the decoder places at [off, off+len) must fit the export: else
 * logged, -ENOSPC. */
static int fits(struct imageview *iv, uint64_t off, uint64_t len)
{
    struct fs_disk *d = iv->d;

    if (off <= d->export_size && len <= d->export_size - off)
        return 0;
    log_err_site(SITE(iv, SITE_FITS), "%s: the %s's disk is larger than the "
                 "export (%" PRIu64 " bytes): data at offset %" PRIu64
                 " does not fit", iv_name(iv), iv->lib->name,
                 d->export_size, off);
    iv->logged = true;
    return -ENOSPC;
}

/* ---- the sink: one for every format's decoder -------------------------- */

/* begin: a size of whole units (sectors) that runs past an export whose
 * size is not whole units takes the export's size back (the bytes past
 * it must be zero: trim()). */
static int sink_begin(void *opaque, const struct nbdf_begin *b)
{
    struct imageview *iv = opaque;
    uint64_t size = b->size, export = iv->d->export_size;

    if (b->unit && size > export && size - export < b->unit)
        size = export;
    iv->clamped = size != b->size;
    /* No unit of this stream is queued yet; the ones queued after this
     * see it (views/unpackers.h). */
    iv->overlay = b->overlay;
    if (iv->f->begun)
        iv->f->begun(iv, b);
    return take(iv, b->kind_name, size, b->overlay, b->file_len);
}

/* The part of [off, off+*len) inside the export: past it, only the zeros
 * of an image whose last unit runs past the export's end; else -ENOSPC,
 * logged unless quiet (an unpack worker's: the workers log it). */
static int trim(struct imageview *iv, uint64_t off, const void *buf,
                uint64_t *len, bool quiet)
{
    uint64_t export = iv->d->export_size;
    bool inside = off <= export && *len <= export - off;

    if (iv->clamped && !inside) {
        uint64_t keep = off < export ? export - off : 0;
        if (!buf || is_zero((const char *) buf + keep, (size_t) (*len - keep))) {
            *len = keep;
            return 0;
        }
    }
    if (inside)
        return 0;
    return quiet ? -ENOSPC : fits(iv, off, *len);
}

/* Decoded bytes to the disk.  A standalone image's disk reads as zero
 * since begin, so all-zero runs are skipped; an overlay's zeros must
 * cover what the parent put there. */
static int place(struct imageview *iv, uint64_t off, const void *buf,
                 size_t len, bool quiet)
{
    uint64_t n = len;

    if (trim(iv, off, buf, &n, quiet) < 0)
        return -ENOSPC;
    if (n == 0)
        return 0;
    if (is_zero(buf, (size_t) n))
        return iv->overlay ? rawfile_place_zero(iv->d, off, n) : 0;
    return rawfile_place(iv->d, off, buf, (size_t) n);
}

static int sink_data(void *opaque, uint64_t off, const void *buf, size_t len)
{
    return place(opaque, off, buf, len, false);
}

/* The unpack workers' placement; any thread. */
int imagesink_unpacked(void *opaque, uint64_t off, const void *buf, size_t len)
{
    return place(opaque, off, buf, len, true);
}

static int sink_zero(void *opaque, uint64_t off, uint64_t len)
{
    struct imageview *iv = opaque;

    if (trim(iv, off, NULL, &len, false) < 0)
        return -ENOSPC;
    return len ? rawfile_place_zero(iv->d, off, len) : 0;  /* < 0: fails */
}

/* A compressed unit, under iv->lock: a copy queued for the workers. */
static int sink_compressed(void *opaque, const void *unit, const void *cdata,
                           size_t clen)
{
    struct imageview *iv = opaque;

    int r = unpackers_queue(iv->unpack, unit, cdata, clen);
    if (r < 0)
        iv->logged = true;            /* the workers said it */
    return r;
}

static int sink_spool_put(void *opaque, uint64_t key, const void *buf,
                          size_t len)
{
    struct imageview *iv = opaque;
    return spool_put(iv->spool, key, buf, len);
}

static int sink_spool_get(void *opaque, uint64_t key, void *buf, size_t len)
{
    struct imageview *iv = opaque;
    return spool_get(iv->spool, key, buf, len);
}

static void sink_spool_drop(void *opaque, uint64_t key)
{
    struct imageview *iv = opaque;
    spool_drop(iv->spool, key);
}

const struct nbdf_sink imagesink = {
    .begin = sink_begin, .data = sink_data, .zero = sink_zero,
    .compressed = sink_compressed,
};

const struct nbdf_sink imagesink_spooling = {
    .begin = sink_begin, .data = sink_data, .zero = sink_zero,
    .compressed = sink_compressed, .spool_put = sink_spool_put,
    .spool_get = sink_spool_get, .spool_drop = sink_spool_drop,
};
