/* tests/unit/fake-nbdx.c: see fake-nbdx.h.
 *
 * THREAD MODEL
 * The pool submits with its own lock held: nbdx_submit() only queues,
 * under x->lock (a leaf).  Ops complete on the test's thread
 * (fake_complete) or on the auto-completer thread; either applies the
 * op under x->lock, drops it, then calls done(), as nbdx's I/O threads
 * do.  The auto-completer sleeps (the delay) without x->lock.
 */
#undef NDEBUG
#include "fake-nbdx.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct pending_op {
    struct nbdx_op *op;
    uint64_t sum;                 /* WRITE: of the buffer at submission */
    struct pending_op *next;
};

struct nbdx {
    struct nbdx_info info;
    unsigned char *disk;
    pthread_mutex_t lock;
    pthread_cond_t cond;          /* an op arrived or completed */
    struct pending_op *head;      /* in flight, oldest first */
    unsigned n;
    enum fake_auto mode;
    uint32_t rng;
    bool stopping;
    pthread_t auto_thread;
    bool auto_started;
    bool auto_busy;               /* completing an op, done() included */
    unsigned delay_us;            /* before each automatic reply */
    struct fake_counts counts;
    uint64_t reconnects;          /* fake_reconnect(); __atomic builtins */
};

volatile bool fake_fail_alloc;

/* ---- allocation failure injection ----------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);

void *__wrap_realloc(void *p, size_t n)
{
    return fake_fail_alloc ? NULL : __real_realloc(p, n);
}

void *__wrap_malloc(size_t n)
{
    return fake_fail_alloc ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return fake_fail_alloc ? NULL : __real_calloc(n, m);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    return fake_fail_alloc ? ENOMEM : __real_posix_memalign(p, a, n);
}

/* ---- sleepers -------------------------------------------------------- */

static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond = PTHREAD_COND_INITIALIZER;
static struct { char what[16]; unsigned count; } sleepers[8];

struct pool;
void pool_test_before_wait(struct pool *p, const char *what);

void pool_test_before_wait(struct pool *p, const char *what)
{
    pthread_mutex_lock(&sleep_lock);
    for (unsigned i = 0; i < 8; i++) {
        if (!sleepers[i].what[0])
            snprintf(sleepers[i].what, sizeof sleepers[i].what, "%s", what);
        if (strcmp(sleepers[i].what, what) == 0) {
            sleepers[i].count++;
            break;
        }
    }
    pthread_cond_broadcast(&sleep_cond);
    pthread_mutex_unlock(&sleep_lock);
}

static unsigned sleeper_count(const char *what)
{
    for (unsigned i = 0; i < 8; i++)
        if (strcmp(sleepers[i].what, what) == 0)
            return sleepers[i].count;
    return 0;
}

void fake_wait_sleeper(const char *what, unsigned count)
{
    pthread_mutex_lock(&sleep_lock);
    while (sleeper_count(what) < count)
        pthread_cond_wait(&sleep_cond, &sleep_lock);
    pthread_mutex_unlock(&sleep_lock);
}

void fake_reset_sleepers(void)
{
    pthread_mutex_lock(&sleep_lock);
    memset(sleepers, 0, sizeof sleepers);
    pthread_mutex_unlock(&sleep_lock);
}

/* ---- the transport ---------------------------------------------------- */

