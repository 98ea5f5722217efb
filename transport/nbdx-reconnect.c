/* transport/nbdx-reconnect.c: losing the server and finding it again: a
 * dead or stalled connection's ops wait for a reconnection and are sent
 * again; past the deadline they fail and the server is given up on, for
 * every connection, until nbdx_heal() finds it again.
 *
 * THREAD MODEL
 * All but the healing run on the connection's I/O thread.  nbdx_heal()
 * runs on the caller's thread (the pool's, with no pool lock held): it
 * takes x->heal_lock (one try at a time), makes its own probe handle,
 * reads only the parked sockets' atomic last-byte times, and hands the
 * result to the I/O threads through x->lost and a kick.
 * x->health_lock is a leaf protecting x->why.
 */
#include "transport/nbdx-internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"

/* The modes that know where the server is: the others were handed one
 * connection (--fd) or started a server of their own. */
bool nbdx_mode_reconnects(const struct nbdx_config *cfg)
{
    return cfg->mode == NBDX_URI || cfg->mode == NBDX_UNIX ||
           cfg->mode == NBDX_TCP;
}

bool nbdx_can_reconnect(const struct nbdx_conn *c)
{
    const struct nbdx_config *cfg = &c->x->cfg;
    return cfg->retry_timeout_s > 0 && !c->gave_up &&
           !atomic_load(&c->x->lost) && nbdx_mode_reconnects(cfg);
}

bool nbdx_connection_error(int err)
{
    return err == ENOTCONN || err == ECONNRESET || err == EPIPE ||
           err == ESHUTDOWN || err == ECONNABORTED;
}

/* The first connection to give up latches the loss for all, with the
 * time and the reason for the status, and wakes the others. */
static void note_lost(struct nbdx *x, const char *why)
{
    if (atomic_exchange(&x->lost, true))
        return;
    atomic_store(&x->lost_at, (long long) time(NULL));
    atomic_fetch_add(&x->losses, 1);
    nbdx_why_set(x, why);
    for (unsigned i = 0; i < x->nconns; i++)
        nbdx_kick(&x->conns[i]);
}

void nbdx_check_dead(struct nbdx_conn *c)
{
    if (c->dead || !(nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)))
        return;
    c->dead = true;
    c->stalled = false;                   /* the ops come back: resent */
    nbdx_event(&c->x->nstalled, &c->in_stall, false);
    atomic_store(&c->fd, -1);
    const char *why = nbd_get_error() ? nbd_get_error() : "closed";
    if (nbdx_can_reconnect(c)) {
        bool first = nbdx_event(&c->x->ndown, &c->in_outage, true);
        nbdx_event_log(first, "connection %u to the server was lost (%s): "
                       "reconnecting for up to %u s", c->index, why,
                       c->x->cfg.retry_timeout_s);
        nbdx_retry_why_set(c->x, c->index, "lost", why);
        if (!atomic_load(&c->outage_ns))
            atomic_store(&c->outage_ns, mono_now_ns());
    } else if (atomic_load(&c->x->lost) || c->gave_up)
        log_info("connection %u closed: the server was given up on",
                 c->index);
    else {
        bool healable = nbdx_mode_reconnects(&c->x->cfg);
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
void nbdx_abort_conn(struct nbdx_conn *c)
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
    nbdx_check_dead(c);
    if (!c->dead) {
        /* Not seen in practice; do not spin on it. */
        log_err("connection %u: could not abort the connection", c->index);
        c->progress_ns = mono_now_ns();
    }
}

/* Send the ops that waited in retry_*, in the order they came. */
static void resend_retries(struct nbdx_conn *c)
{
    struct nbdx_op *op = c->retry_head;
    c->retry_head = c->retry_tail = NULL;
    while (op) {
        struct nbdx_op *next = op->next;
        nbdx_issue(c, op);
        op = next;
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
bool nbdx_drain_parked(struct nbdx_conn *c, unsigned i)
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
 * still be carried out if the server resumes; docs/design/README.md).  A
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
        nbdx_abort_conn(c);
        return;
    }
    log_info("connection %u: given up on with %d request(s) at the server; "
             "its socket stays open until the server closes it", c->index,
             nbd_aio_in_flight(c->h));
    /* The kernel must not reset it either: a paused server's kernel
     * stops taking our bytes, and TCP_USER_TIMEOUT would then drop the
     * connection under it. */
    if (c->x->info.tcp && cfg->request_timeout_s)
        nbdx_set_int_opt(keep, IPPROTO_TCP, TCP_USER_TIMEOUT, 0,
                         "TCP_USER_TIMEOUT");
    park_socket(c, keep);
    /* Close first, then hand back what libnbd did not: from libnbd 1.16
     * on, nbd_close() runs the completion callback (ENOTCONN) of every
     * command it still holds, and op_completed() moves those ops off the
     * wire itself; libnbd 1.14 only frees them.  Handing the wire back
     * before the close completed each op twice on the newer library:
     * the pool released a request, then met it again (freed or kept for
     * a hold) and aborted on its invariant 3 (release_req_locked). */
    nbd_close(c->h);                      /* closes only its descriptor */
    c->h = NULL;
    while (c->wire) {
        struct nbdx_op *op = c->wire;
        nbdx_wire_remove(c, op);
        op->err = ENOTCONN;
        nbdx_push_done(c, op);
    }
    c->dead = true;
    c->closing = false;
    atomic_store(&c->fd, -1);
}

