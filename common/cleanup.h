/* common/cleanup.h: scope-bound cleanup, as in libnbd and nbdkit.
 *
 *   CLEANUP_FREE char *s = strdup(...);     freed when s leaves scope
 *   LOCK_FOR_SCOPE(&p->lock);               unlocked when the scope ends
 *   RDLOCK_FOR_SCOPE(&p->rw);               the same for a pthread_rwlock_t,
 *   WRLOCK_FOR_SCOPE(&p->rw);               shared or exclusive
 *
 * These check the lock call: pthread_mutex_lock() fails only on a
 * programming error (EDEADLK, EINVAL on a destroyed mutex), and so do the
 * rwlock calls (EDEADLK: this thread holds it for writing; EAGAIN: too
 * many readers, a leak); going on unlocked would corrupt whatever the
 * lock guards, so they abort instead. */
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

static inline void cleanup_rwunlock(pthread_rwlock_t **l)
{
    int r = pthread_rwlock_unlock(*l);
    if (r != 0) {
        fprintf(stderr, "pthread_rwlock_unlock: %s\n", strerror(r));
        abort();
    }
}

static inline pthread_rwlock_t *cleanup_rdlock(pthread_rwlock_t *l)
{
    int r = pthread_rwlock_rdlock(l);
    if (r != 0) {
        fprintf(stderr, "pthread_rwlock_rdlock: %s\n", strerror(r));
        abort();
    }
    return l;
}

static inline pthread_rwlock_t *cleanup_wrlock(pthread_rwlock_t *l)
{
    int r = pthread_rwlock_wrlock(l);
    if (r != 0) {
        fprintf(stderr, "pthread_rwlock_wrlock: %s\n", strerror(r));
        abort();
    }
    return l;
}

#define RDLOCK_FOR_SCOPE(l)                                                   \
    __attribute__((cleanup(cleanup_rwunlock))) pthread_rwlock_t              \
        *LOCK_FOR_SCOPE_CAT(rdlock_for_scope_, __COUNTER__) = cleanup_rdlock(l)
#define WRLOCK_FOR_SCOPE(l)                                                   \
    __attribute__((cleanup(cleanup_rwunlock))) pthread_rwlock_t              \
        *LOCK_FOR_SCOPE_CAT(wrlock_for_scope_, __COUNTER__) = cleanup_wrlock(l)
