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
 * nbdx_heal() runs on the caller's thread with no lock of the caller's
 * held: it takes x->heal_lock (one try at a time), makes its own probe
 * handle, and hands the result to the I/O threads through x->lost and a
 * kick; x->health_lock is a leaf protecting the reason string.
 *
 * NOTHING WAITS FOREVER
 * A server that stops answering (paused process, partitioned network, no
 * RST) must not hang close(), fsync() or unmount.  Three bounds:
 * - handshakes (first connect and reconnects) are driven with a deadline
 *   of --request-timeout (and never past the retry deadline);
 * - a connection with requests outstanding and no traffic on its socket
 *   for --request-timeout is stalled: it takes no new requests and the
 *   server has --retry-timeout more to answer or to drop it (then the
 *   reconnect path); still silent, it is given up on (retire_conn: its
 *   socket stays open, never closed under a server that may answer) and
 *   its requests fail;
 * - on TCP, keepalive probes and TCP_USER_TIMEOUT let the kernel notice a
 *   partition even on an idle connection.
 */
#include "transport/nbdx.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libnbd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/signals.h"

/* Sockets of handles given up on that a connection keeps open at once;
 * past that the oldest is closed. */
#define NBDX_PARKED_MAX 8

/* What a reconnection must find again: a server that comes back
 * read-only, without multi-conn or flush, with other block sizes or
 * another size is another server (or another disk), not ours back. */
struct nbdx_first {
    uint64_t size;
    bool readonly, can_multi_conn, can_flush, can_fua;
    uint32_t block_min, block_pref, block_max;
};

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
    bool closing;                         /* I/O thread only: the server
                                           * said ESHUTDOWN; send nothing
                                           * more, drop the connection
                                           * once the replies are in */

    atomic_uint_fast64_t progress_ns;     /* last time the socket moved
                                           * bytes, or the connection
                                           * became busy (written by the
                                           * I/O thread and nbdx_submit,
                                           * read by the status) */
    bool stalled;                         /* I/O thread only: silent past
                                           * --request-timeout; new ops
                                           * wait in retry_*, the ops at
                                           * the server are not resent */
    struct nbdx_op *wire;                 /* I/O thread only: ops libnbd
                                           * holds (and their buffers) */
    int parked[NBDX_PARKED_MAX];          /* I/O thread only: sockets of */
    unsigned nparked;                     /* handles given up on, read and
                                           * discarded until the server
                                           * closes them */
    atomic_uint_fast64_t parked_rx_ns;    /* last byte read from one */

    /* Reconnection (I/O thread only).  Ops that failed because the
     * connection died wait in retry_* and are sent again, in the same
     * order, on the new connection; their done() has not run, so the
     * pool still owns their buffers and keeps overlapping ops back.
     * An outage lasts from the first loss until a request succeeds
     * again, so a server that accepts connections but fails every
     * request with ESHUTDOWN still meets the retry deadline. */
    struct nbdx_op *retry_head, *retry_tail;
    atomic_uint_fast64_t outage_ns;       /* 0: no outage (read by the
                                           * status) */
    uint64_t next_try_ns;                 /* backoff: no connect before */
    unsigned attempts;                    /* connects in this outage */
    bool gave_up;                         /* past the deadline: fail all */
    char refused[160];                    /* why a reconnection was refused */
};

struct nbdx {
    struct nbdx_config cfg;               /* for reconnecting */
    struct nbdx_info info;
    unsigned nconns;
    struct nbdx_conn *conns;
    atomic_uint next;                     /* round-robin tie breaker */
    atomic_uint_fast64_t ops[NBDX_NKINDS], bytes[NBDX_NKINDS], errors;
    atomic_uint_fast64_t reconnects;      /* nbdx_reconnects() */
    atomic_bool lost;                     /* a connection gave up on the
                                           * server: all of them fail now,
                                           * until nbdx_heal() */
    struct nbdx_first first;              /* the first connection's view
                                           * of the server: a reconnect
                                           * must see the same */
    pthread_mutex_t heal_lock;            /* one nbdx_heal() try at a time */
    atomic_uint heal_tries;               /* tries so far */
    pthread_mutex_t health_lock;          /* a leaf: protects why */
    char why[200];
    atomic_llong lost_at, healed_at;      /* CLOCK_REALTIME seconds */
    atomic_uint losses, heals;
    char *ca_dir;                         /* private: ca-cert.pem -> the
                                           * system CA bundle; or NULL */
    int dumpable;                         /* before a key was loaded; -1:
                                           * no key, not changed */
};


/* TCP keepalive: first probe after 10 s idle, then every 5 s; 4 lost
 * probes (30 s in all) and the kernel drops the connection. */
#define KEEPALIVE_IDLE_S 10
#define KEEPALIVE_INTVL_S 5
#define KEEPALIVE_CNT 4

static const char *const kind_name[NBDX_NKINDS] = {
    [NBDX_OP_READ] = "read", [NBDX_OP_WRITE] = "write",
    [NBDX_OP_ZERO] = "zero", [NBDX_OP_FLUSH] = "flush",
    [NBDX_OP_BLOCK_STATUS] = "block-status",
};

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
        /* The user typed this URI: its tls-psk-file and tls-certificates
         * may name local files. */
        nbd_set_uri_allow_local_file(h, true);
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

/* Drive the handshake until the handle is ready, for at most timeout_ms
 * (-1: no limit): a server that accepts the connection and then says
 * nothing (a paused process: the kernel completes the accept) must not
 * hold a reconnection forever.  nbd_poll() is fine here: no other thread
 * knows the handle yet.  Returns 0, -ETIMEDOUT, or -1 with the libnbd
 * error set. */
