/* tools/verify/source-stream.c: a pipe on stdin, read once to its end.
 *
 * A pipe has no size and cannot seek, so it has no holes; every byte is
 * data (blkhash still skips hashing all-zero blocks).  Used by one thread. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/verify/verify.h"

struct stream_src {
    struct verify_source s;             /* first: the ops see this */
    int fd;                             /* owned */
};

/* Reads up to n bytes (fewer only at end of stream); -errno on failure. */
static ssize_t read_full(struct stream_src *f, unsigned char *buf, size_t n)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = read(f->fd, buf + got, n - got);
        if (r == 0)
            break;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = errno;
            verify_err("%s: %s", f->s.name, strerror(err));
            return -err;
        }
        got += (size_t) r;
    }
    return (ssize_t) got;
}

/* An image on a pipe would be hashed as its container: refused, unless
 * --format=raw. */
static int refuse_image(struct stream_src *f, const unsigned char *buf,
                        size_t n)
{
    const char *what = f->s.opt->format == SOURCE_FORMAT_RAW
                       ? NULL : source_probe_stream(buf, n);

    if (!what)
        return 0;
    verify_err("%s: a %s on a pipe: decoding it needs a file (save it "
               "first: nbdferry-verify reads images at random), or pass "
               "--format=raw to hash the bytes as they are", f->s.name, what);
    return -EMEDIUMTYPE;
}

static int stream_run(struct verify_source *s, struct sink *k)
{
    struct stream_src *f = (struct stream_src *) s;
    unsigned char *buf = malloc(s->opt->request_size);
    int r = 0;

    if (!buf) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    while (r == 0 && k->pos < k->end) {
        size_t want = k->end - k->pos < s->opt->request_size
                      ? k->end - k->pos : s->opt->request_size;
        ssize_t n = read_full(f, buf, want);
        if (n < 0)
            r = (int) n;
        else if (k->pos == 0 && (r = refuse_image(f, buf, (size_t) n)) < 0)
            ;
        else if (n > 0)
            r = sink_data(k, buf, (size_t) n);
        if (r == 0 && sink_aborted(k))
            r = -ECANCELED;
        if (r == 0 && (size_t) n < want)
            break;                      /* end of stream */
    }
    free(buf);
    if (r == 0 && !k->open_ended && k->pos < k->end) {
        verify_err("%s: ended after %llu bytes, fewer than --size %llu",
                   s->name, (unsigned long long) k->pos,
                   (unsigned long long) k->end);
        r = -EIO;
    }
    if (r == 0)
        s->size = k->pos;
    return r;
}

static void stream_close(struct verify_source *s)
{
    struct stream_src *f = (struct stream_src *) s;

    close(f->fd);
    free(f);
}

static const struct verify_source_ops stream_ops = {
    .kind = "stream",
    .run = stream_run,
    .close = stream_close,
};

int src_stream_open(const char *name, int fd, const struct source_options *opt,
                    struct verify_source **out)
{
    struct stream_src *f = calloc(1, sizeof *f);

    *out = NULL;
    if (!f) {
        close(fd);
        verify_err("out of memory");
        return -ENOMEM;
    }
    f->fd = fd;
    f->s = (struct verify_source) { .ops = &stream_ops, .name = name,
                                    .size = VERIFY_SIZE_UNKNOWN, .opt = opt };
    *out = &f->s;
    return 0;
}
