/* tools/imgtool/imgtool.c: see imgtool.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/iszero.h"
#include "common/optlist.h"
#include "config.h"
#include "tools/imgtool/imgtool.h"

const char *imgtool_prog = "nbdferry-imgtool";

void imgtool_msg(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", imgtool_prog);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int imgtool_open_in(const char *path)
{
    if (strcmp(path, "-") == 0)
        return STDIN_FILENO;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        imgtool_msg("%s: %s", path, strerror(errno));
    return fd;
}

ssize_t imgtool_read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *) buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        got += (size_t) n;
    }
    return (ssize_t) got;
}

int imgtool_feed(int fd, const char *path,
                 int (*feed)(void *s, uint64_t off, const void *buf,
                             size_t len),
                 void *s)
{
    uint8_t *buf = malloc(IMGTOOL_CHUNK);
    uint64_t off = 0;
    int r = 0;

    if (!buf) {
        imgtool_msg("out of memory");
        return IMGTOOL_EXIT_USAGE;
    }
    for (;;) {
        ssize_t n = imgtool_read_full(fd, buf, IMGTOOL_CHUNK);
        if (n < 0) {
            imgtool_msg("%s: %s", path, strerror((int) -n));
            r = IMGTOOL_EXIT_USAGE;
            break;
        }
        if (n == 0 || (r = feed(s, off, buf, (size_t) n)) < 0)
            break;
        off += (uint64_t) n;
    }
    free(buf);
    return r;
}

int imgtool_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    while (len) {
        ssize_t n = pread(fd, buf, len, (off_t) off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        buf = (char *) buf + n, off += (uint64_t) n, len -= (size_t) n;
    }
    return 0;
}

int imgtool_raw_read(void *opaque, uint64_t off, void *buf, size_t len)
{
    return imgtool_pread_full(*(int *) opaque, buf, len, off);
}

int imgtool_out_open(struct imgtool_out *o, const char *path)
{
    o->name = path ? path : "stdout";
    o->pos = 0;
    o->fd = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                 : STDOUT_FILENO;
    if (o->fd < 0) {
        imgtool_msg("%s: %s", path, strerror(errno));
        return -errno;
    }
    o->seekable = lseek(o->fd, 0, SEEK_CUR) >= 0;
    return 0;
}

static int write_all(int fd, const void *buf, size_t len, off_t off, bool at)
{
    while (len) {
        ssize_t n = at ? pwrite(fd, buf, len, off) : write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        buf = (const char *) buf + n, off += n, len -= (size_t) n;
    }
    return 0;
}

int imgtool_out_write(struct imgtool_out *o, uint64_t off, const void *buf,
                      size_t len)
{
    static const uint8_t zeros[65536];
    int r;
    if (o->fd < 0)
        return 0;
    if (o->seekable) {
        if (buf == NULL || is_zero(buf, len))
            return 0;                   /* holes stay holes */
        r = write_all(o->fd, buf, len, (off_t) off, true);
    } else {
        if (off < o->pos) {
            imgtool_msg("%s: the image places data out of disk order: to a "
                        "pipe it needs them in order (use -o FILE)", o->name);
            return -ESPIPE;
        }
        r = 0;
        while (r == 0 && o->pos < off) {             /* the gap: zeros */
            size_t n = off - o->pos < sizeof zeros ? off - o->pos : sizeof zeros;
            r = write_all(o->fd, zeros, n, 0, false);
            o->pos += n;
        }
        if (r == 0 && len) {
            r = buf ? write_all(o->fd, buf, len, 0, false) : 0;
            for (size_t k = 0; !buf && r == 0 && k < len; k += sizeof zeros)
                r = write_all(o->fd, zeros, len - k < sizeof zeros
                              ? len - k : sizeof zeros, 0, false);
            o->pos += len;
        }
    }
    if (r < 0)
        imgtool_msg("%s: %s", o->name, strerror(-r));
    return r;
}

