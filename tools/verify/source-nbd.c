/* tools/verify/source-nbd.c: an NBD export read with libnbd.
 *
 * THREAD MODEL
 * One thread (the side's worker) owns every handle of the source and does
 * all of it: submits reads and block status, polls the handles' sockets with
 * poll(2) over nbd_aio_get_fd(), calls nbd_aio_notify_*(), and hashes.
 * Completion and extent callbacks run inside nbd_aio_notify_*() on that same
 * thread, so the pipeline state needs no lock.  No handle is ever touched by
 * another thread (libnbd 1.14's nbd_poll() would hold the handle lock while
 * sleeping; we don't use it).
 *
 * PIPELINE
 * The verify library's reader (digest/verify-reader.h) keeps up to 'requests'
 * reads in flight and feeds the sink in order; this file is its libnbd
 * backend: reads spread round-robin over the connections, block status
 * on the first, and the poll loop (on the poll pieces the mount's
 * connections use too, transport/nbdpoll.h).
 *
 * TIMEOUT
 * With requests outstanding, a server that moves no byte on any of the
 * connections for --request-timeout seconds (a handshake that takes that
 * long too) fails the side: one message naming the server, -ETIMEDOUT,
 * and the handles are closed without waiting for the replies.
 *
 * OWNERSHIP
 * A buffer belongs to libnbd from nbd_aio_pread() until read_done() runs;
 * it returns to the reader only after it has been hashed.  If the run
 * stops with reads or block status still in flight (error, abort, non-zero
 * tail), their replies are read and dropped first (drain): nbdkit 1.32
 * aborts (raw_send_socket assertion) when a client closes while read
 * replies are still being sent, and takes every other client and a memory
 * disk with it.  Only a server silent for DRAIN_WAIT_MS is abandoned: the
 * handles are closed first, and only then are the buffers and the
 * reader (the callbacks' user_data) freed.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <libnbd.h>

#include "common/monotime.h"
#include "tools/verify/verify.h"
#include "transport/nbdpoll.h"
#include "digest/verify-reader.h"

#define NBD_MAX_CONN   16
/* Shorter zero extents are read as data: one request beats a split. */
#define ZERO_SKIP_MIN  (64u << 10)
/* Zero entries are hashed in pieces of this size so that replies keep
 * being collected and new reads submitted between pieces. */
#define ZERO_PIECE     (8u << 20)
/* Bytes asked per block status request: the server's maximum block size,
 * or 32 MiB where it advertises none (the protocol's default limit; some
 * servers mishandle longer requests), but no more than this. */
#define BS_SPAN        (1ull << 30)
#define DEFAULT_MAX    (32u << 20)
/* How long replies still on their way are waited for before closing. */
#define DRAIN_WAIT_MS  30000

struct nbd_src {
    struct verify_source s;             /* first: the ops see this */
    struct nbd_handle *h[NBD_MAX_CONN]; /* owned; NULL once closed */
    unsigned nconn;
    bool block_status;                  /* base:allocation negotiated */
    size_t request_size;                /* clamped to the server maximum */
    uint64_t bs_span;                   /* block status request length */
    unsigned next_conn;                 /* the next read's connection */
    uint64_t progress_ns;               /* a byte last moved, or the
                                         * first request went out */
    bool timed_out;                     /* the server stopped answering */
};

/* ---- the reader's backend (digest/verify-reader.h) ---- */

static unsigned in_flight(const struct nbd_src *ns)
{
    unsigned n = 0;

    for (unsigned i = 0; i < ns->nconn; i++) {
        int k = nbd_aio_in_flight(ns->h[i]);
        n += k > 0 ? (unsigned) k : 0;
    }
    return n;
}

/* The request timeout runs from the moment something is outstanding. */
static void start_clock(struct nbd_src *ns)
{
    if (in_flight(ns) == 0)
        ns->progress_ns = mono_now_ns();
}

/* A zero-length extent ends the reply: nothing after it can be placed. */
static int extent_one(void *opaque, uint64_t off, uint64_t len,
                      uint32_t flags)
{
    if (len == 0)
        return 1;
    return vr_extent(opaque, off, len, flags & LIBNBD_STATE_ZERO) < 0
           ? -ENOMEM : 0;
}

/* Runs inside nbd_aio_notify_read() on the worker thread. */
static int extent_cb(void *user_data, const char *metacontext,
                     uint64_t offset, uint32_t *entries, size_t nr_entries,
                     int *error)
{
    return nbdpoll_extents(metacontext, offset, entries, nr_entries, error,
                           extent_one, user_data);
}

