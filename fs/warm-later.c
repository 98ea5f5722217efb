/* fs/warm-later.c: the manifest's digests of a zero-copy write, made on
 * the hasher workers (warm.h, warm_record(): warm_later_record()).
 *
 * THE LATER DIGEST
 * A write that landed in pool buffers (a first pass: the manifest holds
 * nothing about its blocks) needs its whole blocks hashed only for the
 * record, not to decide anything.  Hashing them on the thread that
 * received the write put about 0.3 s per GiB on the copy's critical
 * path: cp waits for each write's answer.  So the receive thread only
 * notes each whole block as changed, its digest to come
 * (manifest_change_later(), with the pool generation read after the
 * commit, as before), takes one more hold on the pool buffers
 * (pool_hold_dup()) and posts a job to the process's hasher workers
 * (digest/workers.h); the write is answered at once.  The job hashes the
 * blocks, gives each digest to the manifest (manifest_resolve(): applied
 * only if the block was not changed again meanwhile; durable with the
 * first manifest_durable() after a flush covered the write's generation),
 * gives its holds back, and says it is done.  The inline digest takes the
 * same digests (digest/known.h, struct digest_later): it waits for the
 * job when it takes the write in, on its own thread, and hashes nothing
 * again, so every block is still hashed once.
 *
 * What stays true: an entry names bytes the write sent (hashed from the
 * very pool buffer the NBD write is sent from, held unchanged); it
 * becomes durable only once a flush covered the write; a block changed
 * again before its digest came keeps the newer change (the sequence
 * number); a block whose digest never comes (out of memory) stays
 * unknown and is sent again by the next pass.  Memory: the jobs hold
 * pool buffers, so the pool's own bound bounds them (a slow hasher
 * slows the writers, it does not grow anything).  warm_close() waits for
 * every job before it stores the manifest.  Without worker threads the
 * job runs on the receive thread, as before.
 */
#include "fs/warm-int.h"

#include <pthread.h>

#include "digest/workers.h"

struct later_job {
    struct workers_task task;     /* first: the task is the job */
    struct digest_later later;    /* what the inline digest waits for */
    struct warm *w;
    uint64_t gen;
    unsigned refs;                /* __atomic: the run, and each holder
                                   * of later (the writer, digest items) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;                    /* lock */
    size_t n;
    uint64_t b[MAX_BLOCKS], seq[MAX_BLOCKS];
    const unsigned char *mem[MAX_BLOCKS];
    unsigned nhold;
    void *hold[POOL_FILL_SEGS];
    unsigned char *copy;          /* blocks across two holds, or NULL */
};

#define JOB(l) ((struct later_job *) ((char *) (l) - \
                                      offsetof(struct later_job, later)))

static void job_get(struct digest_later *l)
{
    __atomic_add_fetch(&JOB(l)->refs, 1, __ATOMIC_RELAXED);
}

static void job_free(struct later_job *j)
{
    pthread_mutex_destroy(&j->lock);
    pthread_cond_destroy(&j->cond);
    free(j);
}

static void job_put(struct digest_later *l)
{
    struct later_job *j = JOB(l);
    if (__atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) == 0)
        job_free(j);
}

static void job_wait(struct digest_later *l)
{
    struct later_job *j = JOB(l);
    LOCK_FOR_SCOPE(&j->lock);
    while (!j->done)
        pthread_cond_wait(&j->cond, &j->lock);
}

static void job_run(struct workers_task *t)
{
    struct later_job *j = (struct later_job *) t;
    struct warm *w = j->w;
    unsigned char dg[MAX_BLOCKS][MF_DIGEST];

    if (w->later_delay_us)
        usleep(w->later_delay_us);    /* tests: a slow hasher */
    warm_hash_blocks(j->mem, j->n, dg);
    for (size_t i = 0; i < j->n; i++) {
        manifest_resolve(w->m, j->b[i], j->seq[i], MF_DATA, dg[i], j->gen);
        digest_known_add(&j->later.known, j->b[i], dg[i]);
    }
    for (unsigned i = 0; i < j->nhold; i++)
        pool_hold_release(j->hold[i]);
    free(j->copy);
    j->copy = NULL;
    {
        LOCK_FOR_SCOPE(&j->lock);
        j->done = true;
        pthread_cond_broadcast(&j->cond);
    }
    {
        LOCK_FOR_SCOPE(&w->jobs_lock);
        if (--w->jobs == 0)
            pthread_cond_broadcast(&w->jobs_cond);
    }
    job_put(&j->later);
}

