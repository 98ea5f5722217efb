/* tools/verify/source-vhdx.c: fixed and dynamic VHDX images as SOURCE,
 * decoded to their virtual disk through vhdx/'s random-access reader
 * (vhdx_image_open(): the header section, the current header and its log
 * replayed, the region table, the metadata and the BAT, checked at open):
 *   - size:   the metadata's virtual disk size;
 *   - extent: blocks not present (and zero, unmapped, undefined) are known
 *             zero; runs of the same kind are merged up to EXTENT_MAX;
 *   - read:   the present blocks' bytes, through pread.
 * A differencing VHDX is refused (its parent is not followed).
 *
 * pread only, and the image is read-only after open: read() is safe on
 * any thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/verify/verify.h"
#include "vhdx/vhdx.h"

#define EXTENT_MAX (256ull << 20)

struct vhdx_src {
    struct verify_source s;             /* first: the ops see this */
    int fd;
    struct vhdx_image *img;
    uint64_t block_size;
};

/* The image's reader: the file's bytes, -EINVAL past its end. */
static int read_at(void *opaque, void *buf, size_t len, uint64_t off)
{
    int fd = *(const int *) opaque;

    for (size_t done = 0; done < len;) {
        ssize_t n = pread(fd, (char *) buf + done, len - done,
                          (off_t) (off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EINVAL;             /* the file ends too soon */
        done += (size_t) n;
    }
    return 0;
}

static bool zero_at(const struct vhdx_src *v, uint64_t off)
{
    return vhdx_image_block(v->img, off / v->block_size) == 0;
}

static int vhdx_extent(struct verify_source *s, uint64_t off, uint64_t end,
                       uint64_t *len, bool *zero)
{
    struct vhdx_src *v = (struct vhdx_src *) s;
    uint64_t bs = v->block_size;
    uint64_t limit = end - off < EXTENT_MAX ? end : off + EXTENT_MAX;
    uint64_t pos = off;

    *zero = s->opt->use_extents && zero_at(v, off);
    if (!s->opt->use_extents) {
        *len = end - off;
        return 0;
    }
    while (pos < limit && zero_at(v, pos) == *zero)
        pos = (pos / bs + 1) * bs;
    *len = (pos < end ? pos : end) - off;
    return 0;
}

static int vhdx_read(struct verify_source *s, void *buf, size_t len,
                     uint64_t off)
{
    struct vhdx_src *v = (struct vhdx_src *) s;
    int r = vhdx_image_read(v->img, buf, len, off);

    if (r < 0)
        verify_err("%s: read %zu bytes at %llu of the virtual disk: %s",
                   s->name, len, (unsigned long long) off, strerror(-r));
    return r;
}

static void vhdx_close(struct verify_source *s)
{
    struct vhdx_src *v = (struct vhdx_src *) s;

    close(v->fd);
    vhdx_image_free(v->img);
    free(v);
}

static const struct verify_source_ops vhdx_ops = {
    .kind = "vhdx",
    .extent = vhdx_extent,
    .read = vhdx_read,
    .read_any_thread = true,
    .close = vhdx_close,
};

int src_vhdx_open(const char *path, int fd, const struct source_options *opt,
                  struct verify_source **out)
{
    struct nbdf_err e = { "" };
    struct vhdx_src *v = calloc(1, sizeof *v);
    off_t end = lseek(fd, 0, SEEK_END);

    *out = NULL;
    if (!v || end < 0) {
        int r = v ? -errno : -ENOMEM;
        verify_err("%s: %s", path, strerror(-r));
        close(fd);
        free(v);
        return r;
    }
    v->fd = fd;
    int r = vhdx_image_open(read_at, &v->fd, (uint64_t) end, &v->img, &e);
    if (r == -EMEDIUMTYPE)
        verify_err("%s: %s (verify the disk it lands on instead)", path,
                   e.msg);
    else if (r < 0)
        verify_err("%s: invalid VHDX: %s (--raw hashes the file as it is)",
                   path, e.msg[0] ? e.msg : strerror(-r));
    if (r < 0) {
        vhdx_close(&v->s);
        return r;
    }
    v->block_size = vhdx_image_meta(v->img)->block_size;
    v->s = (struct verify_source) { .ops = &vhdx_ops, .name = path,
                                    .size = vhdx_image_meta(v->img)->disk_size,
                                    .opt = opt };
    *out = &v->s;
    return 0;
}
