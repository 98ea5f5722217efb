/* tools/verify/source-vmdk.c: VMDK images (streamOptimized and
 * monolithicSparse, the two the nbd.vmdk view takes) as SOURCE or
 * DESTINATION, decoded to their virtual disk.
 *
 * The file is parsed the way qemu reads it, through the grain directory
 * and tables (vmdk/vmdk.h, vmdk_image_*): a streamOptimized file whose
 * directory is at its end is found through its footer.  A simple source:
 *   - size:   the header's capacity;
 *   - extent: unallocated and zero grains are known zero without reading;
 *             runs of the same kind are merged (up to EXTENT_MAX);
 *   - read:   monolithicSparse grains are pread as they are;
 *             streamOptimized grains are read whole (marker, compressed
 *             bytes) and inflated, the last one kept for the next read.
 * Used by one thread at a time (the inflated grain is a cache).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/verify/verify.h"
#include "vmdk/vmdk.h"

#define EXTENT_MAX (256ull << 20)   /* as source-vhd.c */
#define MARKER_HEAD 12              /* lba (8), compressed size (4) */

struct vmdk_src {
    struct verify_source s;         /* first: the ops see this */
    int fd;                         /* owned */
    struct vmdk_image *img;         /* owned */
    const struct vmdk_header *h;    /* the image's */
    uint64_t grain_bytes;
    struct vmdk_inflater *z;        /* owned; streamOptimized only */
    unsigned char *grain;           /* owned: the last inflated grain */
    uint64_t grain_off;             /* its disk offset; UINT64_MAX: none */
    unsigned char *cbuf;            /* owned: compressed bytes */
    size_t ccap;
};

/* 0, or -errno (-EIO at the end of the file). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t n = pread(fd, buf, len, (off_t) off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        buf = (unsigned char *) buf + n;
        off += (uint64_t) n;
        len -= (size_t) n;
    }
    return 0;
}

/* A compressed grain fits in twice a grain plus the marker (deflate grows
 * incompressible data by a few bytes per 64 KiB). */
static int read_compressed(struct vmdk_src *v, uint64_t marker, uint64_t *lba,
                           size_t *clen)
{
    unsigned char head[MARKER_HEAD];
    uint32_t size;
    int r = pread_full(v->fd, head, sizeof head, marker);

    if (r < 0)
        return r;
    vmdk_marker_decode(head, lba, &size);
    if (size == 0 || size > 2 * v->grain_bytes) {
        verify_err("%s: the grain marker at byte %llu claims %u compressed "
                   "bytes", v->s.name, (unsigned long long) marker, size);
        return -EINVAL;
    }
    if (size > v->ccap) {
        unsigned char *b = realloc(v->cbuf, size);
        if (!b)
            return -ENOMEM;
        v->cbuf = b;
        v->ccap = size;
    }
    *clen = size;
    return pread_full(v->fd, v->cbuf, size, marker + MARKER_HEAD);
}

/* Make the grain at disk offset goff (aligned) the cached one. */
static int inflate_grain(struct vmdk_src *v, uint64_t goff, uint64_t marker)
{
    struct vmdk_grain g;
    struct nbdf_err e = { "" };
    uint64_t lba;
    size_t clen;

    if (v->grain_off == goff)
        return 0;
    v->grain_off = UINT64_MAX;
    int r = read_compressed(v, marker, &lba, &clen);
    if (r < 0)
        return r;
    if (lba * VMDK_SECTOR != goff) {
        verify_err("%s: the grain table entry for byte %llu of the disk "
                   "points at the marker of LBA %llu", v->s.name,
                   (unsigned long long) goff, (unsigned long long) lba);
        return -EINVAL;
    }
    vmdk_grain_init(&g, v->h, lba, marker, v->cbuf, clen);
    memset(v->grain, 0, v->grain_bytes);   /* a short last grain */
    if (vmdk_grain_inflate(v->z, &g, v->grain, &e) < 0) {
        verify_err("%s: %s", v->s.name, e.msg);
        return -EINVAL;
    }
    v->grain_off = goff;
    return 0;
}

/* n bytes of the disk at off, all inside one grain (p). */
static int read_piece(struct vmdk_src *v, const struct vmdk_place *p,
                      unsigned char *buf, size_t n, uint64_t off)
{
    uint64_t goff = off - off % v->grain_bytes;
    int r;

    switch (p->src) {
    case VMDK_SRC_ZERO:
        memset(buf, 0, n);
        return 0;
    case VMDK_SRC_FILE:
        return pread_full(v->fd, buf, n, p->file_off);
    case VMDK_SRC_MARKER:
        if ((r = inflate_grain(v, goff, p->file_off)) < 0)
            return r;
        memcpy(buf, v->grain + (off - goff), n);
        return 0;
    }
    return -EINVAL;
}

