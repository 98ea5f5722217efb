/* transport/nbdx-connect.c: connecting a libnbd handle (the first
 * connections, reconnections and healing probes), socket options, and
 * what the server offers.
 *
 * THREAD MODEL
 * Runs on the thread that connects: nbdx_open()'s caller, a
 * connection's I/O thread (reconnecting) or nbdx_heal()'s caller (its
 * probe).  The handle is that thread's alone until the handshake is
 * done, so nbd_poll() is fine here.  No lock is taken.
 */
#include "transport/nbdx-internal.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/monotime.h"
#include "config.h"
#include "transport/nbdpoll.h"

/* ---- extended headers ------------------------------------------------ */

bool nbdx_ext_headers_built(void)
{
    return HAVE_NBD_EXTENDED_HEADERS;
}

/* libnbd >= 1.18 asks for extended headers by default
 * (nbd_set_request_extended_headers()); whether the server agreed is
 * known once the handshake is done. */
static bool ext_headers_negotiated(struct nbd_handle *h)
{
#if HAVE_NBD_EXTENDED_HEADERS
    return nbd_get_extended_headers_negotiated(h) == 1;
#else
    (void) h;
    return false;
#endif
}

/* ---- connecting ------------------------------------------------------ */

static const char *describe(const struct nbdx_config *cfg, char *buf,
                            size_t len)
{
    switch (cfg->mode) {
    case NBDX_URI:
        return nbdx_redact_uri(cfg->uri, buf, len);
    case NBDX_SOCKET_ACTIVATION:
    case NBDX_COMMAND:
        snprintf(buf, len, "command '%s'", cfg->argv[0]);
        return buf;
    case NBDX_UNIX:
        snprintf(buf, len, "unix socket %s", cfg->path);
        return buf;
    case NBDX_TCP:
        snprintf(buf, len, "%s:%s", cfg->host, cfg->port);
        return buf;
    case NBDX_FD:
        snprintf(buf, len, "fd %d", cfg->fd);
        return buf;
    }
    return "?";
}

/* Start connecting; the handshake is driven by finish_connect(). */
static int start_connect(struct nbd_handle *h, const struct nbdx_config *cfg)
{
    switch (cfg->mode) {
    case NBDX_URI:
        return nbd_aio_connect_uri(h, cfg->uri);
    case NBDX_SOCKET_ACTIVATION:
        return nbd_aio_connect_systemd_socket_activation(h, cfg->argv);
    case NBDX_COMMAND:
        return nbd_aio_connect_command(h, cfg->argv);
    case NBDX_UNIX:
        return nbd_aio_connect_unix(h, cfg->path);
    case NBDX_TCP:
        return nbd_aio_connect_tcp(h, cfg->host, cfg->port);
    case NBDX_FD:
        return nbd_aio_connect_socket(h, cfg->fd);
    }
    return -1;
}

void nbdx_set_int_opt(int fd, int level, int name, int v, const char *what)
{
    if (setsockopt(fd, level, name, &v, sizeof v) == -1)
        log_warn("setsockopt %s: %m", what);
}

/* A Unix socket's send buffer: room for one whole 2 MiB write request.
 * With the default (208 KiB) each request leaves in about eight
 * send()s, each ending in EAGAIN, a poll() and a wakeup of the
 * connection thread: about a tenth of the daemon's CPU per GiB written
 * (docs/benchmarks.md).  The kernel doubles what is asked for its own
 * bookkeeping and caps it at twice net.core.wmem_max; where that cap is
 * lower, SO_SNDBUFFORCE (CAP_NET_ADMIN) is tried, and otherwise the
 * socket keeps what it got: only the CPU cost differs.  TCP keeps its
 * autotuning (setting SO_SNDBUF would switch it off). */
#define UNIX_SNDBUF (1u << 20)

static void tune_unix_socket(int fd)
{
    int want = (int) UNIX_SNDBUF, got = 0;
    socklen_t gl = sizeof got;

    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want) == -1 ||
        getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &gl) == -1 ||
        got >= 2 * want)
        return;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) == -1)
        log_debug("unix socket send buffer: %d bytes (net.core.wmem_max "
                  "caps it; %d wanted)", got, 2 * want);
}

/* TCP keepalive: first probe after 10 s idle, then every 5 s; 4 lost
 * probes (30 s in all) and the kernel drops the connection. */
#define KEEPALIVE_IDLE_S 10
#define KEEPALIVE_INTVL_S 5
#define KEEPALIVE_CNT 4

/* Unix sockets: a send buffer of a whole request (above).  TCP:
 * TCP_NODELAY as asked; keepalive and TCP_USER_TIMEOUT, so that a
 * partitioned network is noticed by the kernel too (an idle connection
 * has no request timeout running).  Returns true if the socket is TCP. */
