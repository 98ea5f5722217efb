/* digest/hashers.h: a fork-join over a blkhash (digest/blkhash.h) on the
 * process's hasher threads: the caller hands it a batch of whole blocks
 * and gets them back all stored, hashed side by side on the helpers and
 * its own thread.  Used by the inline digest's pass (digest/blkpass.c). */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest/workers.h"

struct blkhash;

/* THE HASHERS: a write's whole blocks (the common case: every block of a
 * large write) are hashed on helpers beside the pass's own thread: tasks
 * on the process's one pool of hasher threads (digest/workers.h), one per
 * pool thread (at most DIGEST_HASHERS_MAX, one per online CPU but the
 * pass's), and the write returns once all are stored: the pass stays one
 * ordered sequence of changes.  blkhash_update() is safe from any thread
 * for different blocks.  hs.lock protects the job: the pass's thread
 * publishes it and posts the helpers, every thread takes blocks by index
 * until none are left; then the pass takes back the helpers no worker
 * has started (the pool may be busy with a read-back's jobs: the pass
 * never waits for those) and waits for the started ones to return. */
#define DIGEST_HASHERS_MAX 7u
#define DIGEST_HASHERS_BATCH 256u /* blocks a caller hands at once */
#define DIGEST_HASHERS_TAKE 16u   /* blocks a thread takes at a time: they
                                   * are hashed side by side (blkhash.h) */

struct digest_hashers;

struct digest_hashers_helper {
    struct workers_task task;
    struct digest_hashers *hs;
};

struct digest_hashers {
    struct workers *pool;         /* the process's (digest/workers.h) */
    pthread_mutex_t lock;
    pthread_cond_t done;
    struct digest_hashers_helper helper[DIGEST_HASHERS_MAX];
    unsigned n;                   /* helpers it may post */
    unsigned outstanding;         /* posted, neither taken back nor done */
    struct blkhash *h;            /* the job: blocks blk[i] at mem[i] */
    const uint64_t *blk;
    const unsigned char *const *mem;
    size_t count, next, finished;
    int err;
};

/* Take the pool (none of its threads is fine: the caller's thread then
 * hashes every block); let it go (no job running). */
void digest_hashers_start(struct digest_hashers *hs);
void digest_hashers_stop(struct digest_hashers *hs);

/* Hash count whole blocks blk[i] from mem[i] into h, on the helpers and
 * this thread; returns once every one is stored and no helper is left.
 * 0 or -errno.  One caller at a time per struct. */
int digest_hashers_run(struct digest_hashers *hs, struct blkhash *h,
                       const uint64_t *blk, const unsigned char *const *mem,
                       size_t count);
