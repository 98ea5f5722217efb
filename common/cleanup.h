/* common/cleanup.h: scope-bound cleanup, as in libnbd and nbdkit.
 *
 *   CLEANUP_FREE char *s = strdup(...);     freed when s leaves scope
 *   LOCK_FOR_SCOPE(&p->lock);               unlocked when the scope ends
 *
 * LOCK_FOR_SCOPE checks the lock call: pthread_mutex_lock() fails only on
 * a programming error (EDEADLK, EINVAL on a destroyed mutex), and going on
 * unlocked would corrupt whatever the lock guards, so it aborts instead. */
#pragma once
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void cleanup_free(void *p) { free(*(void **) p); }
#define CLEANUP_FREE __attribute__((cleanup(cleanup_free)))

static inline void cleanup_unlock(pthread_mutex_t **m)
{
    int r = pthread_mutex_unlock(*m);
    if (r != 0) {
        fprintf(stderr, "pthread_mutex_unlock: %s\n", strerror(r));
        abort();
    }
}

static inline pthread_mutex_t *cleanup_lock(pthread_mutex_t *m)
{
    int r = pthread_mutex_lock(m);
    if (r != 0) {
        fprintf(stderr, "pthread_mutex_lock: %s\n", strerror(r));
        abort();
    }
    return m;
}

#define LOCK_FOR_SCOPE_CAT2(a, b) a##b
#define LOCK_FOR_SCOPE_CAT(a, b) LOCK_FOR_SCOPE_CAT2(a, b)
#define LOCK_FOR_SCOPE(m)                                                     \
    __attribute__((cleanup(cleanup_unlock))) pthread_mutex_t                 \
        *LOCK_FOR_SCOPE_CAT(lock_for_scope_, __COUNTER__) = cleanup_lock(m)
