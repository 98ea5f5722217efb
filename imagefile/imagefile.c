/* imagefile/imagefile.c: an image file of any format, read with pread.
 * See imagefile/imagefile.h; the backing chain is imagefile/chain.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/minmax.h"
#include "imagefile/imagefile-internal.h"

#define NEED_MAX 4                      /* metadata reads one lookup may ask */

int imagefile_pread(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t) off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;                /* file shrank under us */
        p += n; off += (uint64_t) n; len -= (size_t) n;
    }
    return 0;
}

static int grow(uint8_t **buf, size_t *cap, size_t want)
{
    if (want <= *cap)
        return 0;
    uint8_t *b = realloc(*buf, want);
    if (!b)
        return -ENOMEM;
    *buf = b;
    *cap = want;
    return 0;
}

void imagefile_free(struct imagefile *f)
{
    while (f) {
        struct imagefile *b = f->backing;
        if (f->fd >= 0)
            close(f->fd);
        if (f->fmt && f->img)
            f->fmt->image_free(f->img);
        if (f->uctx)
            f->fmt->unpack->free_ctx(f->uctx);
        free(f->desc);
        free(f->cbuf);
        free(f->unit);
        free(f->meta);
        free(f->path);
        free(f);
        f = b;
    }
}

void imagefile_open_msg(struct nbdf_err *err, const char *path, int r,
                        const struct nbdf_err *e)
{
    if (e->msg[0])
        nbdf_errf(err, r, "%s", e->msg);
    else
        nbdf_errf(err, r, "%s: %s", path, strerror(-r));
}

/* ---- the pull loop ----------------------------------------------------- */

/* Serve what the image asks for until it asks for nothing. */
static int serve(struct imagefile *f, struct nbdf_err *e)
{
    uint64_t off;
    size_t len;
    int r;

    while ((r = f->fmt->image_next(f->img, &off, &len)) > 0) {
        if ((r = grow(&f->meta, &f->meta_cap, len ? len : 1)) < 0 ||
            (r = imagefile_pread(f->fd, f->meta, len, off)) < 0 ||
            (r = f->fmt->image_supply(f->img, f->meta, e)) < 0)
            return r;
    }
    return r;
}

static int parse(struct imagefile *f, struct nbdf_err *e)
{
    int r = f->fmt->image_new(f->file_size, &f->img, e);

    if (r == 0)
        r = serve(f, e);
    if (r == 0)
        f->size = f->fmt->image_size(f->img);
    return r;
}

/* fstat's size, or for a block device where its end is. */
static int identify(struct imagefile *f)
{
    struct stat st;

    if (fstat(f->fd, &st) < 0)
        return -errno;
    /* A directory opens and has a size (tmpfs: a few bytes per entry):
     * refused as what it is, not judged as an image too short. */
    if (S_ISDIR(st.st_mode))
        return -EISDIR;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    f->file_size = (uint64_t) st.st_size;
    if (!S_ISREG(st.st_mode)) {
        off_t end = lseek(f->fd, 0, SEEK_END);
        if (end < 0)
            return -errno;
        f->file_size = (uint64_t) end;
    }
    f->size = f->file_size;
    return 0;
}

int imagefile_open_fd(const char *path, int fd, const struct nbdf_format *fmt,
                      bool raw_ok, struct imagefile **out,
                      struct nbdf_err *err)
{
    struct imagefile *f = calloc(1, sizeof *f);
    int r;

    err->msg[0] = 0;
    if (!f) {
        close(fd);
        return -ENOMEM;
    }
    f->fd = fd;
    f->fmt = fmt;
    f->unit_off = UINT64_MAX;
    if (!(f->path = strdup(path)))
        r = -ENOMEM;
    else if ((r = identify(f)) == 0 && fmt)
        r = parse(f, err);
    if (r == -EINVAL && raw_ok) {       /* blktap: a raw parent */
        fmt->image_free(f->img);
        f->img = NULL;
        f->fmt = NULL;
        f->size = f->file_size;
        err->msg[0] = 0;
        r = 0;
    }
    if (r < 0) {
        imagefile_free(f);
        return r;
    }
    *out = f;
    return 0;
}

int imagefile_open(const char *path, const struct nbdf_format *fmt,
                   bool raw_ok, struct imagefile **out, struct nbdf_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    err->msg[0] = 0;
    if (fd < 0)
        return -errno;
    return imagefile_open_fd(path, fd, fmt, raw_ok, out, err);
}

/* ---- placing disk bytes ------------------------------------------------- */

/* A rule f's image breaks, named with its path. */
static int rule(const struct imagefile *f, int r, struct nbdf_err *e)
{
    if (e->msg[0]) {
        struct nbdf_err m = *e;
        nbdf_errf(e, r, "%s: %s", f->path, m.msg);
    }
    return r;
}

/* Where disk byte off (< f->size) of an image lives, the metadata the
 * lookup asks for read first. */
