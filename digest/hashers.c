/* digest/hashers.c: the fork-join hasher pool (digest/hashers.h). */
#include "digest/hashers.h"

#include <unistd.h>

#include "common/blkhash.h"
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

static void *hasher_main(void *arg)
{
    struct digest_hashers *hs = arg;
    uint64_t seen = 0;

    LOCK_FOR_SCOPE(&hs->lock);
    while (!hs->stop) {
        if (hs->gen == seen) {
            pthread_cond_wait(&hs->go, &hs->lock);
            continue;
        }
        seen = hs->gen;
        hash_some_locked(hs);
    }
    return NULL;
}

void digest_hashers_start(struct digest_hashers *hs)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned want = cpus > 1 ? (unsigned) cpus - 1 : 0;

    pthread_mutex_init(&hs->lock, NULL);
    pthread_cond_init(&hs->go, NULL);
    pthread_cond_init(&hs->done, NULL);
    if (want > DIGEST_HASHERS_MAX)
        want = DIGEST_HASHERS_MAX;
    /* None started is fine: the pass's thread hashes every block. */
    while (hs->n < want && pthread_create(&hs->tid[hs->n], NULL,
                                          hasher_main, hs) == 0)
        hs->n++;
}

void digest_hashers_stop(struct digest_hashers *hs)
{
    {
        LOCK_FOR_SCOPE(&hs->lock);
        hs->stop = true;
        pthread_cond_broadcast(&hs->go);
    }
    for (unsigned i = 0; i < hs->n; i++)
        pthread_join(hs->tid[i], NULL);
    pthread_mutex_destroy(&hs->lock);
    pthread_cond_destroy(&hs->go);
    pthread_cond_destroy(&hs->done);
}

int digest_hashers_run(struct digest_hashers *hs, struct blkhash *h,
                       const uint64_t *blk, const unsigned char *const *mem,
                       size_t count)
{
    LOCK_FOR_SCOPE(&hs->lock);
    hs->gen++;
    hs->h = h;
    hs->blk = blk;
    hs->mem = mem;
    hs->count = count;
    hs->next = hs->finished = 0;
    hs->err = 0;
    if (hs->n && count > 1)
        pthread_cond_broadcast(&hs->go);
    hash_some_locked(hs);
    while (hs->finished < hs->count)
        pthread_cond_wait(&hs->done, &hs->lock);
    int r = hs->err;
    hs->count = hs->next = hs->finished = 0;   /* no job */
    return r;
}
