/* tests/unit/test-pool-damage.c: the pool's damage over the scripted
 * transport.
 *
 * A failed write or zero is damage until a later request over its range
 * succeeds; a failed flush until a flush succeeds; writes acknowledged
 * but not flushed become damage at a reconnect.  pool_damage() says so
 * (fs/ fails every close and fsync on it).  EIO is sent again twice
 * before it counts, other errnos count at once.  Each test completes the
 * requests by hand, in the order it chooses.
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

static struct pool *make_pool(struct nbdx *x)
{
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 1 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000,   /* never: tests drain */
    };
    struct pool *p;
    int r = pool_create(&cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
}

/* pool_drain() or pool_flush() on another thread. */
struct job {
    pthread_t t;
    struct pool *p;
    bool flush;
    int r;
};

static void *job_body(void *arg)
{
    struct job *j = arg;
    if (j->flush)
        j->r = pool_flush(j->p);
    else
        pool_drain(j->p);
    return NULL;
}

static void start(struct job *j, struct pool *p, bool flush)
{
    *j = (struct job){ .p = p, .flush = flush };
    assert(pthread_create(&j->t, NULL, job_body, j) == 0);
}

static void join(struct job *j) { pthread_join(j->t, NULL); }

/* Write len bytes of c at off, drain, answering the write with errs[]
 * in turn (0: success) until it is answered for good. */
static void write_answered(struct nbdx *x, struct pool *p, uint64_t off,
                           uint64_t len, int c, const int *errs, unsigned n)
{
    unsigned char *buf = malloc(len);
    assert(buf);
    memset(buf, c, len);
    assert(pool_write(p, off, buf, len) == (ssize_t) len);
    struct job j;
    start(&j, p, false);
    for (unsigned i = 0; i < n; i++)
        fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), errs[i]);
    join(&j);
    free(buf);
}

static void flush_answered(struct nbdx *x, struct pool *p, int err)
{
    struct job j;
    start(&j, p, true);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), err);
    join(&j);
}

static struct pool_stats stats(struct pool *p)
{
    struct pool_stats s;
    pool_get_stats(p, &s);
    return s;
}

/* ENOSPC counts at once; a rewrite of the range repairs it. */
static void test_rewrite_repairs(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_answered(x, p, 1 * MiB, 64 * KiB, 0x11, (int[]){ ENOSPC }, 1);
    assert(pool_damage(p) == ENOSPC);
    struct pool_stats s = stats(p);
    assert(s.unrepaired && s.damaged_bytes == 64 * KiB && s.nfailures == 1);
    assert(!s.failures[0].repaired);
    /* Half of it written again: still damaged. */
    write_answered(x, p, 1 * MiB, 32 * KiB, 0x22, (int[]){ 0 }, 1);
    assert(pool_damage(p) == ENOSPC);
    assert(stats(p).damaged_bytes == 32 * KiB);
    write_answered(x, p, 1 * MiB + 32 * KiB, 32 * KiB, 0x22, (int[]){ 0 }, 1);
    assert(pool_damage(p) == 0);
    s = stats(p);
    assert(!s.unrepaired && s.repairs == 1 && s.failures[0].repaired);
    pool_destroy(p);
    fake_close(x);
}

/* EIO is sent again, twice, from the same bytes; a success among the
 * retries records nothing. */
static void test_eio_retried(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_answered(x, p, 0, 64 * KiB, 0x33, (int[]){ EIO, EIO, 0 }, 3);
    assert(pool_damage(p) == 0);
    struct pool_stats s = stats(p);
    assert(s.errors == 0 && s.nfailures == 0);
    assert(fake_disk(x)[0] == 0x33 && fake_disk(x)[64 * KiB - 1] == 0x33);
    /* Three EIOs: it counts. */
    write_answered(x, p, 0, 64 * KiB, 0x44, (int[]){ EIO, EIO, EIO }, 3);
    assert(pool_damage(p) == EIO && stats(p).errors == 1);
    pool_destroy(p);
    fake_close(x);
}

/* A failed zero leaves the known-zero map: zeroing the range again is
 * sent, not skipped, and repairs it. */
