/* digest/hashers.h: a fork-join pool of hasher threads over a blkhash
 * (common/blkhash.h): the caller hands it a batch of whole blocks and
 * gets them back all stored, hashed side by side on the helpers and its
 * own thread.  Used by the inline digest's pass (digest/blkpass.c). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct blkhash;

/* THE HASHERS: a write's whole blocks (the common case: every block of a
 * large write) are hashed on helper threads beside the pass's own, one
 * per online CPU but the pass's (at most DIGEST_HASHERS_MAX), and the write
 * returns once all are stored: the pass stays one ordered sequence of
 * changes.  blkhash_update() is safe from any thread for different
 * blocks.  hs.lock protects the job; the pass's thread publishes a job
 * (gen++), helpers take blocks by index until none are left, and the
 * last one done wakes the pass. */
#define DIGEST_HASHERS_MAX 7u
#define DIGEST_HASHERS_BATCH 256u /* blocks a caller hands at once */
#define DIGEST_HASHERS_TAKE 16u             /* blocks a thread takes at a time: they
                                   * are hashed side by side (blkhash.h) */

struct digest_hashers {
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    pthread_t tid[DIGEST_HASHERS_MAX];
    unsigned n;                   /* helper threads running */
    bool stop;
    uint64_t gen;                 /* job number */
    struct blkhash *h;            /* the job: blocks blk[i] at mem[i] */
    const uint64_t *blk;
    const unsigned char *const *mem;
    size_t count, next, finished;
    int err;
};

/* Start the helpers (none started is fine: the caller's thread then
 * hashes every block); stop and join them. */
void digest_hashers_start(struct digest_hashers *hs);
void digest_hashers_stop(struct digest_hashers *hs);

/* Hash count whole blocks blk[i] from mem[i] into h, on the helpers and
 * this thread; returns once every one is stored.  0 or -errno.  One
 * caller at a time per pool. */
int digest_hashers_run(struct digest_hashers *hs, struct blkhash *h,
                       const uint64_t *blk, const unsigned char *const *mem,
                       size_t count);
