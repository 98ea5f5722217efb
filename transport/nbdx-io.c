/* transport/nbdx-io.c: a connection's I/O thread: its loop takes the
 * ops queued for it, polls its socket and the parked ones, runs the
 * completions and notices a silent server.
 *
 * THREAD MODEL
 * Everything here runs on the connection's I/O thread, the only thread
 * that calls libnbd on its handle after the handshake (see
 * nbdx-internal.h).  An op's done() runs from run_done(), after the
 * libnbd call that completed it returned, with no lock held.
 * conn->lock is taken only to take the submission queue.
 */
#include "transport/nbdx-internal.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"
#include "common/signals.h"
#include "transport/nbdpoll.h"

static void run_done(struct nbdx_conn *c)
{
    struct nbdx_op *op;

    while ((op = c->done_head) != NULL) {
        c->done_head = op->next;
        if (!c->done_head)
            c->done_tail = NULL;
        if (op->err && (c->dead || nbdx_connection_error(op->err)) &&
            nbdx_can_reconnect(c)) {
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
                         nbdx_kind_name[op->kind], op->len, op->off,
                         strerror(op->err));
                c->closing = true;
            }
            nbdx_push_retry(c, op);       /* sent again after reconnecting */
            continue;
        }
        if (!op->err && !c->dead) {
            if (c->stalled)
                nbdx_unstall(c);
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
        nbdx_abort_conn(c);
}

static struct nbdx_op *take_queue(struct nbdx_conn *c, bool *stopping)
{
    LOCK_FOR_SCOPE(&c->lock);
    struct nbdx_op *q = c->q_head;
    c->q_head = c->q_tail = NULL;
    *stopping = c->stopping;
    return q;
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
        nbdx_give_up(c, why);
        return;
    }
    bool first = nbdx_event(&c->x->nstalled, &c->in_stall, true);
    nbdx_event_log(first, "connection %u: no reply from the server for %u s "
                   "with %d request(s) outstanding (--request-timeout): "
                   "waiting %u s more (--retry-timeout) before failing them",
                   c->index, cfg->request_timeout_s, nbd_aio_in_flight(c->h),
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
    int timeout = -1;

    if (!c->dead) {
        timeout = stall_wait_ms(c);
        if (timeout == 0) {
            stalled(c);
            return;
        }
        fds[1] = nbdpoll_watch(c->h);
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
        nbdx_drain_kicks(c);
    for (unsigned i = nparked; i-- > 0;)  /* from the end: closing moves */
        if (fds[2 + i].revents)           /* the last one into i */
            nbdx_drain_parked(c, i);
    if (fds[1].fd < 0)
        return;
    /* Bytes move on the socket: the server is alive.  A paused server
     * stops reading (our sends block once the buffers are full) and stops
     * replying. */
    if (fds[1].revents)
        atomic_store(&c->progress_ns, mono_now_ns());
    /* A failed notify leaves the handle dead: nbdx_check_dead() sees it. */
    if (nbdpoll_notify(c->h, fds[1].revents) == NBDPOLL_SOCKET_ERROR)
        nbd_aio_notify_read(c->h);        /* let libnbd see the error */
    nbdx_check_dead(c);
}

void *nbdx_conn_thread(void *arg)
{
    block_stop_signals();
    struct nbdx_conn *c = arg;

    log_set_thread_subject(c->x->cfg.log_subject);   /* a disk's name */

    for (;;) {
        bool stopping;
        /* Before taking the queue: an op submitted after nbdx_heal()
         * cleared the loss must find the connection revived. */
        if (c->gave_up && !atomic_load(&c->x->lost))
            nbdx_revive(c);
        struct nbdx_op *q = take_queue(c, &stopping);
        while (q) {
            struct nbdx_op *next = q->next;
            nbdx_issue(c, q);
            q = next;
        }
        nbdx_check_dead(c);
        run_done(c);
        drop_if_drained(c);
        if (atomic_load(&c->x->lost) && !c->gave_up)
            nbdx_give_up(c, NULL);
        run_done(c);
        if (stopping && atomic_load(&c->outstanding) == 0)
            break;
        if (c->dead && c->retry_head && !c->gave_up) {
            nbdx_reconnect_step(c);
            run_done(c);
            continue;
        }
        wait_for_io(c);
        run_done(c);
    }
    return NULL;
}