static int vmdk_read(struct verify_source *s, void *buf, size_t len,
                     uint64_t off)
{
    struct vmdk_src *v = (struct vmdk_src *) s;
    unsigned char *b = buf;
    int r = 0;

    while (r == 0 && len > 0) {
        struct vmdk_place p;
        if ((r = vmdk_image_lookup(v->img, off, &p)) < 0)
            break;
        size_t n = p.len < len ? (size_t) p.len : len;
        if ((r = read_piece(v, &p, b, n, off)) == 0) {
            b += n;
            off += n;
            len -= n;
        }
    }
    if (r < 0 && r != -EINVAL)  /* -EINVAL was logged with the reason */
        verify_err("%s: read at byte %llu of the virtual disk: %s", s->name,
                   (unsigned long long) off, strerror(-r));
    return r;
}

static int vmdk_extent(struct verify_source *s, uint64_t off, uint64_t end,
                       uint64_t *len, bool *zero)
{
    struct vmdk_src *v = (struct vmdk_src *) s;
    uint64_t limit = end - off < EXTENT_MAX ? end : off + EXTENT_MAX;
    uint64_t pos = off;

    *zero = false;
    *len = end - off;
    if (!s->opt->use_extents)
        return 0;
    while (pos < limit) {
        struct vmdk_place p;
        int r = vmdk_image_lookup(v->img, pos, &p);
        if (r < 0)
            return r;
        bool z = p.src == VMDK_SRC_ZERO;
        if (pos > off && z != *zero)
            break;
        *zero = z;
        pos += p.len < limit - pos ? p.len : limit - pos;
    }
    *len = pos - off;
    return 0;
}

static void vmdk_close(struct verify_source *s)
{
    struct vmdk_src *v = (struct vmdk_src *) s;

    vmdk_image_free(v->img);
    vmdk_inflater_free(v->z);
    free(v->grain);
    free(v->cbuf);
    if (v->fd >= 0)
        close(v->fd);
    free(v);
}

static const struct verify_source_ops vmdk_ops = {
    .kind = "vmdk",
    .extent = vmdk_extent,
    .read = vmdk_read,
    .close = vmdk_close,
};

/* Feed the parser the pieces it asks for. */
static int parse(struct vmdk_src *v, uint64_t file_size)
{
    unsigned char sec[VMDK_SECTOR], *buf = NULL;
    struct nbdf_err e = { "" };
    uint64_t off;
    size_t len;
    int r = pread_full(v->fd, sec, sizeof sec, 0);

    if (r == 0)
        r = vmdk_image_new(sec, file_size, &v->img, &e);
    while (r == 0 && (r = vmdk_image_next(v->img, &off, &len)) > 0) {
        unsigned char *b = realloc(buf, len ? len : 1);
        if (!b) {
            r = -ENOMEM;
            break;
        }
        buf = b;
        if ((r = pread_full(v->fd, buf, len, off)) == 0)
            r = vmdk_image_supply(v->img, buf, &e);
    }
    free(buf);
    if (r < 0)
        verify_err("%s: %s%s", v->s.name, e.msg[0] ? e.msg : strerror(-r),
                   r == -EINVAL ? " (--format=raw hashes the file as it is)"
                                : "");
    return r;
}

int src_vmdk_open(const char *path, int fd, uint64_t file_size,
                  const struct source_options *opt,
                  struct verify_source **out)
{
    struct vmdk_src *v = calloc(1, sizeof *v);
    int r;

    *out = NULL;
    if (!v) {
        close(fd);
        verify_err("out of memory");
        return -ENOMEM;
    }
    v->fd = fd;
    v->grain_off = UINT64_MAX;
    v->s = (struct verify_source) { .ops = &vmdk_ops, .name = path,
                                    .opt = opt };
    if ((r = parse(v, file_size)) < 0) {
        vmdk_close(&v->s);
        return r;
    }
    v->h = vmdk_image_header(v->img);
    v->grain_bytes = vmdk_header_grain_bytes(v->h);
    v->s.size = v->h->capacity * VMDK_SECTOR;
    if ((v->h->flags & VMDK_FLAG_MARKERS) &&
        ((r = vmdk_inflater_new(&v->z)) < 0 ||
         !(v->grain = malloc(v->grain_bytes)))) {
        verify_err("out of memory");
        vmdk_close(&v->s);
        return -ENOMEM;
    }
    *out = &v->s;
    return 0;
}
