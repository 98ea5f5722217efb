/* digest/workers.c: the one pool of hasher threads (digest/workers.h). */
#include "digest/workers.h"

#include <pthread.h>
#include <stdlib.h>

#include "common/cleanup.h"
#include "common/signals.h"

struct workers {
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct workers_task *head, *tail;
    unsigned users;               /* workers_get() minus workers_put() */
    unsigned n;                   /* threads running */
    bool stop;
    pthread_t tid[WORKERS_MAX];
};

/* The process's pool; its lock and users under 'global'. */
static pthread_mutex_t global = PTHREAD_MUTEX_INITIALIZER;
static struct workers *the_pool;

static void *worker_main(void *arg)
{
    struct workers *w = arg;

    /* A stop signal goes to the main thread (common/signals.h): the old
     * hasher threads, started from the main thread, did not block them. */
    block_stop_signals();
    LOCK_FOR_SCOPE(&w->lock);
    for (;;) {
        while (!w->head && !w->stop)
            pthread_cond_wait(&w->work, &w->lock);
        if (!w->head)
            break;                /* stopping: no user has a task left */
        struct workers_task *t = w->head;
        w->head = t->next;
        if (!w->head)
            w->tail = NULL;
        t->queued = false;
        pthread_mutex_unlock(&w->lock);
        t->run(t);                /* t may be gone after this */
        pthread_mutex_lock(&w->lock);
    }
    return NULL;
}

/* Start threads up to want (with global held). */
static void grow(struct workers *w, unsigned want)
{
    if (want > WORKERS_MAX)
        want = WORKERS_MAX;
    LOCK_FOR_SCOPE(&w->lock);
    while (w->n < want &&
           pthread_create(&w->tid[w->n], NULL, worker_main, w) == 0)
        w->n++;
}

struct workers *workers_get(unsigned want)
{
    LOCK_FOR_SCOPE(&global);
    if (!the_pool) {
        struct workers *w = calloc(1, sizeof *w);
        if (!w)
            return NULL;
        pthread_mutex_init(&w->lock, NULL);
        pthread_cond_init(&w->work, NULL);
        the_pool = w;
    }
    the_pool->users++;
    grow(the_pool, want);
    return the_pool;
}

void workers_put(struct workers *w)
{
    if (!w)
        return;
    LOCK_FOR_SCOPE(&global);
    if (--w->users)
        return;
    {
        LOCK_FOR_SCOPE(&w->lock);
        w->stop = true;
        pthread_cond_broadcast(&w->work);
    }
    for (unsigned i = 0; i < w->n; i++)
        pthread_join(w->tid[i], NULL);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->lock);
    free(w);
    the_pool = NULL;
}

unsigned workers_count(struct workers *w)
{
    LOCK_FOR_SCOPE(&w->lock);
    return w->n;
}

void workers_post(struct workers *w, struct workers_task *t)
{
    LOCK_FOR_SCOPE(&w->lock);
    t->next = NULL;
    t->queued = true;
    if (w->tail)
        w->tail->next = t;
    else
        w->head = t;
    w->tail = t;
    pthread_cond_signal(&w->work);
}

bool workers_cancel(struct workers *w, struct workers_task *t)
{
    LOCK_FOR_SCOPE(&w->lock);
    if (!t->queued)
        return false;
    struct workers_task *prev = NULL;
    for (struct workers_task *p = w->head; p; prev = p, p = p->next) {
        if (p != t)
            continue;
        if (prev)
            prev->next = p->next;
        else
            w->head = p->next;
        if (w->tail == p)
            w->tail = prev;
        t->queued = false;
        return true;
    }
    abort();                      /* queued, yet not in the queue */
}
