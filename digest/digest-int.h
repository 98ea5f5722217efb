/* digest/digest-int.h: what the inline digest's front (digest/digest.c) and its
 * two strategies (digest/digest-sha256.c, digest/digest-blkhash.c) share: the
 * queue of items, struct digest and the table of a strategy's hooks.
 * Lock order and the budgets: digest/digest.c. */
#pragma once
#include "digest/digest.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "digest/blkhash.h"
#include "digest/blkpass.h"
#include "digest/known.h"

#define DIGEST_REASON_MAX 160     /* a reason in the status */
#define ITEM_COST 64              /* bookkeeping of one queued item: the
                                   * item and the copy's malloc headers */
#define ZERO_SLICE (64u << 20)    /* zero bytes hashed per lock round */

enum item_kind {
    ITEM_STREAM,                  /* sha256: data, or len zero bytes */
    ITEM_BLK_WRITE,               /* blkhash: data at off */
    ITEM_BLK_ZERO,                /* [off, off + len) reads as zero */
    ITEM_BLK_TRUNCATE,            /* the file is off bytes long (off 0,
                                   * len 1: a view's pass starts) */
    ITEM_BLK_SETTLE,              /* a view's request is all reported */
    ITEM_BLK_CLOSE,               /* the value at size off, please */
};

struct item {
    struct item *next;
    enum item_kind kind;
    uint64_t seq;                 /* blkhash: order of queueing */
    uint64_t off;                 /* blkhash */
    uint64_t len;
    const char *data;             /* NULL: len zero bytes */
    void (*release)(void *);      /* data is the writer's: give it back */
    void *ref;                    /* ... with release(ref); else owned */
    size_t pool_bytes;            /* len if data is a pool hold, else 0 */
    struct digest_known *known;   /* blkhash: digests of its blocks the
                                   * writer had (known.h); owned, or NULL */
    struct digest_later *later;   /* blkhash: ... or is making (known.h):
                                   * one count of it, or NULL */
};

/* A write of a view's pass that came before the bytes below it (THE
 * REORDER HOLD, digest-sha256.c); data[] is its copy. */
struct held {
    struct held *next;
    uint64_t off;
    size_t len;
    char data[];
};

/* A strategy.  Every hook but thread runs with d->lock held, on the
 * thread that reported the change (digest/digest.c, THREAD MODEL); NULL
 * hooks are no-ops (fingerprints: -ENOTSUP). */
struct digest_ops {
    bool any_order;               /* blkhash: writes may come in any order */
    void *(*thread)(void *d);     /* the digest thread's body */
    void (*truncate)(struct digest *d, uint64_t size, uint64_t old);
    void (*write)(struct digest *d, uint64_t off, const void *buf,
                  size_t len, const struct digest_known *known);  /* a copy */
    void (*write_held)(struct digest *d, uint64_t off, const void *buf,
                       size_t len, void (*release)(void *), void *ref,
                       const struct digest_known *known);
    void (*zero)(struct digest *d, uint64_t off, uint64_t len,
                 uint64_t apparent);
    void (*close)(struct digest *d, uint64_t apparent);
    void (*barrier)(struct digest *d);
    /* out holds the common fields already. */
    void (*get)(struct digest *d, uint64_t apparent, struct digest_info *out);
    void (*hint)(const struct digest *d, char *out, size_t n);
    /* Without d->lock. */
    int  (*fingerprints)(struct digest *d, uint64_t size, unsigned *shift,
                         uint64_t **fp, size_t *n);
    void (*set_filler)(struct digest *d,
                       int (*fill)(void *ctx, uint64_t b,
                                   unsigned char *digest),
                       void *ctx);
    void (*set_reader)(struct digest *d,
                       int (*read)(void *ctx, uint64_t off, void *buf,
                                   size_t len),
                       void *ctx, uint64_t size);
};

/* Each strategy's file defines its table and its digest_create*(). */

struct digest {
    const struct digest_ops *ops;
    pthread_mutex_t lock;
    pthread_cond_t cond;          /* work queued, or stopping */
    pthread_cond_t space;         /* the thread took a data item */
    pthread_t thread;
    bool stopping;
    bool busy;                    /* the thread holds a taken item */
    pthread_cond_t idle;          /* !busy and the queue is empty */

    enum digest_state state;      /* IDLE, COMPUTING, NOT_FORWARD, ABANDONED */
    bool closed;                  /* a close came after the last change */
    bool zero_beyond;
    uint64_t gen;                 /* bumped when a pass starts or ends */
    uint64_t pos;
    const char *via;              /* the view whose decoded disk this pass
                                   * hashes (digest_replace()), or NULL */
    struct held *held;            /* sha256, via a view: writes beyond pos
                                   * waiting for a barrier, by offset */
    size_t held_bytes;
    char reason[DIGEST_REASON_MAX];

    struct item *head, *tail;
    size_t queued, limit;         /* payload + ITEM_COST per item */
    size_t pool_held, hold_limit; /* bytes of pool holds queued or being
                                   * hashed; their budget (THE BUDGETS) */
    uint64_t copied;              /* bytes copied past the hold budget */
    uint64_t wait_ns;             /* writers waited for room in the queue */
    unsigned delay_us;            /* NBDFERRY_DEBUG_DIGEST_DELAY_US: a slow
                                   * hasher, for tests */
    bool gate;                    /* NBDFERRY_DEBUG_DIGEST_GATE: the thread
                                   * takes nothing until a writer waits for
                                   * room (or a settle, or stopping) */

    uint64_t hashed;              /* of this gen, by the thread */
    uint64_t hex_len, hex_gen;    /* what hex covers */
    char hex[DIGEST_HEX_MAX];

    /* blkhash only (bp NULL: sha256) */
    struct blkpass *bp;           /* the digest thread's, under bp_lock */
    pthread_mutex_t bp_lock;      /* digest_fingerprints() reads bp */
    char algorithm[32 + BLKHASH_NAME_MAX];
    uint64_t blkhash_block;
    bool takes_known;             /* blkhash/sha256/65536: the writers'
                                   * digests are its own (known.h) */
    uint64_t reused;              /* bytes whose digest a writer gave */
    uint64_t seq, close_seq;      /* items queued; the last close's seq */
    uint64_t res_seq;             /* the close the thread answered ... */
    enum digest_state res_state;  /* ... COMPLETE (hex) or INCOMPLETE */
    char res_reason[DIGEST_REASON_MAX];
};

/* digest/digest.c: the queue and the thread's side of it. */
int  digest_create_ops(size_t queue_limit, const struct digest_ops *ops,
                       struct blkpass *bp, struct digest **out);
void digest_drop_data(const struct item *it);
void digest_free_queue_locked(struct digest *d);
bool digest_active_locked(const struct digest *d);
void digest_drop_held_locked(struct digest *d);
void digest_fail_locked(struct digest *d, enum digest_state state,
                        const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void digest_push_locked(struct digest *d, struct item *it);
size_t digest_item_cost(const struct item *it);
void digest_push_zero_locked(struct digest *d, uint64_t len);
void digest_push_data_locked(struct digest *d, uint64_t off, const void *buf,
                             size_t len, void (*release)(void *), void *ref,
                             const struct digest_known *known);
void digest_slow_down(const struct digest *d, const struct item *it);
void digest_done_item_locked(struct digest *d, const struct item *it);
bool digest_take_locked(struct digest *d, struct item *out);
