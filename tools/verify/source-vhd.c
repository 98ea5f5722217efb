/* tools/verify/source-vhd.c: VHD images as SOURCE, decoded to their
 * virtual disk.
 *
 * Detection is here; parsing and lookups belong to the vhd/ library, the
 * file reads and the parent chain to vhdfile/vhdfile.c (shared with the
 * inspector's cat).  It is a simple source:
 *   - size:   the footer's current size (the virtual disk size);
 *   - extent: unallocated blocks and clear bitmap bits of a dynamic disk are
 *             known zero; in a differencing disk they fall through to the
 *             parent, zero only where the parent says so; runs of the same
 *             kind are merged (up to EXTENT_MAX) so extents stay large;
 *   - read:   pread the sectors of allocated blocks, down the chain.
 * Used by one thread at a time (the chain caches a block bitmap).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/verify/verify.h"
#include "vhdfile/vhdfile.h"

#define VHD_COOKIE "conectix"
/* Merge lookups up to this much: large enough that a hole costs one
 * sink_zero() per block run, small enough to check the abort flag often. */
#define EXTENT_MAX (256ull << 20)

struct vhd_src {
    struct verify_source s;             /* first: the ops see this */
    struct vhdfile *top;                /* owned, with its parents */
};

static int cookie_at(int fd, uint64_t off)
{
    char buf[sizeof VHD_COOKIE - 1];
    ssize_t n = pread(fd, buf, sizeof buf, (off_t) off);

    if (n == -1)
        return -errno;
    return n == (ssize_t) sizeof buf && memcmp(buf, VHD_COOKIE, sizeof buf) == 0;
}

/* Dynamic and differencing VHDs start with a copy of the footer; every VHD
 * ends with one (fixed VHDs have nothing else). */
int src_vhd_probe(int fd, uint64_t size)
{
    if (size < VHD_SECTOR)
        return 0;
    int r = cookie_at(fd, 0);
    if (r != 0)
        return r;
    return cookie_at(fd, size - VHD_SECTOR);
}

static int vhd_read(struct verify_source *s, void *buf, size_t len,
                    uint64_t off)
{
    struct vhd_src *v = (struct vhd_src *) s;
    int r = vhdfile_read(v->top, off, buf, len);

    if (r < 0)
        verify_err("%s: read %zu bytes at %llu of the virtual disk: %s",
                   s->name, len, (unsigned long long) off, strerror(-r));
    return r;
}

/* With --no-extents, everything is read (holes come back as zeros from
 * vhdfile_read): a cross-check of the extent path. */
static int vhd_extent(struct verify_source *s, uint64_t off, uint64_t end,
                      uint64_t *len, bool *zero)
{
    struct vhd_src *v = (struct vhd_src *) s;
    uint64_t limit = end - off < EXTENT_MAX ? end : off + EXTENT_MAX;
    uint64_t pos = off;
    int r = 0;

    *zero = false;
    *len = end - off;
    if (!s->opt->use_extents)
        return 0;
    while (r == 0 && pos < limit) {
        uint64_t n;
        bool z;
        if ((r = vhdfile_extent(v->top, pos, limit - pos, &n, &z)) < 0)
            break;
        if (pos > off && z != *zero)
            break;
        *zero = z;
        pos += n;
    }
    if (r < 0) {
        verify_err("%s: reading a block bitmap at virtual offset %llu: %s",
                   s->name, (unsigned long long) pos, strerror(-r));
        return r;
    }
    *len = pos - off;
    return 0;
}

static void vhd_close(struct verify_source *s)
{
    struct vhd_src *v = (struct vhd_src *) s;

    vhdfile_free(v->top);
    free(v);
}

static const struct verify_source_ops vhd_ops = {
    .kind = "vhd",
    .extent = vhd_extent,
    .read = vhd_read,
    .close = vhd_close,
};

/* Parents: opt->vhd_parents first, then locators.  More --parent than the
 * chain has levels is a mistake worth naming. */
static int open_chain(const char *path, struct vhdfile *top,
                      const struct source_options *opt)
{
    struct nbdf_err err = { "" };
    int r = vhdfile_open_chain(top, opt->vhd_parents, opt->vhd_nparents, &err);

    if (r < 0) {
        verify_err("%s", err.msg);
        return r;
    }
    unsigned depth = vhdfile_chain_depth(top);
    if (opt->vhd_nparents > depth) {
        verify_err("%s: %zu --parent given, but its chain has %u "
                   "differencing level%s", path, opt->vhd_nparents, depth,
                   depth == 1 ? "" : "s");
        return -EINVAL;
    }
    return 0;
}

int src_vhd_open(const char *path, int fd, const struct source_options *opt,
                 struct verify_source **out)
{
    struct nbdf_err err = { "" };
    struct vhdfile *top;
    struct vhd_src *v;
    int r = vhdfile_open_fd(path, fd, false, &top, &err);

    *out = NULL;
    if (r == -EINVAL)
        verify_err("%s: invalid VHD: %s (--raw hashes the file as it is)",
                   path, err.msg);
    else if (r < 0)
        verify_err("%s", err.msg);
    if (r < 0)
        return r;
    if ((r = open_chain(path, top, opt)) < 0) {
        vhdfile_free(top);
        return r;
    }
    if (!(v = calloc(1, sizeof *v))) {
        vhdfile_free(top);
        verify_err("out of memory");
        return -ENOMEM;
    }
    v->s = (struct verify_source) { .ops = &vhd_ops, .name = path,
                                    .size = top->size, .opt = opt };
    v->top = top;
    *out = &v->s;
    return 0;
}
