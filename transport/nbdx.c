/* transport/nbdx.c: NBD connections, each with one I/O thread.
 *
 * THREAD MODEL
 * Each connection has one I/O thread, the only thread that calls libnbd on
 * its handle after the handshake.  In libnbd 1.14 nbd_poll() holds the
 * handle lock while it sleeps, so a second thread calling nbd_aio_pwrite()
 * on the same handle would wait for a reply: a hidden reply gate.  We avoid
 * nbd_poll() altogether: the I/O thread polls the socket itself
 * (nbd_aio_get_fd / nbd_aio_get_direction / nbd_aio_notify_*) together with
 * an eventfd that other threads kick after appending to the connection's
 * submission queue (conn->lock protects only that queue and the flags).
 *
 * libnbd calls our completion and extent callbacks from inside
 * nbd_aio_notify_*() with the handle lock held.  They only record the
 * result and move the op to a done list private to the I/O thread; the
 * op's done() runs after the libnbd call returns, so done() may call
 * nbdx_submit() (which only queues) but never libnbd directly.
 *
 * Lock order: callers' locks (pool->lock) may be held across
 * nbdx_submit(); conn->lock is a leaf and is never held while calling out.
 */
#include "transport/nbdx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <libnbd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/signals.h"

struct nbdx_conn {
    struct nbdx *x;
    unsigned index;
    struct nbd_handle *h;
    pthread_t thread;
    bool thread_started;
    int efd;                              /* kicked after queueing */

    pthread_mutex_t lock;                 /* protects queue and stopping */
    struct nbdx_op *q_head, *q_tail;
    bool stopping;

    atomic_uint outstanding;              /* queued + on the wire */
    atomic_int fd;                        /* the socket, -1 while dead;
                                           * for the TCP_INFO sampler */
    struct nbdx_op *done_head, *done_tail;/* I/O thread only */
    bool dead;                            /* I/O thread only */

    /* Reconnection (I/O thread only).  Ops that failed because the
     * connection died wait in retry_* and are sent again, in the same
     * order, on the new connection; their done() has not run, so the
     * pool still owns their buffers and keeps overlapping ops back. */
    struct nbdx_op *retry_head, *retry_tail;
    uint64_t lost_at_ns;                  /* 0: not reconnecting */
    unsigned attempts;
    bool gave_up;                         /* past the deadline: fail all */
};

struct nbdx {
    struct nbdx_config cfg;               /* for reconnecting */
    struct nbdx_info info;
    unsigned nconns;
    struct nbdx_conn *conns;
    atomic_uint next;                     /* round-robin tie breaker */
    atomic_uint_fast64_t ops[5], bytes[5], errors;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static const char *kind_name[] = { "read", "write", "zero", "flush",
                                   "block-status" };

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

static int connect_handle(struct nbd_handle *h, const struct nbdx_config *cfg)
{
    switch (cfg->mode) {
    case NBDX_URI:
        /* The user typed this URI: its tls-psk-file and tls-certificates
         * may name local files. */
        nbd_set_uri_allow_local_file(h, true);
        return nbd_connect_uri(h, cfg->uri);
    case NBDX_SOCKET_ACTIVATION:
        return nbd_connect_systemd_socket_activation(h, cfg->argv);
    case NBDX_COMMAND:
        return nbd_connect_command(h, cfg->argv);
    case NBDX_UNIX:
        return nbd_connect_unix(h, cfg->path);
    case NBDX_TCP:
        return nbd_connect_tcp(h, cfg->host, cfg->port);
    case NBDX_FD:
        return nbd_connect_socket(h, cfg->fd);
    }
    return -1;
}

/* Set TCP_NODELAY as asked; returns true if the socket is TCP. */
static bool tune_socket(int fd, bool nodelay)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int on = nodelay;

    if (getsockname(fd, (struct sockaddr *) &ss, &sl) == -1 ||
        (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
        return false;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on) == -1)
        log_warn("setsockopt TCP_NODELAY: %m");
    return true;
}

