/* tools/verify/source-image.c: VHD, VMDK, VHDX and qcow2 images as SOURCE
 * or DESTINATION, decoded to their virtual disk.
 *
 * Detection is source.c's; parsing and lookups belong to the format
 * libraries (their tables' random-access members, common/format.h), the
 * file reads, the backing chain and the inflation of compressed units to
 * imagefile/.  What is here is each format's wording.  A simple source:
 *   - size:   the top image's virtual size;
 *   - extent: what the image maps as zero (unallocated VHD blocks and
 *             clear bitmap bits, unallocated and zero VMDK grains, absent
 *             VHDX blocks, zero and unallocated qcow2 clusters), down the
 *             backing chain, is known zero without reading data; runs of
 *             the same kind are merged (up to EXTENT_MAX);
 *   - read:   the image's bytes down the chain, compressed units inflated
 *             (the last one kept).
 * The backing chain: a differencing VHD's parents (--parent first, then
 * its locators), a qcow2's backing files (imagefile/chain.c has both
 * rules).  A differencing VHDX is refused (its parent is not followed).
 * Used by one thread at a time (each level caches its metadata), except a
 * VHDX: nothing is cached after open, read() runs on any thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "imagefile/imagefile.h"
#include "qcow2/qcow2.h"
#include "tools/verify/verify.h"
#include "vhd/vhd.h"
#include "vhdx/vhdx.h"
#include "vmdk/vmdk.h"

#define VHD_COOKIE "conectix"
/* Merge lookups up to this much: large enough that a hole costs one
 * sink_zero() per block run, small enough to check the abort flag often. */
#define EXTENT_MAX (256ull << 20)
#define RAW_HINT " (--raw hashes the file as it is)"
#define FORMAT_RAW_HINT " (--format=raw hashes the file as it is)"

struct image_src {
    struct verify_source s;             /* first: the ops see this */
    struct imagefile *top;              /* owned, with its backing chain */
    enum source_format format;
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

/* A rule an image broke was named with its path; anything else is said
 * here, with the offset. */
static int image_read(struct verify_source *s, void *buf, size_t len,
                      uint64_t off)
{
    struct image_src *v = (struct image_src *) s;
    struct nbdf_err e;
    int r = imagefile_read(v->top, off, buf, len, &e);

    if (r < 0 && e.msg[0])
        verify_err("%s", e.msg);
    if (r < 0 && e.msg[0] && r == -EINVAL)
        return r;
    if (r < 0 && v->format == SOURCE_FORMAT_VMDK)
        verify_err("%s: read at byte %" PRIu64 " of the virtual disk: %s",
                   s->name, off, strerror(-r));
    else if (r < 0)
        verify_err("%s: read %zu bytes at %" PRIu64 " of the virtual disk: "
                   "%s", s->name, len, off, strerror(-r));
    return r;
}

/* With --no-extents, everything is read (holes come back as zeros from
 * imagefile_read): a cross-check of the extent path. */
static int image_extent(struct verify_source *s, uint64_t off, uint64_t end,
                        uint64_t *len, bool *zero)
{
    struct image_src *v = (struct image_src *) s;
    uint64_t limit = end - off < EXTENT_MAX ? end : off + EXTENT_MAX;
    uint64_t pos = off;
    struct nbdf_err e = { "" };
    int r = 0;

    *zero = false;
    *len = end - off;
    if (!s->opt->use_extents)
        return 0;
    while (pos < limit) {
        uint64_t n;
        bool z;
        if ((r = imagefile_extent(v->top, pos, limit - pos, &n, &z, &e)) < 0)
            break;
        if (pos > off && z != *zero)
            break;
        *zero = z;
        pos += n;
    }
    if (r < 0 && e.msg[0])
        verify_err("%s", e.msg);
    else if (r < 0 && v->format == SOURCE_FORMAT_VHD)
        verify_err("%s: reading a block bitmap at virtual offset %llu: %s",
                   s->name, (unsigned long long) pos, strerror(-r));
    else if (r < 0)
        verify_err("%s: %s", s->name, strerror(-r));
    if (r < 0)
        return r;
    *len = pos - off;
    return 0;
}

static void image_close(struct verify_source *s)
{
    struct image_src *v = (struct image_src *) s;

    imagefile_free(v->top);
    free(v);
}

#define IMAGE_OPS(k, any_thread) {                                          \
    .kind = k, .extent = image_extent, .read = image_read,                  \
    .read_any_thread = any_thread, .close = image_close }