static int bs_done(void *user_data, int *error)
{
    vr_extents_done(user_data, *error);
    return 1;
}

static int nbd_extents(void *ctx, struct vreader *r, uint64_t off,
                       uint64_t len)
{
    struct nbd_src *ns = ctx;

    start_clock(ns);
    if (nbd_aio_block_status(ns->h[0], len, off,
                             (nbd_extent_callback) { .callback = extent_cb,
                                                     .user_data = r },
                             (nbd_completion_callback) { .callback = bs_done,
                                                         .user_data = r },
                             0) == -1) {
        int err = nbd_get_errno();
        verify_err("%s: block status: %s", ns->s.name, nbd_get_error());
        return err ? -err : -EIO;
    }
    return 0;
}

/* Runs inside nbd_aio_notify_read() on the worker thread. */
static int read_done(void *user_data, int *error)
{
    vr_done(user_data, *error);
    return 1;                           /* retire the command */
}

static int nbd_read(void *ctx, struct vr_ent *e)
{
    struct nbd_src *ns = ctx;
    struct nbd_handle *h = ns->h[ns->next_conn++ % ns->nconn];

    start_clock(ns);
    if (nbd_aio_pread(h, e->buf, e->len, e->off,
                      (nbd_completion_callback) { .callback = read_done,
                                                  .user_data = e },
                      0) == -1) {
        int err = nbd_get_errno();
        verify_err("%s: read %zu bytes at %llu: %s", ns->s.name, e->len,
                   (unsigned long long) e->off, nbd_get_error());
        return err ? -err : -EIO;
    }
    return 0;
}

/* ---- the event loop ---- */

static int notify(struct nbd_src *ns, struct nbd_handle *h, short revents)
{
    int r = nbdpoll_notify(h, revents);

    if (r == NBDPOLL_SOCKET_ERROR) {
        verify_err("%s: server closed the connection", ns->s.name);
        return -ENOTCONN;
    }
    if (r == -1) {
        int err = nbd_get_errno();
        verify_err("%s: %s", ns->s.name, nbd_get_error());
        return err ? -err : -EIO;
    }
    return 0;
}

/* How long poll() may sleep: timeout_ms, shortened to when the request
 * timeout expires (0: it has; logged once). */
static int stall_wait_ms(struct nbd_src *ns, int timeout_ms, int *err)
{
    uint64_t limit = (uint64_t) ns->s.opt->request_timeout_s * NS_PER_S;
    uint64_t now = mono_now_ns(), due = ns->progress_ns + limit;

    *err = 0;
    if (limit == 0 || in_flight(ns) == 0)
        return timeout_ms;
    if (now >= due) {
        if (!ns->timed_out)
            verify_err("%s: no reply from the server for %u s with %u "
                       "request(s) outstanding (--request-timeout)",
                       ns->s.name, ns->s.opt->request_timeout_s,
                       in_flight(ns));
        ns->timed_out = true;
        *err = -ETIMEDOUT;
        return 0;
    }
    int left = (int) ((due - now + NS_PER_MS - 1) / NS_PER_MS);
    return timeout_ms >= 0 && timeout_ms < left ? timeout_ms : left;
}

static int nbd_wait(void *ctx, int timeout)
{
    struct nbd_src *ns = ctx;
    struct pollfd fds[NBD_MAX_CONN];
    int err;

    if ((timeout = stall_wait_ms(ns, timeout, &err)) == 0 && err)
        return err;
    for (unsigned i = 0; i < ns->nconn; i++) {
        fds[i] = nbdpoll_watch(ns->h[i]);
        if (fds[i].fd == -1) {
            verify_err("%s: %s", ns->s.name, nbd_get_error());
            return -ENOTCONN;
        }
    }
    int n = poll(fds, ns->nconn, timeout);
    if (n == -1)
        return errno == EINTR ? 0 : -errno;
    if (n > 0)                          /* bytes move: the server is alive */
        ns->progress_ns = mono_now_ns();
    for (unsigned i = 0; n > 0 && i < ns->nconn; i++) {
        int r = notify(ns, ns->h[i], fds[i].revents);
        if (r < 0)
            return r;
    }
    return 0;
}

static unsigned nbd_in_flight(void *ctx)
{
    return in_flight(ctx);
}

static const struct vr_backend nbd_backend = {
    .read = nbd_read,
    .extents = nbd_extents,
    .wait = nbd_wait,
    .in_flight = nbd_in_flight,
};

static void close_handles(struct nbd_src *ns)
{
    for (unsigned i = 0; i < ns->nconn; i++) {
        nbd_close(ns->h[i]);
        ns->h[i] = NULL;
    }
    ns->nconn = 0;
}

