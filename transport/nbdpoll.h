/* transport/nbdpoll.h: driving a libnbd handle by hand, the pieces every
 * poll loop over libnbd here shares: the mount's I/O threads
 * (transport/nbdx-io.c, nbdx-issue.c) and nbdferry-verify's NBD source
 * (tools/verify/source-nbd.c).  Each loop keeps its own poll() (the mount
 * also polls an eventfd and parked sockets), its own timeouts and its own
 * messages; what they share is how a handle's socket is watched, how a
 * poll result is handed to libnbd, and how a base:allocation reply is
 * walked.
 *
 * THREAD MODEL
 * No state: each call works on the handle of the thread that owns it
 * (the only one that calls libnbd on it).
 */
#pragma once
#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include <libnbd.h>

/* The pollfd that watches h's socket: fd -1 when h has none (dead or
 * closed; nbd_get_error() says why). */
struct pollfd nbdpoll_watch(struct nbd_handle *h);

/* What nbdpoll_notify() returns when the socket reported only an error
 * (POLLERR, POLLNVAL): libnbd was not called; the caller decides. */
#define NBDPOLL_SOCKET_ERROR 1

/* Hand one poll() result to libnbd, one event per round in the order
 * nbd_poll() uses: readable or hung up, else writable.  0 (also when
 * revents is 0), -1 (the libnbd call failed: nbd_get_error()), or
 * NBDPOLL_SOCKET_ERROR. */
int nbdpoll_notify(struct nbd_handle *h, short revents);

/* Called for each extent of a base:allocation reply, in order: 0 goes
 * on, > 0 stops (the rest of the reply is ignored), -errno fails the
 * reply with that errno. */
typedef int (*nbdpoll_extent_fn)(void *opaque, uint64_t off, uint64_t len,
                                 uint32_t flags);

/* The body of an nbd_extent_callback: other meta contexts are ignored;
 * each (length, flags) pair of a base:allocation reply goes to fn.  Runs
 * inside libnbd (fn must not call libnbd on the handle). */
int nbdpoll_extents(const char *metacontext, uint64_t offset,
                    const uint32_t *entries, size_t nr_entries, int *error,
                    nbdpoll_extent_fn fn, void *opaque);

#ifdef LIBNBD_HAVE_NBD_EXTENT64_CALLBACK
/* The same for an nbd_extent64_callback (libnbd >= 1.18): with NBD
 * extended headers one extent may be longer than 4 GiB. */
int nbdpoll_extents64(const char *metacontext, uint64_t offset,
                      const nbd_extent *entries, size_t nr_entries,
                      int *error, nbdpoll_extent_fn fn, void *opaque);
#endif

/* Drive the handshake of a handle that nbd_aio_connect_*() started until
 * it is ready, for at most timeout_ms (-1: no limit): a server that
 * accepts the connection and then says nothing (a paused process: the
 * kernel completes the accept) must not hold the caller forever.
 * nbd_poll() is fine here: no other thread knows the handle yet.
 * Returns 0, -ETIMEDOUT, or -1 with the libnbd error set. */
int nbdpoll_handshake(struct nbd_handle *h, int64_t timeout_ms);
