/* Unit test for common/cleanup.h: the lock is held inside the scope and
 * released on every way out of it; CLEANUP_FREE frees (ASan and valgrind
 * runs see a leak otherwise); a failing lock call aborts. */
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
    printf("cleanup: ok\n");
    return 0;
}
