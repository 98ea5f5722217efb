/* tests/unit/test-pool-fill.c: zero-copy writes into the pool
 * (pool_fill_begin/commit) and buffer ownership under holds, over the
 * scripted transport in fake-nbdx.c, which also checks that no
 * overlapping writes or zeroes are in flight together and that no write
 * buffer changes before its reply.
 *
 * The promise under test: a buffer belongs to its NBD request until the
 * reply and to each hold until released; a reservation is never sent
 * before it is filled, and undoing one leaves no trace.  Every test
 * checks the bytes that reached the disk.
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
#include "pool-pattern.h"
#include "common/iszero.h"
#include "transport/pool.h"

#define K 1024u

/* The server: a zeroed disk whose replies flow, oldest first. */
static struct nbdx *open_disk(uint64_t size)
{
    struct nbdx *x = fake_open(size, true, 0);
    memset(fake_disk(x), 0, size);
    fake_set_auto(x, FAKE_FIFO, 0);
    return x;
}

static struct pool *make_pool(struct nbdx *x, size_t request, size_t total)
{
    struct pool_config cfg = { .request_size = request, .pool_size = total,
                               .depth = 8, .idle_ms = 1000 };
    struct pool *p;
    int r = pool_create(&cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
}

/* Reserve, fill from src (the write's bytes), commit. */
static ssize_t fill_from(struct pool *p, uint64_t off, const unsigned char *src,
                         size_t len, bool hold, struct pool_fill *f)
{
    int r = pool_fill_begin(p, off, len, f);
    if (r < 0)
        return r;
    size_t pos = 0;
    for (unsigned i = 0; i < f->nseg; pos += f->seg[i++].len)
        memcpy(f->seg[i].mem, src + pos, f->seg[i].len);
    assert(pos == len);
    return pool_fill_commit(p, f, 0, hold);
}

static ssize_t fill(struct pool *p, uint64_t off, size_t len, unsigned seed,
                    bool hold, struct pool_fill *f)
{
    unsigned char *src = malloc(len);
    fill_pattern(src, off, len, seed);
    ssize_t r = fill_from(p, off, src, len, hold, f);
    free(src);
    return r;
}

static ssize_t write_pattern(struct pool *p, uint64_t off, size_t len,
                             unsigned seed)
{
    unsigned char *src = malloc(len);
    fill_pattern(src, off, len, seed);
    ssize_t r = pool_write(p, off, src, len);
    free(src);
    return r;
}

/* A held buffer is not reused after its reply: later writes that need
 * buffers take the other one, and the held bytes stay as written. */
static void test_hold_outlives_reply(void)
{
    struct nbdx *x = open_disk(1u << 20);
    struct pool *p = make_pool(x, 64 * K, 128 * K);   /* two buffers */
    struct pool_fill f;

    assert(fill(p, 0, 64 * K, 1, true, &f) == 64 * K);
    assert(f.nhold == 1 && f.hold[0].off == 0 && f.hold[0].len == 64 * K);
    pool_drain(p);                                    /* acknowledged */
    for (unsigned i = 1; i <= 3; i++) {
        assert(write_pattern(p, i * 64 * K, 64 * K, 10 + i) == 64 * K);
        pool_drain(p);
    }
    assert(has_pattern(f.hold[0].mem, 0, 64 * K, 1));
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 64 * K, 1));
    for (unsigned i = 1; i <= 3; i++)
        assert(has_pattern(d + i * 64 * K, i * 64 * K, 64 * K, 10 + i));
    pool_hold_release(f.hold[0].ref);
    assert(write_pattern(p, 0, 64 * K, 20) == 64 * K);  /* buffers work */
    pool_drain(p);
    assert(has_pattern(d, 0, 64 * K, 20));
    pool_destroy(p);
    fake_close(x);
}

struct blocked_writer {
    struct pool *p;
    atomic_bool done;
    ssize_t r;
};

static void *blocked_writer(void *arg)
{
    struct blocked_writer *w = arg;
    w->r = write_pattern(w->p, 128 * K, 64 * K, 9);
    atomic_store(&w->done, true);
    return NULL;
}

/* Every buffer held: a writer waits for a release (never -ENOMEM, never
 * a held buffer), then proceeds. */
static void test_writer_waits_for_release(void)
{
    struct nbdx *x = open_disk(1u << 20);
    struct pool *p = make_pool(x, 64 * K, 128 * K);
    struct pool_fill f1, f2;
    struct blocked_writer w = { .p = p };
    pthread_t t;

    assert(fill(p, 0, 64 * K, 1, true, &f1) == 64 * K);
    assert(fill(p, 64 * K, 64 * K, 2, true, &f2) == 64 * K);
    pool_drain(p);
    assert(pthread_create(&t, NULL, blocked_writer, &w) == 0);
    usleep(200 * 1000);           /* room to misbehave, not a timing check */
    assert(!atomic_load(&w.done));
    assert(has_pattern(f1.hold[0].mem, 0, 64 * K, 1));
    assert(has_pattern(f2.hold[0].mem, 64 * K, 64 * K, 2));
    pool_hold_release(f1.hold[0].ref);
    pthread_join(t, NULL);
    assert(w.r == 64 * K);
    pool_drain(p);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 64 * K, 1));
    assert(has_pattern(d + 64 * K, 64 * K, 64 * K, 2));
    assert(has_pattern(d + 128 * K, 128 * K, 64 * K, 9));
    assert(has_pattern(f2.hold[0].mem, 64 * K, 64 * K, 2));
    pool_hold_release(f2.hold[0].ref);
    pool_destroy(p);
    fake_close(x);
}

