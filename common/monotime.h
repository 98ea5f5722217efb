/* common/monotime.h: the monotonic clock, and deadlines on it for
 * pthread_cond_timedwait().  A condition variable waited on with such a
 * deadline must use CLOCK_MONOTONIC: create it with mono_cond_init(). */
#pragma once
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define NS_PER_S 1000000000ull
#define NS_PER_MS 1000000ull

static inline uint64_t mono_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * NS_PER_S + (uint64_t) ts.tv_nsec;
}

static inline double mono_now_s(void)
{
    return (double) mono_now_ns() / 1e9;
}

/* t + ns, normalized (tv_nsec below one second). */
static inline struct timespec timespec_add_ns(struct timespec t, uint64_t ns)
{
    uint64_t nsec = (uint64_t) t.tv_nsec + ns % NS_PER_S;
    t.tv_sec += (time_t) (ns / NS_PER_S + nsec / NS_PER_S);
    t.tv_nsec = (long) (nsec % NS_PER_S);
    return t;
}

/* The CLOCK_MONOTONIC time ns from now. */
static inline struct timespec mono_deadline_ns(uint64_t ns)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return timespec_add_ns(now, ns);
}

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines:
 * a wall-clock step (NTP, the admin) then neither cuts a wait short nor
 * stretches it. */
static inline void mono_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
}
