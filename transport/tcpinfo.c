/* transport/tcpinfo.c: TCP_INFO sampling (see tcpinfo.h).
 *
 * THREAD MODEL
 * One sampler thread; getsockopt(TCP_INFO) only reads kernel state, so it
 * does not disturb the I/O thread that owns the socket.  s->lock protects
 * the counters; tcpinfo_get() copies them.
 */
#include "transport/tcpinfo.h"

#include <errno.h>
#include <netinet/in.h>
#include <linux/tcp.h>  /* struct tcp_info with tcpi_notsent_bytes (glibc's lacks it) */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include "common/cleanup.h"
#include "common/monotime.h"
#include "common/signals.h"

struct tcpinfo_sampler {
    int (*fd_of)(void *opaque, unsigned i);
    void *opaque;
    unsigned n;
    unsigned interval_ms;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stopping;
    struct tcpinfo_stats st;
};

static void note_sample(struct tcpinfo_sampler *s, const struct tcp_info *ti)
{
    LOCK_FOR_SCOPE(&s->lock);
    s->st.samples++;
    if (ti->tcpi_notsent_bytes > 0)
        s->st.unsent_samples++;
    if (ti->tcpi_notsent_bytes > 0 &&
        ti->tcpi_notsent_bytes < ti->tcpi_snd_mss && ti->tcpi_unacked > 0)
        s->st.nagle_stalls++;
    s->st.rtt_us = ti->tcpi_rtt;
    s->st.rttvar_us = ti->tcpi_rttvar;
    s->st.mss = ti->tcpi_snd_mss;
}

static void sample_once(struct tcpinfo_sampler *s)
{
    uint32_t unacked = 0, notsent = 0;

    for (unsigned i = 0; i < s->n; i++) {
        struct tcp_info ti;
        socklen_t len = sizeof ti;
        int fd = s->fd_of(s->opaque, i);
        memset(&ti, 0, sizeof ti);
        if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == -1)
            continue;
        note_sample(s, &ti);
        unacked += ti.tcpi_unacked;
        notsent += ti.tcpi_notsent_bytes;
    }
    LOCK_FOR_SCOPE(&s->lock);
    s->st.unacked = unacked;
    s->st.notsent_bytes = notsent;
}

static void *sampler(void *arg)
{
    block_stop_signals();
    struct tcpinfo_sampler *s = arg;

    LOCK_FOR_SCOPE(&s->lock);
    while (!s->stopping) {
        pthread_mutex_unlock(&s->lock);       /* not held while sampling */
        sample_once(s);
        pthread_mutex_lock(&s->lock);
        struct timespec ts = mono_deadline_ns(s->interval_ms * NS_PER_MS);
        if (!s->stopping)
            pthread_cond_timedwait(&s->cond, &s->lock, &ts);
    }
    return NULL;
}

int tcpinfo_start(int (*fd_of)(void *opaque, unsigned i), void *opaque,
                  unsigned n, unsigned interval_ms,
                  struct tcpinfo_sampler **out)
{
    struct tcpinfo_sampler *s = calloc(1, sizeof *s);

    if (!s)
        return -ENOMEM;
    s->fd_of = fd_of;
    s->opaque = opaque;
    s->n = n;
    s->interval_ms = interval_ms ? interval_ms : 10;
    s->st.interval_ms = s->interval_ms;
    pthread_mutex_init(&s->lock, NULL);
    mono_cond_init(&s->cond);
    int r = pthread_create(&s->thread, NULL, sampler, s);
    if (r != 0) {
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->cond);
        free(s);
        return -r;
    }
    *out = s;
    return 0;
}

void tcpinfo_get(struct tcpinfo_sampler *s, struct tcpinfo_stats *out)
{
    LOCK_FOR_SCOPE(&s->lock);
    *out = s->st;
}

void tcpinfo_stop(struct tcpinfo_sampler *s)
{
    if (!s)
        return;
    {
        LOCK_FOR_SCOPE(&s->lock);
        s->stopping = true;
        pthread_cond_signal(&s->cond);
    }
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
}