static int set_tls(struct nbd_handle *h, const struct nbdx_config *cfg)
{
    if (cfg->tls >= 0 && nbd_set_tls(h, cfg->tls) == -1)
        return -1;
    if (cfg->tls_psk_file && nbd_set_tls_psk_file(h, cfg->tls_psk_file) == -1)
        return -1;
    if (cfg->tls_username && nbd_set_tls_username(h, cfg->tls_username) == -1)
        return -1;
    if (cfg->tls_certificates &&
        nbd_set_tls_certificates(h, cfg->tls_certificates) == -1)
        return -1;
    if (cfg->tls_verify_peer && nbd_set_tls_verify_peer(h, true) == -1)
        return -1;
    return 0;
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

static int conn_connect(struct nbdx_conn *c, const struct nbdx_config *cfg,
                        bool quiet)
{
    char name[32], what[256];

    c->h = nbd_create();
    if (!c->h) {
        log_err("%s", nbd_get_error());
        return -ENOMEM;
    }
    snprintf(name, sizeof name, "nbdferry-%u", c->index);
    nbd_set_handle_name(c->h, name);
    if (cfg->debug)
    {
        nbd_set_debug_callback(c->h, (nbd_debug_callback){
                                         .callback = debug_message,
                                         .user_data = (void *) cfg });
        nbd_set_debug(c->h, true);
    }
    nbd_add_meta_context(c->h, LIBNBD_CONTEXT_BASE_ALLOCATION);
    if (set_tls(c->h, cfg) == -1) {
        log_err("TLS settings: %s", nbd_get_error());
        return -EINVAL;
    }
    if (connect_handle(c->h, cfg) == -1) {
        int err = nbd_get_errno(), st;
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
    return 0;
}

static void read_info(struct nbdx *x, struct nbd_handle *h,
                      const struct nbdx_config *cfg)
{
    struct nbdx_info *i = &x->info;
    int64_t v;

    i->size = (uint64_t) nbd_get_size(h);
    i->readonly = cfg->readonly || nbd_is_read_only(h) == 1;
    i->can_flush = nbd_can_flush(h) == 1;
    i->can_zero = nbd_can_zero(h) == 1;
    i->can_fast_zero = nbd_can_fast_zero(h) == 1;
    i->can_multi_conn = nbd_can_multi_conn(h) == 1;
    i->can_extents =
        nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
    v = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
    i->block_min = v > 0 ? (uint32_t) v : 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
    i->block_pref = v > 0 ? (uint32_t) v : 0;
    v = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
    i->block_max = v > 0 ? (uint32_t) v : 0;
    i->tcp = tune_socket(nbd_aio_get_fd(h), cfg->nodelay);
}

/* ---- the I/O thread -------------------------------------------------- */

static void push_done(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->completed = true;
    op->next = NULL;
    if (c->done_tail)
        c->done_tail->next = op;
    else
        c->done_head = op;
    c->done_tail = op;
}

/* libnbd completion callback: runs inside libnbd, records only. */
static int op_completed(void *user_data, int *error)
{
    struct nbdx_op *op = user_data;

    op->err = *error;
    push_done(op->conn, op);
    return 1;                             /* retire the command */
}

/* libnbd extent callback: runs inside libnbd, records only. */
static int op_extents(void *user_data, const char *metacontext,
                      uint64_t offset, uint32_t *entries, size_t nr,
                      int *error)
{
    struct nbdx_op *op = user_data;

    if (strcmp(metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
        return 0;
    for (size_t i = 0; i + 1 < nr; i += 2) {
        op->extent(op, offset, entries[i], entries[i + 1]);
        offset += entries[i];
    }
    return 0;
}

static int64_t start_op(struct nbdx_conn *c, struct nbdx_op *op)
{
    nbd_completion_callback cb = { .callback = op_completed,
                                   .user_data = op };
    struct nbd_handle *h = c->h;

    switch (op->kind) {
    case NBDX_OP_READ:
        return nbd_aio_pread(h, op->buf, op->len, op->off, cb, 0);
    case NBDX_OP_WRITE:
        return nbd_aio_pwrite(h, op->buf, op->len, op->off, cb, op->flags);
    case NBDX_OP_ZERO:
        return nbd_aio_zero(h, op->len, op->off, cb, op->flags);
    case NBDX_OP_FLUSH:
        return nbd_aio_flush(h, cb, 0);
    case NBDX_OP_BLOCK_STATUS: {
        nbd_extent_callback ecb = { .callback = op_extents,
                                    .user_data = op };
        return nbd_aio_block_status(h, op->len, op->off, ecb, cb, 0);
    }
    }
    return -1;
}

static void issue(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->conn = c;
    op->completed = false;
    op->err = 0;
    if (c->dead) {
        op->err = ENOTCONN;               /* run_done() may queue a retry */
        push_done(c, op);
        return;
    }
    if (start_op(c, op) == -1 && !op->completed) {
        int err = nbd_get_errno();
        log_err("nbd %s %" PRIu64 "@%" PRIu64 ": %s", kind_name[op->kind],
                op->len, op->off, nbd_get_error());
        op->err = err ? err : EIO;
        push_done(c, op);
    }
}

static bool can_reconnect(const struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;
    return cfg->retry_timeout_s > 0 && !c->gave_up &&
           (cfg->mode == NBDX_URI || cfg->mode == NBDX_UNIX ||
            cfg->mode == NBDX_TCP);
}

static bool connection_error(int err)
{
    return err == ENOTCONN || err == ECONNRESET || err == EPIPE ||
           err == ESHUTDOWN || err == ECONNABORTED;
}

static void push_retry(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->next = NULL;
    if (c->retry_tail)
        c->retry_tail->next = op;
    else
        c->retry_head = op;
    c->retry_tail = op;
}

static void run_done(struct nbdx_conn *c)
{
    struct nbdx_op *op;

    while ((op = c->done_head) != NULL) {
        c->done_head = op->next;
        if (!c->done_head)
            c->done_tail = NULL;
        if (op->err && (c->dead || connection_error(op->err)) &&
            can_reconnect(c)) {
            push_retry(c, op);            /* sent again after reconnecting */
            continue;
        }
        atomic_fetch_add(&c->x->ops[op->kind], 1);
        atomic_fetch_add(&c->x->bytes[op->kind], op->len);
        if (op->err)
            atomic_fetch_add(&c->x->errors, 1);
        atomic_fetch_sub(&c->outstanding, 1);
        op->done(op, op->err);            /* may free or resubmit op */
    }
}

static struct nbdx_op *take_queue(struct nbdx_conn *c, bool *stopping)
{
    pthread_mutex_lock(&c->lock);
    struct nbdx_op *q = c->q_head;
    c->q_head = c->q_tail = NULL;
    *stopping = c->stopping;
    pthread_mutex_unlock(&c->lock);
    return q;
}

static void check_dead(struct nbdx_conn *c)
{
    if (c->dead || !(nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)))
        return;
    c->dead = true;
    atomic_store(&c->fd, -1);
    const char *why = nbd_get_error() ? nbd_get_error() : "closed";
    if (can_reconnect(c)) {
        log_warn("connection %u to the server was lost (%s): reconnecting "
                 "for up to %u s", c->index, why, c->x->cfg.retry_timeout_s);
        c->lost_at_ns = now_ns();
        c->attempts = 0;
    } else
        log_err("connection %u to the server was lost: %s%s", c->index, why,
                c->x->cfg.retry_timeout_s == 0 ? ""
                : "; this mode (command, socket activation, --fd) cannot "
                  "reconnect");
}

/* Fail every op waiting for a reconnection. */
static void give_up(struct nbdx_conn *c)
{
    struct nbdx_op *op = c->retry_head;

    log_err("connection %u: could not reconnect within %u s; failing the "
            "requests that were not acknowledged", c->index,
            c->x->cfg.retry_timeout_s);
    c->gave_up = true;
    c->retry_head = c->retry_tail = NULL;
    while (op) {
        struct nbdx_op *next = op->next;
        if (!op->err)
            op->err = ENOTCONN;
        push_done(c, op);
        op = next;
    }
}

/* Try once to replace the dead handle.  Returns true on success. */
static bool try_reconnect(struct nbdx_conn *c)
{
    struct nbd_handle *old = c->h;

    c->h = NULL;
    if (conn_connect(c, &c->x->cfg, true) < 0) {
        if (c->h)
            nbd_close(c->h);
        c->h = old;
        return false;
    }
    if ((uint64_t) nbd_get_size(c->h) != c->x->info.size) {
        log_err("connection %u: the export changed size after reconnecting",
                c->index);
        nbd_close(c->h);
        c->h = old;
        c->gave_up = true;
        return false;
    }
    tune_socket(nbd_aio_get_fd(c->h), c->x->cfg.nodelay);
    atomic_store(&c->fd, nbd_aio_get_fd(c->h));
    nbd_close(old);
    c->dead = false;
    c->lost_at_ns = 0;
    log_warn("connection %u: reconnected after %u attempt(s); resending "
             "the unacknowledged requests", c->index, c->attempts);
    struct nbdx_op *op = c->retry_head;
    c->retry_head = c->retry_tail = NULL;
    while (op) {
        struct nbdx_op *next = op->next;
        issue(c, op);
        op = next;
    }
    return true;
}

/* Backoff: 50 ms doubling to 2 s, until the deadline. */
static void reconnect_step(struct nbdx_conn *c)
{
    uint64_t deadline = c->lost_at_ns +
                        (uint64_t) c->x->cfg.retry_timeout_s * 1000000000u;
    if (try_reconnect(c) || c->gave_up) {
        if (c->gave_up)
            give_up(c);
        return;
    }
    c->attempts++;
    if (now_ns() >= deadline) {
        give_up(c);
        return;
    }
    uint64_t wait_ms = 50u << (c->attempts < 6 ? c->attempts : 6);
    if (wait_ms > 2000)
        wait_ms = 2000;
    struct pollfd p = { .fd = c->efd, .events = POLLIN };
    poll(&p, 1, (int) wait_ms);           /* an eventfd kick ends it early */
}

static void wait_for_io(struct nbdx_conn *c)
{
    struct pollfd fds[2] = { { .fd = c->efd, .events = POLLIN } };
    nfds_t n = 1;
    unsigned dir = 0;

    if (!c->dead) {
        dir = nbd_aio_get_direction(c->h);
        fds[1].fd = nbd_aio_get_fd(c->h);
        fds[1].events = (dir & LIBNBD_AIO_DIRECTION_READ ? POLLIN : 0) |
                        (dir & LIBNBD_AIO_DIRECTION_WRITE ? POLLOUT : 0);
        n = fds[1].fd >= 0 ? 2 : 1;
    }
    if (poll(fds, n, -1) == -1) {
        if (errno != EINTR)
            log_err("poll: %m");
        return;
    }
    if (fds[0].revents & POLLIN) {
        uint64_t v;
        if (read(c->efd, &v, sizeof v) < 0) { /* EAGAIN: already drained */
        }
    }
    if (n < 2)
        return;
    /* Same dispatch as libnbd's own nbd_poll(). */
    if (fds[1].revents & (POLLIN | POLLHUP))
        nbd_aio_notify_read(c->h);
    else if (fds[1].revents & POLLOUT)
        nbd_aio_notify_write(c->h);
    else if (fds[1].revents & (POLLERR | POLLNVAL))
        nbd_aio_notify_read(c->h);        /* let libnbd see the error */
    check_dead(c);
}

static void *conn_thread(void *arg)
{
    block_stop_signals();
    struct nbdx_conn *c = arg;

    for (;;) {
        bool stopping;
        struct nbdx_op *q = take_queue(c, &stopping);
        while (q) {
            struct nbdx_op *next = q->next;
            issue(c, q);
            q = next;
        }
        check_dead(c);
        run_done(c);
        if (stopping && atomic_load(&c->outstanding) == 0)
            break;
        if (c->dead && c->retry_head && !c->gave_up) {
            reconnect_step(c);
            run_done(c);
            continue;
        }
        wait_for_io(c);
        run_done(c);
    }
    return NULL;
}

/* ---- public ---------------------------------------------------------- */

static int conn_init(struct nbdx *x, unsigned i, const struct nbdx_config *cfg)
{
    struct nbdx_conn *c = &x->conns[i];

    c->x = x;
    c->index = i;
    pthread_mutex_init(&c->lock, NULL);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->efd == -1) {
        log_err("eventfd: %m");
        return -errno;
    }
    int r = conn_connect(c, cfg, false);
    if (r < 0)
        return r;
    if (i > 0)
        tune_socket(nbd_aio_get_fd(c->h), cfg->nodelay);
    atomic_store(&c->fd, nbd_aio_get_fd(c->h));
    return 0;
}

static unsigned connections_for(const struct nbdx_config *cfg,
                                const struct nbdx_info *info)
{
    unsigned want = cfg->connections ? cfg->connections : 1;

    if (want == 1)
        return 1;
    if (cfg->mode != NBDX_URI && cfg->mode != NBDX_UNIX &&
        cfg->mode != NBDX_TCP) {
        log_info("one connection: this mode cannot open more");
        return 1;
    }
    if (!info->can_multi_conn) {
        log_info("one connection: the server does not offer multi-conn");
        return 1;
    }
    return want;
}

int nbdx_open(const struct nbdx_config *cfg, struct nbdx **out)
{
    struct nbdx *x = calloc(1, sizeof *x);
    unsigned want = cfg->connections ? cfg->connections : 1;
    int r;

    if (!x)
        return -ENOMEM;
    x->cfg = *cfg;
    x->conns = calloc(want, sizeof *x->conns);
    if (!x->conns) {
        free(x);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < want; i++) {
        x->conns[i].efd = -1;
        atomic_init(&x->conns[i].fd, -1);
    }
    x->nconns = 1;
    r = conn_init(x, 0, cfg);
    if (r < 0)
        goto fail;
    read_info(x, x->conns[0].h, cfg);
    want = connections_for(cfg, &x->info);
    for (unsigned i = 1; i < want; i++, x->nconns++) {
        r = conn_init(x, i, cfg);
        if (r < 0)
            goto fail;
    }
    x->info.connections = x->nconns;
    for (unsigned i = 0; i < x->nconns; i++) {
        r = pthread_create(&x->conns[i].thread, NULL, conn_thread,
                           &x->conns[i]);
        if (r != 0) {
            log_err("pthread_create: %s", strerror(r));
            r = -r;
            goto fail;
        }
        x->conns[i].thread_started = true;
    }
    *out = x;
    return 0;

fail:
    nbdx_close(x);
    return r;
}

const struct nbdx_info *nbdx_info(const struct nbdx *x) { return &x->info; }

static void kick(struct nbdx_conn *c)
{
    uint64_t one = 1;
    if (write(c->efd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is already non-zero, the thread will wake */
    }
}

void nbdx_submit(struct nbdx *x, struct nbdx_op *op)
{
    /* Least busy connection; round-robin among equals. */
    unsigned start = atomic_fetch_add(&x->next, 1) % x->nconns;
    struct nbdx_conn *best = &x->conns[start];
    for (unsigned k = 1; k < x->nconns; k++) {
        struct nbdx_conn *c = &x->conns[(start + k) % x->nconns];
        if (atomic_load(&c->outstanding) < atomic_load(&best->outstanding))
            best = c;
    }
    atomic_fetch_add(&best->outstanding, 1);
    op->next = NULL;
    pthread_mutex_lock(&best->lock);
    if (best->q_tail)
        best->q_tail->next = op;
    else
        best->q_head = op;
    best->q_tail = op;
    pthread_mutex_unlock(&best->lock);
    kick(best);
}

struct run_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int err;
    nbdx_done_fn inner_done;
    void *inner_opaque;
};

static void run_done_cb(struct nbdx_op *op, int err)
{
    struct run_wait *w = op->opaque;

    pthread_mutex_lock(&w->lock);
    w->done = true;
    w->err = err;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

int nbdx_run(struct nbdx *x, struct nbdx_op *op)
{
    struct run_wait w = { .lock = PTHREAD_MUTEX_INITIALIZER,
                          .cond = PTHREAD_COND_INITIALIZER };

    op->done = run_done_cb;
    op->opaque = &w;
    nbdx_submit(x, op);
    pthread_mutex_lock(&w.lock);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.lock);
    pthread_mutex_unlock(&w.lock);
    pthread_mutex_destroy(&w.lock);
    pthread_cond_destroy(&w.cond);
    return w.err ? -w.err : 0;
}

unsigned nbdx_connections(const struct nbdx *x) { return x->nconns; }

int nbdx_conn_fd(void *opaque, unsigned i)
{
    struct nbdx *x = opaque;
    return i < x->nconns ? atomic_load(&x->conns[i].fd) : -1;
}

unsigned nbdx_in_flight(const struct nbdx *x)
{
    unsigned n = 0;
    for (unsigned i = 0; i < x->nconns; i++)
        n += atomic_load(&x->conns[i].outstanding);
    return n;
}

void nbdx_get_stats(const struct nbdx *x, struct nbdx_stats *out)
{
    for (int k = 0; k < 5; k++) {
        out->ops[k] = atomic_load(&x->ops[k]);
        out->bytes[k] = atomic_load(&x->bytes[k]);
    }
    out->errors = atomic_load(&x->errors);
}

void nbdx_close(struct nbdx *x)
{
    if (!x)
        return;
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        if (!c->thread_started)
            continue;
        pthread_mutex_lock(&c->lock);
        c->stopping = true;
        pthread_mutex_unlock(&c->lock);
        kick(c);
        pthread_join(c->thread, NULL);
    }
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        if (c->h) {
            if (!c->dead && nbd_aio_is_ready(c->h) == 1)
                nbd_shutdown(c->h, 0);
            nbd_close(c->h);
        }
        if (c->efd >= 0)
            close(c->efd);
        pthread_mutex_destroy(&c->lock);
    }
    free(x->conns);
    free(x);
}
