/* tests/unit/test-pool-aread.c: reads started without waiting
 * (pool_read_start), over the scripted transport in fake-nbdx.c.
 *
 * The promise under test: a started read never passes an earlier
 * overlapping write or zero (it is refused while one is unanswered, and
 * filling buffers it overlaps are sent), ranges known zero cost no
 * request, a range partly pending zero is refused, and pool_destroy()
 * waits for started reads.  Every test checks the bytes read.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake-nbdx.h"
#include "transport/pool.h"

#define K 1024u
#define DISK (4096 * K)

/* The server: a zeroed disk whose replies flow, oldest first. */
static struct nbdx *open_disk(uint64_t size)
{
    struct nbdx *x = fake_open(size, true, 0);
    memset(fake_disk(x), 0, size);
    fake_set_auto(x, FAKE_FIFO, 0);
    return x;
}

struct waiter {
    struct pool_aread a;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int err;
};

static void landed(struct pool_aread *a, int err)
{
    struct waiter *w = a->opaque;
    pthread_mutex_lock(&w->lock);
    w->done = true;
    w->err = err;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static void waiter_init(struct waiter *w, uint64_t off, size_t len)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->a = (struct pool_aread) { .off = off, .len = len,
                                 .buf = malloc(len), .done = landed,
                                 .opaque = w };
    memset(w->a.buf, 0xEE, len);
}

static void waiter_wait(struct waiter *w)
{
    pthread_mutex_lock(&w->lock);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
    assert(w->err == 0);
}

static bool done_yet(struct waiter *w)
{
    pthread_mutex_lock(&w->lock);
    bool d = w->done;
    pthread_mutex_unlock(&w->lock);
    return d;
}

static struct pool *make_pool(struct nbdx *x, bool dest_zero)
{
    struct pool_config cfg = { .request_size = 256 * K,
                               .pool_size = 2048 * K, .depth = 8,
                               .idle_ms = 1000,
                               .destination_is_zero = dest_zero };
    struct pool *p;
    int r = pool_create(&cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
}

static void write_byte(struct pool *p, uint64_t off, size_t len,
                       unsigned char c)
{
    unsigned char *b = malloc(len);
    memset(b, c, len);
    assert(pool_write(p, off, b, len) == (ssize_t) len);
    free(b);
}

static bool all(const void *buf, size_t len, unsigned char c)
{
    const unsigned char *b = buf;
    for (size_t i = 0; i < len; i++)
        if (b[i] != c)
            return false;
    return true;
}

/* A read of acknowledged data lands with the data. */
static void test_reads_written_data(void)
{
    struct nbdx *x = open_disk(DISK);
    struct pool *p = make_pool(x, false);
    write_byte(p, 0, 512 * K, 0x11);
    pool_drain(p);

    struct waiter w;
    waiter_init(&w, 100 * K, 300 * K);
    assert(pool_read_start(p, &w.a) == 0);
    waiter_wait(&w);
    assert(all(w.a.buf, 300 * K, 0x11));
    pool_destroy(p);
    fake_close(x);
    free(w.a.buf);
}

/* An unanswered overlapping write refuses the read (a filling one is
 * sent first); a read elsewhere goes ahead. */
static void test_never_passes_a_write(void)
{
    struct nbdx *x = open_disk(DISK);
    struct pool *p = make_pool(x, false);
    fake_set_auto(x, FAKE_MANUAL, 0);
    write_byte(p, 0, 64 * K, 0x22);            /* FILLING, not sent */

    struct waiter w;
    waiter_init(&w, 32 * K, 64 * K);
    assert(pool_read_start(p, &w.a) == -EAGAIN);
    assert(fake_in_flight(x) == 1);            /* the refusal sent it */
    struct nbdx_op *wr = fake_wait_op(x, NBDX_OP_WRITE);
    assert(wr->off == 0 && wr->len == 64 * K);
    struct waiter far;
    waiter_init(&far, 1024 * K, 64 * K);
    assert(pool_read_start(p, &far.a) == 0);   /* replies held back */
    usleep(10000);
    assert(!done_yet(&far));

    fake_set_auto(x, FAKE_FIFO, 0);
    waiter_wait(&far);
    assert(all(far.a.buf, 64 * K, 0));
    pool_drain(p);                             /* the write was sealed */
    assert(all(fake_disk(x), 64 * K, 0x22));
    assert(pool_read_start(p, &w.a) == 0);
    waiter_wait(&w);
    assert(all(w.a.buf, 32 * K, 0x22) &&
           all((char *) w.a.buf + 32 * K, 32 * K, 0));
    pool_destroy(p);
    fake_close(x);
    free(w.a.buf);
    free(far.a.buf);
}

/* Known zero: filled at once, no request.  Partly pending zero: refused.
 * Entirely pending zero: zero at once. */
static void test_zero_ranges(void)
{
    struct nbdx *x = open_disk(DISK);
    struct pool *p = make_pool(x, true);      /* all known zero */
    struct waiter w;
    waiter_init(&w, 0, 128 * K);
    fake_set_auto(x, FAKE_MANUAL, 0);         /* no reply could come */
    assert(pool_read_start(p, &w.a) == 1);
    assert(all(w.a.buf, 128 * K, 0));
    fake_set_auto(x, FAKE_FIFO, 0);

    write_byte(p, 512 * K, 256 * K, 0x33);
    pool_drain(p);
    assert(pool_zero_lazy(p, 640 * K, 512 * K) == 0);  /* pending zero */
    struct waiter part;
    waiter_init(&part, 512 * K, 256 * K);
    assert(pool_read_start(p, &part.a) == -EAGAIN);
    struct waiter inside;
    waiter_init(&inside, 640 * K, 64 * K);
    assert(pool_read_start(p, &inside.a) == 1);
    assert(all(inside.a.buf, 64 * K, 0));
    pool_destroy(p);
    fake_close(x);
    free(w.a.buf);
    free(part.a.buf);
    free(inside.a.buf);
}

static void *destroyer(void *arg)
{
    pool_destroy(arg);
    return NULL;
}

/* pool_destroy() returns only after every started read's done(). */
static void test_destroy_waits_for_reads(void)
{
    struct nbdx *x = open_disk(DISK);
    struct pool *p = make_pool(x, false);
    write_byte(p, 0, 256 * K, 0x44);
    pool_drain(p);
    fake_set_auto(x, FAKE_MANUAL, 0);
    struct waiter w;
    waiter_init(&w, 0, 256 * K);
    assert(pool_read_start(p, &w.a) == 0);
    pthread_t t;
    pthread_create(&t, NULL, destroyer, p);
    usleep(20000);
    assert(!done_yet(&w));
    fake_set_auto(x, FAKE_FIFO, 0);
    pthread_join(t, NULL);
    assert(done_yet(&w));
    assert(all(w.a.buf, 256 * K, 0x44));
    fake_close(x);
    free(w.a.buf);
}

int main(void)
{
    test_reads_written_data();
    test_never_passes_a_write();
    test_zero_ranges();
    test_destroy_waits_for_reads();
    printf("test-pool-aread: ok\n");
    return 0;
}
