/* vhdfile/vhdfile.c: a VHD file and its differencing chain, read with pread.
 * See vhdfile/vhdfile.h.  Used by nbdferry-vhd and nbdferry-verify. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vhdfile/vhdfile.h"

/* One line into err, cut to fit (messages quote paths of any length). */
static void errf(struct nbdf_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void errf(struct nbdf_err *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

#define PARENT_CANDIDATES 9             /* 8 locators + the unicode name */

int vhdfile_pread(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;                /* file shrank under us */
        p += n; off += n; len -= n;
    }
    return 0;
}

/* ---- one chain member ---------------------------------------------------- */

void vhdfile_free(struct vhdfile *m)
{
    while (m) {
        struct vhdfile *p = m->parent;
        if (m->fd >= 0)
            close(m->fd);
        vhd_image_free(m->img);
        free(m->bm);
        free(m->path);
        free(m);
        m = p;
    }
}

static int supply_one(struct vhdfile *m, uint64_t off, size_t len,
                      struct nbdf_err *e)
{
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return -ENOMEM;
    int r = vhdfile_pread(m->fd, buf, len, off);
    if (r == 0)
        r = vhd_image_supply(m->img, buf, e);
    free(buf);
    return r;
}

/* Parse the VHD at m->fd.  Returns 0, -EINVAL (invalid: e set) or another
 * -errno (I/O).  A size over a library limit counts as invalid. */
static int parse(struct vhdfile *m, struct nbdf_err *e)
{
    uint8_t foot[VHD_FOOTER_SIZE];
    if (m->file_size < VHD_FOOTER_SIZE) {
        snprintf(e->msg, sizeof e->msg, "file of %" PRIu64 " bytes is "
                 "shorter than a VHD footer", m->file_size);
        return -EINVAL;
    }
    int r = vhdfile_pread(m->fd, foot, sizeof foot,
                          m->file_size - VHD_FOOTER_SIZE);
    if (r == 0)
        r = vhd_image_new(foot, m->file_size, &m->img, e);
    uint64_t off;
    size_t len;
    while (r == 0 && (r = vhd_image_next(m->img, &off, &len)) > 0)
        r = supply_one(m, off, len, e);
    if (r < 0)
        return r == -EFBIG ? -EINVAL : r;
    uint32_t bmb = vhd_image_bitmap_bytes(m->img);
    m->size = vhd_image_size(m->img);
    m->bm_block = UINT32_MAX;
    m->bm = malloc(bmb ? bmb : 1);
    return m->bm ? 0 : -ENOMEM;
}

static int open_fail(struct vhdfile *m, int r, const char *path,
                     struct nbdf_err *err)
{
    errf(err, "%s: %s", path, strerror(-r));
    vhdfile_free(m);
    return r;
}

int vhdfile_open_fd(const char *path, int fd, bool raw_ok,
                    struct vhdfile **out, struct nbdf_err *err)
{
    struct vhdfile *m = calloc(1, sizeof *m);
    struct stat st;
    if (!m) {
        close(fd);
        return open_fail(NULL, -ENOMEM, path, err);
    }
    m->fd = fd;
    if (!(m->path = strdup(path)))
        return open_fail(m, -ENOMEM, path, err);
    if (fstat(fd, &st) < 0)
        return open_fail(m, -errno, path, err);
    /* A directory opens and has a size (tmpfs: a few bytes per entry):
     * refused as what it is, not judged as an image too short. */
    if (S_ISDIR(st.st_mode))
        return open_fail(m, -EISDIR, path, err);
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    m->file_size = st.st_size;
    struct nbdf_err e = { "" };
    int r = parse(m, &e);
    if (r == -EINVAL && raw_ok) {       /* blktap: raw parent */
        vhd_image_free(m->img);
        m->img = NULL;
        m->size = m->file_size;
        r = 0;
    }
    if (r == -EINVAL) {
        errf(err, "%s", e.msg);
        vhdfile_free(m);
        return r;
    }
    if (r < 0)
        return open_fail(m, r, path, err);
    *out = m;
    return 0;
}

int vhdfile_open(const char *path, bool raw_ok, struct vhdfile **out,
                 struct nbdf_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return open_fail(NULL, -errno, path, err);
    return vhdfile_open_fd(path, fd, raw_ok, out, err);
}

/* ---- parent resolution ---------------------------------------------------- */

/* Candidate parent paths from the locators (MacX, W2ru, W2ku) and the
 * unicode name, in that order.  Returns the count; each is malloc'ed. */
static int parent_candidates(const struct vhdfile *m,
                             char *cand[PARENT_CANDIDATES])
{
    static const uint32_t order[] = { VHD_PLAT_MACX, VHD_PLAT_W2RU, VHD_PLAT_W2KU };
    const struct vhd_header *h = vhd_image_header(m->img);
    char path[4096];
    int n = 0;
    for (size_t o = 0; o < 3; o++)
        for (int i = 0; i < 8; i++) {
            size_t len;
            const uint8_t *p = vhd_image_locator_payload(m->img, i, &len);
            if (h->loc[i].code != order[o] || !p)
                continue;
            if (vhd_locator_path(&h->loc[i], p, len, path, sizeof path, NULL) > 0)
                cand[n++] = strdup(path);
        }
    if (vhd_parent_name(h, path, sizeof path) > 0)
        cand[n++] = strdup(path);
    return n;
}

/* Locator strings are untrusted: resolve a relative path against the
 * child's directory and accept it only if it stays inside that directory. */
static char *resolve_inside(const char *child, const char *rel)
{
    if (!rel || rel[0] == '/' || (rel[0] && rel[1] == ':'))
        return NULL;                    /* absolute (POSIX or Windows drive) */
    char *c = strdup(child);
    char dir[PATH_MAX], joined[PATH_MAX * 2], real[PATH_MAX];
    if (!c || !realpath(dirname(c), dir)) {
        free(c);
        return NULL;
    }
    free(c);
    snprintf(joined, sizeof joined, "%s/%s", dir, rel);
    if (!realpath(joined, real))
        return NULL;
    size_t dl = strlen(dir);
    if (strncmp(real, dir, dl) != 0 || (real[dl] != '/' && strcmp(dir, "/")))
        return NULL;
    return strdup(real);
}

/* The first candidate that resolves, or NULL with the candidates tried
 * listed in tried[]. */
static char *find_parent(const struct vhdfile *m, char *tried, size_t size)
{
    char *cand[PARENT_CANDIDATES] = { 0 }, *found = NULL;
    int n = parent_candidates(m, cand);
    size_t used = 0;
    tried[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!found)
            found = resolve_inside(m->path, cand[i]);
        if (!found && cand[i])
            used += snprintf(tried + used, used < size ? size - used : 0,
                             "%s\"%s\"", used ? ", " : "", cand[i]);
        free(cand[i]);
    }
    if (!found && n == 0)
        snprintf(tried, size, "no parent locator or name");
    return found;
}

