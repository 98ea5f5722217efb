/* imagefile/chain.c: an image's backing chain, opened as its format's rule
 * says (common/format.h, enum nbdf_backing_rule):
 *   LOCATED (VHD): a differencing disk's parent from --parent, else its
 *     locators and unicode name, each resolved inside the child's
 *     directory (the names are untrusted); the parent's identity checked
 *     (the format's hook); a raw parent only where the format allows it.
 *   NAMED (qcow2, as qemu): the name in the header, relative to the
 *     directory of the image that names it (absolute as it is), never a
 *     protocol; of the format the header says (this one or raw), probed
 *     from its first bytes when unsaid.
 * Either way at most IMAGEFILE_CHAIN_MAX levels, and a file met twice
 * (device and inode) is a loop.  The messages are each rule's own. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/imagekind.h"
#include "imagefile/imagefile-internal.h"

#define NAME_MAX_LEN 4096

static bool in_chain(const struct imagefile *top, const struct imagefile *m)
{
    for (; top; top = top->backing)
        if (top->dev == m->dev && top->ino == m->ino)
            return true;
    return false;
}

static bool has_backing(const struct imagefile *f)
{
    return f->fmt && f->fmt->image_has_backing &&
           f->fmt->image_has_backing(f->img);
}

/* ---- LOCATED: a VHD's differencing chain ---------------------------------- */

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

/* The first candidate name that resolves, or NULL with the candidates
 * tried listed in tried[]. */
static char *find_parent(const struct imagefile *m, char *tried, size_t size)
{
    char name[NAME_MAX_LEN], *found = NULL;
    size_t used = 0;
    unsigned i = 0;

    tried[0] = 0;
    for (; m->fmt->image_backing(m->img, i, name, sizeof name) > 0; i++) {
        if (!found)
            found = resolve_inside(m->path, name);
        if (!found)
            used += snprintf(tried + used, used < size ? size - used : 0,
                             "%s\"%s\"", used ? ", " : "", name);
    }
    if (!found && i == 0)
        snprintf(tried, size, "no parent locator or name");
    return found;
}

/* Open and attach m's parent at path (owned, freed here). */
static int attach_located(struct imagefile *top, struct imagefile *m,
                          char *path, struct nbdf_err *err)
{
    struct nbdf_err e = { "" }, ve = { "" }, line;
    struct imagefile *p;
    bool raw_ok = m->fmt->image_backing_raw_ok &&
                  m->fmt->image_backing_raw_ok(m->img);
    int r = imagefile_open(path, m->fmt, raw_ok, &p, &e);

    if (r < 0) {
        imagefile_open_msg(&line, path, r, &e);
        free(path);
        return nbdf_errf(err, r, "parent of %s: %s", m->path, line.msg);
    }
    free(path);
    if (in_chain(top, p)) {
        nbdf_errf(err, -EINVAL, "%s: differencing chain loops back to %s",
                  top->path, p->path);
        imagefile_free(p);
        return -EINVAL;
    }
    m->backing = p;
    if (p->fmt && m->fmt->image_check_backing &&
        m->fmt->image_check_backing(m->img, p->img, &ve) < 0)
        return nbdf_errf(err, -EINVAL, "%s: parent %s: %s", m->path,
                         p->path, ve.msg);
    return 0;
}

static int open_located(struct imagefile *top, struct imagefile *m,
                        size_t level, const char *const *parents,
                        size_t nparents, struct nbdf_err *err)
{
    char tried[768];

    if (level >= IMAGEFILE_CHAIN_MAX)
        return nbdf_errf(err, -EINVAL, "%s: differencing chain deeper "
                         "than %d", top->path, IMAGEFILE_CHAIN_MAX);
    char *path = level < nparents ? strdup(parents[level])
                                  : find_parent(m, tried, sizeof tried);
    if (!path && level < nparents)
        return -ENOMEM;
    if (!path)
        return nbdf_errf(err, -ENOENT, "%s: cannot find the parent (tried "
                         "%s); use --parent", m->path, tried);
    return attach_located(top, m, path, err);
}

/* ---- NAMED: a qcow2's backing file ------------------------------------------ */

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

/* The format of a backing file whose header does not say it, probed from
 * its first bytes: fmt's name, "raw", or another image format's (to be
 * refused). */