static int finish_connect(struct nbd_handle *h, int64_t timeout_ms)
{
    uint64_t due = mono_now_ns() + (uint64_t) (timeout_ms < 0 ? 0 : timeout_ms) *
                              NS_PER_MS;

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

static void set_int_opt(int fd, int level, int name, int v, const char *what)
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

/* Unix sockets: a send buffer of a whole request (above).  TCP:
 * TCP_NODELAY as asked; keepalive and TCP_USER_TIMEOUT, so that a
 * partitioned network is noticed by the kernel too (an idle connection
 * has no request timeout running).  Returns true if the socket is TCP. */
static bool tune_socket(int fd, const struct nbdx_config *cfg)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;

    if (getsockname(fd, (struct sockaddr *) &ss, &sl) == -1)
        return false;
    if (ss.ss_family == AF_UNIX)
        tune_unix_socket(fd);
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
        return false;
    set_int_opt(fd, IPPROTO_TCP, TCP_NODELAY, cfg->nodelay, "TCP_NODELAY");
    set_int_opt(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
    set_int_opt(fd, IPPROTO_TCP, TCP_KEEPIDLE, KEEPALIVE_IDLE_S,
                "TCP_KEEPIDLE");
    set_int_opt(fd, IPPROTO_TCP, TCP_KEEPINTVL, KEEPALIVE_INTVL_S,
                "TCP_KEEPINTVL");
    set_int_opt(fd, IPPROTO_TCP, TCP_KEEPCNT, KEEPALIVE_CNT, "TCP_KEEPCNT");
    /* Unacknowledged data older than the request timeout: the peer is
     * gone. */
    if (cfg->request_timeout_s)
        set_int_opt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT,
                    (int) (cfg->request_timeout_s * 1000u),
                    "TCP_USER_TIMEOUT");
    return true;
}

/* ---- TLS: verified or refused ---------------------------------------- */

/* Where distributions keep the system's CA bundle. */
static const char *const system_ca_bundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",   /* Debian, Ubuntu, Alpine */
    "/etc/pki/tls/certs/ca-bundle.crt",     /* Fedora, RHEL */
    "/etc/ssl/ca-bundle.pem",               /* openSUSE */
    "/etc/ssl/cert.pem",
};

/* The TLS mode libnbd will use: nbds:// URIs require it whatever
 * nbd_set_tls() said (nbd_connect_uri sets it). */
static int effective_tls(const struct nbdx_config *cfg)
{
    if (cfg->mode == NBDX_URI && nbdx_uri_is_tls(cfg->uri))
        return LIBNBD_TLS_REQUIRE;
    return cfg->tls != NBDX_TLS_FROM_URI ? cfg->tls : LIBNBD_TLS_DISABLE;
}

static bool dir_has(const char *dir, const char *name)
{
    char p[PATH_MAX];
    return snprintf(p, sizeof p, "%s/%s", dir, name) < (int) sizeof p &&
           access(p, R_OK) == 0;
}

/* The certificate directory libnbd will use: the URI's, the option's, or
 * libnbd's own default (for root /etc/pki/libnbd, else ~/.pki/libnbd and
 * ~/.config/pki/libnbd), the first holding ca-cert.pem.  NULL if none. */
static const char *certificate_dir(const struct nbdx_config *cfg, char *buf,
                                   size_t len)
{
    const char *home = getenv("HOME");

    if (cfg->mode == NBDX_URI &&
        nbdx_uri_query(cfg->uri, "tls-certificates", buf, len))
        return buf;
    if (cfg->tls_certificates)
        return cfg->tls_certificates;
    if (geteuid() == 0) {
        snprintf(buf, len, "/etc/pki/libnbd");
        return dir_has(buf, "ca-cert.pem") ? buf : NULL;
    }
    if (!home)
        return NULL;
    snprintf(buf, len, "%s/.pki/libnbd", home);
    if (dir_has(buf, "ca-cert.pem"))
        return buf;
    snprintf(buf, len, "%s/.config/pki/libnbd", home);
    return dir_has(buf, "ca-cert.pem") ? buf : NULL;
}

/* libnbd 1.14 verifies the server's chain and host name only when it
 * found ca-cert.pem in a certificate directory; without one it loads the
 * system trust and checks nothing.  So give it one: a private directory
 * (mkdtemp, 0700) whose ca-cert.pem links to the system bundle. */
static int make_system_ca_dir(struct nbdx *x)
{
    const char *bundle = NULL, *tmp = getenv("TMPDIR");
    char link[PATH_MAX];

    for (size_t i = 0; i < sizeof system_ca_bundles /
                           sizeof system_ca_bundles[0] && !bundle; i++)
        if (access(system_ca_bundles[i], R_OK) == 0)
            bundle = system_ca_bundles[i];
    if (!bundle)
        return -ENOENT;
    if (!tmp || tmp[0] != '/')
        tmp = "/tmp";
    if (asprintf(&x->ca_dir, "%s/nbdferry-ca-XXXXXX", tmp) == -1) {
        x->ca_dir = NULL;
        return -ENOMEM;
    }
    if (!mkdtemp(x->ca_dir)) {
        int err = errno;
        log_err("TLS: mkdtemp %s: %m", x->ca_dir);
        free(x->ca_dir);
        x->ca_dir = NULL;
        return -err;
    }
    snprintf(link, sizeof link, "%s/ca-cert.pem", x->ca_dir);
    if (symlink(bundle, link) == -1) {
        int err = errno;
        log_err("TLS: symlink %s: %m", link);
        rmdir(x->ca_dir);
        free(x->ca_dir);
        x->ca_dir = NULL;
        return -err;
    }
    log_info("TLS: verifying the server against the system CA bundle %s",
             bundle);
    return 0;
}

static void remove_ca_dir(struct nbdx *x)
{
    char link[PATH_MAX];

    if (!x->ca_dir)
        return;
    snprintf(link, sizeof link, "%s/ca-cert.pem", x->ca_dir);
    unlink(link);
    rmdir(x->ca_dir);
    free(x->ca_dir);
    x->ca_dir = NULL;
}

static bool has_host_name(const struct nbdx_config *cfg)
{
    return cfg->mode == NBDX_TCP ||
           (cfg->mode == NBDX_URI && nbdx_uri_is_tcp(cfg->uri));
}

/* X.509: the server's chain and host name are verified, or we refuse to
 * connect.  The only way around it is --tls-insecure, logged. */
