/* tests/unit/test-pool-resend.c: a restarted server is survived
 * (cfg.retain), over the scripted transport.
 *
 * An acknowledged write keeps its buffer until a successful NBD flush
 * covers it; after a reconnect it is sent again, minus what something
 * newer covers, and awaits the next flush.  "The server restarted and
 * lost what it had not flushed" is a memset of the fake disk plus
 * fake_reconnect().  The retained buffers count against the pool: a
 * writer that finds none waits while the pool flushes by itself; the
 * pool also flushes every cfg.flush_bytes.  Each test completes the
 * requests by hand.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake-nbdx.h"
#include "transport/pool.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

static struct pool *make_pool_cfg(struct nbdx *x, struct pool_config *cfg)
{
    struct pool *p;
    int r = pool_create(cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
}

/* 16 buffers of 64 KiB; the pool flushes on its own only when a writer
 * needs buffers or half of them are retained. */
static struct pool *make_pool(struct nbdx *x)
{
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 1 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000,   /* never: tests drain */
        .retain = true,
    };
    return make_pool_cfg(x, &cfg);
}

struct job {
    pthread_t t;
    struct pool *p;
    int what;                     /* 0 drain, 1 flush, 2 write */
    uint64_t off, len;
    int c;
    int r;
};

static void *job_body(void *arg)
{
    struct job *j = arg;
    if (j->what == 1)
        j->r = pool_flush(j->p);
    else if (j->what == 0)
        pool_drain(j->p);
    else {
        unsigned char *b = malloc(64 * KiB);
        assert(b);
        memset(b, j->c, 64 * KiB);
        j->r = 0;
        for (uint64_t o = 0; o < j->len && j->r == 0; o += 64 * KiB)
            if (pool_write(j->p, j->off + o, b, 64 * KiB) != 64 * KiB)
                j->r = -1;
        free(b);
    }
    return NULL;
}

static void start(struct job *j, struct pool *p, int what)
{
    j->p = p;
    j->what = what;
    assert(pthread_create(&j->t, NULL, job_body, j) == 0);
}

static void join(struct job *j) { pthread_join(j->t, NULL); }

static void put(struct pool *p, uint64_t off, uint64_t len, int c)
{
    unsigned char *b = malloc(len);
    assert(b);
    memset(b, c, len);
    assert(pool_write(p, off, b, len) == (ssize_t) len);
    free(b);
}

/* Write and drain, every write answered with success. */
static void write_acked(struct nbdx *x, struct pool *p, uint64_t off,
                        uint64_t len, int c)
{
    put(p, off, len, c);
    struct job j = { 0 };
    start(&j, p, 0);
    for (uint64_t n = 0; n < (len + 64 * KiB - 1) / (64 * KiB); n++)
        fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    join(&j);
}

static int flush_answered(struct nbdx *x, struct pool *p, int err)
{
    struct job j = { 0 };
    start(&j, p, 1);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), err);
    join(&j);
    return j.r;
}

/* pool_flush(), answering everything it sends, in order. */
static int flush_answered_all(struct nbdx *x, struct pool *p)
{
    fake_set_auto(x, FAKE_FIFO, 0);
    int r = pool_flush(p);
    fake_set_auto(x, FAKE_MANUAL, 0);
    fake_quiesce(x, NULL);
    return r;
}

static struct pool_stats stats(struct pool *p)
{
    struct pool_stats s;
    pool_get_stats(p, &s);
    return s;
}

static bool disk_is(struct nbdx *x, uint64_t off, uint64_t len, int c)
{
    const unsigned char *d = fake_disk(x);
    for (uint64_t i = off; i < off + len; i++)
        if (d[i] != (unsigned char) c) {
            fprintf(stderr, "disk[%llu] = %#x, want %#x\n",
                    (unsigned long long) i, d[i], c);
            return false;
        }
    return true;
}

/* The server restarts and comes back without what was not flushed. */
static void restart_server(struct nbdx *x, uint64_t off, uint64_t len)
{
    memset(fake_disk(x) + off, 0, len);
    fake_reconnect(x);
}

/* Acknowledged, not flushed, the server restarts empty: resent, no
 * damage, and the disk holds the bytes again; flushed before the
 * restart: not resent (the server kept it). */