static void test_failed_zero_not_known_zero(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);
    struct job j;

    assert(pool_zero_lazy(p, 0, 1 * MiB) == 0);
    start(&j, p, false);
    fake_complete(x, fake_wait_op(x, NBDX_OP_ZERO), EINVAL);
    join(&j);
    assert(pool_damage(p) == EINVAL);
    assert(stats(p).known_zero == 0);         /* may hold anything */
    uint64_t skipped = stats(p).bytes_zero_skipped;
    /* The damage past a truncate is zeroed again. */
    assert(pool_zero_damage(p, 0) == 0);
    start(&j, p, false);
    struct nbdx_op *op = fake_wait_op(x, NBDX_OP_ZERO);
    assert(op->off == 0 && op->len == 1 * MiB);
    fake_complete(x, op, 0);
    join(&j);
    assert(stats(p).bytes_zero_skipped == skipped);
    assert(pool_damage(p) == 0 && fake_disk(x)[0] == 0);
    pool_destroy(p);
    fake_close(x);
}

/* A failed flush is damage until a flush succeeds. */
static void test_flush_failure(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_answered(x, p, 0, 64 * KiB, 0x55, (int[]){ 0 }, 1);
    struct job j;
    start(&j, p, true);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), ENOSPC);
    join(&j);
    assert(j.r == -ENOSPC && pool_damage(p) == ENOSPC);
    assert(stats(p).flush_failed);
    flush_answered(x, p, 0);                  /* tried again: not clean */
    assert(pool_damage(p) == 0 && stats(p).repairs == 1);
    pool_destroy(p);
    fake_close(x);
}

/* Without retention (cfg.retain off, or a server that cannot flush: the
 * pool keeps no acknowledged buffer, so nothing can be resent):
 * acknowledged, not flushed, then a reconnect: lost.  Flushed before the
 * reconnect: kept.  With retention, test-pool-resend.c. */
static void test_reconnect_loses_unflushed(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);

    write_answered(x, p, 0, 64 * KiB, 0x66, (int[]){ 0 }, 1);
    flush_answered(x, p, 0);
    write_answered(x, p, 2 * MiB, 64 * KiB, 0x77, (int[]){ 0 }, 1);
    assert(pool_damage(p) == 0);
    fake_reconnect(x);
    assert(pool_damage(p) == EIO);
    struct pool_stats s = stats(p);
    assert(s.nfailures == 1 && s.failures[0].lost);
    assert(s.failures[0].off == 2 * MiB && s.failures[0].len == 64 * KiB);
    assert(s.damaged_bytes == 64 * KiB);
    /* Written again: repaired. */
    write_answered(x, p, 2 * MiB, 64 * KiB, 0x77, (int[]){ 0 }, 1);
    assert(pool_damage(p) == 0);
    /* A flush that fails keeps its writes unflushed. */
    write_answered(x, p, 4 * MiB, 64 * KiB, 0x78, (int[]){ 0 }, 1);
    flush_answered(x, p, ENOSPC);
    flush_answered(x, p, 0);
    assert(pool_damage(p) == 0);
    fake_reconnect(x);
    assert(pool_damage(p) == 0);              /* nothing was unflushed */
    pool_destroy(p);
    fake_close(x);
}

/* Zeroes acknowledged, not flushed, then a reconnect: they need no data,
 * so they are zeroed again at the next drain instead of counting as lost,
 * but for the part that a write made since covers (it writes it) and the
 * part a lost write covers (damage: a zero must not pass for its repair). */