static int x509_policy(struct nbdx *x, int tls)
{
    struct nbdx_config *cfg = &x->cfg;
    char buf[PATH_MAX];

    if (cfg->tls_insecure) {
        log_warn("--tls-insecure: the server's X.509 certificate is NOT "
                 "verified; anyone on the network path can read and change "
                 "the disk");
        return 0;
    }
    if (!has_host_name(cfg)) {
        if (tls == LIBNBD_TLS_ALLOW) {
            /* Unverifiable TLS is no better than the plaintext that
             * --tls=allow accepts anyway. */
            log_info("TLS off: without a host name (Unix socket, --fd, "
                     "command) X.509 could not be verified");
            cfg->tls = LIBNBD_TLS_DISABLE;
            return 0;
        }
        log_err("X.509 TLS cannot be verified without the server's host "
                "name, which a Unix socket, --fd or a command does not "
                "give: connect with nbds://HOST:PORT/ or --tcp, use a "
                "pre-shared key (--tls-psk-file), or accept an unverified "
                "server with --tls-insecure");
        return -EINVAL;
    }
    const char *dir = certificate_dir(cfg, buf, sizeof buf);
    if (dir) {
        if (!dir_has(dir, "ca-cert.pem")) {
            log_err("TLS: %s/ca-cert.pem: %s: the CA certificate that "
                    "verifies the server must be there", dir,
                    strerror(errno));
            return -EINVAL;
        }
        log_info("TLS: verifying the server against %s/ca-cert.pem", dir);
        return 0;
    }
    int r = make_system_ca_dir(x);
    if (r == -ENOENT)
        log_err("TLS: no CA to verify the server's certificate with: give "
                "--tls-certificates DIR (holding DIR/ca-cert.pem) or "
                "tls-certificates=DIR in the URI, or install the system CA "
                "bundle (ca-certificates)");
    if (r < 0)
        return r;
    cfg->tls_certificates = x->ca_dir;
    return 0;
}

/* A key file another user owns: they can read the keys (and so act as
 * the server) or replace them whatever its mode.  -EPERM, logged. */
static int psk_owner(const char *file, const struct stat *st, bool from_uri)
{
    uid_t me = geteuid();

    if (st->st_uid == me || st->st_uid == 0)
        return 0;
    struct passwd *pw = getpwuid(me);
    char name[64];
    if (pw)
        snprintf(name, sizeof name, "%s", pw->pw_name);
    else
        snprintf(name, sizeof name, "%u", (unsigned) me);
    if (from_uri)
        log_err("the URI's tls-psk-file belongs to uid %u, not to this "
                "user or root (that user can read and replace the keys): "
                "run chown %s on it", (unsigned) st->st_uid, name);
    else
        log_err("TLS key file %s belongs to uid %u, not to this user or "
                "root (that user can read and replace the keys): run "
                "chown %s %s", file, (unsigned) st->st_uid, name, file);
    return -EPERM;
}

/* A key file must be the owner's alone, as ssh insists for its keys, and
 * owned by the daemon's user or root.  from_uri: the path came from the
 * URI, whose tls-psk-file value every message redacts, so this one does
 * not name it either.  A file that cannot be stat'ed is left to libnbd's
 * connect to report. */
static int psk_policy(const char *file, bool from_uri)
{
    struct stat st;

    if (stat(file, &st) == -1)
        return 0;
    if (psk_owner(file, &st, from_uri) < 0)
        return -EPERM;
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        if (from_uri)
            log_err("the URI's tls-psk-file is open to group or others "
                    "(mode %04o): run chmod 600 on it",
                    (unsigned) (st.st_mode & 07777));
        else
            log_err("TLS key file %s is open to group or others (mode "
                    "%04o): run chmod 600 %s", file,
                    (unsigned) (st.st_mode & 07777), file);
        return -EPERM;
    }
    return 0;
}

/* While a key is loaded (a PSK, or an X.509 client key), a core dump
 * would carry it: the process is made non-dumpable (which also keeps
 * other users' ptrace and /proc/PID/mem out) until nbdx_close(). */
static void hold_keys(struct nbdx *x)
{
    x->dumpable = prctl(PR_GET_DUMPABLE);
    if (prctl(PR_SET_DUMPABLE, 0) == -1)
        log_warn("prctl(PR_SET_DUMPABLE): %m");
    else
        log_info("TLS key loaded: core dumps are off until it is released");
}

static int tls_policy(struct nbdx *x)
{
    const struct nbdx_config *cfg = &x->cfg;
    int tls = effective_tls(cfg);
    char psk[PATH_MAX], buf[PATH_MAX];
    const char *psk_file = cfg->tls_psk_file;

    if (tls == LIBNBD_TLS_DISABLE)
        return 0;
    bool from_uri = cfg->mode == NBDX_URI &&
                    nbdx_uri_query(cfg->uri, "tls-psk-file", psk, sizeof psk);
    if (from_uri)
        psk_file = psk;
    int r = psk_file ? psk_policy(psk_file, from_uri) : x509_policy(x, tls);
    if (r < 0)
        return r;
    const char *dir = psk_file ? NULL : certificate_dir(cfg, buf, sizeof buf);
    if (psk_file || (dir && dir_has(dir, "client-key.pem")))
        hold_keys(x);
    return 0;
}