static void test_resend_after_reconnect(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_acked(x, p, 0, 64 * KiB, 0x66);
    assert(flush_answered(x, p, 0) == 0);
    assert(stats(p).bufs_retained == 0);           /* the flush freed it */
    write_acked(x, p, 2 * MiB, 128 * KiB, 0x77);
    assert(stats(p).bufs_retained == 2);
    restart_server(x, 2 * MiB, 128 * KiB);
    /* Noticed (here by the stats): the flushed write's sample is read
     * back, and the server still holds it. */
    stats(p);
    struct nbdx_op *rd = fake_wait_op(x, NBDX_OP_READ);
    assert(rd->off == 0);
    fake_complete(x, rd, 0);
    assert(pool_damage(p) == 0);
    struct job j = { 0 };
    start(&j, p, 1);                      /* the next flush: resent first */
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    join(&j);
    assert(j.r == 0);
    assert(disk_is(x, 2 * MiB, 128 * KiB, 0x77));
    assert(disk_is(x, 0, 64 * KiB, 0x66));
    struct pool_stats s = stats(p);
    assert(pool_damage(p) == 0 && s.errors == 0 && s.nfailures == 0);
    assert(s.bytes_resent == 128 * KiB && s.bufs_retained == 0);
    assert(s.bytes_acked == s.bytes_written);   /* counted once */
    pool_destroy(p);
    fake_close(x);
    printf("ok resend_after_reconnect\n");
    fflush(stdout);
}

/* A newer write over part of a retained one wins over its resend:
 * newer and in flight at the reconnect (nbdx resends it), newer and
 * retained too, newer and still filling; and a newer zero, acknowledged,
 * cuts the older write at once. */
static void test_newer_wins(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    /* A: [0, 256K) = 0x11, retained in four buffers. */
    write_acked(x, p, 0, 256 * KiB, 0x11);
    /* B, in flight: [32K, 96K) = 0x22. */
    put(p, 32 * KiB, 64 * KiB, 0x22);
    struct job j = { 0 };
    start(&j, p, 0);
    struct nbdx_op *b = fake_wait_op(x, NBDX_OP_WRITE);
    assert(b->off == 32 * KiB);
    restart_server(x, 0, 1 * MiB);
    fake_complete(x, b, 0);               /* the new server's reply */
    /* The resends: A minus B (B itself is sent again in its place). */
    for (int i = 0; i < 5; i++)
        fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    join(&j);
    assert(fake_in_flight(x) == 0);
    assert(disk_is(x, 0, 32 * KiB, 0x11));
    assert(disk_is(x, 32 * KiB, 64 * KiB, 0x22));
    assert(disk_is(x, 96 * KiB, 160 * KiB, 0x11));
    assert(pool_damage(p) == 0);

    write_acked(x, p, 128 * KiB, 32 * KiB, 0x33);        /* C */
    assert(pool_zero(p, 200 * KiB, 8 * KiB) == 0);       /* D */
    start(&j, p, 0);
    fake_complete(x, fake_wait_op(x, NBDX_OP_ZERO), 0);
    join(&j);
    /* E, filling: [240K, 244K) = 0x44, not yet sent. */
    put(p, 240 * KiB, 4 * KiB, 0x44);
    restart_server(x, 0, 1 * MiB);
    assert(pool_damage(p) == 0);
    assert(flush_answered_all(x, p) == 0);
    assert(disk_is(x, 0, 32 * KiB, 0x11));
    assert(disk_is(x, 32 * KiB, 64 * KiB, 0x22));
    assert(disk_is(x, 96 * KiB, 32 * KiB, 0x11));
    assert(disk_is(x, 128 * KiB, 32 * KiB, 0x33));
    assert(disk_is(x, 160 * KiB, 40 * KiB, 0x11));
    assert(disk_is(x, 200 * KiB, 8 * KiB, 0));
    assert(disk_is(x, 208 * KiB, 32 * KiB, 0x11));
    assert(disk_is(x, 240 * KiB, 4 * KiB, 0x44));
    assert(disk_is(x, 244 * KiB, 12 * KiB, 0x11));
    assert(pool_damage(p) == 0 && stats(p).nfailures == 0);
    assert(stats(p).bufs_retained == 0);
    pool_destroy(p);
    fake_close(x);
    printf("ok newer_wins\n");
    fflush(stdout);
}