static void test_reconnect_rezeroes(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);
    struct job j;

    assert(pool_zero_lazy(p, 0, 1 * MiB) == 0);
    start(&j, p, false);
    fake_complete(x, fake_wait_op(x, NBDX_OP_ZERO), 0);
    join(&j);
    memset(fake_disk(x), 0xAA, 1 * MiB);      /* the restarted server */
    unsigned char buf[4096];
    memset(buf, 0x5A, sizeof buf);
    assert(pool_write(p, 512 * KiB, buf, sizeof buf) == sizeof buf);
    fake_reconnect(x);                        /* the write is filling */
    assert(pool_damage(p) == 0 && stats(p).nfailures == 0);
    assert(stats(p).pending_zero == 1 * MiB - sizeof buf);
    start(&j, p, false);
    for (int i = 0; i < 3; i++)               /* the write, two zeroes */
        fake_complete(x, fake_wait_op(x, -1), 0);
    join(&j);
    unsigned char *d = fake_disk(x);
    assert(d[0] == 0 && d[512 * KiB - 1] == 0 && d[512 * KiB] == 0x5A &&
           d[516 * KiB - 1] == 0x5A && d[516 * KiB] == 0 &&
           d[1 * MiB - 1] == 0);
    /* A lost write inside a lost zero: the write is damage, the rest of
     * the zero is zeroed again. */
    flush_answered(x, p, 0);
    assert(pool_zero_lazy(p, 2 * MiB, 1 * MiB) == 0);
    start(&j, p, false);
    fake_complete(x, fake_wait_op(x, NBDX_OP_ZERO), 0);
    join(&j);
    write_answered(x, p, 2 * MiB, 64 * KiB, 0x66, (int[]){ 0 }, 1);
    fake_reconnect(x);
    struct pool_stats s = stats(p);
    assert(s.nfailures == 1 && s.failures[0].lost &&
           s.failures[0].kind == POOL_WRITE && s.damaged_bytes == 64 * KiB);
    assert(s.pending_zero == 1 * MiB - 64 * KiB);
    start(&j, p, false);
    struct nbdx_op *op = fake_wait_op(x, NBDX_OP_ZERO);
    assert(op->off == 2 * MiB + 64 * KiB);
    fake_complete(x, op, 0);
    join(&j);
    assert(pool_damage(p) == EIO && stats(p).damaged_bytes == 64 * KiB);
    pool_destroy(p);
    fake_close(x);
}

/* cfg.on_durable: told after a good flush, with a generation newer than
 * every write made before it; not told after a failed flush, nor while
 * damage (a reconnect before the flush) is left. */
static uint64_t durable_gen;
static unsigned durable_calls;

static void on_durable(void *opaque, uint64_t gen)
{
    assert(opaque == &durable_calls);
    assert(gen >= durable_gen);           /* told again: recorded since */
    durable_gen = gen;
    durable_calls++;
}

static void test_durable_generations(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 1 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000,
        .on_durable = on_durable, .durable_opaque = &durable_calls,
    };
    struct pool *p;
    assert(pool_create(&cfg, x, nbdx_info(x)->size, &p) == 0);

    write_answered(x, p, 0, 64 * KiB, 0x11, (int[]){ 0 }, 1);
    uint64_t g1 = pool_gen(p);
    assert(durable_calls == 0);               /* acknowledged, not flushed */
    flush_answered(x, p, ENOSPC);
    assert(durable_calls == 0);
    flush_answered(x, p, 0);
    assert(durable_calls == 1 && durable_gen >= g1);

    /* Acknowledged, then a reconnect before the flush: damage, not told. */
    write_answered(x, p, 1 * MiB, 64 * KiB, 0x22, (int[]){ 0 }, 1);
    uint64_t g2 = pool_gen(p);
    assert(g2 > g1);
    fake_reconnect(x);
    struct job j;
    start(&j, p, true);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    join(&j);
    assert(durable_calls == 1);
    /* Rewritten and flushed: told, newer than the rewrite. */
    write_answered(x, p, 1 * MiB, 64 * KiB, 0x22, (int[]){ 0 }, 1);
    uint64_t g3 = pool_gen(p);
    flush_answered(x, p, 0);
    assert(durable_calls == 2 && durable_gen >= g3);
    pool_destroy(p);

    /* With retention the reconnect is no damage: the write is resent.
     * A flush whose reply came across the reconnect covers nothing (not
     * told); the same pool_flush() drains the resend and flushes again,
     * and that flush is told, newer than the write. */
    cfg.retain = true;
    durable_gen = 0;                          /* a new pool's generations */
    assert(pool_create(&cfg, x, nbdx_info(x)->size, &p) == 0);
    write_answered(x, p, 2 * MiB, 64 * KiB, 0x33, (int[]){ 0 }, 1);
    uint64_t g4 = pool_gen(p);
    start(&j, p, true);
    struct nbdx_op *f = fake_wait_op(x, NBDX_OP_FLUSH);
    memset(fake_disk(x) + 2 * MiB, 0, 64 * KiB);   /* restarted, lost */
    fake_reconnect(x);
    fake_complete(x, f, 0);
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);   /* the resend */
    assert(durable_calls == 2);
    fake_complete(x, fake_wait_op(x, NBDX_OP_FLUSH), 0);
    join(&j);
    assert(j.r == 0 && pool_damage(p) == 0);
    assert(durable_calls == 3 && durable_gen >= g4);
    assert(fake_disk(x)[2 * MiB] == 0x33);
    pool_destroy(p);
    fake_close(x);
}

