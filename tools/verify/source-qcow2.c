/* tools/verify/source-qcow2.c: qcow2 images (versions 2 and 3) as SOURCE
 * or DESTINATION, decoded to their virtual disk.
 *
 * Parsing and lookups belong to the qcow2/ library (qcow2_image_*:
 * header, L1 table, each L2 entry checked); the reads, the L2 tables it
 * asks for, decompression and the backing chain are here.  A simple
 * source:
 *   - size:   the top image's virtual size;
 *   - extent: zero clusters and subclusters, unallocated ones of an image
 *             without a backing file, and what lies past a backing file's
 *             end are known zero without reading data; runs of the same
 *             kind are merged (up to EXTENT_MAX);
 *   - read:   data clusters pread as they are, compressed clusters read
 *             whole and decompressed (deflate or zstd; the last one kept),
 *             unallocated ones read from the backing file.
 * The backing chain follows qemu: the name in the header, relative to the
 * directory of the image that names it (absolute as it is); its format
 * from the header's backing format extension (qcow2 or raw; other formats
 * are refused), probed when absent; at most CHAIN_MAX levels, and a file
 * met twice (device and inode) is a loop, refused.
 * Used by one thread at a time (each level caches one L2 table, the
 * source one decompressed cluster).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/minmax.h"
#include "qcow2/qcow2.h"
#include "tools/verify/verify.h"

#define EXTENT_MAX (256ull << 20)   /* as source-vhd.c */
#define CHAIN_MAX 32                /* backing levels followed */

struct level {
    char *path;                     /* owned: as opened */
    int fd;                         /* owned */
    dev_t dev;
    ino_t ino;
    uint64_t file_size;
    uint64_t size;                  /* its disk (raw: the file's size) */
    struct qcow2_image *img;        /* owned; NULL: a raw backing file */
    uint8_t *l2;                    /* owned: the last L2 table read */
    uint64_t l2_off;                /* its file offset; 0: none */
    struct level *backing;          /* owned; NULL: none */
};

