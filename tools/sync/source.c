/* tools/sync/source.c: the disk nbdferry-sync copies from: a file or
 * block device (pread), or an NBD export (libnbd, one handle, one request
 * at a time: the mount pipelines the writes, and a cutover reads little).
 *
 * TIMEOUT
 * Each NBD step (the handshake, a read, a block status request) is
 * issued with the aio calls and waited for with nbd_poll(): a server that
 * moves no byte for s->timeout_s seconds fails the run with one line
 * naming it (-ETIMEDOUT), never a hang.  The handle is then closed with
 * the request unanswered (the server is not answering anyway).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libnbd.h>

#include "tools/sync/sync.h"

#define FILE_READ     ((size_t) 4 << 20)
#define NBD_READ      ((size_t) 4 << 20)    /* no more than the server's
                                             * maximum block size */
/* Bytes of block status asked at a time: the server may answer less; the
 * next request starts where the answer ended, to the disk's end. */
#define STATUS_SPAN   ((uint64_t) 1 << 30)
#define NBD_STATE_DIRTY 1u                  /* qemu:dirty-bitmap's flag */
#define POLL_MS       200

static int nbd_fail(const struct sync_source *s, const char *what)
{
    int e = nbd_get_errno();

    sync_err("%s: %s: %s", s->name, what, nbd_get_error());
    return e ? -e : -EIO;
}

/* Polls s->h until cookie's command completed (cookie 0: until the
 * handshake is over), failing after timeout_s seconds without progress. */
static int nbd_wait(struct sync_source *s, int64_t cookie, const char *what)
{
    unsigned idle_ms = 0;

    for (;;) {
        int done = cookie ? nbd_aio_command_completed(s->h, (uint64_t) cookie)
                          : !nbd_aio_is_connecting(s->h);
        if (done == -1)
            return nbd_fail(s, what);
        if (done)
            return 0;
        if (s->timeout_s && idle_ms >= s->timeout_s * 1000u) {
            sync_err("%s: %s: the server answered nothing for %u s "
                     "(--request-timeout)", s->name, what, s->timeout_s);
            return -ETIMEDOUT;
        }
        int r = nbd_poll(s->h, POLL_MS);
        if (r == -1)
            return nbd_fail(s, what);
        idle_ms = r == 0 ? idle_ms + POLL_MS : 0;
    }
}

static int nbd_connect(struct sync_source *s, const char *uri)
{
    int r;

    if (nbd_aio_connect_uri(s->h, uri) == -1)
        return nbd_fail(s, "connecting");
    if ((r = nbd_wait(s, 0, "connecting")) < 0)
        return r;
    if (nbd_aio_is_ready(s->h) != 1) {
        sync_err("%s: connecting: %s", s->name,
                 nbd_get_error() ? nbd_get_error() : "the handshake failed");
        return -EIO;
    }
    return 0;
}

static int open_nbd(const char *uri, const char *bitmap,
                    struct sync_source *s)
{
    int r;

    s->h = nbd_create();
    if (!s->h)
        return nbd_fail(s, "libnbd");
    if (bitmap) {
        if (asprintf(&s->meta_context, "qemu:dirty-bitmap:%s", bitmap) < 0) {
            s->meta_context = NULL;
            return -ENOMEM;
        }
        if (nbd_add_meta_context(s->h, s->meta_context) == -1)
            return nbd_fail(s, "asking for the dirty bitmap");
    }
    if ((r = nbd_connect(s, uri)) < 0)
        return r;
    if (bitmap && nbd_can_meta_context(s->h, s->meta_context) != 1) {
        sync_err("%s: the server does not offer %s (qemu-nbd exports a "
                 "bitmap with -B NAME; qemu's NBD server with "
                 "block-export-add's bitmaps)", s->name, s->meta_context);
        return -ENOTSUP;
    }
    int64_t size = nbd_get_size(s->h);
    if (size < 0)
        return nbd_fail(s, "its size");
    s->size = (uint64_t) size;
    s->max_read = NBD_READ;
    int64_t max = nbd_get_block_size(s->h, LIBNBD_SIZE_MAXIMUM);
    if (max > 0 && (uint64_t) max < s->max_read)
        s->max_read = (size_t) max;
    return 0;
}