static bool in_chain(const struct vhdfile *top, const struct vhdfile *m)
{
    for (; top; top = top->parent)
        if (top->dev == m->dev && top->ino == m->ino)
            return true;
    return false;
}

static bool zero_id(const uint8_t id[16])
{
    for (int i = 0; i < 16; i++)
        if (id[i])
            return false;
    return true;
}

/* Open and attach m's parent at path (owned, freed here). */
static int attach_parent(struct vhdfile *top, struct vhdfile *m, char *path,
                         struct nbdf_err *err)
{
    struct nbdf_err e = { "" };
    struct nbdf_err ve = { "" };
    struct vhdfile *p;
    bool raw_ok = zero_id(vhd_image_header(m->img)->parent_uuid);
    int r = vhdfile_open(path, raw_ok, &p, &e);
    free(path);
    if (r < 0) {
        errf(err, "parent of %s: %s", m->path, e.msg);
        return r;
    }
    if (in_chain(top, p)) {
        errf(err, "%s: differencing chain loops "
                 "back to %s", top->path, p->path);
        vhdfile_free(p);
        return -EINVAL;
    }
    m->parent = p;
    if (p->img && vhd_image_check_parent(m->img, p->img, &ve) < 0) {
        errf(err, "%s: parent %s: %s", m->path,
                 p->path, ve.msg);
        return -EINVAL;
    }
    return 0;
}

