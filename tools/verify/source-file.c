/* tools/verify/source-file.c: a regular file or a block device.
 *
 * Holes come from SEEK_DATA/SEEK_HOLE and are delivered as known zero
 * without reading.  Where the file system or device does not support them
 * (EINVAL), everything is data.  Used by one thread at a time. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/verify/verify.h"

struct file_src {
    struct verify_source s;             /* first: the ops see this */
    int fd;                             /* owned */
    bool seek_holes;                    /* SEEK_DATA/SEEK_HOLE usable */
};

static int file_size(const char *path, int fd, uint64_t *size)
{
    struct stat st;

    if (fstat(fd, &st) == -1) {
        int err = errno;
        verify_err("%s: %s", path, strerror(err));
        return -err;
    }
    if (S_ISREG(st.st_mode)) {
        *size = (uint64_t) st.st_size;
        return 0;
    }
    if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, size) == -1) {
            int err = errno;
            verify_err("%s: BLKGETSIZE64: %s", path, strerror(err));
            return -err;
        }
        return 0;
    }
    verify_err("%s: not a regular file or block device", path);
    return -EINVAL;
}

static void seek_unsupported(struct file_src *f)
{
    f->seek_holes = false;
}

/* Past the last data, ENXIO; anything else (EINVAL: no support) turns the
 * hole lookups off and the rest of the file is read as data. */
static int file_extent(struct verify_source *s, uint64_t off, uint64_t end,
                       uint64_t *len, bool *zero)
{
    struct file_src *f = (struct file_src *) s;

    *zero = false;
    *len = end - off;
    if (!f->seek_holes)
        return 0;
    off_t data = lseek(f->fd, (off_t) off, SEEK_DATA);
    if (data == -1) {
        if (errno == ENXIO)
            *zero = true;
        else
            seek_unsupported(f);
        return 0;
    }
    if ((uint64_t) data > off) {
        *zero = true;
        *len = ((uint64_t) data < end ? (uint64_t) data : end) - off;
        return 0;
    }
    off_t hole = lseek(f->fd, (off_t) off, SEEK_HOLE);
    if (hole == -1)
        seek_unsupported(f);
    else if ((uint64_t) hole < end && (uint64_t) hole > off)
        *len = (uint64_t) hole - off;
    return 0;
}

static int file_read(struct verify_source *s, void *buf, size_t len,
                     uint64_t off)
{
    struct file_src *f = (struct file_src *) s;
    char *p = buf;

    while (len > 0) {
        ssize_t n = pread(f->fd, p, len, (off_t) off);
        if (n == -1 && errno == EINTR)
            continue;
        if (n <= 0) {
            int err = n == 0 ? EIO : errno;
            verify_err("%s: read %zu bytes at %llu: %s", s->name, len,
                       (unsigned long long) off,
                       n == 0 ? "file shrank" : strerror(err));
            return -err;
        }
        p += n;
        off += (uint64_t) n;
        len -= (size_t) n;
    }
    return 0;
}

static void file_close(struct verify_source *s)
{
    struct file_src *f = (struct file_src *) s;

    close(f->fd);
    free(f);
}

static const struct verify_source_ops file_ops = {
    .kind = "file",
    .extent = file_extent,
    .read = file_read,
    .read_any_thread = true,             /* pread on a shared fd */
    .close = file_close,
};

int src_file_open(const char *path, int fd, const struct source_options *opt,
                  struct verify_source **out)
{
    uint64_t size;
    int r = file_size(path, fd, &size);
    if (r < 0) {
        close(fd);
        return r;
    }
    struct file_src *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        verify_err("out of memory");
        return -ENOMEM;
    }
    f->s = (struct verify_source) { .ops = &file_ops, .name = path,
                                    .size = size, .opt = opt };
    f->fd = fd;
    f->seek_holes = opt->use_extents;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    *out = &f->s;
    return 0;
}
