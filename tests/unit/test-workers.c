/* tests/unit/test-workers.c: digest/workers.c, the process's one pool of
 * hasher threads.
 *
 * - Every posted task runs exactly once, on a pool thread, whatever the
 *   number of users posting at once.
 * - A task taken back before a worker started it never runs; one already
 *   run cannot be taken back.
 * - Users share one pool: a second get returns the same pool and can
 *   grow it; the last put stops it, and a get after that starts a new one.
 * - The fork-join over it (digest/hashers.c) stores every block, with
 *   the pool busy with another user's slow tasks (the helpers not yet
 *   started are taken back: the caller does not wait for them).
 * Run under TSan in the sanitizer stage. */
#undef NDEBUG
#include <assert.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "digest/blkhash.h"
#include "digest/hashers.h"
#include "digest/workers.h"

struct counted {
    struct workers_task task;
    int runs;                     /* atomic */
    pthread_t on;
};

static pthread_t main_thread;

static void count_run(struct workers_task *t)
{
    struct counted *c = (struct counted *) t;
    c->on = pthread_self();
    __atomic_add_fetch(&c->runs, 1, __ATOMIC_SEQ_CST);
}

static void wait_runs(struct counted *c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        while (__atomic_load_n(&c[i].runs, __ATOMIC_SEQ_CST) == 0)
            usleep(100);
}

#define USERS 4
#define PER_USER 2000

static void *poster(void *arg)
{
    struct workers *w = workers_get(2);
    struct counted *c = arg;
    for (size_t i = 0; i < PER_USER; i++) {
        c[i].task.run = count_run;
        workers_post(w, &c[i].task);
    }
    wait_runs(c, PER_USER);
    workers_put(w);
    return NULL;
}

static void every_task_once(void)
{
    struct workers *w = workers_get(1);   /* held across the users */
    static struct counted c[USERS][PER_USER];
    pthread_t t[USERS];
    for (int i = 0; i < USERS; i++)
        assert(pthread_create(&t[i], NULL, poster, c[i]) == 0);
    for (int i = 0; i < USERS; i++)
        assert(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < USERS; i++)
        for (int j = 0; j < PER_USER; j++) {
            assert(__atomic_load_n(&c[i][j].runs, __ATOMIC_SEQ_CST) == 1);
            assert(!pthread_equal(c[i][j].on, main_thread));
        }
    assert(workers_count(w) == 2);        /* grown by the users' gets */
    workers_put(w);
}

/* A task that holds its worker until told. */
struct gate {
    struct workers_task task;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int started, open;
};

static void gate_run(struct workers_task *t)
{
    struct gate *g = (struct gate *) t;
    pthread_mutex_lock(&g->lock);
    g->started = 1;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void gate_init(struct gate *g)
{
    memset(g, 0, sizeof *g);
    g->task.run = gate_run;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
}

static void gate_wait_started(struct gate *g)
{
    pthread_mutex_lock(&g->lock);
    while (!g->started)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void gate_open(struct gate *g)
{
    pthread_mutex_lock(&g->lock);
    g->open = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void cancel_before_start(void)
{
    struct workers *w = workers_get(1);
    assert(workers_count(w) == 1);
    struct gate g;
    gate_init(&g);
    workers_post(w, &g.task);             /* the one worker, held */
    gate_wait_started(&g);
    struct counted c[3] = { { .task.run = count_run },
                            { .task.run = count_run },
                            { .task.run = count_run } };
    for (int i = 0; i < 3; i++)
        workers_post(w, &c[i].task);
    assert(workers_cancel(w, &c[1].task));     /* the middle one */
    assert(!workers_cancel(w, &c[1].task));    /* once */
    gate_open(&g);
    wait_runs(&c[0], 1);
    wait_runs(&c[2], 1);
    assert(c[1].runs == 0);
    assert(!workers_cancel(w, &c[0].task));    /* already run */
    workers_put(w);

    /* The last put stopped the pool; a new get starts one again. */
    w = workers_get(1);
    struct counted again = { .task.run = count_run };
    workers_post(w, &again.task);
    wait_runs(&again, 1);
    workers_put(w);
}

/* The fork-join with every pool thread held by another user: the caller
 * hashes every block itself, takes its helpers back, and the value is
 * the reference's. */
static void fork_join_on_a_busy_pool(void)
{
    enum { BS = 65536, N = 200 };
    unsigned char *buf = malloc((size_t) N * BS);
    uint64_t blk[N];
    const unsigned char *mem[N];
    for (size_t i = 0; i < (size_t) N * BS; i++)
        buf[i] = (unsigned char) (i * 7 + i / BS);
    for (int i = 0; i < N; i++) {
        blk[i] = (uint64_t) i;
        mem[i] = buf + (size_t) i * BS;
    }
    for (int busy = 0; busy < 2; busy++) {
        struct digest_hashers hs = { .n = 0 };
        digest_hashers_start(&hs);
        struct workers *w = workers_get(0);
        unsigned nw = workers_count(w);
        struct gate *g = calloc(nw ? nw : 1, sizeof *g);
        for (unsigned i = 0; busy && i < nw; i++) {
            gate_init(&g[i]);
            workers_post(w, &g[i].task);
        }
        for (unsigned i = 0; busy && i < nw; i++)
            gate_wait_started(&g[i]);
        struct blkhash *h, *ref;
        unsigned char a[EVP_MAX_MD_SIZE], b[EVP_MAX_MD_SIZE];
        unsigned na, nb;
        assert(blkhash_create("sha256", BS, &h) == 0);
        assert(blkhash_create("sha256", BS, &ref) == 0);
        assert(digest_hashers_run(&hs, h, blk, mem, N) == 0);
        assert(blkhash_update(ref, 0, buf, (size_t) N * BS) == 0);
        assert(blkhash_finish(h, (uint64_t) N * BS, a, &na) == 0);
        assert(blkhash_finish(ref, (uint64_t) N * BS, b, &nb) == 0);
        assert(na == nb && memcmp(a, b, na) == 0);
        for (unsigned i = 0; busy && i < nw; i++)
            gate_open(&g[i]);
        blkhash_free(h);
        blkhash_free(ref);
        digest_hashers_stop(&hs);
        workers_put(w);                   /* waits for the gates' return */
        free(g);
    }
    free(buf);
}

int main(void)
{
    main_thread = pthread_self();
    every_task_once();
    cancel_before_start();
    fork_join_on_a_busy_pool();
    printf("workers: ok\n");
    return 0;
}