int imgtool_out_finish(struct imgtool_out *o, uint64_t size)
{
    int r = 0;
    if (o->fd < 0)
        return 0;
    if (o->seekable && ftruncate(o->fd, (off_t) size) < 0)
        r = -errno;
    else if (!o->seekable && o->pos < size)
        r = imgtool_out_write(o, size, NULL, 0);
    if (o->fd != STDOUT_FILENO && close(o->fd) < 0 && r == 0)
        r = -errno;
    if (r < 0 && r != -ESPIPE)
        imgtool_msg("%s: %s", o->name, strerror(-r));
    o->fd = -1;
    return r;
}

int imgtool_out_end(struct imgtool_out *o, int r, const uint64_t *size)
{
    if (r == 0 && size)
        return imgtool_out_finish(o, *size) < 0 ? IMGTOOL_EXIT_USAGE : 0;
    if (r != 0 && o->fd >= 0 && o->fd != STDOUT_FILENO)
        close(o->fd);
    return r;
}

int imgtool_data_ranges(int fd, uint64_t size,
                        int (*add)(void *opaque, uint64_t off, uint64_t len),
                        void *opaque)
{
    for (off_t pos = 0; (uint64_t) pos < size;) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0)
            return errno == ENXIO ? 0 : -errno;
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h <= d || (uint64_t) h > size)
            h = (off_t) size;
        int r = add(opaque, (uint64_t) d, (uint64_t) (h - d));
        if (r < 0)
            return r;
        pos = h;
    }
    return 0;
}

int imgtool_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    }
    if (errno || end == s || *end || s[0] == '-' ||
        (v << shift) >> shift != v)
        return -EINVAL;
    *out = (uint64_t) v << shift;
    return 0;
}

/* The synthesizer's bytes, in order, to o. */
static int export_copy(const char *raw, int fd, void *s,
                       const struct imgtool_synth_ops *ops,
                       struct imgtool_out *o)
{
    uint8_t *buf = malloc(IMGTOOL_CHUNK);
    int r = buf ? 0 : -ENOMEM;

    for (uint64_t off = 0; r == 0;) {
        int64_t n = ops->read(s, off, buf, IMGTOOL_CHUNK, &fd);
        if (n < 0) {
            imgtool_msg("%s: %s", raw, strerror((int) -n));
            r = (int) n;
        } else if (n == 0) {
            break;
        } else if ((r = imgtool_out_write(o, off, buf, (size_t) n)) == 0) {
            off += (uint64_t) n;
        }
    }
    free(buf);
    return r;
}

int imgtool_export(const char *raw, const char *out,
                   const struct imgtool_synth_ops *ops)
{
    int fd = imgtool_open_in(raw), r = IMGTOOL_EXIT_USAGE, rr;
    struct imgtool_out o = { .fd = -1 };
    void *s = NULL;
    struct stat st;

    if (fd < 0)
        return IMGTOOL_EXIT_USAGE;
    if (fstat(fd, &st) < 0) {
        imgtool_msg("%s: %s", raw, strerror(errno));
        goto out;
    }
    if ((r = ops->new_synth(raw, &st, out, &s)) != 0)
        goto out;
    r = IMGTOOL_EXIT_USAGE;
    if ((rr = imgtool_data_ranges(fd, (uint64_t) st.st_size, ops->allocate,
                                  s)) < 0 || (rr = ops->seal(s)) < 0) {
        imgtool_msg("%s: %s", raw, strerror(-rr));
        goto out;
    }
    if (imgtool_out_open(&o, out) < 0 || export_copy(raw, fd, s, ops, &o) < 0)
        goto out;
    r = imgtool_out_finish(&o, ops->file_size(s)) < 0 ? IMGTOOL_EXIT_USAGE : 0;
out:
    if (o.fd >= 0 && o.fd != STDOUT_FILENO)
        close(o.fd);
    if (fd != STDIN_FILENO)
        close(fd);
    if (s)
        ops->free(s);
    return r;
}