bool nbdx_tune_socket(int fd, const struct nbdx_config *cfg)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;

    if (getsockname(fd, (struct sockaddr *) &ss, &sl) == -1)
        return false;
    if (ss.ss_family == AF_UNIX)
        tune_unix_socket(fd);
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
        return false;
    nbdx_set_int_opt(fd, IPPROTO_TCP, TCP_NODELAY, cfg->nodelay, "TCP_NODELAY");
    nbdx_set_int_opt(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
    nbdx_set_int_opt(fd, IPPROTO_TCP, TCP_KEEPIDLE, KEEPALIVE_IDLE_S,
                     "TCP_KEEPIDLE");
    nbdx_set_int_opt(fd, IPPROTO_TCP, TCP_KEEPINTVL, KEEPALIVE_INTVL_S,
                     "TCP_KEEPINTVL");
    nbdx_set_int_opt(fd, IPPROTO_TCP, TCP_KEEPCNT, KEEPALIVE_CNT,
                     "TCP_KEEPCNT");
    /* Unacknowledged data older than the daemon's own patience (the
     * request timeout, then the retry timeout; a second more): the peer
     * is gone.  Never sooner: a paused server's kernel stops taking our
     * bytes as soon as its buffer is full, and a drop at the request
     * timeout alone cut the retry window short and took the "no reply"
     * path's verdict with it (seen as a flaky stall test). */
    if (cfg->request_timeout_s)
        nbdx_set_int_opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT,
                         (int) ((cfg->request_timeout_s +
                                 cfg->retry_timeout_s + 1u) * 1000u),
                         "TCP_USER_TIMEOUT");
    return true;
}

/* libnbd's debug messages, with the URI's secrets redacted: libnbd
 * prints the URI it was given verbatim. */
static int debug_message(void *user_data, const char *context,
                         const char *msg)
{
    const struct nbdx_config *cfg = user_data;
    const char *at = cfg->uri ? strstr(msg, cfg->uri) : NULL;

    if (!at) {
        log_debug("libnbd: %s: %s", context, msg);
        return 0;
    }
    char red[512];
    nbdx_redact_uri(cfg->uri, red, sizeof red);
    log_debug("libnbd: %s: %.*s%s%s", context, (int) (at - msg), msg, red,
              at + strlen(cfg->uri));
    return 0;
}

/* The server command we started ([ CMD ], --command) failed to answer:
 * when it has exited, its status says more than libnbd's recv error.
 * At the first connect the daemon's only child is that server; reaping
 * it here leaves libnbd's own waitpid() an ECHILD, which it ignores.
 * -1 if no child exits within a second. */
static int server_exit_status(const struct nbdx_config *cfg)
{
    if (cfg->mode != NBDX_COMMAND && cfg->mode != NBDX_SOCKET_ACTIVATION)
        return -1;
    for (int i = 0; i < 100; i++) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (pid == -1)
            return -1;
        usleep(10000);
    }
    return -1;
}

/* Connect c->h within timeout_ms (-1: no limit).  quiet: a reconnection
 * attempt, logged at info level. */
int nbdx_conn_connect(struct nbdx_conn *c, const struct nbdx_config *cfg,
                      bool quiet, int64_t timeout_ms)
{
    char name[32], what[256];
    int r;

    c->h = nbd_create();
    if (!c->h) {
        log_err("%s", nbd_get_error());
        return -ENOMEM;
    }
    snprintf(name, sizeof name, "nbdferry-%u", c->index);
    nbd_set_handle_name(c->h, name);
    /* libnbd zeroes every read buffer before the read by default (so that
     * a caller that ignores an error never sees old heap bytes): a memset
     * of every byte read, 6-7% of the daemon's CPU on a copy-out.  We
     * never use a buffer whose read failed, libnbd still fails a reply
     * that does not cover the whole request, and still zeroes the ranges
     * a server answers as holes. */
    nbd_set_pread_initialize(c->h, false);
    if (cfg->debug)
    {
        nbd_set_debug_callback(c->h, (nbd_debug_callback){
                                         .callback = debug_message,
                                         .user_data = (void *) cfg });
        nbd_set_debug(c->h, true);
    }
    nbd_add_meta_context(c->h, LIBNBD_CONTEXT_BASE_ALLOCATION);
    if (nbdx_configure_handle(c->h, cfg) == -1) {
        log_err("TLS settings: %s", nbd_get_error());
        return -EINVAL;
    }
    r = start_connect(c->h, cfg);
    if (r == 0)
        r = nbdpoll_handshake(c->h, timeout_ms);
    if (r == -ETIMEDOUT) {
        describe(cfg, what, sizeof what);
        snprintf(c->connect_err, sizeof c->connect_err, "no answer within "
                 "%" PRId64 " ms", timeout_ms);
        if (quiet)
            log_info("reconnect to %s: no answer within %" PRId64 " ms",
                     what, timeout_ms);
        else
            log_err("cannot connect to %s: no answer within %" PRId64
                    " ms", what, timeout_ms);
        return -ETIMEDOUT;
    }
    if (r == -1) {
        int err = nbd_get_errno(), st;
        snprintf(c->connect_err, sizeof c->connect_err, "%s",
                 nbd_get_error() ? nbd_get_error() : strerror(err ? err
                                                            : ECONNREFUSED));
        if (quiet)
            log_info("reconnect to %s: %s", describe(cfg, what, sizeof what),
                     nbd_get_error());
        else if ((st = server_exit_status(cfg)) >= 0)
            log_err("cannot connect to %s: the server command exited with "
                    "status %d", describe(cfg, what, sizeof what), st);
        else
            log_err("cannot connect to %s: %s",
                    describe(cfg, what, sizeof what), nbd_get_error());
        return err ? -err : -ECONNREFUSED;
    }
    c->ext_headers = ext_headers_negotiated(c->h);
    return 0;
}