struct qcow2_src {
    struct verify_source s;         /* first: the ops see this */
    struct level *top;              /* owned, with its backing chain */
    struct qcow2_decompressor *dz;  /* owned, made at the first use */
    uint8_t *cbuf;                  /* owned: compressed bytes */
    size_t ccap;
    uint8_t *cluster;               /* owned: the last decompressed one */
    size_t cluster_cap;
    const struct level *cl_level;   /* whose; NULL: none */
    uint64_t cl_off;                /* its disk offset */
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

static void level_free(struct level *lv)
{
    while (lv) {
        struct level *next = lv->backing;
        qcow2_image_free(lv->img);
        free(lv->l2);
        free(lv->path);
        if (lv->fd >= 0)
            close(lv->fd);
        free(lv);
        lv = next;
    }
}

/* ---- lookups, reads and extents down the chain --------------------------- */

/* The place of disk byte off (< lv->size) of a qcow2 level, the L2 table
 * the lookup names read first if it is not the one kept. */
static int locate(struct level *lv, uint64_t off, struct qcow2_place *p)
{
    struct nbdf_err e = { "" };
    int r = qcow2_image_lookup(lv->img, off, lv->l2_off ? lv->l2 : NULL,
                               lv->l2_off, p, &e);

    if (r == 0 && p->src == QCOW2_SRC_L2) {
        lv->l2_off = 0;
        if (!lv->l2 && !(lv->l2 = malloc(p->len)))
            r = -ENOMEM;
        else if ((r = pread_full(lv->fd, lv->l2, p->len, p->file_off)) == 0)
            lv->l2_off = p->file_off;
        if (r == 0)
            r = qcow2_image_lookup(lv->img, off, lv->l2, lv->l2_off, p, &e);
    }
    if (r < 0)
        verify_err("%s: %s", lv->path, e.msg[0] ? e.msg : strerror(-r));
    return r;
}

/* Make the compressed cluster of place p (of level lv) the kept one. */
static int decompress(struct qcow2_src *q, const struct level *lv,
                      const struct qcow2_place *p)
{
    struct qcow2_compressed c;
    struct nbdf_err e = { "" };
    int r;

    if (q->cl_level == lv && q->cl_off == p->cluster)
        return 0;
    q->cl_level = NULL;
    if (!q->dz && (r = qcow2_decompressor_new(&q->dz)) < 0)
        return r;
    if ((r = grow(&q->cbuf, &q->ccap, (size_t) p->clen)) < 0 ||
        (r = pread_full(lv->fd, q->cbuf, (size_t) p->clen, p->file_off)) < 0)
        return r;
    qcow2_image_compressed(lv->img, p, q->cbuf, &c);
    if ((r = grow(&q->cluster, &q->cluster_cap, c.cluster_size)) < 0)
        return r;
    if (qcow2_compressed_decode(q->dz, &c, q->cluster, &e) < 0) {
        verify_err("%s: %s", lv->path, e.msg);
        return -EINVAL;
    }
    q->cl_level = lv;
    q->cl_off = p->cluster;
    return 0;
}

/* One piece of [off, off+len) of level lv: *n bytes (<= len) into buf. */
static int read_piece(struct qcow2_src *q, struct level *lv, uint8_t *buf,
                      size_t len, uint64_t off, size_t *n);

/* Disk bytes [off, off+len) of level lv: past its end they read as zero
 * (a backing file smaller than its overlay). */
static int read_level(struct qcow2_src *q, struct level *lv, uint8_t *buf,
                      size_t len, uint64_t off)
{
    while (len > 0) {
        size_t n;
        int r;
        if (off >= lv->size) {
            memset(buf, 0, len);
            return 0;
        }
        if ((r = read_piece(q, lv, buf, len, off, &n)) < 0)
            return r;
        buf += n;
        off += n;
        len -= n;
    }
    return 0;
}

static int read_piece(struct qcow2_src *q, struct level *lv, uint8_t *buf,
                      size_t len, uint64_t off, size_t *n)
{
    struct qcow2_place p;
    int r;

    if (!lv->img) {                             /* raw */
        *n = (size_t) MIN((uint64_t) len, lv->size - off);
        return pread_full(lv->fd, buf, *n, off);
    }
    if ((r = locate(lv, off, &p)) < 0)
        return r;
    *n = (size_t) MIN((uint64_t) len, p.len);
    switch (p.src) {
    case QCOW2_SRC_FILE:
        return pread_full(lv->fd, buf, *n, p.file_off);
    case QCOW2_SRC_COMPRESSED:
        if ((r = decompress(q, lv, &p)) < 0)
            return r;
        memcpy(buf, q->cluster + (off - p.cluster), *n);
        return 0;
    case QCOW2_SRC_BACKING:
        if (lv->backing)
            return read_level(q, lv->backing, buf, *n, off);
        break;
    default:
        break;
    }
    memset(buf, 0, *n);                         /* zero */
    return 0;
}

/* [off, off + *len) of level lv (*len <= max) is all known zero (*zero)
 * or all to be read. */
static int extent_level(struct level *lv, uint64_t off, uint64_t max,
                        uint64_t *len, bool *zero)
{
    struct qcow2_place p;
    int r;

    if (off >= lv->size) {
        *len = max;
        *zero = true;
        return 0;
    }
    *zero = false;
    *len = MIN(max, lv->size - off);
    if (!lv->img)
        return 0;                               /* raw: data */
    if ((r = locate(lv, off, &p)) < 0)
        return r;
    *len = MIN(max, p.len);
    if (p.src == QCOW2_SRC_BACKING && lv->backing)
        return extent_level(lv->backing, off, *len, len, zero);
    *zero = p.src == QCOW2_SRC_ZERO || p.src == QCOW2_SRC_BACKING;
    return 0;
}

/* ---- the source -------------------------------------------------------- */

static int qcow2_read(struct verify_source *s, void *buf, size_t len,
                      uint64_t off)
{
    struct qcow2_src *q = (struct qcow2_src *) s;
    int r = read_level(q, q->top, buf, len, off);

    if (r < 0 && r != -EINVAL)          /* -EINVAL was logged with the rule */
        verify_err("%s: read %zu bytes at %" PRIu64 " of the virtual disk: "
                   "%s", s->name, len, off, strerror(-r));
    return r;
}

/* With --no-extents, everything is read (zero clusters come back as
 * zeros from qcow2_read): a cross-check of the extent path. */
static int qcow2_extent(struct verify_source *s, uint64_t off, uint64_t end,
                        uint64_t *len, bool *zero)
{
    struct qcow2_src *q = (struct qcow2_src *) s;
    uint64_t limit = end - off < EXTENT_MAX ? end : off + EXTENT_MAX;
    uint64_t pos = off;

    *zero = false;
    *len = end - off;
    if (!s->opt->use_extents)
        return 0;
    while (pos < limit) {
        uint64_t n;
        bool z;
        int r = extent_level(q->top, pos, limit - pos, &n, &z);
        if (r < 0)
            return r;
        if (pos > off && z != *zero)
            break;
        *zero = z;
        pos += n;
    }
    *len = pos - off;
    return 0;
}

static void qcow2_close(struct verify_source *s)
{
    struct qcow2_src *q = (struct qcow2_src *) s;

    level_free(q->top);
    qcow2_decompressor_free(q->dz);
    free(q->cbuf);
    free(q->cluster);
    free(q);
}

static const struct verify_source_ops qcow2_ops = {
    .kind = "qcow2",
    .extent = qcow2_extent,
    .read = qcow2_read,
    .close = qcow2_close,
};

/* ---- opening: the image and its backing chain ------------------------------ */

/* Feed lv's image the pieces it asks for. */
static int parse(struct level *lv, struct nbdf_err *e)
{
    uint8_t *buf = NULL;
    uint64_t off;
    size_t len;
    int r = qcow2_image_new(lv->file_size, &lv->img, e);

    while (r == 0 && (r = qcow2_image_next(lv->img, &off, &len)) > 0) {
        uint8_t *b = realloc(buf, len ? len : 1);
        if (!b) {
            r = -ENOMEM;
            break;
        }
        buf = b;
        if ((r = pread_full(lv->fd, buf, len, off)) == 0)
            r = qcow2_image_supply(lv->img, buf, e);
    }
    free(buf);
    if (r == 0)
        lv->size = qcow2_image_header(lv->img)->size;
    return r;
}

/* A level on fd (taken, even on error): its identity and size. */
static int level_new(const char *path, int fd, struct level **out)
{
    struct level *lv = calloc(1, sizeof *lv);
    struct stat st;

    if (!lv || !(lv->path = strdup(path))) {
        free(lv);
        close(fd);
        return -ENOMEM;
    }
    lv->fd = fd;
    if (fstat(fd, &st) == -1) {
        int err = errno;
        level_free(lv);
        return -err;
    }
    lv->dev = st.st_dev;
    lv->ino = st.st_ino;
    lv->file_size = lv->size = (uint64_t) st.st_size;
    *out = lv;
    return 0;
}

/* qemu's rule: a name with a ':' before any '/' names a protocol
 * ("nbd:", "json:{...}", "https://"), not a file. */
static bool has_protocol(const char *name)
{
    const char *colon = strchr(name, ':'), *slash = strchr(name, '/');
    return colon && (!slash || colon < slash);
}

/* The backing file's path: relative to the directory of child's path. */
static char *backing_path(const char *child, const char *name)
{
    const char *slash = strrchr(child, '/');
    size_t dir = name[0] == '/' || !slash ? 0 : (size_t) (slash - child) + 1;
    char *p = malloc(dir + strlen(name) + 1);

    if (p) {
        memcpy(p, child, dir);
        strcpy(p + dir, name);
    }
    return p;
}

/* "qcow2", "raw", or a reason to refuse the backing file on fd, whose
 * header does not say its format: probed from its first bytes. */
static const char *probe_backing(int fd)
{
    unsigned char head[8] = { 0 };

    if (pread(fd, head, sizeof head, 0) < 0)
        return "raw";                   /* the read fails again, named */
    if (memcmp(head, "QFI\xfb", 4) == 0)
        return "qcow2";
    if (memcmp(head, "conectix", 8) == 0 || memcmp(head, "KDMV", 4) == 0 ||
        memcmp(head, "vhdxfile", 8) == 0)
        return "VHD, VMDK or VHDX";
    return "raw";
}

static int open_backing(struct level *top, struct level *child, unsigned depth);

/* child's backing file (named by its header) as a new level. */
static int backing_level(struct level *child, struct level **out)
{
    const struct qcow2_header *h = qcow2_image_header(child->img);
    struct nbdf_err e = { "" };
    const char *fmt = h->backing_format;
    int r;

    if (has_protocol(h->backing_file)) {
        verify_err("%s: backing file \"%s\" is not a local file (a protocol "
                   "or json: name); convert the chain to one image first "
                   "(qemu-img convert -O qcow2)", child->path, h->backing_file);
        return -EMEDIUMTYPE;
    }
    char *path = backing_path(child->path, h->backing_file);
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd == -1) {
        r = path ? -errno : -ENOMEM;
        verify_err("%s: backing file %s: %s", child->path,
                   path ? path : h->backing_file, strerror(-r));
        free(path);
        return r;
    }
    if ((r = level_new(path, fd, out)) < 0)
        verify_err("%s: backing file %s: %s", child->path, path, strerror(-r));
    free(path);
    if (r < 0)
        return r;
    if (!fmt[0])
        fmt = probe_backing((*out)->fd);
    if (strcmp(fmt, "raw") == 0)
        return 0;
    if (strcmp(fmt, "qcow2") != 0) {
        verify_err("%s: backing file %s is %s%s: only qcow2 and raw backing "
                   "files are read (qemu-img convert the chain to one image "
                   "first)", child->path, (*out)->path,
                   h->backing_format[0] ? "of format " : "a ", fmt);
        return -EMEDIUMTYPE;
    }
    if ((r = parse(*out, &e)) < 0)
        verify_err("%s: backing file %s: %s", child->path, (*out)->path,
                   e.msg[0] ? e.msg : strerror(-r));
    return r;
}

