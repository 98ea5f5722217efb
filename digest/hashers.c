/* digest/hashers.c: the fork-join over the hasher threads (digest/hashers.h). */
#include "digest/hashers.h"

#include <unistd.h>

#include "digest/blkhash.h"
#include "common/cleanup.h"

/* Take and hash blocks of the current job until none are left.  With
 * hs->lock held; drops it while hashing. */
static void hash_some_locked(struct digest_hashers *hs)
{
    while (hs->next < hs->count) {
        size_t i = hs->next, n = hs->count - i;
        if (n > DIGEST_HASHERS_TAKE)
            n = DIGEST_HASHERS_TAKE;
        hs->next += n;
        pthread_mutex_unlock(&hs->lock);
        int r = blkhash_update_blocks(hs->h, hs->blk + i, hs->mem + i, n);
        pthread_mutex_lock(&hs->lock);
        if (r < 0 && !hs->err)
            hs->err = r;
        if ((hs->finished += n) == hs->count)
            pthread_cond_broadcast(&hs->done);
    }
}

/* A helper, on a pool thread: hash what is left, then say it is done
 * (and touch nothing of hs after: the run may return at once). */
static void helper_run(struct workers_task *t)
{
    struct digest_hashers *hs = ((struct digest_hashers_helper *) t)->hs;

    LOCK_FOR_SCOPE(&hs->lock);
    hash_some_locked(hs);
    if (--hs->outstanding == 0)
        pthread_cond_broadcast(&hs->done);
}

void digest_hashers_start(struct digest_hashers *hs)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned want = cpus > 1 ? (unsigned) cpus - 1 : 0;

    pthread_mutex_init(&hs->lock, NULL);
    pthread_cond_init(&hs->done, NULL);
    if (want > DIGEST_HASHERS_MAX)
        want = DIGEST_HASHERS_MAX;
    hs->pool = workers_get(want);
    hs->n = hs->pool ? workers_count(hs->pool) : 0;
    if (hs->n > DIGEST_HASHERS_MAX)
        hs->n = DIGEST_HASHERS_MAX;
    for (unsigned i = 0; i < DIGEST_HASHERS_MAX; i++)
        hs->helper[i] = (struct digest_hashers_helper) {
            .task = { .run = helper_run }, .hs = hs };
}

void digest_hashers_stop(struct digest_hashers *hs)
{
    workers_put(hs->pool);        /* no job runs: no helper is posted */
    hs->pool = NULL;
    pthread_mutex_destroy(&hs->lock);
    pthread_cond_destroy(&hs->done);
}

int digest_hashers_run(struct digest_hashers *hs, struct blkhash *h,
                       const uint64_t *blk, const unsigned char *const *mem,
                       size_t count)
{
    LOCK_FOR_SCOPE(&hs->lock);
    hs->h = h;
    hs->blk = blk;
    hs->mem = mem;
    hs->count = count;
    hs->next = hs->finished = 0;
    hs->err = 0;
    /* One helper per DIGEST_HASHERS_TAKE blocks beyond this thread's. */
    size_t takes = (count + DIGEST_HASHERS_TAKE - 1) / DIGEST_HASHERS_TAKE;
    unsigned k = takes > 1 ? (unsigned) (takes - 1 < hs->n ? takes - 1
                                                           : hs->n) : 0;
    hs->outstanding = k;
    for (unsigned i = 0; i < k; i++)
        workers_post(hs->pool, &hs->helper[i].task);
    hash_some_locked(hs);
    /* Every block is taken: a helper no worker started has nothing to do. */
    for (unsigned i = 0; i < k; i++)
        if (workers_cancel(hs->pool, &hs->helper[i].task))
            hs->outstanding--;
    while (hs->finished < hs->count || hs->outstanding)
        pthread_cond_wait(&hs->done, &hs->lock);
    int r = hs->err;
    hs->count = hs->next = hs->finished = 0;   /* no job */
    return r;
}