static void read_first(struct nbd_handle *h, struct nbdx_first *f)
{
    int64_t v;

    f->size = (uint64_t) nbd_get_size(h);
    f->readonly = nbd_is_read_only(h) == 1;
    f->can_multi_conn = nbd_can_multi_conn(h) == 1;
    f->can_flush = nbd_can_flush(h) == 1;
    f->can_fua = nbd_can_fua(h) == 1;
    v = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
    f->block_min = v > 0 ? (uint32_t) v : 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
    f->block_pref = v > 0 ? (uint32_t) v : 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
    f->block_max = v > 0 ? (uint32_t) v : 0;
    f->ext_headers = ext_headers_negotiated(h);
}

/* An offer (multi-conn, flush, FUA) the server made and no longer makes,
 * or the other way round: why says which. */
static bool offer_changed(bool now, bool was, const char *what,
                          struct nbdf_err *why)
{
    if (now == was)
        return false;
    nbdf_errf(why, 0, "the server %s %s now",
              now ? "offers" : "no longer offers", what);
    return true;
}

/* Does the server behind h differ from the one first connected to?  If
 * so, why says how (for the log). */
bool nbdx_server_changed(const struct nbdx *x, struct nbd_handle *h,
                         struct nbdf_err *why)
{
    const struct nbdx_first *a = &x->first;
    struct nbdx_first b;

    read_first(h, &b);
    if (b.size != a->size)
        nbdf_errf(why, 0, "the export's size is now %" PRIu64 " bytes, "
                  "not %" PRIu64, b.size, a->size);
    else if (b.readonly != a->readonly)
        nbdf_errf(why, 0, "the export is now %s",
                  b.readonly ? "read-only" : "writable");
    else if (offer_changed(b.can_multi_conn, a->can_multi_conn, "multi-conn",
                           why) ||
             offer_changed(b.can_flush, a->can_flush, "flush", why) ||
             offer_changed(b.can_fua, a->can_fua, "FUA", why))
        return true;
    /* The pool's zero and block status requests may be longer than
     * 4 GiB with extended headers, and cannot be sent without them;
     * gaining them changes nothing. */
    else if (a->ext_headers && !b.ext_headers)
        nbdf_errf(why, 0, "the server no longer offers NBD extended "
                  "headers");
    else if (b.block_min != a->block_min || b.block_pref != a->block_pref ||
             b.block_max != a->block_max)
        nbdf_errf(why, 0, "the block sizes (minimum, preferred, maximum) "
                  "are now %" PRIu32 "/%" PRIu32 "/%" PRIu32 ", not %" PRIu32
                  "/%" PRIu32 "/%" PRIu32, b.block_min, b.block_pref,
                  b.block_max, a->block_min, a->block_pref, a->block_max);
    else
        return false;
    return true;
}

void nbdx_read_info(struct nbdx *x, struct nbd_handle *h,
                    const struct nbdx_config *cfg)
{
    struct nbdx_info *i = &x->info;
    const struct nbdx_first *f = &x->first;

    read_first(h, &x->first);
    i->size = f->size;
    i->readonly = cfg->readonly || f->readonly;
    i->can_flush = f->can_flush;
    i->can_zero = nbd_can_zero(h) == 1;
    i->can_fast_zero = nbd_can_fast_zero(h) == 1;
    i->can_multi_conn = f->can_multi_conn;
    i->can_extents =
        nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
    i->block_min = f->block_min;
    i->block_pref = f->block_pref;
    i->block_max = f->block_max;
    i->ext_headers = f->ext_headers;   /* and every other connection's:
                                        * nbdx_open() */
    i->tcp = nbdx_tune_socket(nbd_aio_get_fd(h), cfg);
}

void nbdx_disconnect(struct nbd_handle *h, uint64_t due)
{
    if (nbd_aio_disconnect(h, 0) == -1)
        return;
    while (nbd_aio_is_closed(h) != 1 && nbd_aio_is_dead(h) != 1) {
        uint64_t now = mono_now_ns();
        if (now >= due) {
            log_info("the server did not close the connection within %u s "
                     "of the disconnect request", DISCONNECT_WAIT_S);
            return;
        }
        if (nbd_poll(h, (int) ((due - now + NS_PER_MS - 1) / NS_PER_MS)) ==
            -1)
            return;
    }
}