static int place(struct imagefile *f, uint64_t off, struct nbdf_place *p,
                 struct nbdf_err *e)
{
    for (int i = 0; i <= NEED_MAX; i++) {
        int r = f->fmt->image_lookup(f->img, off, p, e);
        /* A placement of no bytes would have the readers above loop on
         * the same offset for ever: a broken adapter, refused. */
        if (r == 0 && p->kind != NBDF_PLACE_NEED && p->len == 0)
            return nbdf_errf(e, -EIO, "%s: disk byte %llu placed in no "
                             "bytes", f->path, (unsigned long long) off);
        if (r == 0 && p->kind != NBDF_PLACE_NEED)
            return 0;
        if (r == 0)
            r = serve(f, e);
        if (r < 0)
            return rule(f, r, e);
    }
    return nbdf_errf(e, -EIO, "%s: disk byte %llu: the image keeps asking "
                     "for metadata", f->path, (unsigned long long) off);
}

/* File bytes [foff, +n) as the image reads them: a format with a patch
 * hook (a VHDX's log) may reach past the file's end, zeros there. */
static int file_bytes(struct imagefile *f, uint8_t *buf, size_t n,
                      uint64_t foff)
{
    if (!f->fmt || !f->fmt->image_patch)
        return imagefile_pread(f->fd, buf, n, foff);
    size_t have = foff < f->file_size
                  ? (size_t) MIN((uint64_t) n, f->file_size - foff) : 0;
    int r = imagefile_pread(f->fd, buf, have, foff);
    if (r < 0)
        return r;
    memset(buf + have, 0, n - have);
    f->fmt->image_patch(f->img, foff, buf, n);
    return 0;
}

/* Make the compressed unit of place p the one kept, decoded. */
static int decode_unit(struct imagefile *f, const struct nbdf_place *p,
                       struct nbdf_err *e)
{
    const struct nbdf_unpack *u = f->fmt->unpack;
    size_t usize = (size_t) f->fmt->image_unit(f->img);
    int r;

    if (f->unit_off == p->unit_off)
        return 0;
    f->unit_off = UINT64_MAX;
    if (!f->uctx && (r = u->new_ctx(&f->uctx)) < 0)
        return r;
    if (!f->desc && !(f->desc = malloc(u->desc_size)))
        return -ENOMEM;
    if ((r = grow(&f->cbuf, &f->ccap, (size_t) p->clen)) < 0 ||
        (r = imagefile_pread(f->fd, f->cbuf, (size_t) p->clen,
                             p->file_off)) < 0 ||
        (r = f->fmt->image_unpack_desc(f->img, p, f->cbuf, f->desc, e)) < 0 ||
        (r = grow(&f->unit, &f->unit_cap, usize)) < 0)
        return rule(f, r, e);
    memset(f->unit, 0, usize);          /* a short last unit */
    if (u->decode(f->uctx, f->desc, f->unit, e) < 0)
        return rule(f, -EINVAL, e);
    f->unit_off = p->unit_off;
    return 0;
}

static bool has_backing(const struct imagefile *f)
{
    return f->fmt->image_has_backing && f->fmt->image_has_backing(f->img);
}

/* One piece of [off, off+len) of f (off < f->size): *n bytes into buf. */
static int read_piece(struct imagefile *f, uint8_t *buf, size_t len,
                      uint64_t off, size_t *n, struct nbdf_err *e)
{
    struct nbdf_place p;
    int r;

    *n = (size_t) MIN((uint64_t) len, f->size - off);
    if (!f->fmt)
        return imagefile_pread(f->fd, buf, *n, off);
    if ((r = place(f, off, &p, e)) < 0)
        return r;
    *n = (size_t) MIN((uint64_t) len, p.len);
    switch (p.kind) {
    case NBDF_PLACE_FILE:
        return file_bytes(f, buf, *n, p.file_off);
    case NBDF_PLACE_COMPRESSED:
        if ((r = decode_unit(f, &p, e)) < 0)
            return r;
        memcpy(buf, f->unit + (off - p.unit_off), *n);
        return 0;
    case NBDF_PLACE_BACKING:
        if (f->backing)
            return imagefile_read(f->backing, off, buf, *n, e);
        if (has_backing(f))
            return -ENOENT;             /* the chain was not opened */
        break;
    default:
        break;
    }
    memset(buf, 0, *n);
    return 0;
}

int imagefile_read(struct imagefile *f, uint64_t off, void *vbuf, size_t len,
                   struct nbdf_err *e)
{
    uint8_t *buf = vbuf;

    e->msg[0] = 0;
    while (len > 0) {
        size_t n;
        int r;
        if (off >= f->size) {           /* past a smaller backing image */
            memset(buf, 0, len);
            return 0;
        }
        if ((r = read_piece(f, buf, len, off, &n, e)) < 0)
            return r;
        buf += n;
        off += n;
        len -= n;
    }
    return 0;
}

int imagefile_extent(struct imagefile *f, uint64_t off, uint64_t max,
                     uint64_t *len, bool *zero, struct nbdf_err *e)
{
    struct nbdf_place p;
    int r;

    e->msg[0] = 0;
    *zero = off >= f->size;             /* past a smaller backing image */
    *len = max;
    if (*zero || !f->fmt)
        return 0;
    if ((r = place(f, off, &p, e)) < 0)
        return r;
    *len = MIN(max, p.len);
    *zero = p.kind == NBDF_PLACE_ZERO;
    if (p.kind != NBDF_PLACE_BACKING)
        return 0;
    if (f->backing)
        return imagefile_extent(f->backing, off, *len, len, zero, e);
    if (has_backing(f))
        return -ENOENT;
    *zero = true;
    return 0;
}
