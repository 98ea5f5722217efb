/* Unit test for common/monotime.h: normalization of deadlines, and a
 * timed wait on a mono_cond_init() condition variable that returns at its
 * deadline (ETIMEDOUT), not at once nor much later. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>

#include "common/monotime.h"

int main(void)
{
    struct timespec t = { .tv_sec = 5, .tv_nsec = 999999999 };
    struct timespec u = timespec_add_ns(t, 1);
    assert(u.tv_sec == 6 && u.tv_nsec == 0);
    u = timespec_add_ns(t, 2 * NS_PER_S + 2);
    assert(u.tv_sec == 8 && u.tv_nsec == 1);
    u = timespec_add_ns(t, 0);
    assert(u.tv_sec == 5 && u.tv_nsec == 999999999);
    u = timespec_add_ns((struct timespec){ 0, 0 }, 3 * NS_PER_S / 2);
    assert(u.tv_sec == 1 && u.tv_nsec == 500000000);

    uint64_t a = mono_now_ns(), b = mono_now_ns();
    assert(b >= a && a > 0);

    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c;
    mono_cond_init(&c);
    pthread_mutex_lock(&m);
    uint64_t start = mono_now_ns();
    struct timespec dl = mono_deadline_ns(20 * 1000000ull);
    int r;
    do
        r = pthread_cond_timedwait(&c, &m, &dl);
    while (r == 0);                     /* spurious wakeups */
    assert(r == ETIMEDOUT);
    /* Only a lower bound: the deadline was honoured, on this clock. */
    assert(mono_now_ns() - start >= 20 * 1000000ull);
    pthread_mutex_unlock(&m);
    pthread_cond_destroy(&c);
    printf("monotime: ok\n");
    return 0;
}