/* Per format: its table, its kind in the report, how its open failure is
 * worded. */
static const struct image_format {
    const struct nbdf_format *fmt;
    struct verify_source_ops ops;
} formats[] = {
    [SOURCE_FORMAT_VHD] = { &vhd_format, IMAGE_OPS("vhd", false) },
    [SOURCE_FORMAT_VMDK] = { &vmdk_format, IMAGE_OPS("vmdk", false) },
    [SOURCE_FORMAT_VHDX] = { &vhdx_format, IMAGE_OPS("vhdx", true) },
    [SOURCE_FORMAT_QCOW2] = { &qcow2_format, IMAGE_OPS("qcow2", false) },
};

static void open_failed(const char *path, enum source_format f, int r,
                        const struct nbdf_err *e)
{
    const char *why = e->msg[0] ? e->msg : strerror(-r);

    switch (f) {
    case SOURCE_FORMAT_VHD:
        if (r == -EINVAL)
            verify_err("%s: invalid VHD: %s" RAW_HINT, path, e->msg);
        else
            verify_err("%s: %s", path, strerror(-r));
        break;
    case SOURCE_FORMAT_VHDX:
        if (r == -EMEDIUMTYPE)
            verify_err("%s: %s (verify the disk it lands on instead)", path,
                       e->msg);
        else
            verify_err("%s: invalid VHDX: %s" RAW_HINT, path, why);
        break;
    default:                            /* VMDK, qcow2 */
        verify_err("%s: %s%s", path, why, r == -EINVAL ? FORMAT_RAW_HINT
                                                       : "");
        break;
    }
}

/* The backing chain: for a VHD, opt->vhd_parents first, then locators;
 * more --parent than the chain has levels is a mistake worth naming. */
static int open_chain(const char *path, struct imagefile *top,
                      enum source_format f, const struct source_options *opt)
{
    struct nbdf_err err = { "" };
    bool vhd = f == SOURCE_FORMAT_VHD;
    int r = imagefile_open_chain(top, vhd ? opt->vhd_parents : NULL,
                                 vhd ? opt->vhd_nparents : 0, &err);

    if (r < 0) {
        verify_err("%s", err.msg);
        return r;
    }
    unsigned depth = imagefile_chain_depth(top);
    if (vhd && opt->vhd_nparents > depth) {
        verify_err("%s: %zu --parent given, but its chain has %u "
                   "differencing level%s", path, opt->vhd_nparents, depth,
                   depth == 1 ? "" : "s");
        return -EINVAL;
    }
    return 0;
}

int src_image_open(const char *path, int fd, enum source_format f,
                   const struct source_options *opt,
                   struct verify_source **out)
{
    struct nbdf_err err = { "" };
    struct imagefile *top;
    struct image_src *v;
    int r = imagefile_open_fd(path, fd, formats[f].fmt, false, &top, &err);

    *out = NULL;
    if (r < 0) {
        open_failed(path, f, r, &err);
        return r;
    }
    if ((r = open_chain(path, top, f, opt)) < 0) {
        imagefile_free(top);
        return r;
    }
    if (!(v = calloc(1, sizeof *v))) {
        imagefile_free(top);
        verify_err("out of memory");
        return -ENOMEM;
    }
    v->s = (struct verify_source) { .ops = &formats[f].ops, .name = path,
                                    .size = top->size, .opt = opt };
    v->top = top;
    v->format = f;
    *out = &v->s;
    return 0;
}
