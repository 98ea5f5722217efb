/* daemon/stopsig.c: the daemon's stop signals (daemon/stopsig.h).
 *
 * THREAD MODEL
 * Stop signals reach only the main thread: every other thread blocks
 * them (common/signals.h).  The handler does only what a signal handler
 * may: fuse_session_exit() for the first signal (what libfuse's own
 * handler does), a write() to a pipe for the later ones.  The stop
 * thread waits on the pipe and calls pool_abandon_zeroing(), which takes
 * the pool's lock (a handler must not: the thread it interrupted may hold
 * it).  The handler is installed without SA_RESTART, so the receiver's
 * read() of /dev/fuse returns EINTR and the loop sees the session end.
 */
#include "daemon/stopsig.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/signals.h"

static const int stop_signals[] = { SIGTERM, SIGINT, SIGHUP };

static struct fuse_session *_Atomic stop_se;
static atomic_uint stop_count;
static int stop_pipe[2] = { -1, -1 };
static pthread_t stop_thread;
static bool started;

static void on_stop(int sig)
{
    int saved = errno;
    struct fuse_session *se = atomic_load(&stop_se);

    (void) sig;
    if (atomic_fetch_add(&stop_count, 1) == 0) {
        if (se)
            fuse_session_exit(se);
    } else if (write(stop_pipe[1], "x", 1) < 0) {
        /* EAGAIN: the thread has a byte to read already */
    }
    errno = saved;
}

static struct pool *const *stop_pools;   /* the disks' pools, every one */
static unsigned stop_npools;

static void *stop_main(void *arg)
{
    char c;

    (void) arg;
    block_stop_signals();
    while (read(stop_pipe[0], &c, 1) == 1) {
        log_notice("second stop signal: any zeroing still to do is "
                   "abandoned");
        for (unsigned i = 0; i < stop_npools; i++)
            pool_abandon_zeroing(stop_pools[i]);
    }
    return NULL;                  /* the write end was closed */
}

static void set_handlers(void (*fn)(int))
{
    struct sigaction sa = { .sa_handler = fn };   /* no SA_RESTART */

    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaction(stop_signals[i], &sa, NULL);
}

int stopsig_start(struct fuse_session *se, struct pool *const *pools,
                  unsigned npools)
{
    stop_pools = pools;
    stop_npools = npools;
    if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) == -1)
        return -errno;
    /* Only the write end is non-blocking (the handler must never wait). */
    int fl = fcntl(stop_pipe[0], F_GETFL);
    if (fl == -1 || fcntl(stop_pipe[0], F_SETFL, fl & ~O_NONBLOCK) == -1) {
        int err = errno;
        close(stop_pipe[0]);
        close(stop_pipe[1]);
        return -err;
    }
    /* Created with the stop signals blocked, which it inherits: none may
     * reach it before its own block_stop_signals(). */
    sigset_t stop, old;
    sigemptyset(&stop);
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaddset(&stop, stop_signals[i]);
    pthread_sigmask(SIG_BLOCK, &stop, &old);
    int r = pthread_create(&stop_thread, NULL, stop_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        close(stop_pipe[0]);
        close(stop_pipe[1]);
        return -r;
    }
    started = true;
    atomic_store(&stop_se, se);
    set_handlers(on_stop);
    return 0;
}

bool stopsig_started(void)
{
    return started;
}

void stopsig_session_end(void)
{
    atomic_store(&stop_se, NULL);
}

void stopsig_stop(void)
{
    if (!started)
        return;
    set_handlers(SIG_IGN);
    close(stop_pipe[1]);          /* the thread's read() returns 0 */
    pthread_join(stop_thread, NULL);
    close(stop_pipe[0]);
    started = false;
}