static int open_backing(struct level *top, struct level *child, unsigned depth)
{
    struct level *b = NULL;
    int r;

    if (!child->img || !qcow2_image_header(child->img)->backing_file[0])
        return 0;
    if (depth >= CHAIN_MAX) {
        verify_err("%s: the backing chain is deeper than %u levels",
                   top->path, CHAIN_MAX);
        return -ELOOP;
    }
    if ((r = backing_level(child, &b)) < 0) {
        level_free(b);
        return r;
    }
    child->backing = b;
    for (const struct level *lv = top; lv != b; lv = lv->backing)
        if (lv->dev == b->dev && lv->ino == b->ino) {
            verify_err("%s: the backing chain loops: %s names %s, which "
                       "is already in the chain (as %s)", top->path,
                       child->path, b->path, lv->path);
            return -ELOOP;
        }
    return open_backing(top, b, depth + 1);
}

int src_qcow2_open(const char *path, int fd, const struct source_options *opt,
                   struct verify_source **out)
{
    struct qcow2_src *q = calloc(1, sizeof *q);
    struct nbdf_err e = { "" };
    int r;

    *out = NULL;
    if (!q) {
        close(fd);
        verify_err("out of memory");
        return -ENOMEM;
    }
    q->s = (struct verify_source) { .ops = &qcow2_ops, .name = path,
                                    .opt = opt };
    if ((r = level_new(path, fd, &q->top)) < 0) {
        verify_err("%s: %s", path, strerror(-r));
    } else if ((r = parse(q->top, &e)) < 0) {
        verify_err("%s: %s%s", path, e.msg[0] ? e.msg : strerror(-r),
                   r == -EINVAL ? " (--format=raw hashes the file as it is)"
                                : "");
    } else {
        r = open_backing(q->top, q->top, 0);
    }
    if (r < 0) {
        qcow2_close(&q->s);
        return r;
    }
    q->s.size = q->top->size;
    *out = &q->s;
    return 0;
}