static int open_file(const char *path, struct sync_source *s)
{
    struct stat st;

    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0 || fstat(s->fd, &st) < 0) {
        int e = errno;
        sync_err("%s: %s", path, strerror(e));
        return -e;
    }
    if (S_ISBLK(st.st_mode)) {
        if (ioctl(s->fd, BLKGETSIZE64, &s->size) < 0) {
            int e = errno;
            sync_err("%s: its size: %s", path, strerror(e));
            return -e;
        }
    } else if (S_ISREG(st.st_mode)) {
        s->size = (uint64_t) st.st_size;
    } else {
        sync_err("%s: not a regular file, a block device or an NBD URI",
                 path);
        return -EINVAL;
    }
    s->max_read = FILE_READ;
    return 0;
}

int sync_source_open(const char *operand, const char *bitmap,
                     unsigned timeout_s, struct sync_source *s)
{
    memset(s, 0, sizeof *s);
    s->name = operand;
    s->timeout_s = timeout_s;
    s->fd = -1;
    if (strstr(operand, "://"))
        return open_nbd(operand, bitmap, s);
    if (bitmap) {
        sync_err("%s: dirty-bitmap:%s needs an NBD SOURCE (the URI of the "
                 "qemu-nbd or qemu NBD server that exports the bitmap)",
                 operand, bitmap);
        return -EINVAL;
    }
    return open_file(operand, s);
}

int sync_source_read(struct sync_source *s, void *buf, size_t len,
                     uint64_t off)
{
    if (s->h) {
        for (size_t done = 0; done < len;) {
            size_t n = len - done < s->max_read ? len - done : s->max_read;
            int64_t c = nbd_aio_pread(s->h, (char *) buf + done, n,
                                      off + done, NBD_NULL_COMPLETION, 0);
            int r = c == -1 ? nbd_fail(s, "read") : nbd_wait(s, c, "read");
            if (r < 0)
                return r;
            done += n;
            s->bytes_read += n;
        }
        return 0;
    }
    for (size_t done = 0; done < len;) {
        ssize_t n = pread(s->fd, (char *) buf + done, len - done,
                          (off_t) (off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            sync_err("%s: read %zu@%" PRIu64 ": %s", s->name, len - done,
                     off + done, n < 0 ? strerror(e) : "the file ended early");
            return -e;
        }
        done += (size_t) n;
        s->bytes_read += (uint64_t) n;
    }
    return 0;
}

struct dirty_walk {
    struct sync_source *s;
    struct sync_list *l;
    uint64_t end;                       /* the answer covered [.., end) */
};

/* Runs inside nbd_block_status(): the extents of one context, in order
 * from offset; the last may reach past what was asked (clipped). */
static int dirty_extents(void *opaque, const char *context, uint64_t offset,
                         uint32_t *entries, size_t nr_entries, int *error)
{
    struct dirty_walk *w = opaque;
    uint64_t off = offset;

    (void) error;
    if (strcmp(context, w->s->meta_context) != 0)
        return 0;
    for (size_t i = 0; i + 1 < nr_entries && off < w->l->size; i += 2) {
        uint64_t len = entries[i];
        if (len > w->l->size - off)
            len = w->l->size - off;
        if (entries[i + 1] & NBD_STATE_DIRTY)
            sync_list_add(w->l, off, len);
        off += len;
    }
    if (off > w->end)
        w->end = off;
    return 0;
}

int sync_source_dirty(struct sync_source *s, struct sync_list *l)
{
    struct dirty_walk w = { .s = s, .l = l };

    for (uint64_t off = 0; off < s->size; off = w.end) {
        uint64_t span = s->size - off < STATUS_SPAN ? s->size - off
                                                    : STATUS_SPAN;
        w.end = off;
        int64_t c = nbd_aio_block_status(
            s->h, span, off,
            (nbd_extent_callback) { .callback = dirty_extents,
                                    .user_data = &w },
            NBD_NULL_COMPLETION, 0);
        int r = c == -1 ? nbd_fail(s, "block status of the dirty bitmap")
                        : nbd_wait(s, c, "block status of the dirty bitmap");
        if (r < 0)
            return r;
        if (w.end <= off) {
            sync_err("%s: block status of %s at %" PRIu64 " described "
                     "nothing: the bitmap cannot be read to its end",
                     s->name, s->meta_context, off);
            return -EIO;
        }
    }
    return 0;
}

void sync_source_close(struct sync_source *s)
{
    if (s->h) {
        /* A clean disconnect, unless a request is still unanswered (a
         * timeout): then the socket is just closed. */
        if (nbd_aio_is_ready(s->h) == 1 && nbd_aio_in_flight(s->h) == 0)
            nbd_shutdown(s->h, 0);
        nbd_close(s->h);
        s->h = NULL;
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    free(s->meta_context);
    s->meta_context = NULL;
}
