/* common/cleanup.h: scope-bound cleanup, as in libnbd and nbdkit. */
#pragma once
#include <pthread.h>
#include <stdlib.h>

static inline void cleanup_free(void *p) { free(*(void **) p); }
#define CLEANUP_FREE __attribute__((cleanup(cleanup_free)))

static inline void cleanup_unlock(pthread_mutex_t **m) { pthread_mutex_unlock(*m); }
#define LOCK_FOR_SCOPE_CAT2(a, b) a##b
#define LOCK_FOR_SCOPE_CAT(a, b) LOCK_FOR_SCOPE_CAT2(a, b)
#define LOCK_FOR_SCOPE(m)                                                     \
    __attribute__((cleanup(cleanup_unlock))) pthread_mutex_t                 \
        *LOCK_FOR_SCOPE_CAT(lock_for_scope_, __LINE__) = (m);                \
    pthread_mutex_lock(m)