/* The bound: every buffer retained, the writer waits while the pool
 * sends a flush by itself (no close, no fsync); the flush frees them. */
static void test_bound_flushes_and_waits(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);
    struct job w = { .off = 0, .len = 24 * 64 * KiB, .c = 0x55 };

    fake_reset_sleepers();
    start(&w, p, 2);
    /* Answer writes until the pool asks for a flush (half the buffers
     * retained); hold it back and answer the writes that still come. */
    struct nbdx_op *f;
    for (;;) {
        struct nbdx_op *op = fake_wait_op(x, -1);
        if (op->kind == NBDX_OP_FLUSH) {
            f = op;
            break;
        }
        fake_complete(x, op, 0);
    }
    /* The writer runs out: every buffer is retained or filling. */
    fake_wait_sleeper("buffer", 1);
    while (fake_in_flight(x) > 1)
        fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    struct pool_stats s = stats(p);
    assert(s.bufs_retained >= 8 && s.bufs_in_use <= s.nbufs);
    assert(s.bytes_written < w.len);       /* still waiting */
    fake_complete(x, f, 0);
    /* From here on, answer whatever comes, flushes included. */
    fake_set_auto(x, FAKE_FIFO, 0);
    join(&w);
    assert(w.r == 0);
    assert(pool_flush(p) == 0);
    fake_quiesce(x, NULL);
    s = stats(p);
    assert(s.flushes_auto >= 1 && s.bufs_retained == 0);
    assert(disk_is(x, 0, w.len, 0x55));
    pool_destroy(p);
    fake_close(x);
    printf("ok bound_flushes_and_waits\n");
    fflush(stdout);
}

/* Every cfg.flush_bytes acknowledged, a flush, with no close. */
static void test_periodic_flush_by_bytes(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 4 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000, .retain = true,
        .flush_bytes = 192 * KiB,
    };
    struct pool *p = make_pool_cfg(x, &cfg);

    write_acked(x, p, 0, 128 * KiB, 0x12);
    usleep(100 * 1000);
    assert(fake_in_flight(x) == 0);        /* 128 KiB: not yet */
    write_acked(x, p, 128 * KiB, 64 * KiB, 0x12);
    struct nbdx_op *f = fake_wait_op(x, NBDX_OP_FLUSH);
    assert(stats(p).bufs_retained == 3);
    fake_complete(x, f, 0);
    while (stats(p).flushes_auto < 1 || stats(p).bufs_retained > 0)
        usleep(1000);
    pool_destroy(p);
    fake_close(x);
    printf("ok periodic_flush_by_bytes\n");
    fflush(stdout);
}

/* Every cfg.flush_interval_ms while something is unflushed, a flush,
 * with no close and no byte budget reached. */
static void test_periodic_flush_by_time(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 4 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000, .retain = true,
        .flush_interval_ms = 200,
    };
    struct pool *p = make_pool_cfg(x, &cfg);

    usleep(300 * 1000);
    assert(fake_in_flight(x) == 0);        /* nothing written: no flush */
    write_acked(x, p, 0, 64 * KiB, 0x13);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    while (stats(p).flushes_auto < 1 || stats(p).bufs_retained > 0)
        usleep(1000);
    pool_destroy(p);
    fake_close(x);
    printf("ok periodic_flush_by_time\n");
    fflush(stdout);
}

/* A flush that fails keeps the writes retained: a restart after it is
 * still repaired by the resend. */
static void test_failed_flush_keeps_retained(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_acked(x, p, 1 * MiB, 64 * KiB, 0x21);
    assert(flush_answered(x, p, ENOSPC) == -ENOSPC);
    assert(stats(p).bufs_retained == 1 && pool_damage(p) == ENOSPC);
    restart_server(x, 1 * MiB, 64 * KiB);
    struct job j = { 0 };
    start(&j, p, 1);
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    join(&j);
    assert(j.r == 0 && pool_damage(p) == 0);
    assert(disk_is(x, 1 * MiB, 64 * KiB, 0x21));
    assert(stats(p).bytes_resent == 64 * KiB);
    pool_destroy(p);
    fake_close(x);
    printf("ok failed_flush_keeps_retained\n");
    fflush(stdout);
}

