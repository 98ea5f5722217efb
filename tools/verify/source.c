/* tools/verify/source.c: open an operand; drive simple sources. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/verify/verify.h"

/* "-" is stdin: a file or block device redirected there is read like any
 * other (holes, VHD); anything else (a pipe) is a stream.  *stream tells. */
static int open_fd(const char *path, bool *stream)
{
    struct stat st;
    int fd = strcmp(path, "-") == 0 ? fcntl(0, F_DUPFD_CLOEXEC, 3)
                                    : open(path, O_RDONLY | O_CLOEXEC);

    *stream = false;
    if (fd == -1) {
        int err = errno;
        verify_err("%s: %s", path, strerror(err));
        return -err;
    }
    if (strcmp(path, "-") == 0 && fstat(fd, &st) == 0 &&
        !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
        *stream = true;
    return fd;
}

/* PROBED_* or -errno. */
static int probe(int fd, uint64_t size)
{
    unsigned char head[512];
    ssize_t got = pread(fd, head, sizeof head, 0);

    if (got < 0)
        return -errno;
    int vhd = src_vhd_probe(fd, size);
    if (vhd < 0)
        return vhd;
    return vhd ? PROBED_VHD : source_probe_head(head, (size_t) got);
}


/* The format to read fd as, or -errno (logged). */
static int choose_format(const char *path, int fd, uint64_t size,
                         enum source_format want)
{
    if (want == SOURCE_FORMAT_RAW)
        return SOURCE_FORMAT_RAW;
    int p = probe(fd, size);
    if (p < 0) {
        verify_err("%s: %s", path, strerror(-p));
        return p;
    }
    if (want != SOURCE_FORMAT_AUTO) {
        static const struct { int probed; const char *opt, *name; } w[] = {
            [SOURCE_FORMAT_VHD] = { PROBED_VHD, "vhd", "VHD" },
            [SOURCE_FORMAT_VMDK] = { PROBED_VMDK, "vmdk", "VMDK" },
            [SOURCE_FORMAT_VHDX] = { PROBED_VHDX, "vhdx", "VHDX" },
            [SOURCE_FORMAT_QCOW2] = { PROBED_QCOW2, "qcow2", "qcow2 image" },
        };
        if (p == w[want].probed)
            return want;
        verify_err("%s: --format=%s, but this is %s %s", path, w[want].opt,
                   p == PROBED_RAW ? "not a" : "a",
                   p == PROBED_RAW ? w[want].name : source_probed_name(p));
        return -EMEDIUMTYPE;
    }
    switch (p) {
    case PROBED_RAW:  return SOURCE_FORMAT_RAW;
    case PROBED_VHD:  return SOURCE_FORMAT_VHD;
    case PROBED_VMDK: return SOURCE_FORMAT_VMDK;
    case PROBED_VHDX: return SOURCE_FORMAT_VHDX;
    case PROBED_QCOW2: return SOURCE_FORMAT_QCOW2;
    }
    verify_err("%s: a %s, which nbdferry-verify does not decode: its digest "
               "would be the container's, not the disk's.  %s, or pass "
               "--format=raw to hash the file's bytes as they are", path,
               source_probed_name(p), p == PROBED_TAR
               ? "Verify the disk inside it (tar -xf the .vmdk out)"
               : p == PROBED_VMDK_DESCRIPTOR
               ? "Verify its extent file (the -flat.vmdk holds the raw disk)"
               : "Convert it to raw first (qemu-img convert -O raw)");
    return -EMEDIUMTYPE;
}

/* The file source found the size (block devices too): probe with it, and
 * reopen through a decoder if one applies. */
static int open_path(const char *path, const struct source_options *opt,
                     struct verify_source **out)
{
    bool stream;
    int fd = open_fd(path, &stream);
    if (fd < 0)
        return fd;
    if (stream)
        return src_stream_open(path, fd, opt, out);
    int r = src_file_open(path, fd, opt, out);
    if (r < 0)
        return r;
    uint64_t size = (*out)->size;
    int f = choose_format(path, fd, size, opt->format);
    if (f == SOURCE_FORMAT_RAW)
        return 0;
    int dfd = f < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 3);
    int err = errno;
    source_close(*out);
    *out = NULL;
    if (f < 0)
        return f;
    if (dfd == -1) {
        verify_err("%s: dup: %s", path, strerror(err));
        return -err;
    }
    return src_image_open(path, dfd, (enum source_format) f, opt, out);
}

int source_open(const char *operand, const struct source_options *opt,
                bool is_source, struct verify_source **out)
{
    int r;

    *out = NULL;
    if (strstr(operand, "://"))
        r = src_nbd_open(operand, opt, out);
    else
        r = open_path(operand, opt, out);
    if (r == 0 && is_source && opt->vhd_nparents &&
        strcmp((*out)->ops->kind, "vhd") != 0) {
        verify_err("%s: --parent given, but this is not a VHD", operand);
        source_close(*out);
        *out = NULL;
        r = -EINVAL;
    }
    return r;
}

void source_close(struct verify_source *s)
{
    if (s)
        s->ops->close(s);
}

static int read_any_thread(void *ctx, void *buf, size_t len, uint64_t off)
{
    struct verify_source *s = ctx;

    return s->ops->read(s, buf, len, off);
}

/* Data the sink can have its hasher threads read: whole jobs go there,
 * the rest (*lead bytes) is read here. */
static int64_t defer(struct verify_source *s, struct sink *k, uint64_t len,
                     uint64_t *lead)
{
    *lead = len;
    if (!s->ops->read_any_thread)
        return 0;
    return sink_defer(k, len, read_any_thread, s, lead);
}

/* One extent: a known-zero range goes to the sink as such; a data range is
 * read in request_size pieces.  The kernel's readahead (the file source asks
 * for POSIX_FADV_SEQUENTIAL) overlaps the next read with our hashing. */
static int run_extent(struct verify_source *s, struct sink *k,
                      unsigned char *buf, uint64_t len, bool zero)
{
    if (zero)
        return sink_zero(k, len);
    while (len > 0) {
        uint64_t lead;
        int64_t t = defer(s, k, len, &lead);
        int r;

        if (t < 0)
            return (int) t;
        if (t == 0) {
            size_t n = lead < s->opt->request_size ? lead
                                                   : s->opt->request_size;
            if ((r = s->ops->read(s, buf, n, k->pos)) < 0)
                return r;
            if ((r = sink_data(k, buf, n)) != 0)
                return r;
            t = (int64_t) n;
        }
        if (sink_aborted(k))
            return -ECANCELED;
        len -= (uint64_t) t;
    }
    return 0;
}

static int run_simple(struct verify_source *s, struct sink *k)
{
    unsigned char *buf = malloc(s->opt->request_size);
    int r = 0;

    if (!buf) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    while (r == 0 && k->pos < k->end) {
        uint64_t len;
        bool zero;

        if (sink_aborted(k))
            r = -ECANCELED;
        else if ((r = s->ops->extent(s, k->pos, k->end, &len, &zero)) == 0)
            r = run_extent(s, k, buf, len, zero);
    }
    free(buf);
    return r;
}

int source_run(struct verify_source *s, struct sink *k)
{
    int r = s->ops->run ? s->ops->run(s, k) : run_simple(s, k);

    if (r == SINK_STOP)
        r = 0;
    return r;
}