static const char *probe_backing(int fd, const struct nbdf_format *fmt)
{
    unsigned char head[8] = { 0 };

    if (pread(fd, head, sizeof head, 0) < 0)
        return "raw";                   /* the read fails again, named */
    enum image_kind k = image_kind(head, sizeof head);
    if (k == fmt->kind)
        return fmt->name;
    if (k == IMAGE_VHD || k == IMAGE_VMDK || k == IMAGE_VHDX ||
        k == IMAGE_QCOW2)
        return "VHD, VMDK or VHDX";
    return "raw";
}

/* child's backing file, named by its header, opened as *out (raw or of
 * child's format). */
static int named_level(struct imagefile *child, struct imagefile **out,
                       struct nbdf_err *err)
{
    const struct nbdf_format *fmt = child->fmt;
    const char *said = fmt->image_backing_format
                       ? fmt->image_backing_format(child->img) : "";
    char name[NAME_MAX_LEN];
    struct nbdf_err e = { "" };
    int r;

    if (fmt->image_backing(child->img, 0, name, sizeof name) <= 0)
        return nbdf_errf(err, -EINVAL, "%s: backing file name unreadable",
                         child->path);
    if (has_protocol(name))
        return nbdf_errf(err, -EMEDIUMTYPE, "%s: backing file \"%s\" is not "
                         "a local file (a protocol or json: name); convert "
                         "the chain to one image first (qemu-img convert -O "
                         "%s)", child->path, name, fmt->name);
    char *path = backing_path(child->path, name);
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd == -1) {
        r = path ? -errno : -ENOMEM;
        nbdf_errf(err, r, "%s: backing file %s: %s", child->path,
                  path ? path : name, strerror(-r));
        free(path);
        return r;
    }
    const char *kind = said[0] ? said : probe_backing(fd, fmt);
    bool raw = strcmp(kind, "raw") == 0;
    if (!raw && strcmp(kind, fmt->name) != 0) {
        nbdf_errf(err, -EMEDIUMTYPE, "%s: backing file %s is %s%s: only %s "
                  "and raw backing files are read (qemu-img convert the "
                  "chain to one image first)", child->path, path,
                  said[0] ? "of format " : "a ", kind, fmt->name);
        close(fd);
        free(path);
        return -EMEDIUMTYPE;
    }
    r = imagefile_open_fd(path, fd, raw ? NULL : fmt, false, out, &e);
    if (r < 0)
        nbdf_errf(err, r, "%s: backing file %s: %s", child->path, path,
                  e.msg[0] ? e.msg : strerror(-r));
    free(path);
    return r;
}

static int open_named(struct imagefile *top, struct imagefile *child,
                      size_t level, struct nbdf_err *err)
{
    struct imagefile *b = NULL;
    int r;

    if (level >= IMAGEFILE_CHAIN_MAX)
        return nbdf_errf(err, -ELOOP, "%s: the backing chain is deeper "
                         "than %u levels", top->path, IMAGEFILE_CHAIN_MAX);
    if ((r = named_level(child, &b, err)) < 0)
        return r;
    child->backing = b;
    for (const struct imagefile *lv = top; lv != b; lv = lv->backing)
        if (lv->dev == b->dev && lv->ino == b->ino)
            return nbdf_errf(err, -ELOOP, "%s: the backing chain loops: %s "
                             "names %s, which is already in the chain (as "
                             "%s)", top->path, child->path, b->path,
                             lv->path);
    return 0;
}

/* ---- the chain ------------------------------------------------------------- */

int imagefile_open_chain(struct imagefile *top, const char *const *parents,
                         size_t nparents, struct nbdf_err *err)
{
    struct imagefile *m = top;

    err->msg[0] = 0;
    for (size_t level = 0; has_backing(m); level++) {
        int r = m->fmt->image_backing_rule == NBDF_BACKING_LOCATED
                ? open_located(top, m, level, parents, nparents, err)
                : open_named(top, m, level, err);
        if (r < 0)
            return r;
        m = m->backing;
    }
    return 0;
}

unsigned imagefile_chain_depth(const struct imagefile *top)
{
    unsigned n = 0;

    for (; has_backing(top); top = top->backing)
        n++;
    return n;
}
