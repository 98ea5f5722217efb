/* common/signals.h: keep stop signals on the main thread. */
#pragma once
#include <signal.h>
#include <pthread.h>

/* Call first thing in every thread the daemon starts.  libfuse's SIGTERM
 * handler only marks the session as exiting; its loop notices when the
 * signal interrupts the main thread (libfuse's own workers block these
 * signals), so a stop signal must never be delivered to one of ours.
 * Done per thread, not by blocking in main() around pthread_create(): a
 * server that libnbd forks from the main thread (socket activation,
 * --command) would inherit the blocked mask and ignore libnbd's SIGTERM. */
static inline void block_stop_signals(void)
{
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGHUP);
    sigaddset(&s, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
}