/* Bytes [pos, pos+n) of a committed write, from its holds: in place if
 * one hold has them all, else copied into tmp (NULL: none, and NULL is
 * returned). */
static const unsigned char *from_holds(const struct pool_fill *f,
                                       uint64_t pos, size_t n,
                                       unsigned char *tmp)
{
    size_t done = 0;
    for (unsigned i = 0; i < f->nhold && done < n; i++) {
        const struct pool_hold *h = &f->hold[i];
        uint64_t at = pos + done;
        if (at < h->off || at >= h->off + h->len)
            continue;
        size_t k = (size_t) (h->off + h->len - at);
        if (k > n - done)
            k = n - done;
        if (done == 0 && k == n)
            return (const unsigned char *) h->mem + (at - h->off);
        if (!tmp)
            return NULL;
        memcpy(tmp + done, (const char *) h->mem + (at - h->off), k);
        done += k;
    }
    return done == n ? tmp : NULL;
}

void warm_later_init(struct warm *w)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    /* NBDFERRY_DEBUG_LATER_DELAY_US: each job this much slower, so that
     * tests can show the bytes stay held and the digest waits. */
    const char *delay = getenv("NBDFERRY_DEBUG_LATER_DELAY_US");
    w->later_delay_us = delay ? (unsigned) strtoul(delay, NULL, 10) : 0;
    pthread_mutex_init(&w->jobs_lock, NULL);
    pthread_cond_init(&w->jobs_cond, NULL);
    /* The inline digest's hashers take one per CPU beside its thread:
     * the same pool, so no more threads than that. */
    w->workers = workers_get(cpus > 1 ? (unsigned) cpus - 1 : 1);
}

void warm_later_fini(struct warm *w)
{
    {
        LOCK_FOR_SCOPE(&w->jobs_lock);
        while (w->jobs)
            pthread_cond_wait(&w->jobs_cond, &w->jobs_lock);
    }
    workers_put(w->workers);
    w->workers = NULL;
    /* Digests that came after the last flush covered their writes. */
    manifest_durable(w->m, 0);
    pthread_mutex_destroy(&w->jobs_lock);
    pthread_cond_destroy(&w->jobs_cond);
}

struct digest_later *warm_later_record(struct fs_disk *d, struct warm *w,
                                       uint64_t off, uint64_t len,
                                       const struct pool_fill *f)
{
    uint64_t gen = pool_gen(d->pool), end = off + len;
    struct later_job *j = calloc(1, sizeof *j);
    size_t ncopy = 0;

    /* A block across two holds is copied: at most one per boundary. */
    if (j && f->nhold > 1)
        j->copy = malloc((size_t) (f->nhold - 1) * BS);
    for (uint64_t b = off / BS; b * BS < end; b++) {
        bool whole = b * BS >= off && (b + 1) * BS <= end;
        unsigned char *slot = j && j->copy && ncopy + 1 < f->nhold
            ? j->copy + ncopy * BS : NULL;
        const unsigned char *p = whole && j && j->n < MAX_BLOCKS
            ? from_holds(f, b * BS, BS, slot) : NULL;
        if (p && p == slot)
            ncopy++;
        if (p && is_zero(p, BS)) {
            manifest_change(w->m, b, MF_ZERO, NULL, gen);
        } else if (p) {
            uint64_t seq = manifest_change_later(w->m, b, gen);
            if (seq) {
                j->b[j->n] = b;
                j->seq[j->n] = seq;
                j->mem[j->n++] = p;
            }
        } else {
            manifest_change(w->m, b, MF_NONE, NULL, gen);
        }
    }
    if (!j)
        return NULL;
    if (j->n == 0) {
        free(j->copy);
        free(j);
        return NULL;
    }
    j->task.run = job_run;
    j->later = (struct digest_later) { .wait = job_wait, .get = job_get,
                                       .put = job_put };
    j->w = w;
    j->gen = gen;
    j->refs = 2;                  /* the run, and the writer's */
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->cond, NULL);
    for (unsigned i = 0; i < f->nhold; i++) {
        pool_hold_dup(f->hold[i].ref);
        j->hold[j->nhold++] = f->hold[i].ref;
    }
    {
        LOCK_FOR_SCOPE(&w->jobs_lock);
        w->jobs++;
    }
    if (w->workers && workers_count(w->workers) > 0)
        workers_post(w->workers, &j->task);
    else
        job_run(&j->task);        /* no thread to give it to */
    return &j->later;
}