/* The server answered a connection that was silent past the request
 * timeout: send what waited. */
void nbdx_unstall(struct nbdx_conn *c)
{
    uint64_t since = atomic_load(&c->outage_ns);

    bool last = nbdx_event(&c->x->nstalled, &c->in_stall, false);
    nbdx_event_log(last, "connection %u: the server answers again after "
                   "%.1f s without a reply", c->index,
                   since ? (double) (mono_now_ns() - since) / 1e9 +
                           c->x->cfg.request_timeout_s : 0.0);
    c->stalled = false;
    resend_retries(c);
}

/* At close (the I/O threads have exited): before the parked sockets are
 * closed, read what the server still sends on them until it closes them,
 * or until they have been quiet for PARKED_QUIET_NS, or until due.  A
 * server that resumed just before the unmount is still answering what
 * they held: closing under it then is a close with requests outstanding
 * (nbdkit 1.32 aborts, see retire_conn).  One still paused sends nothing
 * and is closed after the quiet time: the daemon cannot wait forever. */
#define PARKED_QUIET_NS (500 * NS_PER_MS)

static unsigned parked_total(const struct nbdx *x)
{
    unsigned n = 0;
    for (unsigned i = 0; i < x->nconns; i++)
        n += x->conns[i].nparked;
    return n;
}

void nbdx_settle_parked(struct nbdx *x, uint64_t due)
{
    uint64_t last = mono_now_ns();
    unsigned logged = parked_total(x);

    if (logged)
        log_info("waiting for the server to answer on %u socket(s) given "
                 "up on before closing them", logged);
    while (parked_total(x) > 0) {
        uint64_t now = mono_now_ns();
        for (unsigned i = 0; i < x->nconns; i++) {
            uint64_t t = atomic_load(&x->conns[i].parked_rx_ns);
            last = t > last ? t : last;
        }
        if (now >= last + PARKED_QUIET_NS || now >= due)
            return;
        struct pollfd fds[NBDX_PARKED_MAX];
        for (unsigned i = 0; i < x->nconns; i++) {
            struct nbdx_conn *c = &x->conns[i];
            unsigned n = c->nparked;
            for (unsigned k = 0; k < n; k++)
                fds[k] = (struct pollfd) { .fd = c->parked[k],
                                           .events = POLLIN };
            if (n && poll(fds, n, 20) > 0)
                for (unsigned k = n; k-- > 0;)
                    if (fds[k].revents)
                        nbdx_drain_parked(c, k);
        }
    }
}

/* ---- losing the server and finding it again ------------------------ */

static void wall_clock(time_t t, char *buf, size_t len)
{
    struct tm tm;
    if (!t || !localtime_r(&t, &tm) ||
        !strftime(buf, len, "%Y-%m-%d %H:%M:%S %Z", &tm))
        snprintf(buf, len, "never");
}

/* Fail every op waiting for a reconnection (or held back while the
 * server was silent), retire the connection if it is still up, and tell
 * the other connections: one server, so when one connection cannot reach
 * it within the deadline, the others fail at once too instead of each
 * running its own timeout and deadline, one after the other.  why: the
 * reason, logged (NULL: another connection gave up first). */
void nbdx_give_up(struct nbdx_conn *c, const char *why)
{
    if (why && !atomic_load(&c->x->lost))
        log_err("connection %u: %s; failing the requests that were not "
                "acknowledged%s", c->index, why,
                nbdx_mode_reconnects(&c->x->cfg) ? ""
                : "; this mount cannot reconnect (--command, --fd or "
                  "socket activation): unmount and mount again");
    c->gave_up = true;
    c->stalled = false;
    nbdx_event(&c->x->nstalled, &c->in_stall, false);
    nbdx_event(&c->x->ndown, &c->in_outage, false);
    note_lost(c->x, why ? why : "the server was given up on");
    if (!c->dead)
        retire_conn(c);                   /* fail what is on the wire */
    struct nbdx_op *op = c->retry_head;
    c->retry_head = c->retry_tail = NULL;
    while (op) {
        struct nbdx_op *next = op->next;
        if (!op->err)
            op->err = ENOTCONN;
        nbdx_push_done(c, op);
        op = next;
    }
}

/* After nbdx_heal(): the server answers again.  The connection stays
 * dead until its next op, which takes the reconnect path with a fresh
 * outage. */
