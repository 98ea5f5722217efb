/* transport/nbdpoll.c: the shared pieces of a libnbd poll loop
 * (nbdpoll.h). */
#include "transport/nbdpoll.h"

#include <errno.h>
#include <string.h>

#include "common/monotime.h"

struct pollfd nbdpoll_watch(struct nbd_handle *h)
{
    unsigned dir = nbd_aio_get_direction(h);

    return (struct pollfd) {
        .fd = nbd_aio_get_fd(h),
        .events = (short) (((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
                           ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0)),
    };
}

int nbdpoll_notify(struct nbd_handle *h, short revents)
{
    if (revents & (POLLIN | POLLHUP))
        return nbd_aio_notify_read(h) == -1 ? -1 : 0;
    if (revents & POLLOUT)
        return nbd_aio_notify_write(h) == -1 ? -1 : 0;
    if (revents & (POLLERR | POLLNVAL))
        return NBDPOLL_SOCKET_ERROR;
    return 0;
}

int nbdpoll_extents(const char *metacontext, uint64_t offset,
                    const uint32_t *entries, size_t nr_entries, int *error,
                    nbdpoll_extent_fn fn, void *opaque)
{
    if (strcmp(metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
        return 0;
    for (size_t i = 0; i + 1 < nr_entries; i += 2) {
        int r = fn(opaque, offset, entries[i], entries[i + 1]);
        if (r > 0)
            break;
        if (r < 0) {
            *error = -r;
            return -1;
        }
        offset += entries[i];
    }
    return 0;
}

#ifdef LIBNBD_HAVE_NBD_EXTENT64_CALLBACK
int nbdpoll_extents64(const char *metacontext, uint64_t offset,
                      const nbd_extent *entries, size_t nr_entries,
                      int *error, nbdpoll_extent_fn fn, void *opaque)
{
    if (strcmp(metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
        return 0;
    for (size_t i = 0; i < nr_entries; i++) {
        /* base:allocation flags are 32 bits (libnbd's docs). */
        int r = fn(opaque, offset, entries[i].length,
                   (uint32_t) entries[i].flags);
        if (r > 0)
            break;
        if (r < 0) {
            *error = -r;
            return -1;
        }
        offset += entries[i].length;
    }
    return 0;
}
#endif

int nbdpoll_handshake(struct nbd_handle *h, int64_t timeout_ms)
{
    uint64_t due = mono_now_ns() +
                   (uint64_t) (timeout_ms < 0 ? 0 : timeout_ms) * NS_PER_MS;

    while (nbd_aio_is_connecting(h) == 1) {
        int wait = -1;
        if (timeout_ms >= 0) {
            uint64_t now = mono_now_ns();
            if (now >= due)
                return -ETIMEDOUT;
            wait = (int) ((due - now + NS_PER_MS - 1) / NS_PER_MS);
        }
        if (nbd_poll(h, wait) == -1)
            return -1;
    }
    return nbd_aio_is_ready(h) == 1 ? 0 : -1;
}