int vhdfile_open_chain(struct vhdfile *top, const char *const *parents,
                       size_t nparents, struct nbdf_err *err)
{
    struct vhdfile *m = top;
    err->msg[0] = 0;
    for (size_t level = 0; m->img && vhd_image_kind(m->img) == VHD_DIFF;
         level++) {
        if (level >= VHDFILE_CHAIN_MAX) {
            errf(err, "%s: differencing chain "
                     "deeper than %d", top->path, VHDFILE_CHAIN_MAX);
            return -EINVAL;
        }
        char tried[768];
        char *path = level < nparents ? strdup(parents[level])
                                      : find_parent(m, tried, sizeof tried);
        if (!path && level < nparents)
            return -ENOMEM;
        if (!path) {
            errf(err, "%s: cannot find the parent "
                     "(tried %s); use --parent", m->path, tried);
            return -ENOENT;
        }
        int r = attach_parent(top, m, path, err);
        if (r < 0)
            return r;
        m = m->parent;
    }
    return 0;
}

unsigned vhdfile_chain_depth(const struct vhdfile *top)
{
    unsigned n = 0;
    for (; top && top->img && vhd_image_kind(top->img) == VHD_DIFF;
         top = top->parent)
        n++;
    return n;
}

/* ---- random-access decode of a chain -------------------------------------- */

static int load_bitmap(struct vhdfile *m, uint64_t off,
                       const struct vhd_place *pl)
{
    uint32_t block = off / vhd_image_block_size(m->img);
    if (m->bm_block == block)
        return 0;
    int r = vhdfile_pread(m->fd, m->bm, pl->len, pl->file_off);
    m->bm_block = r == 0 ? block : UINT32_MAX;
    return r;
}

/* vhd_image_lookup(), reading the block's bitmap when it is needed. */
static int lookup(struct vhdfile *m, uint64_t off, struct vhd_place *pl)
{
    int r = vhd_image_lookup(m->img, off, NULL, pl);
    if (r == 0 && pl->src == VHD_SRC_BITMAP) {
        if ((r = load_bitmap(m, off, pl)) < 0)
            return r;
        r = vhd_image_lookup(m->img, off, m->bm, pl);
    }
    return r;
}

static int read_parent(struct vhdfile *m, uint64_t off, uint8_t *buf,
                       size_t len)
{
    struct vhdfile *p = m->parent;
    if (!p)
        return -ENOENT;
    size_t in = off < p->size ? (p->size - off < len ? p->size - off : len) : 0;
    memset(buf + in, 0, len - in);      /* a child may be larger than its parent */
    return in ? vhdfile_read(p, off, buf, in) : 0;
}

int vhdfile_read(struct vhdfile *m, uint64_t off, void *vbuf, size_t len)
{
    uint8_t *buf = vbuf;
    if (!m->img)                        /* raw parent */
        return vhdfile_pread(m->fd, buf, len, off);
    while (len) {
        struct vhd_place pl;
        int r = lookup(m, off, &pl);
        if (r < 0)
            return r;
        size_t n = pl.len < len ? pl.len : len;
        if (pl.src == VHD_SRC_FILE)
            r = vhdfile_pread(m->fd, buf, n, pl.file_off);
        else if (pl.src == VHD_SRC_ZERO)
            memset(buf, 0, n);
        else
            r = read_parent(m, off, buf, n);
        if (r < 0)
            return r;
        off += n; buf += n; len -= n;
    }
    return 0;
}

int vhdfile_extent(struct vhdfile *m, uint64_t off, uint64_t max,
                   uint64_t *len, bool *zero)
{
    struct vhd_place pl;
    *zero = false;
    *len = max;
    if (!m->img)                        /* raw parent: all data */
        return 0;
    int r = lookup(m, off, &pl);
    if (r < 0)
        return r;
    if (pl.len < max)
        *len = pl.len;
    *zero = pl.src == VHD_SRC_ZERO;
    if (pl.src != VHD_SRC_PARENT)
        return 0;
    if (!m->parent)
        return -ENOENT;
    if (off >= m->parent->size) {       /* past a smaller parent: zeros */
        *zero = true;
        return 0;
    }
    uint64_t in = m->parent->size - off;
    return vhdfile_extent(m->parent, off, *len < in ? *len : in, len, zero);
}