/* A failed fill is undone: nothing of it reaches the disk or the
 * counters, and the same tail can be reserved again. */
static void test_failed_fill_is_undone(void)
{
    struct nbdx *x = open_disk(1u << 20);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_fill f;
    struct pool_stats st;
    struct fake_counts c;

    assert(write_pattern(p, 0, 16 * K, 1) == 16 * K);
    assert(pool_fill_begin(p, 16 * K, 16 * K, &f) == 0);
    assert(f.nseg == 1);
    void *tail = f.seg[0].mem;
    memset(tail, 0xee, 16 * K);
    assert(pool_fill_commit(p, &f, -EIO, true) == -EIO);
    assert(f.nhold == 0);
    assert(pool_fill_begin(p, 16 * K, 16 * K, &f) == 0);
    assert(f.nseg == 1 && f.seg[0].mem == tail);   /* same buffer, tail */
    fill_pattern(f.seg[0].mem, 16 * K, 16 * K, 2);
    assert(pool_fill_commit(p, &f, 0, false) == 16 * K);
    /* A new buffer reserved and given up. */
    assert(pool_fill_begin(p, 512 * K, 64 * K, &f) == 0);
    memset(f.seg[0].mem, 0xee, 64 * K);
    assert(pool_fill_commit(p, &f, -EINTR, false) == -EINTR);
    pool_drain(p);
    fake_quiesce(x, &c);
    pool_get_stats(p, &st);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 16 * K, 1));
    assert(has_pattern(d + 16 * K, 16 * K, 16 * K, 2));
    assert(is_zero(d + 32 * K, (1u << 20) - 32 * K));
    assert(st.bytes_written == 32 * K && st.bytes_acked == 32 * K);
    assert(c.writes == 1 && c.write_bytes == 32 * K);
    pool_destroy(p);
    fake_close(x);
}

/* A reserved buffer is not sent before it is filled, even when full
 * (sealed) and even when a drain wants it. */
static void test_not_sent_before_commit(void)
{
    struct nbdx *x = open_disk(1u << 20);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_fill f;
    struct fake_counts c;

    assert(pool_fill_begin(p, 0, 64 * K, &f) == 0);
    assert(write_pattern(p, 64 * K, 64 * K, 3) == 64 * K);  /* others go */
    fake_quiesce(x, &c);
    assert(c.writes == 1);
    fill_pattern(f.seg[0].mem, 0, 64 * K, 4);
    assert(pool_fill_commit(p, &f, 0, false) == 64 * K);
    pool_drain(p);
    fake_quiesce(x, &c);
    assert(c.writes == 2);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 64 * K, 4));
    assert(has_pattern(d + 64 * K, 64 * K, 64 * K, 3));
    pool_destroy(p);
    fake_close(x);
}

/* Zero chunks in a filled write still become write-zeroes; the hold is
 * then a private copy of the whole write. */
static void test_zero_chunks_become_write_zeroes(void)
{
    struct nbdx *x = open_disk(1u << 20);
    struct pool *p = make_pool(x, 256 * K, 512 * K);
    struct pool_fill f;
    struct fake_counts c;
    unsigned char *src = malloc(192 * K);

    memset(fake_disk(x), 0xaa, 1u << 20);  /* not zero */
    fill_pattern(src, 0, 192 * K, 5);
    memset(src + 64 * K, 0, 64 * K);
    assert(fill_from(p, 0, src, 192 * K, true, &f) == 192 * K);
    assert(f.nhold == 1 && f.hold[0].len == 192 * K);
    assert(memcmp(f.hold[0].mem, src, 192 * K) == 0);
    pool_drain(p);
    fake_quiesce(x, &c);
    assert(memcmp(fake_disk(x), src, 192 * K) == 0);
    assert(c.zero_bytes == 64 * K && c.write_bytes == 128 * K);
    pool_hold_release(f.hold[0].ref);
    free(src);
    pool_destroy(p);
    fake_close(x);
}

/* A buffer trimmed below its held bytes (a zero chunk straddling two
 * writes goes as write-zeroes) takes no new write over them: the holder
 * still reads them. */