/* ---- the command line --------------------------------------------------- */

uint64_t imgtool_spool_max = 1ull << 30;
uint64_t imgtool_cluster_size;

static void usage(FILE *f, const struct imgtool_verbs *v)
{
    const char *p = imgtool_prog;

    fprintf(f, "usage: %s info FILE\n       %s check FILE\n       %s map FILE\n"
            "       %s cat FILE [-o OUT]\n       %s export %sRAW -o OUT\n",
            p, p, p, p, p, v->cluster_size ? "[--cluster-size SIZE] " : "");
    if (v->spool)
        fputs("Options: --spool-max SIZE (default 1G): bytes of a file held "
              "while\n         the tables that place them have not "
              "arrived.\n", f);
    if (v->cluster_size)
        fprintf(f, "%s--cluster-size SIZE (default 64K): the export's "
                "clusters, a\n         power of two from 512 to 2M.\n",
                v->spool ? "         " : "Options: ");
    fprintf(f, "FILE may be - (standard input).\n"
            "Exit status: 0 ok, 1 invalid %s, 2 usage or I/O error.\n",
            v->what);
}

static int run_verb(const struct imgtool_verbs *v, const char *cmd,
                    const char *file, const char *out)
{
    if (strcmp(cmd, "cat") == 0)
        return v->cat(file, out);
    if (strcmp(cmd, "export") == 0 && out)
        return imgtool_export(file, out, v->export);
    if (!out && strcmp(cmd, "info") == 0)
        return v->info(file);
    if (!out && strcmp(cmd, "check") == 0)
        return v->check(file);
    if (!out && strcmp(cmd, "map") == 0)
        return v->map(file);
    usage(stderr, v);
    return IMGTOOL_EXIT_USAGE;
}

int imgtool_main(int argc, char **argv, const struct imgtool_verbs *v)
{
    /* Only the options the program offers, so that completion lists only
     * what it takes. */
    static const struct option spool_opt =
        { "spool-max", required_argument, NULL, 258 };
    static const struct option cluster_opt =
        { "cluster-size", required_argument, NULL, 259 };
    static const struct option common[] = {
        { "output", required_argument, NULL, 'o' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { "long-options", no_argument, NULL, 256 },
        { "short-options", no_argument, NULL, 257 },
        { NULL, 0, NULL, 0 },
    };
    struct option o[2 + sizeof common / sizeof common[0]];
    size_t no = 0;
    if (v->spool)
        o[no++] = spool_opt;
    if (v->cluster_size)
        o[no++] = cluster_opt;
    memcpy(o + no, common, sizeof common);
    static const char short_opts[] = "o:hV";
    const char *out = NULL;
    int c;

    while ((c = getopt_long(argc, argv, short_opts, o, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 258:
            if (imgtool_parse_size(optarg, &imgtool_spool_max) < 0) {
                imgtool_msg("--spool-max %s: not a size (like 512M)", optarg);
                return IMGTOOL_EXIT_USAGE;
            }
            break;
        case 259: {
            uint64_t n;
            if (imgtool_parse_size(optarg, &n) < 0 || n < 512 ||
                n > (2u << 20) || (n & (n - 1))) {
                imgtool_msg("--cluster-size %s: not a power of two from 512 "
                            "to 2M", optarg);
                return IMGTOOL_EXIT_USAGE;
            }
            imgtool_cluster_size = n;
            break;
        }
        case 'h': usage(stdout, v); return 0;
        case 'V': printf("%s %s\n", imgtool_prog, PACKAGE_VERSION); return 0;
        case 256: optlist_long(o); return 0;            /* completion */
        case 257: optlist_short(short_opts); return 0;
        default: usage(stderr, v); return IMGTOOL_EXIT_USAGE;
        }
    }
    if (argc - optind != 2) {
        usage(stderr, v);
        return IMGTOOL_EXIT_USAGE;
    }
    return run_verb(v, argv[optind], argv[optind + 1], out);
}
