/* Unit test for common/cleanup.h: the lock is held inside the scope and
 * released on every way out of it, for a mutex and for a rwlock shared or
 * exclusive; CLEANUP_FREE frees (ASan and valgrind runs see a leak
 * otherwise); a failing lock call aborts. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cleanup.h"

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;

static int held_then_return(int early)
{
    LOCK_FOR_SCOPE(&m);
    assert(pthread_mutex_trylock(&m) == EBUSY);
    if (early)
        return 1;
    {
        CLEANUP_FREE char *s = malloc(64);
        assert(s);
    }
    return 2;
}

static pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;

static int read_held_then_return(int early)
{
    RDLOCK_FOR_SCOPE(&rw);
    assert(pthread_rwlock_trywrlock(&rw) == EBUSY);
    assert(pthread_rwlock_tryrdlock(&rw) == 0);     /* shared */
    pthread_rwlock_unlock(&rw);
    if (early)
        return 1;
    return 2;
}

static int write_held_then_return(int early)
{
    WRLOCK_FOR_SCOPE(&rw);
    assert(pthread_rwlock_tryrdlock(&rw) == EBUSY);
    if (early)
        return 1;
    return 2;
}

static void check_rw_released(void)
{
    assert(pthread_rwlock_trywrlock(&rw) == 0);
    pthread_rwlock_unlock(&rw);
}

/* A lock call that fails must abort: run it in a child, which must die
 * of SIGABRT. */
static void expect_abort(void (*fn)(void))
{
    pid_t pid = fork();
    assert(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        fn();
        _exit(0);                               /* not reached */
    }
    int st;
    assert(waitpid(pid, &st, 0) == pid);
    assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

/* glibc: a thread that holds a rwlock for writing gets EDEADLK when it
 * asks for it again, for reading or writing. */
static void wrlock_twice(void)
{
    pthread_rwlock_wrlock(&rw);
    WRLOCK_FOR_SCOPE(&rw);
}

static void rdlock_under_wrlock(void)
{
    pthread_rwlock_wrlock(&rw);
    RDLOCK_FOR_SCOPE(&rw);
}

int main(void)
{
    assert(held_then_return(1) == 1);
    assert(pthread_mutex_trylock(&m) == 0);     /* released */
    pthread_mutex_unlock(&m);
    assert(held_then_return(0) == 2);
    assert(pthread_mutex_trylock(&m) == 0);
    pthread_mutex_unlock(&m);

    for (int i = 0; i < 3; i++) {
        LOCK_FOR_SCOPE(&m);                     /* per iteration */
    }
    assert(pthread_mutex_trylock(&m) == 0);
    pthread_mutex_unlock(&m);

    /* An error-checking mutex locked twice by its owner: EDEADLK, which
     * LOCK_FOR_SCOPE must not ignore. */
    pid_t pid = fork();
    assert(pid >= 0);
    if (pid == 0) {
        pthread_mutexattr_t a;
        pthread_mutex_t em;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
        pthread_mutex_init(&em, &a);
        pthread_mutex_lock(&em);
        freopen("/dev/null", "w", stderr);
        LOCK_FOR_SCOPE(&em);
        _exit(0);                               /* not reached */
    }
    int st;
    assert(waitpid(pid, &st, 0) == pid);
    assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);

    for (int early = 0; early < 2; early++) {
        assert(read_held_then_return(early) == 2 - early);
        check_rw_released();
        assert(write_held_then_return(early) == 2 - early);
        check_rw_released();
    }
    expect_abort(wrlock_twice);
    expect_abort(rdlock_under_wrlock);
    printf("cleanup: ok\n");
    return 0;
}