static uint64_t checksum(const void *buf, uint64_t len)
{
    const unsigned char *b = buf;
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static bool changes_disk(const struct nbdx_op *op)
{
    return op->kind == NBDX_OP_WRITE || op->kind == NBDX_OP_ZERO;
}

const struct nbdx_info *nbdx_info(const struct nbdx *x) { return &x->info; }

uint64_t nbdx_reconnects(const struct nbdx *x)
{
    return __atomic_load_n(&x->reconnects, __ATOMIC_SEQ_CST);
}

void fake_reconnect(struct nbdx *x)
{
    __atomic_add_fetch(&x->reconnects, 1, __ATOMIC_SEQ_CST);
}
/* The fake never loses its server for good: nothing to heal, and a pool
 * that latched a loss stays lost (EIO), as a mount in a mode that cannot
 * reconnect does. */
int nbdx_heal(struct nbdx *x) { (void) x; return -EIO; }
/* The fake never gives up on its server: a loss is the pool's latch
 * (p->lost), which the scripted failures set. */
bool nbdx_lost(struct nbdx *x) { (void) x; return false; }
/* Only the block status scan calls it, and the fake offers no block
 * status. */
void nbdx_abandon(struct nbdx *x) { (void) x; }

void nbdx_submit(struct nbdx *x, struct nbdx_op *op)
{
    struct pending_op *p = __real_calloc(1, sizeof *p);   /* never fails */

    assert(p);
    pthread_mutex_lock(&x->lock);
    assert(op->off + op->len <= x->info.size);
    if (changes_disk(op))
        for (struct pending_op *q = x->head; q; q = q->next)
            if (changes_disk(q->op) && op->off < q->op->off + q->op->len &&
                q->op->off < op->off + op->len) {
                fprintf(stderr, "fake-nbdx: overlapping requests in flight: "
                        "%llu+%llu and %llu+%llu\n",
                        (unsigned long long) op->off,
                        (unsigned long long) op->len,
                        (unsigned long long) q->op->off,
                        (unsigned long long) q->op->len);
                abort();
            }
    p->op = op;
    if (op->kind == NBDX_OP_WRITE)
        p->sum = checksum(op->buf, op->len);
    struct pending_op **tail = &x->head;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    x->n++;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
}

/* nbdx_run() is transport/nbdx-run.c's, over nbdx_submit() above. */

struct nbdx_op *fake_wait_op(struct nbdx *x, int kind)
{
    pthread_mutex_lock(&x->lock);
    for (;;) {
        for (struct pending_op *p = x->head; p; p = p->next)
            if (kind < 0 || (int) p->op->kind == kind) {
                struct nbdx_op *op = p->op;
                pthread_mutex_unlock(&x->lock);
                return op;
            }
        pthread_cond_wait(&x->cond, &x->lock);
    }
}

unsigned fake_in_flight(struct nbdx *x)
{
    pthread_mutex_lock(&x->lock);
    unsigned n = x->n;
    pthread_mutex_unlock(&x->lock);
    return n;
}

void fake_complete(struct nbdx *x, struct nbdx_op *op, int err)
{
    pthread_mutex_lock(&x->lock);
    struct pending_op **pp = &x->head, *p;
    while ((p = *pp) && p->op != op)
        pp = &p->next;
    assert(p);                    /* completing what is in flight */
    *pp = p->next;
    x->n--;
    if (op->kind == NBDX_OP_WRITE && p->sum != checksum(op->buf, op->len)) {
        fprintf(stderr, "fake-nbdx: write buffer %llu+%llu changed while "
                "in flight\n", (unsigned long long) op->off,
                (unsigned long long) op->len);
        abort();
    }
    if (!err) {
        if (op->kind == NBDX_OP_WRITE) {
            memcpy(x->disk + op->off, op->buf, op->len);
            x->counts.writes++;
            x->counts.write_bytes += op->len;
        } else if (op->kind == NBDX_OP_ZERO) {
            memset(x->disk + op->off, 0, op->len);
            x->counts.zeroes++;
            x->counts.zero_bytes += op->len;
        } else if (op->kind == NBDX_OP_READ)
            memcpy(op->buf, x->disk + op->off, op->len);
    }
    free(p);
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
    op->done(op, err);            /* as nbdx: outside every lock */
}

void fake_complete_all(struct nbdx *x)
{
    for (;;) {
        pthread_mutex_lock(&x->lock);
        struct nbdx_op *op = x->head ? x->head->op : NULL;
        pthread_mutex_unlock(&x->lock);
        if (!op)
            return;
        fake_complete(x, op, 0);
    }
}

static void *auto_thread(void *arg)
{
    struct nbdx *x = arg;
    bool delayed = false;         /* the wait before the next reply is over */

    pthread_mutex_lock(&x->lock);
    while (!x->stopping) {
        if (!x->head || x->mode == FAKE_MANUAL) {
            pthread_cond_wait(&x->cond, &x->lock);
            continue;
        }
        if (x->delay_us && !delayed) {
            unsigned us = x->delay_us;
            pthread_mutex_unlock(&x->lock);
            usleep(us);           /* the op stays in flight meanwhile */
            pthread_mutex_lock(&x->lock);
            delayed = true;
            continue;             /* look again: the mode may have changed */
        }
        delayed = false;
        struct pending_op *p = x->head;
        if (x->mode == FAKE_RANDOM) {
            x->rng = x->rng * 1103515245u + 12345u;
            for (unsigned k = (x->rng >> 16) % x->n; k > 0; k--)
                p = p->next;
        }
        struct nbdx_op *op = p->op;
        x->auto_busy = true;
        pthread_mutex_unlock(&x->lock);
        fake_complete(x, op, 0);
        pthread_mutex_lock(&x->lock);
        x->auto_busy = false;
        pthread_cond_broadcast(&x->cond);     /* for fake_quiesce() */
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

void fake_set_auto(struct nbdx *x, enum fake_auto mode, uint32_t seed)
{
    pthread_mutex_lock(&x->lock);
    x->mode = mode;
    x->rng = seed;
    if (!x->auto_started) {
        x->auto_started = true;
        pthread_create(&x->auto_thread, NULL, auto_thread, x);
    }
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
}

void fake_set_delay(struct nbdx *x, unsigned us)
{
    pthread_mutex_lock(&x->lock);
    x->delay_us = us;
    pthread_mutex_unlock(&x->lock);
}

void fake_quiesce(struct nbdx *x, struct fake_counts *out)
{
    pthread_mutex_lock(&x->lock);
    while (x->auto_busy ||
           (x->head && x->auto_started && x->mode != FAKE_MANUAL))
        pthread_cond_wait(&x->cond, &x->lock);
    if (out)
        *out = x->counts;
    pthread_mutex_unlock(&x->lock);
}

struct nbdx *fake_open(uint64_t size, bool can_zero, unsigned depth_hint)
{
    struct nbdx *x = __real_calloc(1, sizeof *x);
    assert(x);
    x->info = (struct nbdx_info){ .size = size, .can_flush = true,
                                  .can_zero = can_zero, .connections = 1 };
    x->disk = __real_malloc(size);
    assert(x->disk);
    memset(x->disk, 0xAA, size);  /* old data everywhere */
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->cond, NULL);
    (void) depth_hint;
    return x;
}

unsigned char *fake_disk(struct nbdx *x) { return x->disk; }

void fake_close(struct nbdx *x)
{
    pthread_mutex_lock(&x->lock);
    x->stopping = true;
    pthread_cond_broadcast(&x->cond);
    pthread_mutex_unlock(&x->lock);
    if (x->auto_started)
        pthread_join(x->auto_thread, NULL);
    assert(!x->head);
    free(x->disk);
    free(x);
}
