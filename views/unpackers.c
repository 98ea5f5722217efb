/* views/unpackers.c: the decompressing threads of the format views.  See
 * views/unpackers.h (its THREAD MODEL). */
#include "views/unpackers.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/log.h"
#include "common/rounding.h"

#define QMAX 8                    /* units waiting (bounded memory) */
#define WORKERS_MAX 64            /* one per core but the writer's (an array bound) */

/* One unit: its descriptor (cdata pointing at the copy), then (aligned)
 * its compressed bytes. */
struct job {
    uint8_t *mem;                 /* owned */
};

struct unpackers {
    const struct unpackers_ops *ops;
    const char *name;             /* borrowed */
    void *opaque;                 /* the place hook's */
    void *ctx;                    /* the writer's, under the ingest lock */
    uint8_t *out;                 /* its output */
    pthread_mutex_t lock;
    pthread_cond_t cond;          /* broadcast on every change below */
    struct job jobs[QMAX];        /* ring */
    unsigned head, count;         /* jobs queued */
    unsigned busy;                /* jobs being run */
    int err;                      /* first run error (negative) */
    bool quit;
    unsigned nthreads;
    pthread_t threads[WORKERS_MAX];
};

static size_t cdata_off(const struct unpackers *u)
{
    return ROUND_UP(u->ops->desc_size, 16);
}

static void run_job(struct unpackers *u, struct job *j, void *ctx,
                    uint8_t *out)
{
    struct nbdf_err e = { "" };
    uint64_t off;
    int64_t n = u->ops->decode(ctx, j->mem, out, &e);

    memcpy(&off, j->mem + u->ops->disk_off_at, sizeof off);
    int r = n < 0 ? (int) n : u->ops->place(u->opaque, off, out, (size_t) n);

    free(j->mem);
    LOCK_FOR_SCOPE(&u->lock);
    if (r < 0 && !u->err) {
        u->err = r;
        log_err("%s: %s", u->name, e.msg[0] ? e.msg : strerror(-r));
    }
    u->busy--;
    pthread_cond_broadcast(&u->cond);
}

/* Take the oldest job: the caller then runs it without u->lock. */
static struct job pop_locked(struct unpackers *u)
{
    assert(u->count > 0);
    struct job j = u->jobs[u->head];
    u->head = (u->head + 1) % QMAX;
    u->count--;
    u->busy++;
    pthread_cond_broadcast(&u->cond);
    return j;
}

/* Run the oldest job (u->lock held on entry and exit). */
static void run_one_locked(struct unpackers *u, void *ctx, uint8_t *out)
{
    struct job j = pop_locked(u);
    pthread_mutex_unlock(&u->lock);
    run_job(u, &j, ctx, out);
    pthread_mutex_lock(&u->lock);
}

/* Run jobs until quit and nothing left.  Holds u->lock except while
 * running one. */
static void worker_serve(struct unpackers *u, void *ctx, uint8_t *out)
{
    LOCK_FOR_SCOPE(&u->lock);
    for (;;) {
        while (!u->count && !u->quit)
            pthread_cond_wait(&u->cond, &u->lock);
        if (!u->count)
            break;                    /* quit, and nothing left */
        run_one_locked(u, ctx, out);
    }
}

static void *worker(void *opaque)
{
    struct unpackers *u = opaque;
    void *ctx = NULL;
    uint8_t *out = malloc(u->ops->out_max);

    if (u->ops->new_ctx(&ctx) < 0 || !out)
        abort();                      /* startup only; cannot recover */
    worker_serve(u, ctx, out);
    u->ops->free_ctx(ctx);
    free(out);
    return NULL;
}

static int start_workers(struct unpackers *u)
{
    /* One core is the writer's, which decompresses too. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN) - 1;
    unsigned n = cpus < 1 ? 1 : cpus > WORKERS_MAX ? WORKERS_MAX
                                                    : (unsigned) cpus;

    if (u->ops->new_ctx(&u->ctx) < 0 || !(u->out = malloc(u->ops->out_max)))
        return -ENOMEM;
    for (unsigned i = 0; i < n; i++) {
        int r = pthread_create(&u->threads[i], NULL, worker, u);
        if (r)
            return -r;
        u->nthreads++;
    }
    return 0;
}

void unpackers_stop(struct unpackers *u)
{
    if (!u)
        return;
    {
        LOCK_FOR_SCOPE(&u->lock);
        assert(u->count == 0);        /* nothing is queued between requests */
        u->quit = true;
        pthread_cond_broadcast(&u->cond);
    }
    for (unsigned i = 0; i < u->nthreads; i++)
        pthread_join(u->threads[i], NULL);
    if (u->ctx)
        u->ops->free_ctx(u->ctx);
    free(u->out);
    pthread_mutex_destroy(&u->lock);
    pthread_cond_destroy(&u->cond);
    free(u);
}

int unpackers_start(const char *name, void *opaque,
                    const struct unpackers_ops *ops, struct unpackers **out)
{
    struct unpackers *u = calloc(1, sizeof *u);

    if (!u)
        return -ENOMEM;
    u->ops = ops;
    u->name = name;
    u->opaque = opaque;
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->cond, NULL);
    int r = start_workers(u);
    if (r < 0) {
        log_err("%s: cannot start %s threads: %s", name, ops->what,
                strerror(-r));
        unpackers_stop(u);
        return r;
    }
    *out = u;
    return 0;
}

int unpackers_queue(struct unpackers *u, const void *desc, const void *cdata,
                    size_t clen)
{
    uint8_t *mem = malloc(cdata_off(u) + clen);

    if (!mem)
        return -ENOMEM;
    const void *copy = mem + cdata_off(u);

    memcpy(mem, desc, u->ops->desc_size);
    memcpy(mem + u->ops->cdata_at, &copy, sizeof copy);
    if (clen)
        memcpy(mem + cdata_off(u), cdata, clen);
    int r;
    {
        LOCK_FOR_SCOPE(&u->lock);
        while (u->count == QMAX && !u->err)
            run_one_locked(u, u->ctx, u->out);
        r = u->err;
        if (r == 0) {
            u->jobs[(u->head + u->count) % QMAX].mem = mem;
            u->count++;
            pthread_cond_broadcast(&u->cond);
        }
    }
    if (r < 0)
        free(mem);                    /* run_job said it */
    return r;
}

int unpackers_drain(struct unpackers *u, bool clear)
{
    LOCK_FOR_SCOPE(&u->lock);
    while (u->count)
        run_one_locked(u, u->ctx, u->out);
    while (u->busy)
        pthread_cond_wait(&u->cond, &u->lock);
    int r = u->err;
    if (clear)
        u->err = 0;
    return r;
}