void nbdx_revive(struct nbdx_conn *c)
{
    c->gave_up = false;
    c->stalled = false;
    nbdx_event(&c->x->nstalled, &c->in_stall, false);
    nbdx_event(&c->x->ndown, &c->in_outage, false);
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
    c->connect_err[0] = '\0';
    if (nbdx_conn_connect(c, &c->x->cfg, true, timeout_ms) < 0) {
        char what[32];
        snprintf(what, sizeof what, "try %u failed", c->attempts);
        nbdx_retry_why_set(c->x, c->index, what,
                           c->connect_err[0] ? c->connect_err : "failed");
        if (c->h)
            nbd_close(c->h);
        c->h = old;
        return false;
    }
    struct nbdf_err why;
    if (nbdx_server_changed(c->x, c->h, &why)) {
        log_err("connection %u: refusing the server after reconnecting: %s",
                c->index, why.msg);
        nbd_close(c->h);
        c->h = old;
        c->gave_up = true;
        /* cut to fit */
        snprintf(c->refused, sizeof c->refused, "%.*s",
                 (int) sizeof c->refused - 1, why.msg);
        return false;
    }
    nbdx_tune_socket(nbd_aio_get_fd(c->h), &c->x->cfg);
    atomic_store(&c->fd, nbd_aio_get_fd(c->h));
    if (old)
        nbd_close(old);
    c->dead = false;
    c->closing = false;
    /* Before the resends: a reply counted after this comes from the new
     * server (the pool's damage accounting relies on it). */
    atomic_fetch_add(&c->x->reconnects, 1);
    bool last = nbdx_event(&c->x->ndown, &c->in_outage, false);
    nbdx_event_log(last, "connection %u: reconnected after %u attempt(s); "
                   "resending the unacknowledged requests", c->index,
                   c->attempts);
    resend_retries(c);
    return true;
}

/* Sleep until t_ns.  A submitter's kick ends the sleep early, and is read
 * so that the next poll() sleeps again: an unread eventfd stays readable
 * and would turn every later wait into a busy loop.  Ops queued meanwhile
 * join the retry list (nbdx_issue() on a dead connection). */
static void sleep_until(struct nbdx_conn *c, uint64_t t_ns)
{
    uint64_t now = mono_now_ns();
    if (now >= t_ns)
        return;
    struct pollfd p = { .fd = c->efd, .events = POLLIN };
    int ms = (int) ((t_ns - now + NS_PER_MS - 1) / NS_PER_MS);
    if (poll(&p, 1, ms) > 0 && (p.revents & POLLIN))
        nbdx_drain_kicks(c);
}

/* Backoff between connects: 50 ms doubling to 2 s. */
static uint64_t backoff_ns(unsigned attempts)
{
    uint64_t ms = 50u << (attempts < 6 ? attempts : 6);
    return (ms > 2000 ? 2000 : ms) * NS_PER_MS;
}

/* One step of an outage: give up past the deadline, else wait out the
 * backoff, else try to connect once. */
void nbdx_reconnect_step(struct nbdx_conn *c)
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
        nbdx_give_up(c, why);
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
        nbdx_give_up(c, why);
    }
}

/* ---- healing ------------------------------------------------------- */

/* Before the connections are used again, the sockets given up on must
 * have been quiet this long: a resumed server first carries out what
 * they still held (the ops failed), and the pool's next writes must
 * not race with those. */
#define HEAL_QUIET_NS (500 * NS_PER_MS)

/* One connection to the server, compared with the first: 0, or -errno
 * with why set. */
static int heal_probe(struct nbdx *x, struct nbdf_err *why)
{
    const struct nbdx_config *cfg = &x->cfg;
    struct nbdx_conn probe = { .x = x, .index = x->nconns };
    int64_t ms = (int64_t) (cfg->request_timeout_s ? cfg->request_timeout_s
                                                   : 30) * 1000;
    int r = nbdx_conn_connect(&probe, cfg, true, ms);

    if (r < 0)
        nbdf_errf(why, r, "reconnecting failed: %s", strerror(-r));
    else if (nbdx_server_changed(x, probe.h, why)) {
        log_err("refusing the server: %s", why->msg);
        r = -EIO;
    }
    if (probe.h) {
        if (r == 0)
            nbdx_disconnect(probe.h, mono_now_ns() + (uint64_t) ms * NS_PER_MS);
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
    if (!nbdx_mode_reconnects(&x->cfg))
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
    if (!nbdx_mode_reconnects(&x->cfg) ||
        atomic_load(&x->heal_tries) != tries) {
        nbdx_why_get(x, why, sizeof why);
        heal_refused(x, why);
        return -EIO;
    }
    struct nbdf_err probe_why;
    int r = heal_probe(x, &probe_why);
    atomic_fetch_add(&x->heal_tries, 1);
    if (r < 0) {
        heal_refused(x, probe_why.msg);
        nbdx_why_set(x, probe_why.msg);
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
        nbdx_kick(&x->conns[i]);
    log_warn("the server answers again: the mount is healed (the server was "
             "given up on at %s); requests are sent again", at);
    return 0;
}