/* A server that lost what a flush had covered (a RAM disk restarted
 * empty): the resend cannot repair it; the sample of the flushed write
 * read back after the reconnect differs, and all of the disk is damage,
 * loudly, even once everything retained is resent and flushed. */
static void test_flushed_then_lost_is_loud(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_acked(x, p, 0, 64 * KiB, 0x71);
    assert(flush_answered(x, p, 0) == 0);
    write_acked(x, p, 1 * MiB, 64 * KiB, 0x72);
    restart_server(x, 0, 8 * MiB);             /* everything gone */
    stats(p);
    fake_complete(x, fake_wait_op(x, NBDX_OP_READ), 0);
    assert(pool_damage(p) == EIO);
    struct pool_stats s = stats(p);
    assert(s.flushed_lost == 1 && s.errors_lost == 1);
    assert(s.damaged_bytes == 8 * MiB);
    struct job j = { 0 };
    start(&j, p, 1);
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);   /* the resend */
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    join(&j);
    assert(disk_is(x, 1 * MiB, 64 * KiB, 0x72));
    assert(disk_is(x, 0, 64 * KiB, 0));        /* gone for good */
    assert(pool_damage(p) == EIO);             /* and told */
    pool_destroy(p);
    fake_close(x);
    printf("ok flushed_then_lost_is_loud\n");
    fflush(stdout);
}

/* The loud path stays: a retained write whose resend cannot be made
 * (out of memory for its pieces) is damage, "lost". */
static void test_resend_out_of_memory_is_loud(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_acked(x, p, 0, 64 * KiB, 0x31);
    put(p, 16 * KiB, 16 * KiB, 0x32);      /* newer, filling: cuts it */
    restart_server(x, 0, 64 * KiB);
    fake_fail_alloc = true;
    int d = pool_damage(p);
    fake_fail_alloc = false;
    assert(d == EIO);
    struct pool_stats s = stats(p);
    assert(s.errors_lost >= 1 && s.failures[0].lost);
    struct job j = { 0 };
    start(&j, p, 0);                       /* the filling write still goes */
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    join(&j);
    pool_destroy(p);
    fake_close(x);
    printf("ok resend_out_of_memory_is_loud\n");
    fflush(stdout);
}

/* The durable hook across a reconnect: a flush whose reply came across
 * it covers nothing (not told); the flush after the resend is. */
static uint64_t durable_gen;
static unsigned durable_calls;

static void on_durable(void *opaque, uint64_t gen)
{
    (void) opaque;
    assert(gen > durable_gen);
    durable_gen = gen;
    durable_calls++;
}

static void test_durable_after_resend(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 1 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000, .retain = true,
        .on_durable = on_durable,
    };
    struct pool *p = make_pool_cfg(x, &cfg);

    write_acked(x, p, 0, 64 * KiB, 0x41);
    uint64_t g1 = pool_gen(p);
    struct job j = { 0 };
    start(&j, p, 1);
    struct nbdx_op *f = fake_wait_op(x, NBDX_OP_FLUSH);
    restart_server(x, 0, 64 * KiB);        /* the flush crosses it */
    fake_complete(x, f, 0);
    /* Not told: the reply may be the new server's.  The write is resent
     * and flushed again by the same pool_flush(). */
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    assert(durable_calls == 0);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    join(&j);
    assert(j.r == 0 && durable_calls == 1 && durable_gen >= g1);
    assert(disk_is(x, 0, 64 * KiB, 0x41));
    pool_destroy(p);
    fake_close(x);
    printf("ok durable_after_resend\n");
    fflush(stdout);
}

int main(void)
{
    alarm(120);                   /* a hang fails the test */
    test_resend_after_reconnect();
    test_newer_wins();
    test_bound_flushes_and_waits();
    test_periodic_flush_by_bytes();
    test_periodic_flush_by_time();
    test_failed_flush_keeps_retained();
    test_flushed_then_lost_is_loud();
    test_resend_out_of_memory_is_loud();
    test_durable_after_resend();
    return 0;
}