static int set_tls(struct nbd_handle *h, const struct nbdx_config *cfg)
{
    if (cfg->tls != NBDX_TLS_FROM_URI && nbd_set_tls(h, cfg->tls) == -1)
        return -1;
    if (cfg->tls_psk_file && nbd_set_tls_psk_file(h, cfg->tls_psk_file) == -1)
        return -1;
    if (cfg->tls_username && nbd_set_tls_username(h, cfg->tls_username) == -1)
        return -1;
    if (cfg->tls_certificates &&
        nbd_set_tls_certificates(h, cfg->tls_certificates) == -1)
        return -1;
    if (nbd_set_tls_verify_peer(h, !cfg->tls_insecure) == -1)
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

/* Connect c->h within timeout_ms (-1: no limit).  quiet: a reconnection
 * attempt, logged at info level. */
static int conn_connect(struct nbdx_conn *c, const struct nbdx_config *cfg,
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
    if (set_tls(c->h, cfg) == -1) {
        log_err("TLS settings: %s", nbd_get_error());
        return -EINVAL;
    }
    r = start_connect(c->h, cfg);
    if (r == 0)
        r = finish_connect(c->h, timeout_ms);
    if (r == -ETIMEDOUT) {
        describe(cfg, what, sizeof what);
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
}

/* Does the server behind h differ from the one first connected to?  If
 * so, why says how (for the log). */
static bool server_changed(const struct nbdx *x, struct nbd_handle *h,
                           char *why, size_t len)
{
    const struct nbdx_first *a = &x->first;
    struct nbdx_first b;

    read_first(h, &b);
    if (b.size != a->size)
        snprintf(why, len, "the export's size is now %" PRIu64 " bytes, "
                 "not %" PRIu64, b.size, a->size);
    else if (b.readonly != a->readonly)
        snprintf(why, len, "the export is now %s",
                 b.readonly ? "read-only" : "writable");
    else if (b.can_multi_conn != a->can_multi_conn)
        snprintf(why, len, "the server %s multi-conn now",
                 b.can_multi_conn ? "offers" : "no longer offers");
    else if (b.can_flush != a->can_flush)
        snprintf(why, len, "the server %s flush now",
                 b.can_flush ? "offers" : "no longer offers");
    else if (b.can_fua != a->can_fua)
        snprintf(why, len, "the server %s FUA now",
                 b.can_fua ? "offers" : "no longer offers");
    else if (b.block_min != a->block_min || b.block_pref != a->block_pref ||
             b.block_max != a->block_max)
        snprintf(why, len, "the block sizes (minimum, preferred, maximum) "
                 "are now %" PRIu32 "/%" PRIu32 "/%" PRIu32 ", not %" PRIu32
                 "/%" PRIu32 "/%" PRIu32, b.block_min, b.block_pref,
                 b.block_max, a->block_min, a->block_pref, a->block_max);
    else
        return false;
    return true;
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
    i->tcp = tune_socket(nbd_aio_get_fd(h), cfg);
    read_first(h, &x->first);
}

/* ---- the I/O thread -------------------------------------------------- */

static void push_done(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->completed = true;
    QUEUE_APPEND(c->done_head, c->done_tail, op);
}

/* The ops libnbd holds, so that a handle given up on can hand them back
 * (retire_conn). */
static void wire_add(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->on_wire = true;
    op->wprev = NULL;
    op->wnext = c->wire;
    if (c->wire)
        c->wire->wprev = op;
    c->wire = op;
}

static void wire_remove(struct nbdx_conn *c, struct nbdx_op *op)
{
    if (!op->on_wire)
        return;
    op->on_wire = false;
    if (op->wprev)
        op->wprev->wnext = op->wnext;
    else
        c->wire = op->wnext;
    if (op->wnext)
        op->wnext->wprev = op->wprev;
    op->wprev = op->wnext = NULL;
}

/* libnbd completion callback: runs inside libnbd, records only. */
static int op_completed(void *user_data, int *error)
{
    struct nbdx_op *op = user_data;

    op->err = *error;
    wire_remove(op->conn, op);
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

static void push_retry(struct nbdx_conn *c, struct nbdx_op *op);

static void issue(struct nbdx_conn *c, struct nbdx_op *op)
{
    op->conn = c;
    op->completed = false;
    op->err = 0;
    if (c->stalled && !c->dead) {
        push_retry(c, op);                /* sent once the server answers */
        return;
    }
    if (c->dead || c->closing) {
        op->err = ENOTCONN;               /* run_done() may queue a retry */
        push_done(c, op);
        return;
    }
    /* The request timeout runs from the moment the connection has
     * something outstanding. */
    if (nbd_aio_in_flight(c->h) <= 0)
        atomic_store(&c->progress_ns, mono_now_ns());
    wire_add(c, op);
    if (start_op(c, op) == -1 && !op->completed) {
        wire_remove(c, op);
        int err = nbd_get_errno();
        log_err("nbd %s %" PRIu64 "@%" PRIu64 ": %s", kind_name[op->kind],
                op->len, op->off, nbd_get_error());
        op->err = err ? err : EIO;
        push_done(c, op);
    }
}

/* The modes that know where the server is: the others were handed one
 * connection (--fd) or started a server of their own. */
static bool mode_reconnects(const struct nbdx_config *cfg)
{
    return cfg->mode == NBDX_URI || cfg->mode == NBDX_UNIX ||
           cfg->mode == NBDX_TCP;
}

static bool can_reconnect(const struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;
    return cfg->retry_timeout_s > 0 && !c->gave_up &&
           !atomic_load(&c->x->lost) && mode_reconnects(cfg);
}

static void note_lost(struct nbdx *x, const char *why);
static void kick(struct nbdx_conn *c);

static bool connection_error(int err)
{
    return err == ENOTCONN || err == ECONNRESET || err == EPIPE ||
           err == ESHUTDOWN || err == ECONNABORTED;
}

static void push_retry(struct nbdx_conn *c, struct nbdx_op *op)
{
    QUEUE_APPEND(c->retry_head, c->retry_tail, op);
}

static void check_dead(struct nbdx_conn *c)
{
    if (c->dead || !(nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)))
        return;
    c->dead = true;
    c->stalled = false;                   /* the ops come back: resent */
    atomic_store(&c->fd, -1);
    const char *why = nbd_get_error() ? nbd_get_error() : "closed";
    if (can_reconnect(c)) {
        log_warn("connection %u to the server was lost (%s): reconnecting "
                 "for up to %u s", c->index, why, c->x->cfg.retry_timeout_s);
        if (!atomic_load(&c->outage_ns))
            atomic_store(&c->outage_ns, mono_now_ns());
    } else if (atomic_load(&c->x->lost) || c->gave_up)
        log_info("connection %u closed: the server was given up on",
                 c->index);
    else {
        bool healable = mode_reconnects(&c->x->cfg);
        log_err("connection %u to the server was lost: %s%s", c->index, why,
                healable ? ""
                : "; this mode (command, socket activation, --fd) cannot "
                  "reconnect: unmount and mount again");
        /* No resending (--retry-timeout 0, or a mode that cannot): the
         * server is given up on at once (conn_thread), and the next open
         * or write tries it again where the mode can. */
        note_lost(c->x, why);
    }
}

/* Fail every request on the connection as if the server had dropped it:
 * shut the socket down and let libnbd's state machine run into the
 * closed socket, which retires every command with ENOTCONN through
 * op_completed().  Used when the server stalls or says it is going away
 * (ESHUTDOWN); the requests then take the reconnect path. */
static void abort_conn(struct nbdx_conn *c)
{
    int fd = nbd_aio_get_fd(c->h);

    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
    /* After shutdown() every recv() and send() returns at once. */
    for (int i = 0; i < 16 && !nbd_aio_is_dead(c->h) &&
                    !nbd_aio_is_closed(c->h); i++) {
        unsigned dir = nbd_aio_get_direction(c->h);
        if (dir & LIBNBD_AIO_DIRECTION_READ)
            nbd_aio_notify_read(c->h);
        else if (dir & LIBNBD_AIO_DIRECTION_WRITE)
            nbd_aio_notify_write(c->h);
        else
            break;
    }
    check_dead(c);
    if (!c->dead) {
        /* Not seen in practice; do not spin on it. */
        log_err("connection %u: could not abort the connection", c->index);
        c->progress_ns = mono_now_ns();
    }
}

/* ---- retiring a connection without provoking the server ------------- */

/* Keep fd open, read and discarded, until the server closes it. */
static void park_socket(struct nbdx_conn *c, int fd)
{
    if (c->nparked == NBDX_PARKED_MAX) {
        log_info("connection %u: closing the oldest socket given up on",
                 c->index);
        close(c->parked[0]);
        memmove(c->parked, c->parked + 1,
                (NBDX_PARKED_MAX - 1) * sizeof c->parked[0]);
        c->nparked--;
    }
    c->parked[c->nparked++] = fd;
}

/* Read whatever the server still sends on parked socket i; close it once
 * the server has closed its end.  Returns true if it was closed. */
static bool drain_parked(struct nbdx_conn *c, unsigned i)
{
    char buf[16384];

    for (;;) {
        ssize_t n = recv(c->parked[i], buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            atomic_store(&c->parked_rx_ns, mono_now_ns());
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        log_info("connection %u: the server closed a socket given up on",
                 c->index);
        close(c->parked[i]);
        c->parked[i] = c->parked[--c->nparked];
        return true;
    }
}

/* Give up on a live connection without provoking the server.  nbdkit
 * 1.32 aborts (connections.c, raw_send_socket: assertion 'sock >= 0')
 * when a reply cannot be sent while another worker still sends one: a
 * client that closes or shuts down its socket with requests outstanding
 * kills a paused server the moment it resumes, and with it every other
 * client and a memory disk.  So the socket stays open (a duplicate is
 * parked and drained, until the server closes it or nbdx_close()), and
 * only the libnbd handle is closed: libnbd forgets its commands, so the
 * ops' buffers are ours again, and the ops fail with ENOTCONN (they may
 * still be carried out if the server resumes; docs/design.md).  A
 * request half sent stays half sent: the server waits for its rest and
 * answers the others.  Modes where libnbd owns a server process (it
 * waits for it in nbd_close, and a paused one never exits) and
 * connections with nothing outstanding are aborted instead: then no
 * reply is pending. */
static void retire_conn(struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;
    int fd = nbd_aio_get_fd(c->h), keep = -1;

    if (nbd_aio_in_flight(c->h) > 0 && fd >= 0 &&
        cfg->mode != NBDX_COMMAND && cfg->mode != NBDX_SOCKET_ACTIVATION)
        keep = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (keep < 0) {
        abort_conn(c);
        return;
    }
    log_info("connection %u: given up on with %d request(s) at the server; "
             "its socket stays open until the server closes it", c->index,
             nbd_aio_in_flight(c->h));
    /* The kernel must not reset it either: a paused server's kernel
     * stops taking our bytes, and TCP_USER_TIMEOUT would then drop the
     * connection under it. */
    if (c->x->info.tcp && cfg->request_timeout_s)
        set_int_opt(keep, IPPROTO_TCP, TCP_USER_TIMEOUT, 0,
                    "TCP_USER_TIMEOUT");
    park_socket(c, keep);
    while (c->wire) {
        struct nbdx_op *op = c->wire;
        wire_remove(c, op);
        op->err = ENOTCONN;
        push_done(c, op);
    }
    nbd_close(c->h);                      /* closes only its descriptor */
    c->h = NULL;
    c->dead = true;
    c->closing = false;
    atomic_store(&c->fd, -1);
}

/* The server answered a connection that was silent past the request
 * timeout: send what waited. */
static void unstall(struct nbdx_conn *c)
{
    uint64_t since = atomic_load(&c->outage_ns);

    log_warn("connection %u: the server answers again after %.1f s without "
             "a reply", c->index,
             since ? (double) (mono_now_ns() - since) / 1e9 +
                     c->x->cfg.request_timeout_s : 0.0);
    c->stalled = false;
    struct nbdx_op *op = c->retry_head;
    c->retry_head = c->retry_tail = NULL;
    while (op) {
        struct nbdx_op *next = op->next;
        issue(c, op);
        op = next;
    }
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
            /* ESHUTDOWN on a live connection: the server is going away
             * (nbdkit answers it while it shuts down).  Send nothing
             * more on this connection and drop it once the other
             * replies are in (drop_if_drained), so this op and the
             * others that fail are resent after reconnecting; parking
             * only this one would leave it waiting for a reconnection
             * that never comes.  Not dropped at once: nbdkit 1.32
             * aborts (connections.c: raw_send_socket assertion) when a
             * client closes while its worker threads still send
             * replies. */
            if (!c->dead && !c->closing) {
                log_warn("connection %u: the server answered %s %" PRIu64
                         "@%" PRIu64 " with: %s; reconnecting", c->index,
                         kind_name[op->kind], op->len, op->off,
                         strerror(op->err));
                c->closing = true;
            }
            push_retry(c, op);            /* sent again after reconnecting */
            continue;
        }
        if (!op->err && !c->dead) {
            if (c->stalled)
                unstall(c);
            atomic_store(&c->outage_ns, 0);   /* the server works again */
            c->attempts = 0;
            c->next_try_ns = 0;
        }
        atomic_fetch_add(&c->x->ops[op->kind], 1);
        atomic_fetch_add(&c->x->bytes[op->kind], op->len);
        if (op->err)
            atomic_fetch_add(&c->x->errors, 1);
        atomic_fetch_sub(&c->outstanding, 1);
        op->done(op, op->err);            /* may free or resubmit op */
    }
}

/* A closing connection whose replies are all in is dropped. */
static void drop_if_drained(struct nbdx_conn *c)
{
    if (c->closing && !c->dead && nbd_aio_in_flight(c->h) <= 0)
        abort_conn(c);
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

static void kick(struct nbdx_conn *c);

static void wall_clock(time_t t, char *buf, size_t len)
{
    struct tm tm;
    if (!t || !localtime_r(&t, &tm) ||
        !strftime(buf, len, "%Y-%m-%d %H:%M:%S %Z", &tm))
        snprintf(buf, len, "never");
}

/* The first connection to give up latches the loss for all, with the
 * time and the reason for the status, and wakes the others. */
static void note_lost(struct nbdx *x, const char *why)
{
    if (atomic_exchange(&x->lost, true))
        return;
    atomic_store(&x->lost_at, (long long) time(NULL));
    atomic_fetch_add(&x->losses, 1);
    pthread_mutex_lock(&x->health_lock);
    snprintf(x->why, sizeof x->why, "%s", why);
    pthread_mutex_unlock(&x->health_lock);
    for (unsigned i = 0; i < x->nconns; i++)
        kick(&x->conns[i]);
}

/* Fail every op waiting for a reconnection (or held back while the
 * server was silent), retire the connection if it is still up, and tell
 * the other connections: one server, so when one connection cannot reach
 * it within the deadline, the others fail at once too instead of each
 * running its own timeout and deadline, one after the other.  why: the
 * reason, logged (NULL: another connection gave up first). */
static void give_up(struct nbdx_conn *c, const char *why)
{
    if (why && !atomic_load(&c->x->lost))
        log_err("connection %u: %s; failing the requests that were not "
                "acknowledged%s", c->index, why,
                mode_reconnects(&c->x->cfg) ? ""
                : "; this mount cannot reconnect (--command, --fd or "
                  "socket activation): unmount and mount again");
    c->gave_up = true;
    c->stalled = false;
    note_lost(c->x, why ? why : "the server was given up on");
    if (!c->dead)
        retire_conn(c);                   /* fail what is on the wire */
    struct nbdx_op *op = c->retry_head;
    c->retry_head = c->retry_tail = NULL;
    while (op) {
        struct nbdx_op *next = op->next;
        if (!op->err)
            op->err = ENOTCONN;
        push_done(c, op);
        op = next;
    }
}

/* After nbdx_heal(): the server answers again.  The connection stays
 * dead until its next op, which takes the reconnect path with a fresh
 * outage. */
static void revive(struct nbdx_conn *c)
{
    c->gave_up = false;
    c->stalled = false;
    atomic_store(&c->outage_ns, 0);
    c->attempts = 0;
    c->next_try_ns = 0;
}

/* Try once to replace the dead handle, spending at most timeout_ms on
 * the handshake.  Returns true on success. */
static bool try_reconnect(struct nbdx_conn *c, int64_t timeout_ms)
{
    struct nbd_handle *old = c->h;

    c->h = NULL;
    if (conn_connect(c, &c->x->cfg, true, timeout_ms) < 0) {
        if (c->h)
            nbd_close(c->h);
        c->h = old;
        return false;
    }
    char why[160];
    if (server_changed(c->x, c->h, why, sizeof why)) {
        log_err("connection %u: refusing the server after reconnecting: %s",
                c->index, why);
        nbd_close(c->h);
        c->h = old;
        c->gave_up = true;
        snprintf(c->refused, sizeof c->refused, "%s", why);
        return false;
    }
    tune_socket(nbd_aio_get_fd(c->h), &c->x->cfg);
    atomic_store(&c->fd, nbd_aio_get_fd(c->h));
    if (old)
        nbd_close(old);
    c->dead = false;
    c->closing = false;
    /* Before the resends: a reply counted after this comes from the new
     * server (the pool's damage accounting relies on it). */
    atomic_fetch_add(&c->x->reconnects, 1);
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

static void drain_kicks(struct nbdx_conn *c)
{
    uint64_t v;
    if (read(c->efd, &v, sizeof v) < 0) { /* EAGAIN: already drained */
    }
}

/* Sleep until t_ns.  A submitter's kick ends the sleep early, and is read
 * so that the next poll() sleeps again: an unread eventfd stays readable
 * and would turn every later wait into a busy loop.  Ops queued meanwhile
 * join the retry list (issue() on a dead connection). */
static void sleep_until(struct nbdx_conn *c, uint64_t t_ns)
{
    uint64_t now = mono_now_ns();
    if (now >= t_ns)
        return;
    struct pollfd p = { .fd = c->efd, .events = POLLIN };
    int ms = (int) ((t_ns - now + NS_PER_MS - 1) / NS_PER_MS);
    if (poll(&p, 1, ms) > 0 && (p.revents & POLLIN))
        drain_kicks(c);
}

/* Backoff between connects: 50 ms doubling to 2 s. */
static uint64_t backoff_ns(unsigned attempts)
{
    uint64_t ms = 50u << (attempts < 6 ? attempts : 6);
    return (ms > 2000 ? 2000 : ms) * NS_PER_MS;
}

/* One step of an outage: give up past the deadline, else wait out the
 * backoff, else try to connect once. */
static void reconnect_step(struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;
    uint64_t now = mono_now_ns();

    if (!atomic_load(&c->outage_ns))
        atomic_store(&c->outage_ns, now);
    uint64_t deadline = atomic_load(&c->outage_ns) +
                        (uint64_t) cfg->retry_timeout_s * NS_PER_S;
    if (now >= deadline) {
        char why[96];
        snprintf(why, sizeof why, "could not reconnect within %u s "
                 "(--retry-timeout)", cfg->retry_timeout_s);
        give_up(c, why);
        return;
    }
    if (now < c->next_try_ns) {
        sleep_until(c, c->next_try_ns < deadline ? c->next_try_ns : deadline);
        return;
    }
    c->attempts++;
    c->next_try_ns = now + backoff_ns(c->attempts);
    int64_t left_ms = (int64_t) ((deadline - now) / NS_PER_MS) + 1;
    int64_t timeout_ms = cfg->request_timeout_s ?
                         (int64_t) cfg->request_timeout_s * 1000 : left_ms;
    if (timeout_ms > left_ms)
        timeout_ms = left_ms;
    if (!try_reconnect(c, timeout_ms) && c->gave_up) {
        char why[200];
        snprintf(why, sizeof why, "the server changed (%s)", c->refused);
        give_up(c, why);
    }
}

/* How long poll() may sleep before the request timeout expires (or, on
 * a connection already silent past it, the retry deadline): -1 when it
 * is not running (nothing outstanding, or no timeout), 0 when it has
 * expired. */
static int stall_wait_ms(struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;
    uint64_t due, now = mono_now_ns();

    if (cfg->request_timeout_s == 0 ||
        (!c->stalled && nbd_aio_in_flight(c->h) <= 0))
        return -1;
    if (c->stalled)
        due = atomic_load(&c->outage_ns) +
              (uint64_t) cfg->retry_timeout_s * NS_PER_S;
    else
        due = atomic_load(&c->progress_ns) +
              (uint64_t) cfg->request_timeout_s * NS_PER_S;
    if (now >= due)
        return 0;
    return (int) ((due - now + NS_PER_MS - 1) / NS_PER_MS);
}

/* No reply progress for --request-timeout: hold new requests back and
 * wait for the server, without resending what it has (it may still
 * carry it out) and without closing (which would provoke it, see
 * retire_conn).  Still silent --retry-timeout later: give up.  A server
 * that drops the connection meanwhile takes the reconnect path with the
 * same deadline. */
static void stalled(struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;

    if (c->stalled) {
        char why[160];
        snprintf(why, sizeof why, "no reply from the server for %u s "
                 "(--request-timeout %u s + --retry-timeout %u s)",
                 cfg->request_timeout_s + cfg->retry_timeout_s,
                 cfg->request_timeout_s, cfg->retry_timeout_s);
        give_up(c, why);
        return;
    }
    log_warn("connection %u: no reply from the server for %u s with %d "
             "request(s) outstanding (--request-timeout): waiting %u s more "
             "(--retry-timeout) before failing them", c->index,
             cfg->request_timeout_s, nbd_aio_in_flight(c->h),
             cfg->retry_timeout_s);
    c->stalled = true;
    if (!atomic_load(&c->outage_ns))
        atomic_store(&c->outage_ns, mono_now_ns());
}

/* Poll the eventfd, the handle's socket (while it is up) and the parked
 * sockets. */
static void wait_for_io(struct nbdx_conn *c)
{
    struct pollfd fds[2 + NBDX_PARKED_MAX] = {
        { .fd = c->efd, .events = POLLIN },
        { .fd = -1 } };
    unsigned dir = 0;
    int timeout = -1;

    if (!c->dead) {
        timeout = stall_wait_ms(c);
        if (timeout == 0) {
            stalled(c);
            return;
        }
        dir = nbd_aio_get_direction(c->h);
        fds[1].fd = nbd_aio_get_fd(c->h);
        fds[1].events = (dir & LIBNBD_AIO_DIRECTION_READ ? POLLIN : 0) |
                        (dir & LIBNBD_AIO_DIRECTION_WRITE ? POLLOUT : 0);
    }
    for (unsigned i = 0; i < c->nparked; i++)
        fds[2 + i] = (struct pollfd) { .fd = c->parked[i], .events = POLLIN };
    unsigned nparked = c->nparked;
    if (poll(fds, 2 + nparked, timeout) == -1) {
        if (errno != EINTR)
            log_err("poll: %m");
        return;
    }
    if (fds[0].revents & POLLIN)
        drain_kicks(c);
    for (unsigned i = nparked; i-- > 0;)  /* from the end: closing moves */
        if (fds[2 + i].revents)           /* the last one into i */
            drain_parked(c, i);
    if (fds[1].fd < 0)
        return;
    /* Bytes move on the socket: the server is alive.  A paused server
     * stops reading (our sends block once the buffers are full) and stops
     * replying. */
    if (fds[1].revents)
        atomic_store(&c->progress_ns, mono_now_ns());
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

    log_set_thread_subject(c->x->cfg.log_subject);   /* a disk's name */

    for (;;) {
        bool stopping;
        /* Before taking the queue: an op submitted after nbdx_heal()
         * cleared the loss must find the connection revived. */
        if (c->gave_up && !atomic_load(&c->x->lost))
            revive(c);
        struct nbdx_op *q = take_queue(c, &stopping);
        while (q) {
            struct nbdx_op *next = q->next;
            issue(c, q);
            q = next;
        }
        check_dead(c);
        run_done(c);
        drop_if_drained(c);
        if (atomic_load(&c->x->lost) && !c->gave_up)
            give_up(c, NULL);
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
    int r = conn_connect(c, cfg, false,
                         cfg->request_timeout_s ?
                         (int64_t) cfg->request_timeout_s * 1000 : -1);
    if (r < 0)
        return r;
    if (i > 0)
        tune_socket(nbd_aio_get_fd(c->h), cfg);
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
    x->dumpable = -1;
    pthread_mutex_init(&x->heal_lock, NULL);
    pthread_mutex_init(&x->health_lock, NULL);
    x->conns = calloc(want, sizeof *x->conns);
    if (!x->conns) {
        free(x);
        return -ENOMEM;
    }
    cfg = &x->cfg;                        /* as the TLS policy left it */
    r = tls_policy(x);
    if (r < 0) {
        x->nconns = 0;
        nbdx_close(x);
        return r;
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
    for (unsigned i = 1; i < want; i++) {
        x->nconns++;          /* first: nbdx_close() frees a failed one too */
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
    /* Busy from now: the request timeout and the status's silence run
     * from here, not from the last reply of an earlier busy spell. */
    if (atomic_fetch_add(&best->outstanding, 1) == 0)
        atomic_store(&best->progress_ns, mono_now_ns());
    pthread_mutex_lock(&best->lock);
    QUEUE_APPEND(best->q_head, best->q_tail, op);
    pthread_mutex_unlock(&best->lock);
    kick(best);
}

struct run_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int err;
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

uint64_t nbdx_reconnects(const struct nbdx *x)
{
    return atomic_load(&((struct nbdx *) x)->reconnects);
}

void nbdx_get_stats(const struct nbdx *x, struct nbdx_stats *out)
{
    for (int k = 0; k < NBDX_NKINDS; k++) {
        out->ops[k] = atomic_load(&x->ops[k]);
        out->bytes[k] = atomic_load(&x->bytes[k]);
    }
    out->errors = atomic_load(&x->errors);
}

/* ---- healing ------------------------------------------------------- */

/* Before the connections are used again, the sockets given up on must
 * have been quiet this long: a resumed server first carries out what
 * they still held (the ops failed), and the pool's next writes must
 * not race with those. */
#define HEAL_QUIET_NS (500 * NS_PER_MS)

static void disconnect(struct nbd_handle *h, uint64_t due);

/* One connection to the server, compared with the first: 0, or -errno
 * with why set. */
static int heal_probe(struct nbdx *x, char *why, size_t len)
{
    const struct nbdx_config *cfg = &x->cfg;
    struct nbdx_conn probe = { .x = x, .index = x->nconns };
    int64_t ms = (int64_t) (cfg->request_timeout_s ? cfg->request_timeout_s
                                                   : 30) * 1000;
    int r = conn_connect(&probe, cfg, true, ms);

    if (r < 0)
        snprintf(why, len, "reconnecting failed: %s", strerror(-r));
    else if (server_changed(x, probe.h, why, len)) {
        log_err("refusing the server: %s", why);
        r = -EIO;
    }
    if (probe.h) {
        if (r == 0)
            disconnect(probe.h, mono_now_ns() + (uint64_t) ms * NS_PER_MS);
        nbd_close(probe.h);
    }
    return r;
}

/* Wait (up to a few seconds) until no parked socket has received a byte
 * for HEAL_QUIET_NS.  The parked sockets are the I/O threads'; only
 * their last-byte times are read here. */
static void wait_parked_quiet(struct nbdx *x)
{
    uint64_t give_up_at = mono_now_ns() + 5 * NS_PER_S;

    for (;;) {
        uint64_t last = 0, now = mono_now_ns();
        for (unsigned i = 0; i < x->nconns; i++) {
            uint64_t t = atomic_load(&x->conns[i].parked_rx_ns);
            last = t > last ? t : last;
        }
        if (now >= last + HEAL_QUIET_NS || now >= give_up_at)
            return;
        usleep(50000);
    }
}

static void heal_refused(struct nbdx *x, const char *why)
{
    char at[64];

    wall_clock((time_t) atomic_load(&x->lost_at), at, sizeof at);
    if (!mode_reconnects(&x->cfg))
        log_err("the server was given up on at %s and this mount cannot "
                "reconnect (--command, --fd or socket activation): every "
                "request fails; unmount and mount again", at);
    else
        log_err("the server was given up on at %s; trying again: %s (the "
                "next open or write tries again)", at, why);
}

int nbdx_heal(struct nbdx *x)
{
    char why[200];

    if (!atomic_load(&x->lost))
        return 0;
    unsigned tries = atomic_load(&x->heal_tries);
    LOCK_FOR_SCOPE(&x->heal_lock);
    if (!atomic_load(&x->lost))
        return 0;                         /* healed while we waited */
    /* A try that failed while we waited for it is our answer too: the
     * writers queued behind a paused server do not each wait out their
     * own handshake timeout. */
    if (!mode_reconnects(&x->cfg) || atomic_load(&x->heal_tries) != tries) {
        pthread_mutex_lock(&x->health_lock);
        snprintf(why, sizeof why, "%s", x->why);
        pthread_mutex_unlock(&x->health_lock);
        heal_refused(x, why);
        return -EIO;
    }
    int r = heal_probe(x, why, sizeof why);
    atomic_fetch_add(&x->heal_tries, 1);
    if (r < 0) {
        heal_refused(x, why);
        pthread_mutex_lock(&x->health_lock);
        snprintf(x->why, sizeof x->why, "%s", why);
        pthread_mutex_unlock(&x->health_lock);
        return -EIO;
    }
    wait_parked_quiet(x);
    char at[64];
    wall_clock((time_t) atomic_load(&x->lost_at), at, sizeof at);
    atomic_store(&x->healed_at, (long long) time(NULL));
    atomic_fetch_add(&x->heals, 1);
    /* A heal is a reconnect too: writes the old connections acknowledged
     * and no flush covered may be gone with a restarted server, and the
     * pool counts them lost when this number moves (before any request
     * reaches the new connection). */
    atomic_fetch_add(&x->reconnects, 1);
    atomic_store(&x->lost, false);
    for (unsigned i = 0; i < x->nconns; i++)
        kick(&x->conns[i]);
    log_warn("the server answers again: the mount is healed (the server was "
             "given up on at %s); requests are sent again", at);
    return 0;
}

void nbdx_get_health(struct nbdx *x, struct nbdx_health *out)
{
    const struct nbdx_config *cfg = &x->cfg;
    uint64_t now = mono_now_ns(), fail_at = 0;

    memset(out, 0, sizeof *out);
    out->fails_in_s = -1;
    out->lost = atomic_load(&x->lost);
    out->can_heal = mode_reconnects(cfg);
    out->lost_at = (time_t) atomic_load(&x->lost_at);
    out->healed_at = (time_t) atomic_load(&x->healed_at);
    out->losses = atomic_load(&x->losses);
    out->heals = atomic_load(&x->heals);
    pthread_mutex_lock(&x->health_lock);
    snprintf(out->why, sizeof out->why, "%s", x->why);
    pthread_mutex_unlock(&x->health_lock);
    if (out->lost)
        return;
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        unsigned n = atomic_load(&c->outstanding);
        uint64_t p = atomic_load(&c->progress_ns),
                 o = atomic_load(&c->outage_ns);
        if (n == 0)
            continue;
        out->outstanding += n;
        double silent = now > p ? (double) (now - p) / 1e9 : 0;
        if (silent > out->silent_s)
            out->silent_s = silent;
        if (o && atomic_load(&c->fd) < 0)
            out->reconnecting = true;
        else if (o)
            out->stalled = true;
        uint64_t at = o ? o + (uint64_t) cfg->retry_timeout_s * NS_PER_S
                        : p + (uint64_t) (cfg->request_timeout_s +
                                          cfg->retry_timeout_s) * NS_PER_S;
        if (cfg->request_timeout_s && (!fail_at || at < fail_at))
            fail_at = at;
    }
    if (fail_at)
        out->fails_in_s = fail_at > now ? (double) (fail_at - now) / 1e9 : 0;
}

/* A polite NBD_CMD_DISC, then wait for the server to close until due.
 * Everything was acknowledged (and flushed) before: this is courtesy, so
 * the wait is short.  nbd_shutdown() would wait forever on a paused
 * server and hang the daemon's exit after a clean unmount. */
#define DISCONNECT_WAIT_S 5

static void disconnect(struct nbd_handle *h, uint64_t due)
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

void nbdx_abandon(struct nbdx *x)
{
    /* Each I/O thread sees lost, aborts its socket and fails everything
     * (conn_thread); give_up() logs nothing once lost is set. */
    if (!atomic_exchange(&x->lost, true))
        for (unsigned i = 0; i < x->nconns; i++)
            kick(&x->conns[i]);
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
    uint64_t due = mono_now_ns() + (uint64_t) DISCONNECT_WAIT_S * NS_PER_S;
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        if (c->h) {
            if (!c->dead && nbd_aio_is_ready(c->h) == 1)
                disconnect(c->h, due);
            nbd_close(c->h);
        }
        if (c->efd >= 0)
            close(c->efd);
        /* XXX a server still paused now meets a closed socket when it
         * resumes (retire_conn); the daemon cannot wait forever. */
        for (unsigned k = 0; k < c->nparked; k++)
            close(c->parked[k]);
        pthread_mutex_destroy(&c->lock);
    }
    pthread_mutex_destroy(&x->heal_lock);
    pthread_mutex_destroy(&x->health_lock);
    remove_ca_dir(x);
    if (x->dumpable >= 0)                 /* every key is released now */
        prctl(PR_SET_DUMPABLE, x->dumpable);
    free(x->conns);
    free(x);
}
