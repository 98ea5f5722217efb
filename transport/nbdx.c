/* transport/nbdx.c: NBD connections, each with one I/O thread: open,
 * submit, stats, health and close.  The design (thread model, nothing
 * waits forever) and the files of nbdx are in nbdx-internal.h.
 *
 * THREAD MODEL
 * nbdx_open() and nbdx_close() run on the daemon's main thread, before
 * and after everything else.  nbdx_submit() runs on any thread, often
 * with the caller's lock held (pool->lock): it only queues, under the
 * chosen connection's conn->lock (a leaf), and kicks its I/O thread.
 * The stats and the health read atomics (and x->health_lock, a leaf)
 * from the status and progress threads.
 */
#include "transport/nbdx-internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/list.h"
#include "common/log.h"
#include "common/monotime.h"

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
    int r = nbdx_conn_connect(c, cfg, false,
                              cfg->request_timeout_s ?
                              (int64_t) cfg->request_timeout_s * 1000 : -1);
    if (r < 0)
        return r;
    if (i > 0)
        nbdx_tune_socket(nbd_aio_get_fd(c->h), cfg);
    atomic_store(&c->fd, nbd_aio_get_fd(c->h));
    return 0;
}

static unsigned connections_for(const struct nbdx_config *cfg,
                                const struct nbdx_info *info)
{
    unsigned want = cfg->connections ? cfg->connections : 1;

    if (want == 1)
        return 1;
    if (!nbdx_mode_reconnects(cfg)) {
        log_info("one connection: this mode cannot open more");
        return 1;
    }
    if (!info->can_multi_conn) {
        log_info("one connection: the server does not offer multi-conn");
        return 1;
    }
    return want;
}

int nbdx_prepare(const struct nbdx_config *cfg, struct nbdx **out)
{
    struct nbdx *x = calloc(1, sizeof *x);
    int r;

    *out = NULL;
    if (!x)
        return -ENOMEM;
    x->cfg = *cfg;
    x->dumpable = -1;
    pthread_mutex_init(&x->heal_lock, NULL);
    pthread_mutex_init(&x->health_lock, NULL);
    if ((r = nbdx_tls_policy(x)) < 0) {
        nbdx_close(x);
        return r;
    }
    *out = x;
    return 0;
}

const struct nbdx_config *nbdx_config(const struct nbdx *x)
{
    return &x->cfg;
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
    r = nbdx_tls_policy(x);
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
    nbdx_read_info(x, x->conns[0].h, cfg);
    want = connections_for(cfg, &x->info);
    for (unsigned i = 1; i < want; i++) {
        x->nconns++;          /* first: nbdx_close() frees a failed one too */
        r = conn_init(x, i, cfg);
        if (r < 0)
            goto fail;
    }
    x->info.connections = x->nconns;
    for (unsigned i = 1; i < x->nconns; i++)
        if (!x->conns[i].ext_headers)     /* the same server: not seen */
            x->info.ext_headers = x->first.ext_headers = false;
    for (unsigned i = 0; i < x->nconns; i++) {
        r = pthread_create(&x->conns[i].thread, NULL, nbdx_conn_thread,
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
    {
        LOCK_FOR_SCOPE(&best->lock);
        QUEUE_APPEND(best->q_head, best->q_tail, op);
    }
    nbdx_kick(best);
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

bool nbdx_lost(struct nbdx *x)
{
    return atomic_load(&x->lost);
}

void nbdx_get_health(struct nbdx *x, struct nbdx_health *out)
{
    const struct nbdx_config *cfg = &x->cfg;
    uint64_t now = mono_now_ns(), fail_at = 0;

    memset(out, 0, sizeof *out);
    out->fails_in_s = -1;
    out->lost = atomic_load(&x->lost);
    out->can_heal = nbdx_mode_reconnects(cfg);
    out->lost_at = (time_t) atomic_load(&x->lost_at);
    out->healed_at = (time_t) atomic_load(&x->healed_at);
    out->losses = atomic_load(&x->losses);
    out->heals = atomic_load(&x->heals);
    nbdx_why_get(x, out->why, sizeof out->why);
    {
        LOCK_FOR_SCOPE(&x->health_lock);
        snprintf(out->retry_why, sizeof out->retry_why, "%s", x->retry_why);
    }
    if (out->lost)
        return;
    uint64_t heard = 0;           /* the last byte on any connection */
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        unsigned n = atomic_load(&c->outstanding);
        uint64_t p = atomic_load(&c->progress_ns),
                 o = atomic_load(&c->outage_ns);
        /* An idle connection's time is its last reply (or later send). */
        if (p > heard)
            heard = p;
        if (n == 0)
            continue;
        out->outstanding += n;
        double silent = now > p ? (double) (now - p) / 1e9 : 0;
        if (silent > out->worst_s)
            out->worst_s = silent;
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
    if (out->outstanding && now > heard)
        out->silent_s = (double) (now - heard) / 1e9;
    if (fail_at)
        out->fails_in_s = fail_at > now ? (double) (fail_at - now) / 1e9 : 0;
}

void nbdx_abandon(struct nbdx *x)
{
    /* Each I/O thread sees lost, aborts its socket and fails everything
     * (conn_thread); nbdx_give_up() logs nothing once lost is set. */
    if (!atomic_exchange(&x->lost, true))
        for (unsigned i = 0; i < x->nconns; i++)
            nbdx_kick(&x->conns[i]);
}

void nbdx_close(struct nbdx *x)
{
    if (!x)
        return;
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        if (!c->thread_started)
            continue;
        {
            LOCK_FOR_SCOPE(&c->lock);
            c->stopping = true;
        }
        nbdx_kick(c);
        pthread_join(c->thread, NULL);
    }
    uint64_t due = mono_now_ns() + (uint64_t) DISCONNECT_WAIT_S * NS_PER_S;
    nbdx_settle_parked(x, due);
    for (unsigned i = 0; i < x->nconns; i++) {
        struct nbdx_conn *c = &x->conns[i];
        if (c->h) {
            if (!c->dead && nbd_aio_is_ready(c->h) == 1)
                nbdx_disconnect(c->h, due);
            nbd_close(c->h);
        }
        if (c->efd >= 0)
            close(c->efd);
        /* Settled above: closed by the server, or quiet for a while (a
         * server still paused now meets a closed socket when it resumes;
         * the daemon cannot wait forever). */
        for (unsigned k = 0; k < c->nparked; k++)
            close(c->parked[k]);
        pthread_mutex_destroy(&c->lock);
    }
    pthread_mutex_destroy(&x->heal_lock);
    pthread_mutex_destroy(&x->health_lock);
    nbdx_tls_release(x);
    free(x->conns);
    free(x);
}
