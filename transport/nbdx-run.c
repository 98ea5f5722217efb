/* transport/nbdx-run.c: nbdx_run(), one op submitted and waited for.
 * Built on nbdx_submit() alone, so the unit tests' scripted transport
 * (tests/unit/fake-nbdx.c) links this file too.
 *
 * THREAD MODEL
 * The caller sleeps on a condition variable of its own stack frame; the
 * op's done() (an nbdx I/O thread, or the fake's completer) signals it.
 * The caller holds no lock of the pool's (nbdx_run() waits for the
 * network).
 */
#include "transport/nbdx.h"

#include <pthread.h>
#include <stdbool.h>

#include "common/cleanup.h"

struct run_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int err;
};

static void run_done_cb(struct nbdx_op *op, int err)
{
    struct run_wait *w = op->opaque;

    LOCK_FOR_SCOPE(&w->lock);
    w->done = true;
    w->err = err;
    pthread_cond_signal(&w->cond);
}

int nbdx_run(struct nbdx *x, struct nbdx_op *op)
{
    struct run_wait w = { .lock = PTHREAD_MUTEX_INITIALIZER,
                          .cond = PTHREAD_COND_INITIALIZER };

    op->done = run_done_cb;
    op->opaque = &w;
    nbdx_submit(x, op);
    {
        LOCK_FOR_SCOPE(&w.lock);
        while (!w.done)
            pthread_cond_wait(&w.cond, &w.lock);
    }
    pthread_mutex_destroy(&w.lock);
    pthread_cond_destroy(&w.cond);
    return w.err ? -w.err : 0;
}
