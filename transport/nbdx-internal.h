/* transport/nbdx-internal.h: the state of the NBD connections, shared by
 * the files of transport/nbdx*.c and transport/tls.c and by nothing else
 * (never included outside transport/; the pool and fs/ know only
 * transport/nbdx.h).
 *
 * FILES, bottom first: each calls only the ones above it in this list
 * (tools/dev/import-graph checks that no object imports in a cycle)
 *   tls.c             the TLS policy: verified or refused
 *   nbdx-connect.c    connecting and disconnecting a handle, socket
 *                     options, what the server offers and whether it
 *                     changed
 *   nbdx-issue.c      issuing an op on a handle, collecting its result
 *   nbdx-reconnect.c  losing the server, retiring, reconnecting, healing
 *   nbdx-io.c         the I/O thread: its loop, polling, completions
 *   nbdx.c            open, submit, stats, health, close
 *   nbdx-run.c        nbdx_run(): one op, waited for (the unit tests'
 *                     scripted transport links it too)
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
#pragma once

#include "transport/nbdx.h"

#include <libnbd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "common/cleanup.h"
#include "common/err.h"

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
    bool ext_headers;     /* the pool sized its requests by it */
};

struct nbdx_conn {
    struct nbdx *x;
    unsigned index;
    struct nbd_handle *h;
    bool ext_headers;                     /* negotiated on h (set with h,
                                           * by nbdx_conn_connect()) */
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
    char connect_err[160];                /* why nbdx_conn_connect() last
                                           * failed (its thread only) */
    bool in_stall, in_outage;             /* counted in x->nstalled,
                                           * x->ndown (its thread only) */
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
    pthread_mutex_t health_lock;          /* a leaf: protects why and
                                           * retry_why */
    char why[200];
    char retry_why[256];                  /* while reconnecting: the loss,
                                           * then each failed try's error */
    atomic_llong lost_at, healed_at;      /* CLOCK_REALTIME seconds */
    /* Connections stalled, and down being reconnected: one event (a
     * paused or killed server) is warned by the first connection into it
     * and the last out of it; the others log at info level. */
    atomic_uint nstalled, ndown;
    atomic_uint losses, heals;
    char *ca_dir;                         /* private: ca-cert.pem -> the
                                           * system CA bundle; or NULL */
    int dumpable;                         /* before a key was loaded; -1:
                                           * no key, not changed */
};

/* x->why, the reason the server was given up on, under x->health_lock
 * (a leaf). */
static inline void nbdx_why_set(struct nbdx *x, const char *why)
{
    LOCK_FOR_SCOPE(&x->health_lock);
    snprintf(x->why, sizeof x->why, "%.*s", (int) sizeof x->why - 1, why);
}

/* x->retry_why: why a connection is being reconnected (the loss, then
 * the last try's error), for the status. */
static inline void nbdx_retry_why_set(struct nbdx *x, unsigned conn,
                                      const char *what, const char *why)
{
    LOCK_FOR_SCOPE(&x->health_lock);
    snprintf(x->retry_why, sizeof x->retry_why, "connection %u %s: %s",
             conn, what, why);
}

/* Count c in or out of an event (*in: whether it is counted in n).
 * True for the first connection in (on) or the last out (!on): the one
 * that warns. */
static inline bool nbdx_event(atomic_uint *n, bool *in, bool on)
{
    if (*in == on)
        return false;
    *in = on;
    return on ? atomic_fetch_add(n, 1) == 0 : atomic_fetch_sub(n, 1) == 1;
}

/* The level for a connection's line about a server-wide event. */
#define nbdx_event_log(warn, ...)                                        \
    do {                                                                 \
        if (warn)                                                        \
            log_warn(__VA_ARGS__);                                       \
        else                                                             \
            log_info(__VA_ARGS__);                                       \
    } while (0)

static inline void nbdx_why_get(struct nbdx *x, char *buf, size_t len)
{
    LOCK_FOR_SCOPE(&x->health_lock);
    snprintf(buf, len, "%s", x->why);
}

/* ---- nbdx-connect.c -------------------------------------------------- */

void nbdx_set_int_opt(int fd, int level, int name, int v, const char *what);
/* Socket options; true if the socket is TCP. */
bool nbdx_tune_socket(int fd, const struct nbdx_config *cfg);
/* Connect c->h within timeout_ms (-1: no limit).  quiet: a reconnection
 * attempt, logged at info level.  0 or -errno. */
int nbdx_conn_connect(struct nbdx_conn *c, const struct nbdx_config *cfg,
                      bool quiet, int64_t timeout_ms);
/* Does the server behind h differ from the one first connected to?  If
 * so, why says how. */
bool nbdx_server_changed(const struct nbdx *x, struct nbd_handle *h,
                         struct nbdf_err *why);
void nbdx_read_info(struct nbdx *x, struct nbd_handle *h,
                    const struct nbdx_config *cfg);
/* A polite NBD_CMD_DISC, then wait for the server to close until due.
 * Everything was acknowledged (and flushed) before: this is courtesy, so
 * the wait is short.  nbd_shutdown() would wait forever on a paused
 * server and hang the daemon's exit after a clean unmount. */
#define DISCONNECT_WAIT_S 5
void nbdx_disconnect(struct nbd_handle *h, uint64_t due);

/* ---- tls.c ----------------------------------------------------------- */

/* Check the TLS settings before the first connect: verified, or refused
 * with the reason logged (-EINVAL, -EPERM, ...).  May rewrite x->cfg. */
int nbdx_tls_policy(struct nbdx *x);
/* Apply the TLS settings to a new handle; -1 with the libnbd error. */
int nbdx_tls_set(struct nbd_handle *h, const struct nbdx_config *cfg);
/* At close: remove the private CA directory, make the process dumpable
 * again if a key had made it not. */
void nbdx_tls_release(struct nbdx *x);

/* ---- nbdx-issue.c (the I/O thread's, but for nbdx_kick()) ----------- */

extern const char *const nbdx_kind_name[NBDX_NKINDS];
void nbdx_push_done(struct nbdx_conn *c, struct nbdx_op *op);
void nbdx_push_retry(struct nbdx_conn *c, struct nbdx_op *op);
void nbdx_wire_remove(struct nbdx_conn *c, struct nbdx_op *op);
/* Send op on c's handle, or park it (stalled), or fail it (dead). */
void nbdx_issue(struct nbdx_conn *c, struct nbdx_op *op);
void nbdx_drain_kicks(struct nbdx_conn *c);
/* Wake c's I/O thread (an eventfd: never blocks). */
void nbdx_kick(struct nbdx_conn *c);

/* ---- nbdx-reconnect.c (I/O thread only, but for the healing) --------- */

/* The modes that know where the server is. */
bool nbdx_mode_reconnects(const struct nbdx_config *cfg);
bool nbdx_can_reconnect(const struct nbdx_conn *c);
bool nbdx_connection_error(int err);
void nbdx_check_dead(struct nbdx_conn *c);
void nbdx_abort_conn(struct nbdx_conn *c);
bool nbdx_drain_parked(struct nbdx_conn *c, unsigned i);
/* At close, with the I/O threads gone: let the parked sockets settle
 * (closed by the server, or quiet) until due. */
void nbdx_settle_parked(struct nbdx *x, uint64_t due);
void nbdx_unstall(struct nbdx_conn *c);
void nbdx_give_up(struct nbdx_conn *c, const char *why);
void nbdx_revive(struct nbdx_conn *c);
void nbdx_reconnect_step(struct nbdx_conn *c);

/* ---- nbdx-io.c ------------------------------------------------------- */

void *nbdx_conn_thread(void *arg);