static int nbd_run(struct verify_source *s, struct sink *k)
{
    struct nbd_src *ns = (struct nbd_src *) s;
    struct vr_config c = {
        .name = s->name, .requests = s->opt->requests,
        .request_size = ns->request_size, .block_status = ns->block_status,
        .bs_span = ns->bs_span, .zero_skip_min = ZERO_SKIP_MIN,
        .zero_piece = ZERO_PIECE,
    };
    struct vreader *r;
    int e = vreader_create(&c, &nbd_backend, ns, k, &r);

    if (e == 0)
        e = vreader_run(r);
    /* See OWNERSHIP above: drain, and close what never answers before
     * its buffers are freed. */
    if (r && !vreader_drain(r, DRAIN_WAIT_MS))
        close_handles(ns);
    vreader_free(r);
    return e;
}

static void nbd_src_close(struct verify_source *s)
{
    struct nbd_src *ns = (struct nbd_src *) s;

    for (unsigned i = 0; i < ns->nconn; i++)
        nbd_shutdown(ns->h[i], 0);
    close_handles(ns);
    free(ns);
}

static const struct verify_source_ops nbd_ops = {
    .kind = "nbd",
    .run = nbd_run,
    .close = nbd_src_close,
};

static int connect_one(const char *uri, bool want_bs, unsigned timeout_s,
                       struct nbd_handle **out)
{
    struct nbd_handle *h = nbd_create();
    int err, r;

    if (!h)
        goto fail;
    /* No zeroing of each buffer before its read: a failed read is never
     * hashed, and libnbd still zeroes the holes a server answers with. */
    nbd_set_pread_initialize(h, false);
    /* The user typed this URI: its tls-psk-file and tls-certificates may
     * name local files (libnbd refuses them by default), as the mount's
     * do. */
    nbd_set_uri_allow_local_file(h, true);
    if (want_bs && nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1)
        goto fail;
    if (nbd_aio_connect_uri(h, uri) == -1)
        goto fail;
    r = nbdpoll_handshake(h, timeout_s ? (int64_t) timeout_s * 1000 : -1);
    if (r == -ETIMEDOUT) {
        verify_err("%s: no answer to the handshake within %u s "
                   "(--request-timeout)", uri, timeout_s);
        nbd_close(h);
        return r;
    }
    if (r < 0)
        goto fail;
    *out = h;
    return 0;
fail:
    err = nbd_get_errno();
    verify_err("%s: %s", uri, nbd_get_error());
    nbd_close(h);
    return err ? -err : -EIO;
}

/* Server limits, block status and multi-conn, learnt from the first
 * connection. */
static int negotiate(struct nbd_src *ns, const struct source_options *opt)
{
    struct nbd_handle *h = ns->h[0];
    int64_t size = nbd_get_size(h);
    int64_t max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);

    if (size < 0) {
        verify_err("%s: %s", ns->s.name, nbd_get_error());
        return -EIO;
    }
    ns->s.size = (uint64_t) size;
    ns->request_size = opt->request_size;
    if (max > 0 && (uint64_t) max < ns->request_size)
        ns->request_size = (size_t) max;
    ns->bs_span = max > 0 ? (uint64_t) max : DEFAULT_MAX;
    if (ns->bs_span > BS_SPAN)
        ns->bs_span = BS_SPAN;
    ns->block_status = opt->use_extents &&
        nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
    return 0;
}

int src_nbd_open(const char *uri, const struct source_options *opt,
                 struct verify_source **out)
{
    struct nbd_src *ns = calloc(1, sizeof *ns);
    int r;

    if (!ns) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    ns->s = (struct verify_source) { .ops = &nbd_ops, .name = uri, .opt = opt };
    if ((r = connect_one(uri, opt->use_extents, opt->request_timeout_s,
                         &ns->h[0])) < 0)
        goto fail;
    ns->nconn = 1;
    if ((r = negotiate(ns, opt)) < 0)
        goto fail;
    /* Extra connections only where the server says they see the same data. */
    unsigned want = opt->connections < NBD_MAX_CONN ? opt->connections : NBD_MAX_CONN;
    if (want > 1 && nbd_can_multi_conn(ns->h[0]) == 1)
        for (; ns->nconn < want; ns->nconn++)
            if ((r = connect_one(uri, ns->block_status,
                                    opt->request_timeout_s,
                                    &ns->h[ns->nconn])) < 0)
                goto fail;
    *out = &ns->s;
    return 0;
fail:
    close_handles(ns);
    free(ns);
    return r;
}
