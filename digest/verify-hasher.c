/* digest/verify-hasher.c: blkhash data blocks on the process's hasher threads.
 *
 * THREAD MODEL
 * One producer (the sink's thread: verify-sink.c) copies runs of data
 * blocks into jobs and posts them, or posts read jobs that name a range and a read
 * function safe on any thread (a file's pread), to the process's one pool
 * of hasher threads (digest/workers.h, shared with the inline digest);
 * a worker runs a job: the read if there is one, then blkhash_update(),
 * which is safe from any thread.  So for a file the copy out of the page
 * cache runs on every core too, straight into the buffer the worker
 * hashes.  q->lock protects the byte count, 'busy', 'pending', 'err',
 * 'stop' and the free list; the producer waits on q->room while jobs not
 * yet started hold max_bytes or more (memory bound), and in
 * hasher_drain() and hasher_free() until no job is pending.  No lock is
 * held while hashing or copying.  Hashed jobs go to a free list and are
 * reused: a fresh 1 MiB malloc is an mmap, and faulting its pages in
 * again for every job costs more system time than the copy itself.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "digest/workers.h"
#include "digest/verify-sink.h"

struct job {
    struct workers_task task;            /* first: the pool's handle */
    struct hasher *q;
    struct job *next;                    /* the free list */
    uint64_t off;
    size_t len;
    hasher_read_fn *read;                /* NULL: data[] holds the bytes */
    void *ctx;                           /* read's first argument */
    unsigned char data[];
};

struct hasher {
    struct blkhash *bh;                  /* borrowed */
    struct workers *pool;
    pthread_mutex_t lock;
    pthread_cond_t room;
    struct job *free;                    /* hashed jobs, for reuse */
    size_t job_cap;                      /* data bytes per job */
    size_t bytes, max_bytes;             /* jobs not started * job_cap */
    unsigned busy;                       /* jobs being run */
    unsigned pending;                    /* posted and not yet run */
    int err;                             /* first failure, sticky */
    bool stop;                           /* hasher_free(): skip the rest */
};

static void run_job(struct workers_task *t)
{
    struct job *j = (struct job *) t;
    struct hasher *q = j->q;
    bool skip;
    int r = 0;

    {
        LOCK_FOR_SCOPE(&q->lock);
        q->bytes -= q->job_cap;          /* a short job holds as much */
        q->busy++;
        skip = q->err || q->stop;        /* after a failure: drop it */
    }
    if (!skip && j->read)
        r = j->read(j->ctx, j->data, j->len, j->off);
    if (!skip && r == 0 && (r = blkhash_update(q->bh, j->off, j->data,
                                               j->len)) < 0)
        verify_err("blkhash: %s", strerror(-r));   /* read() logs */
    LOCK_FOR_SCOPE(&q->lock);
    j->next = q->free;
    q->free = j;
    if (r < 0 && !q->err)
        q->err = r;
    q->busy--;
    q->pending--;
    pthread_cond_broadcast(&q->room);
}

int hasher_create(struct blkhash *bh, unsigned workers, size_t job_cap,
                  size_t max_bytes, struct hasher **out)
{
    struct hasher *q = calloc(1, sizeof *q);

    *out = NULL;
    if (!q) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    q->bh = bh;
    q->max_bytes = max_bytes;
    q->job_cap = job_cap;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->room, NULL);
    q->pool = workers_get(workers ? workers : 1);
    if (!q->pool || workers_count(q->pool) == 0) {
        verify_err("cannot start hasher threads");
        hasher_free(q);
        return -EAGAIN;
    }
    *out = q;
    return 0;
}

/* A job from the free list, or a new one; waits while the queue is full.
 * NULL (q->err set, or out of memory: logged) if there is none. */
static struct job *get_job(struct hasher *q)
{
    struct job *j = NULL;
    bool failed;

    {
        LOCK_FOR_SCOPE(&q->lock);
        while (q->bytes >= q->max_bytes && !q->err)
            pthread_cond_wait(&q->room, &q->lock);
        if (!q->err && (j = q->free) != NULL)
            q->free = j->next;
        failed = q->err != 0;
    }
    if (!j && !failed && !(j = malloc(sizeof *j + q->job_cap)))
        verify_err("out of memory");
    return j;
}

/* Posts a job filled by the caller; frees it if a worker has failed. */
static int enqueue(struct hasher *q, struct job *j)
{
    int r;

    {
        LOCK_FOR_SCOPE(&q->lock);
        if ((r = q->err) == 0) {
            q->bytes += q->job_cap;
            q->pending++;
        }
    }
    if (r == 0) {
        j->task.run = run_job;
        j->q = q;
        workers_post(q->pool, &j->task);
    } else {
        free(j);                         /* only after a failure */
    }
    return r;
}

static int no_job(struct hasher *q)
{
    int r;

    LOCK_FOR_SCOPE(&q->lock);
    r = q->err ? q->err : -ENOMEM;
    return r;
}

int hasher_submit(struct hasher *q, uint64_t off, const void *p, size_t len)
{
    struct job *j;

    assert(len <= q->job_cap);
    if (!(j = get_job(q)))
        return no_job(q);
    *j = (struct job) { .off = off, .len = len };
    memcpy(j->data, p, len);
    return enqueue(q, j);
}

int hasher_submit_read(struct hasher *q, uint64_t off, size_t len,
                       hasher_read_fn *read, void *ctx)
{
    struct job *j;

    assert(len <= q->job_cap && read);
    if (!(j = get_job(q)))
        return no_job(q);
    *j = (struct job) { .off = off, .len = len, .read = read, .ctx = ctx };
    return enqueue(q, j);
}

int hasher_drain(struct hasher *q)
{
    int r;

    LOCK_FOR_SCOPE(&q->lock);
    while (q->pending && !q->err)
        pthread_cond_wait(&q->room, &q->lock);
    r = q->err;                          /* logged by the worker */
    return r;
}

void hasher_free(struct hasher *q)
{
    if (!q)
        return;
    {
        LOCK_FOR_SCOPE(&q->lock);
        q->stop = true;                  /* after an error: drop the rest */
        while (q->pending)
            pthread_cond_wait(&q->room, &q->lock);
    }
    workers_put(q->pool);
    while (q->free) {
        struct job *j = q->free;
        q->free = j->next;
        free(j);
    }
    pthread_cond_destroy(&q->room);
    pthread_mutex_destroy(&q->lock);
    free(q);
}