static void test_no_write_over_held_bytes(void)
{
    struct nbdx *x = open_disk(1u << 20);
    struct pool *p = make_pool(x, 256 * K, 512 * K);
    struct pool_fill f1, f2;
    unsigned char *src = malloc(96 * K), zeros[32 * K] = { 0 };

    fill_pattern(src, 0, 64 * K, 1);
    memset(src + 64 * K, 0, 32 * K);              /* a chunk's first half */
    assert(fill_from(p, 0, src, 96 * K, true, &f1) == 96 * K);
    assert(f1.nhold == 1);
    assert(pool_write(p, 96 * K, zeros, 32 * K) == 32 * K);  /* its rest */
    assert(fill(p, 64 * K, 32 * K, 2, false, &f2) == 32 * K);
    assert(memcmp(f1.hold[0].mem, src, 96 * K) == 0);
    pool_drain(p);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 64 * K, 1));
    assert(has_pattern(d + 64 * K, 64 * K, 32 * K, 2));
    assert(is_zero(d + 96 * K, 32 * K));
    pool_hold_release(f1.hold[0].ref);
    free(src);
    pool_destroy(p);
    fake_close(x);
}

/* Many writers, a slow transport answering out of order and a slow
 * "digest" that checks every held byte before releasing it: a buffer
 * reused early shows up as a held byte that changed, a buffer filled
 * after it was sent as the fake's "changed while in flight". */
#define STRESS_REGION (2u << 20)
#define STRESS_HOLDS 4096

struct stress {
    struct pool *p;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct pool_hold q[STRESS_HOLDS];
    unsigned head, tail, writers_left;
    atomic_uint bad, fallbacks;
};

static void stress_push(struct stress *s, const struct pool_fill *f)
{
    pthread_mutex_lock(&s->lock);
    for (unsigned i = 0; i < f->nhold; i++) {
        assert(s->tail - s->head < STRESS_HOLDS);
        s->q[s->tail++ % STRESS_HOLDS] = f->hold[i];
    }
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void *stress_writer(void *arg)
{
    struct stress *s = arg;
    static atomic_uint next_id;
    unsigned id = atomic_fetch_add(&next_id, 1);
    uint64_t off = (uint64_t) id * STRESS_REGION;
    unsigned n = 0;

    while (off < (uint64_t) (id + 1) * STRESS_REGION) {
        size_t len = (12 + 8 * (n++ % 7)) * K;  /* straddles buffers */
        if (off + len > (uint64_t) (id + 1) * STRESS_REGION)
            len = (size_t) ((id + 1) * STRESS_REGION - off);
        struct pool_fill f;
        ssize_t r = fill(s->p, off, len, 7, true, &f);
        if (r == -EAGAIN) {
            atomic_fetch_add(&s->fallbacks, 1);
            r = write_pattern(s->p, off, len, 7);
            f.nhold = 0;
        }
        assert(r == (ssize_t) len);
        stress_push(s, &f);
        off += len;
    }
    pthread_mutex_lock(&s->lock);
    s->writers_left--;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void *stress_digest(void *arg)
{
    struct stress *s = arg;

    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->head == s->tail && s->writers_left > 0)
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->head == s->tail)
            break;
        struct pool_hold h = s->q[s->head++ % STRESS_HOLDS];
        pthread_mutex_unlock(&s->lock);
        usleep(20);                               /* a slow hash */
        if (!has_pattern(h.mem, h.off, h.len, 7))
            atomic_fetch_add(&s->bad, 1);
        pool_hold_release(h.ref);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void test_holds_under_load(void)
{
    enum { WRITERS = 3 };
    struct nbdx *x = open_disk(WRITERS * STRESS_REGION);
    struct stress s = { .writers_left = WRITERS };
    pthread_t w[WRITERS], dg;

    s.p = make_pool(x, 64 * K, 256 * K);           /* four buffers */
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.cond, NULL);
    fake_set_delay(x, 50);
    fake_set_auto(x, FAKE_RANDOM, 7);          /* replies out of order */
    assert(pthread_create(&dg, NULL, stress_digest, &s) == 0);
    for (unsigned i = 0; i < WRITERS; i++)
        assert(pthread_create(&w[i], NULL, stress_writer, &s) == 0);
    for (unsigned i = 0; i < WRITERS; i++)
        pthread_join(w[i], NULL);
    pthread_join(dg, NULL);
    pool_drain(s.p);
    assert(atomic_load(&s.bad) == 0);
    assert(has_pattern(fake_disk(x), 0, WRITERS * STRESS_REGION, 7));
    printf("  holds under load: %u writes fell back to pool_write()\n",
           atomic_load(&s.fallbacks));
    pool_destroy(s.p);
    fake_close(x);
}

int main(void)
{
    test_hold_outlives_reply();
    test_writer_waits_for_release();
    test_failed_fill_is_undone();
    test_not_sent_before_commit();
    test_zero_chunks_become_write_zeroes();
    test_no_write_over_held_bytes();
    test_holds_under_load();
    printf("test-pool-fill: ok\n");
    return 0;
}
