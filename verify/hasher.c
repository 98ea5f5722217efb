/* verify/hasher.c: blkhash data blocks on worker threads.
 *
 * THREAD MODEL
 * One producer (the sink's thread: sink.c) copies runs of data blocks into
 * jobs and queues them, or queues read jobs that name a range and a read
 * function safe on any thread (a file's pread); 'workers' threads take
 * jobs, do the read if there is one, and call blkhash_update(), which is
 * safe from any thread.  So for a file the copy out of the page cache runs
 * on every core too, straight into the buffer the worker hashes.  q->lock protects the
 * queue, the byte count, 'busy', 'err' and 'stop'; the producer waits on
 * q->room while the queue holds max_bytes or more (memory bound), workers
 * wait on q->work.  The producer waits on q->room in hasher_drain() too,
 * until the queue is empty and no worker is busy.  No lock is held while
 * hashing or copying.  Hashed jobs go to a free list and are reused: a
 * fresh 1 MiB malloc is an mmap, and faulting its pages in again for every
 * job costs more system time than the copy itself.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/cleanup.h"
#include "common/list.h"
#include "verify/sink.h"

struct job {
    struct job *next;
    uint64_t off;
    size_t len;
    hasher_read_fn *read;                /* NULL: data[] holds the bytes */
    void *ctx;                           /* read's first argument */
    unsigned char data[];
};

struct hasher {
    struct blkhash *bh;                  /* borrowed */
    pthread_mutex_t lock;
    pthread_cond_t work, room;
    struct job *head, *tail;             /* FIFO */
    struct job *free;                    /* hashed jobs, for reuse */
    size_t job_cap;                      /* data bytes per job */
    size_t bytes, max_bytes;             /* queued jobs * job_cap, bound */
    unsigned busy;                       /* workers hashing a job */
    int err;                             /* first failure, sticky */
    bool stop;
    unsigned nthreads;
    pthread_t threads[];
};

static struct job *take_locked(struct hasher *q)
{
    struct job *j = q->head;

    q->head = j->next;
    if (!q->head)
        q->tail = NULL;
    q->bytes -= q->job_cap;              /* a short job holds as much */
    q->busy++;
    return j;
}

static void *worker(void *arg)
{
    struct hasher *q = arg;

    LOCK_FOR_SCOPE(&q->lock);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->work, &q->lock);
        if (!q->head)
            break;                       /* stop, and nothing left */
        struct job *j = take_locked(q);
        pthread_mutex_unlock(&q->lock);
        int r = j->read ? j->read(j->ctx, j->data, j->len, j->off) : 0;
        if (r == 0 && (r = blkhash_update(q->bh, j->off, j->data,
                                          j->len)) < 0)
            verify_err("blkhash: %s", strerror(-r));   /* read() logs */
        pthread_mutex_lock(&q->lock);
        j->next = q->free;
        q->free = j;
        if (r < 0 && !q->err)
            q->err = r;
        q->busy--;
        pthread_cond_broadcast(&q->room);
    }
    return NULL;
}

int hasher_create(struct blkhash *bh, unsigned workers, size_t job_cap,
                  size_t max_bytes, struct hasher **out)
{
    struct hasher *q = calloc(1, sizeof *q + workers * sizeof(pthread_t));

    *out = NULL;
    if (!q) {
        verify_err("out of memory");
        return -ENOMEM;
    }
    q->bh = bh;
    q->max_bytes = max_bytes;
    q->job_cap = job_cap;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->room, NULL);
    for (; q->nthreads < workers; q->nthreads++) {
        int err = pthread_create(&q->threads[q->nthreads], NULL, worker, q);
        if (err) {
            verify_err("pthread_create: %s", strerror(err));
            hasher_free(q);
            return -err;
        }
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

/* Queues a job filled by the caller; frees it if a worker has failed. */
static int enqueue(struct hasher *q, struct job *j)
{
    int r;

    {
        LOCK_FOR_SCOPE(&q->lock);
        if ((r = q->err) == 0) {
            QUEUE_APPEND(q->head, q->tail, j);
            q->bytes += q->job_cap;
            pthread_cond_signal(&q->work);
            j = NULL;
        }
    }
    free(j);                             /* only after a failure */
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
    while ((q->head || q->busy) && !q->err)
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
        q->stop = true;
        while (q->head) {                /* after an error: drop the rest */
            struct job *j = q->head;
            q->head = j->next;
            free(j);
        }
        q->tail = NULL;
        pthread_cond_broadcast(&q->work);
    }
    for (unsigned i = 0; i < q->nthreads; i++)
        pthread_join(q->threads[i], NULL);
    while (q->free) {
        struct job *j = q->free;
        q->free = j->next;
        free(j);
    }
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->room);
    pthread_mutex_destroy(&q->lock);
    free(q);
}
