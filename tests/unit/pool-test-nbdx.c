/* tests/unit/pool-test-nbdx.c: a scripted transport under the pool.
 *
 * Implements the part of transport/nbdx.h that transport/pool.c uses,
 * over a disk in memory.  Like the real one, done() runs on an I/O
 * thread of its own, never inside nbdx_submit().  The test can hold
 * replies back (pool_test_gate) and count what was sent.
 *
 * THREAD MODEL
 * The pool calls nbdx_submit() with its lock held: it only queues under
 * x->lock (a leaf).  The I/O thread applies each op to the disk, drops
 * x->lock and calls done().  nbdx_run() applies the op on the caller's
 * thread.
 */
#include "pool-test-nbdx.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct nbdx {
    struct nbdx_info info;
    unsigned char *disk;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct nbdx_op *head, *tail;
    bool gate_closed, stopping, busy;
    unsigned delay_us;            /* before each reply */
    struct pool_test_counts counts;
    pthread_t thread;
};

static void apply_locked(struct nbdx *x, struct nbdx_op *op)
{
    switch (op->kind) {
    case NBDX_OP_WRITE:
        memcpy(x->disk + op->off, op->buf, op->len);
        x->counts.writes++;
        x->counts.write_bytes += op->len;
        break;
    case NBDX_OP_ZERO:
        memset(x->disk + op->off, 0, op->len);
        x->counts.zeros++;
        x->counts.zero_bytes += op->len;
        break;
    case NBDX_OP_READ:
        memcpy(op->buf, x->disk + op->off, op->len);
        break;
    default:
        break;
    }
}

static void *io_thread(void *arg)
{
    struct nbdx *x = arg;

    pthread_mutex_lock(&x->lock);
    for (;;) {
        while (!x->stopping && (!x->head || x->gate_closed))
            pthread_cond_wait(&x->cond, &x->lock);
        if (x->stopping && !x->head)
            break;
        struct nbdx_op *op = x->head;
        x->head = op->next;
        if (!x->head)
            x->tail = NULL;
        x->busy = true;
        apply_locked(x, op);
        unsigned delay = x->delay_us;
        pthread_mutex_unlock(&x->lock);
        if (delay)
            usleep(delay);
        op->done(op, 0);
        pthread_mutex_lock(&x->lock);
        x->busy = false;
        pthread_cond_broadcast(&x->cond);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

struct nbdx *pool_test_nbdx(uint64_t size)
{
    struct nbdx *x = calloc(1, sizeof *x);
    if (!x || !(x->disk = calloc(1, size)))
        abort();
    x->info = (struct nbdx_info) { .size = size, .can_flush = true,
                                   .can_zero = true, .connections = 1 };
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->cond, NULL);
    if (pthread_create(&x->thread, NULL, io_thread, x) != 0)
        abort();
    return x;
}

void pool_test_nbdx_free(struct nbdx *x)
{
    pthread_mutex_lock(&x->lock);
    x->stopping = true;
    x->gate_closed = false;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
    pthread_join(x->thread, NULL);
    free(x->disk);
    free(x);
}

const unsigned char *pool_test_disk(struct nbdx *x) { return x->disk; }

void pool_test_gate(struct nbdx *x, bool closed)
{
    pthread_mutex_lock(&x->lock);
    x->gate_closed = closed;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
}

void pool_test_delay(struct nbdx *x, unsigned us)
{
    pthread_mutex_lock(&x->lock);
    x->delay_us = us;
    pthread_mutex_unlock(&x->lock);
}

void pool_test_quiesce(struct nbdx *x, struct pool_test_counts *out)
{
    pthread_mutex_lock(&x->lock);
    while ((x->head && !x->gate_closed) || x->busy)
        pthread_cond_wait(&x->cond, &x->lock);
    *out = x->counts;
    pthread_mutex_unlock(&x->lock);
}

const struct nbdx_info *nbdx_info(const struct nbdx *x) { return &x->info; }

void nbdx_submit(struct nbdx *x, struct nbdx_op *op)
{
    pthread_mutex_lock(&x->lock);
    op->next = NULL;
    if (x->tail)
        x->tail->next = op;
    else
        x->head = op;
    x->tail = op;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
}

int nbdx_run(struct nbdx *x, struct nbdx_op *op)
{
    pthread_mutex_lock(&x->lock);
    apply_locked(x, op);
    pthread_mutex_unlock(&x->lock);
    return 0;
}