/* pool_note_unchanged(): a write not sent cancels the pending zero over
 * its range, and only over a range wholly pending; the drain zeroes the
 * rest; reads see the server's bytes there. */
static void test_note_unchanged(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x);
    unsigned char *disk = fake_disk(x), buf[64 * KiB];
    struct fake_counts c;

    memset(disk, 0x33, 2 * MiB);            /* the server holds data */
    fake_set_auto(x, FAKE_FIFO, 1);
    assert(pool_zero_lazy(p, 0, 1 * MiB) == 0);
    assert(stats(p).pending_zero == 1 * MiB);
    assert(pool_note_unchanged(p, 64 * KiB, 64 * KiB) == 1);
    assert(stats(p).pending_zero == 1 * MiB - 64 * KiB);
    assert(pool_note_unchanged(p, 64 * KiB, 64 * KiB) == 0);  /* nothing */
    assert(pool_note_unchanged(p, 1 * MiB - 32 * KiB, 64 * KiB) == -EAGAIN);
    assert(pool_read(p, 64 * KiB, buf, sizeof buf) == 0);
    assert(buf[0] == 0x33 && buf[sizeof buf - 1] == 0x33);
    assert(pool_read(p, 0, buf, sizeof buf) == 0 && buf[0] == 0);
    pool_drain(p);
    fake_quiesce(x, &c);
    assert(c.zero_bytes == 1 * MiB - 64 * KiB);
    assert(disk[0] == 0 && disk[64 * KiB] == 0x33 &&
           disk[128 * KiB - 1] == 0x33 && disk[128 * KiB] == 0);
    pool_destroy(p);
    fake_close(x);
}

/* pool_checkpoint(): writes drained and flushed, on_durable told, the
 * pending zeroes (a truncate's) left pending. */
static void test_checkpoint_keeps_pending_zero(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 1 * MiB, .depth = 8,
        .idle_ms = 3600 * 1000,
        .on_durable = on_durable, .durable_opaque = &durable_calls,
    };
    struct pool *p;
    struct fake_counts c;
    unsigned char data[64 * KiB];
    assert(pool_create(&cfg, x, nbdx_info(x)->size, &p) == 0);
    fake_set_auto(x, FAKE_FIFO, 1);
    memset(data, 0x44, sizeof data);
    assert(pool_zero_lazy(p, 0, 1 * MiB) == 0);
    assert(pool_write(p, 2 * MiB, data, sizeof data) == sizeof data);
    uint64_t g = pool_gen(p);
    unsigned before = durable_calls;
    durable_gen = 0;              /* a new pool: its own generations */
    assert(pool_checkpoint(p) == 0);
    fake_quiesce(x, &c);
    assert(c.write_bytes == 64 * KiB && c.zero_bytes == 0);
    assert(stats(p).pending_zero == 1 * MiB);
    assert(durable_calls == before + 1 && durable_gen >= g);
    assert(fake_disk(x)[2 * MiB] == 0x44);
    pool_drain(p);                            /* now the zeroes go */
    fake_quiesce(x, &c);
    assert(stats(p).pending_zero == 0);
    pool_destroy(p);
    fake_close(x);
}

int main(void)
{
    alarm(120);                   /* a hang fails the test */
    test_rewrite_repairs();
    test_eio_retried();
    test_failed_zero_not_known_zero();
    test_flush_failure();
    test_reconnect_loses_unflushed();
    test_reconnect_rezeroes();
    test_durable_generations();
    test_note_unchanged();
    test_checkpoint_keeps_pending_zero();
    return 0;
}
