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

static int open_path(const char *path, const struct source_options *opt,
                     bool probe_vhd, struct verify_source **out)
{
    bool stream;
    int fd = open_fd(path, &stream);
    if (fd < 0)
        return fd;
    if (stream)
        return src_stream_open(path, fd, opt, out);
    int r = src_file_open(path, fd, opt, out);
    if (r < 0 || !probe_vhd)
        return r;

    /* The file source found the size (block devices too): probe with it. */
    r = src_vhd_probe(fd, (*out)->size);
    if (r <= 0) {
        if (r < 0) {
            verify_err("%s: %s", path, strerror(-r));
            source_close(*out);
            *out = NULL;
        }
        return r;
    }
    int vfd = dup(fd);
    int err = errno;
    source_close(*out);
    *out = NULL;
    if (vfd == -1) {
        verify_err("%s: dup: %s", path, strerror(err));
        return -err;
    }
    return src_vhd_open(path, vfd, opt, out);
}

int source_open(const char *operand, const struct source_options *opt,
                bool probe_vhd, struct verify_source **out)
{
    int r;

    *out = NULL;
    if (strstr(operand, "://"))
        r = src_nbd_open(operand, opt, out);
    else
        r = open_path(operand, opt, probe_vhd, out);
    if (r == 0 && probe_vhd && opt->vhd_nparents &&
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
