/* tests/unit/test-pool.c: transport/pool.c over the scripted transport.
 *
 * Each interleaving test drives the pool into one exact sleep (the
 * before-wait hook tells the test the thread is about to sleep), acts
 * while it sleeps, then completes requests in a chosen order, and checks
 * that what the pool reads back is what the server holds and what the
 * operations allow.  The model test then runs random writes, zeroes,
 * truncate-style lazy zeroes and reads against a byte-array model, with
 * requests completing in random order and a second thread draining and
 * reading all the time (a second process opening and closing the file),
 * with large and tiny zero-map bounds.  pool.c is built here with its
 * assertions on (ordering invariants 1-3); the fake transport checks
 * that no overlapping writes are in flight together and that no write
 * buffer changes before its reply.
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

static struct pool *make_pool(struct nbdx *x, size_t request_size,
                              size_t pool_size, unsigned depth,
                              size_t map_ranges)
{
    struct pool_config cfg = {
        .request_size = request_size, .pool_size = pool_size,
        .depth = depth, .idle_ms = 3600 * 1000,  /* never: tests seal */
        .zero_map_ranges = map_ranges,
    };
    struct pool *p;
    int r = pool_create(&cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
}

/* ---- a pool call on another thread ------------------------------------ */

enum job_kind { JOB_ZERO, JOB_DRAIN, JOB_READ, JOB_WRITE };

struct job {
    pthread_t t;
    enum job_kind kind;
    struct pool *p;
    uint64_t off, len;
    unsigned char *buf;
    int r;
};

static void *job_body(void *arg)
{
    struct job *j = arg;
    switch (j->kind) {
    case JOB_ZERO: j->r = pool_zero(j->p, j->off, j->len); break;
    case JOB_DRAIN: pool_drain(j->p); j->r = 0; break;
    case JOB_READ: j->r = pool_read(j->p, j->off, j->buf, j->len); break;
    case JOB_WRITE:
        j->r = (int) pool_write(j->p, j->off, j->buf, (size_t) j->len);
        break;
    }
    return NULL;
}

static void start(struct job *j) { assert(pthread_create(&j->t, NULL, job_body, j) == 0); }
static void join(struct job *j) { pthread_join(j->t, NULL); }

/* Queue MAX_ZERO_REQS (256) separate zero requests in [from, ...): the
 * next zero must wait for a slot. */
static void fill_zero_slots(struct pool *p, uint64_t from)
{
    for (unsigned i = 0; i < 256; i++)
        assert(pool_zero(p, from + i * 128 * KiB, 4 * KiB) == 0);
}

static void finish(struct nbdx *x, struct pool *p)
{
    fake_set_auto(x, FAKE_FIFO, 1);
    pool_drain(p);
}

static bool all(const unsigned char *b, size_t n, unsigned char c)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != c)
            return false;
    return true;
}

/* ---- the interleavings -------------------------------------------------- */

/* A zero waits for a slot; a write lands in its range meanwhile.  The
 * zero must not then mark its whole range known-zero while the write
 * goes to the server after it (reads would return zeros the disk does
 * not hold). */
static void test_zero_waits_write_lands(void)
{
    struct nbdx *x = fake_open(64 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 4, 0);
    unsigned char data[4096], *got = malloc(MiB);

    fake_reset_sleepers();
    fill_zero_slots(p, 32 * MiB);
    struct job a = { .kind = JOB_ZERO, .p = p, .off = 0, .len = MiB };
    start(&a);
    fake_wait_sleeper("zero-slot", 1);
    memset(data, 0x55, sizeof data);
    assert(pool_write(p, 8 * KiB, data, sizeof data) == sizeof data);
    fake_complete(x, fake_wait_op(x, NBDX_OP_ZERO), 0);
    join(&a);
    assert(a.r == 0);
    finish(x, p);

    assert(pool_read(p, 0, got, MiB) == 0);
    assert(memcmp(got, fake_disk(x), MiB) == 0);     /* reads = disk */
    /* Either order of the two is correct; nothing else is. */
    assert(all(got, 8 * KiB, 0) && all(got + 12 * KiB, MiB - 12 * KiB, 0));
    assert(all(got + 8 * KiB, 4 * KiB, 0) || all(got + 8 * KiB, 4 * KiB, 0x55));
    pool_destroy(p);
    fake_close(x);
    free(got);
    printf("ok zero_waits_write_lands\n");
}

/* A drain turns a truncate's pending zeroes into zero requests and waits
 * for a slot; a write after the truncate lands in the range meanwhile
 * and is sent at once (a full buffer).  The zero must leave the write's
 * bytes alone: they are newer than the truncate. */
static void test_materialize_waits_write_lands(void)
{
    struct nbdx *x = fake_open(64 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 4, 0);
    unsigned char *data = malloc(64 * KiB), *got = malloc(64 * KiB);

    fake_reset_sleepers();
    assert(pool_zero_lazy(p, 0, 32 * MiB) == 0);    /* O_TRUNC */
    fill_zero_slots(p, 32 * MiB);
    struct job a = { .kind = JOB_DRAIN, .p = p };   /* a reader's close */
    start(&a);
    fake_wait_sleeper("zero-slot", 1);
    memset(data, 0x66, 64 * KiB);
    assert(pool_write(p, 0, data, 64 * KiB) == 64 * KiB);
    fake_complete(x, fake_wait_op(x, NBDX_OP_ZERO), 0);
    fake_set_auto(x, FAKE_FIFO, 1);
    join(&a);
    finish(x, p);

    assert(memcmp(fake_disk(x), data, 64 * KiB) == 0);
    assert(pool_read(p, 0, got, 64 * KiB) == 0);
    assert(memcmp(got, data, 64 * KiB) == 0);
    assert(all(fake_disk(x) + 64 * KiB, 32 * MiB - 64 * KiB, 0));
    pool_destroy(p);
    fake_close(x);
    free(data);
    free(got);
    printf("ok materialize_waits_write_lands\n");
}

/* A read of a range partly pending zero is on the server when a drain
 * turns the pending zeroes into a zero request; the server answers the
 * read with the bytes from before the zero.  The read must still return
 * zeros where the truncate was. */
static void test_read_races_materialize(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 4, 0);
    unsigned char *got = malloc(64 * KiB);

    fake_reset_sleepers();
    assert(pool_zero_lazy(p, 32 * KiB, 8 * MiB - 32 * KiB) == 0);
    struct job a = { .kind = JOB_READ, .p = p, .off = 0, .len = 64 * KiB,
                     .buf = got };
    start(&a);
    struct nbdx_op *rd = fake_wait_op(x, NBDX_OP_READ);
    struct job b = { .kind = JOB_DRAIN, .p = p };
    start(&b);
    fake_wait_op(x, NBDX_OP_ZERO);
    fake_complete(x, rd, 0);                       /* old bytes */
    join(&a);
    assert(a.r == 0);
    assert(all(got, 32 * KiB, 0xAA) && all(got + 32 * KiB, 32 * KiB, 0));
    fake_set_auto(x, FAKE_FIFO, 1);
    join(&b);
    pool_destroy(p);
    fake_close(x);
    free(got);
    printf("ok read_races_materialize\n");
}

/* A zero-copy write is reserved after a truncate and filled without the
 * lock; a drain (a close) in that window turns the pending zeroes into
 * zero requests.  They must not cover the reserved range: the write is
 * newer than the truncate. */
static void test_drain_during_fill(void)
{
    struct nbdx *x = fake_open(64 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 4, 0);
    unsigned char got[64 * KiB];
    struct pool_fill f;

    fake_reset_sleepers();
    assert(pool_zero_lazy(p, 0, 32 * MiB) == 0);    /* O_TRUNC */
    assert(pool_fill_begin(p, 0, 64 * KiB, &f) == 0);
    struct job a = { .kind = JOB_DRAIN, .p = p };   /* another close */
    start(&a);
    fake_set_auto(x, FAKE_FIFO, 1);
    fake_wait_sleeper("drain", 1);                  /* it waits for us */
    for (unsigned i = 0; i < f.nseg; i++)
        memset(f.seg[i].mem, 0x77, f.seg[i].len);
    assert(pool_fill_commit(p, &f, 0, false) == 64 * KiB);
    join(&a);
    pool_drain(p);
    assert(all(fake_disk(x), 64 * KiB, 0x77));
    assert(pool_read(p, 0, got, sizeof got) == 0 && all(got, sizeof got, 0x77));
    assert(all(fake_disk(x) + 64 * KiB, 32 * MiB - 64 * KiB, 0));
    pool_destroy(p);
    fake_close(x);
    printf("ok drain_during_fill\n");
}

/* ---- allocation failures ------------------------------------------------- */

/* No buffer can be allocated and none is in use: an error, not a wait
 * for a buffer that nothing will free. */
static void test_alloc_fail_empty_pool(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 4, 0);
    unsigned char data[4096];

    memset(data, 0x11, sizeof data);
    fake_fail_alloc = true;
    ssize_t r = pool_write(p, 0, data, sizeof data);
    fake_fail_alloc = false;
    assert(r == -ENOMEM);
    assert(pool_write(p, 0, data, sizeof data) == sizeof data);
    finish(x, p);
    assert(all(fake_disk(x), 4096, 0x11));
    pool_destroy(p);
    fake_close(x);
    printf("ok alloc_fail_empty_pool\n");
}

/* A rewrite inside a filling buffer must leave pending_zero, which needs
 * an allocation that fails: the write must fail, not land and then be
 * zeroed at the drain. */
static void test_alloc_fail_pending_split(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 4, 0);
    unsigned char a[20 * KiB], b[KiB], got[20 * KiB];

    memset(a, 0x11, sizeof a);
    memset(b, 0x22, sizeof b);
    assert(pool_write(p, 0, a, sizeof a) == sizeof a);
    assert(pool_zero_lazy(p, 4 * KiB, 4 * KiB) == 0);
    for (unsigned i = 1; i < 16; i++)     /* 16 pending ranges in all */
        assert(pool_zero_lazy(p, i * MiB / 4, 4 * KiB) == 0);
    fake_fail_alloc = true;
    ssize_t r = pool_write(p, 5 * KiB, b, sizeof b);
    fake_fail_alloc = false;
    finish(x, p);
    assert(pool_read(p, 0, got, sizeof got) == 0);
    assert(memcmp(got, fake_disk(x), sizeof got) == 0);
    assert(all(got, 4 * KiB, 0x11) && all(got + 8 * KiB, 12 * KiB, 0x11));
    if (r == (ssize_t) sizeof b)           /* it landed: it must show */
        assert(all(got + 4 * KiB, KiB, 0) && all(got + 5 * KiB, KiB, 0x22) &&
               all(got + 6 * KiB, 2 * KiB, 0));
    else {                                 /* it failed: nothing landed */
        assert(r == -ENOMEM);
        assert(all(got + 4 * KiB, 4 * KiB, 0));
    }
    pool_destroy(p);
    fake_close(x);
    printf("ok alloc_fail_pending_split (%s)\n", r < 0 ? "refused" : "landed");
}

/* ---- the model ----------------------------------------------------------- */

struct closer {
    pthread_t t;
    struct pool *p;
    uint64_t size;
    bool stop;                    /* __atomic */
    unsigned rounds;
};

static void *closer_body(void *arg)
{
    struct closer *c = arg;
    unsigned char buf[8192];
    uint32_t rng = 99;

    while (!__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
        rng = rng * 1103515245u + 12345u;
        uint64_t off = ((uint64_t) rng * 4096) % (c->size - sizeof buf);
        assert(pool_read(c->p, off, buf, sizeof buf) == 0);
        pool_drain(c->p);                 /* what a close used to do */
        c->rounds++;
    }
    return NULL;
}

static uint32_t mrng;
static uint32_t rnd(void)
{
    mrng ^= mrng << 13;
    mrng ^= mrng >> 17;
    mrng ^= mrng << 5;
    return mrng;
}

static void model_run(uint32_t seed, size_t map_ranges, bool closer_on)
{
    const uint64_t size = 4 * MiB;
    struct nbdx *x = fake_open(size, true, 0);
    struct pool *p = make_pool(x, 16 * KiB, 128 * KiB, 4, map_ranges);
    unsigned char *model = malloc(size), *buf = malloc(512 * KiB);
    struct closer c = { .p = p, .size = size };

    mrng = seed;
    memset(model, 0xAA, size);
    fake_set_auto(x, FAKE_RANDOM, seed);
    if (closer_on)
        assert(pthread_create(&c.t, NULL, closer_body, &c) == 0);
    for (unsigned i = 0; i < 4000; i++) {
        uint64_t len = 1 + rnd() % (rnd() % 8 ? 8 * KiB : 256 * KiB);
        uint64_t off = rnd() % (size - len);
        if (rnd() % 3 == 0)
            off &= ~(uint64_t) 4095;
        switch (rnd() % 10) {
        case 0: case 1: case 2: case 3: {         /* write */
            for (uint64_t k = 0; k < len; k++)
                buf[k] = (unsigned char) (rnd() | 1);
            if (len >= 128 * KiB)                 /* a zero run inside */
                memset(buf + 64 * KiB, 0, 64 * KiB);
            struct pool_fill f;
            if (rnd() % 2 && pool_fill_begin(p, off, len, &f) == 0) {
                size_t pos = 0;                   /* zero-copy path */
                for (unsigned k = 0; k < f.nseg; pos += f.seg[k++].len)
                    memcpy(f.seg[k].mem, buf + pos, f.seg[k].len);
                assert(pos == len);
                assert(pool_fill_commit(p, &f, 0, false) == (ssize_t) len);
            } else
                assert(pool_write(p, off, buf, len) == (ssize_t) len);
            memcpy(model + off, buf, len);
            break;
        }
        case 4:                                   /* punch hole */
            assert(pool_zero(p, off, len) == 0);
            memset(model + off, 0, len);
            break;
        case 5:                                   /* truncate to off */
            if (rnd() % 4 == 0) {
                assert(pool_zero_lazy(p, off, size - off) == 0);
                memset(model + off, 0, size - off);
            }
            break;
        case 6:
            if (rnd() % 8 == 0)
                pool_drain(p);
            break;
        default:                                  /* read */
            assert(pool_read(p, off, buf, len) == 0);
            if (memcmp(buf, model + off, len) != 0) {
                uint64_t k = 0;
                while (buf[k] == model[off + k])
                    k++;
                fprintf(stderr, "seed %u op %u: read %llu+%llu differs at "
                        "%llu: got %02x, want %02x\n", seed, i,
                        (unsigned long long) off, (unsigned long long) len,
                        (unsigned long long) (off + k), buf[k],
                        model[off + k]);
                abort();
            }
        }
        struct pool_stats st;
        pool_get_stats(p, &st);
        assert(st.known_zero_ranges <= (map_ranges ? map_ranges : POOL_ZERO_MAP_RANGES));
        assert(st.pending_zero_ranges <= (map_ranges ? map_ranges : POOL_ZERO_MAP_RANGES));
    }
    if (closer_on) {
        __atomic_store_n(&c.stop, true, __ATOMIC_RELAXED);
        pthread_join(c.t, NULL);
    }
    pool_drain(p);
    assert(memcmp(fake_disk(x), model, size) == 0);
    assert(pool_error_seq(p) == 0);
    pool_destroy(p);
    fake_close(x);
    free(model);
    free(buf);
}

static void test_model(unsigned seeds)
{
    for (uint32_t s = 1; s <= seeds; s++) {
        model_run(s, 0, s % 2 == 0);
        model_run(s + 1000, 16, true);
    }
    printf("ok model: %u seeds x 2 runs x 4000 operations\n", seeds);
}

/* ---- the ordering invariants, one scripted case each ------------------- */

/* Invariant 2: a write over a range whose older write is on the wire is
 * held back until that one's reply, while a write elsewhere goes at
 * once; the server ends with the newer bytes.  A dispatcher that ignored
 * the overlap would trip send_req_locked()'s assert and the fake's
 * overlap check; one that completed them out of order would leave the
 * older bytes. */
static void test_overlap_waits_for_reply(void)
{
    struct nbdx *x = fake_open(64 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 1 * MiB, 8, 0);
    unsigned char *a = malloc(64 * KiB), *b = malloc(64 * KiB);
    unsigned char *c = malloc(64 * KiB), *got = malloc(3 * 64 * KiB);

    memset(a, 0x11, 64 * KiB);
    memset(b, 0x22, 64 * KiB);
    memset(c, 0x33, 64 * KiB);
    assert(pool_write(p, 0, a, 64 * KiB) == (ssize_t) (64 * KiB));
    struct nbdx_op *first = fake_wait_op(x, NBDX_OP_WRITE);
    assert(first->off == 0 && fake_in_flight(x) == 1);
    /* Overlaps the write in flight: queued, not sent. */
    assert(pool_write(p, 32 * KiB, b, 64 * KiB) == (ssize_t) (64 * KiB));
    assert(fake_in_flight(x) == 1);
    /* Overlaps nothing: sent at once (the depth is not what held b). */
    assert(pool_write(p, 1 * MiB, c, 64 * KiB) == (ssize_t) (64 * KiB));
    assert(fake_in_flight(x) == 2);
    fake_complete(x, first, 0);   /* the reply lets b go */
    assert(fake_in_flight(x) == 2);
    finish(x, p);

    const unsigned char *d = fake_disk(x);
    assert(all(d, 32 * KiB, 0x11) && all(d + 32 * KiB, 64 * KiB, 0x22));
    assert(all(d + 96 * KiB, 32 * KiB, 0xaa));   /* the fake's old data */
    assert(all(d + MiB, 64 * KiB, 0x33));
    assert(pool_read(p, 0, got, 3 * 64 * KiB) == 0);
    assert(memcmp(got, d, 3 * 64 * KiB) == 0);
    pool_destroy(p);
    fake_close(x);
    free(a), free(b), free(c), free(got);
    printf("ok overlap_waits_for_reply\n");
}

/* Invariant 3: with both buffers on the wire, a third write sleeps for
 * a buffer; it gets one only when a reply frees it, and the buffer still
 * on the wire is not
 * touched meanwhile (the fake checks each write's bytes at its reply).
 * Freeing a buffer at send time would let the third write through at
 * once or overwrite bytes still being sent. */
static void test_buffer_freed_after_reply(void)
{
    struct nbdx *x = fake_open(64 * MiB, true, 0);
    struct pool *p = make_pool(x, 64 * KiB, 128 * KiB, 8, 0);
    unsigned char *buf[3];

    for (int i = 0; i < 3; i++) {
        buf[i] = malloc(64 * KiB);
        memset(buf[i], 0x11 * (i + 1), 64 * KiB);
    }
    fake_reset_sleepers();
    assert(pool_write(p, 0, buf[0], 64 * KiB) == (ssize_t) (64 * KiB));
    assert(pool_write(p, 64 * KiB, buf[1], 64 * KiB) == (ssize_t) (64 * KiB));
    assert(fake_in_flight(x) == 2);
    struct pool_stats st;
    pool_get_stats(p, &st);
    assert(st.nbufs == 2 && st.bufs_in_use == 2);  /* none back before a reply */
    struct job w = { .kind = JOB_WRITE, .p = p, .off = 128 * KiB,
                     .len = 64 * KiB, .buf = buf[2] };
    start(&w);
    fake_wait_sleeper("buffer", 1);
    assert(fake_in_flight(x) == 2);
    struct nbdx_op *op0 = fake_wait_op(x, NBDX_OP_WRITE);
    assert(op0->off == 0);
    fake_complete(x, op0, 0);     /* frees buffer 0 ... */
    join(&w);                     /* ... which the third write takes */
    assert(w.r == (int) (64 * KiB));
    assert(fake_in_flight(x) == 2);   /* 64 KiB still on the wire, 128 KiB */
    finish(x, p);

    const unsigned char *d = fake_disk(x);
    for (int i = 0; i < 3; i++)
        assert(memcmp(d + i * 64 * KiB, buf[i], 64 * KiB) == 0);
    pool_destroy(p);
    fake_close(x);
    for (int i = 0; i < 3; i++)
        free(buf[i]);
    printf("ok buffer_freed_after_reply\n");
}

/* The touched map (the read-back's): every write and zero sent, exact;
 * past its bound, or when not kept, everything. */
static bool touched(struct pool *p, uint64_t pos, uint64_t start,
                    uint64_t end)
{
    struct pool_range t;
    return pool_touched_next(p, pos, &t) && t.start == start && t.end == end;
}

static void test_touched_ranges(void)
{
    struct nbdx *x = fake_open(8 * MiB, true, 0);
    struct pool_config cfg = {
        .request_size = 64 * KiB, .pool_size = 1 * MiB, .depth = 4,
        .idle_ms = 3600 * 1000, .zero_map_ranges = 16,
        .track_touched = true,
    };
    struct pool *p;
    unsigned char data[4096];
    struct pool_range t;

    memset(data, 0x5a, sizeof data);
    assert(pool_create(&cfg, x, nbdx_info(x)->size, &p) == 0);
    assert(!pool_touched_next(p, 0, &t));
    assert(pool_write(p, 0, data, sizeof data) == sizeof data);
    assert(pool_zero(p, 1 * MiB, 64 * KiB) == 0);
    finish(x, p);
    assert(touched(p, 0, 0, 4096));
    assert(touched(p, 4096, 1 * MiB, 1 * MiB + 64 * KiB));
    assert(!pool_touched_next(p, 2 * MiB, &t));
    for (unsigned i = 0; i < 20; i++)   /* past the bound of 16 */
        assert(pool_write(p, 2 * MiB + i * 128 * KiB, data, sizeof data) ==
               sizeof data);
    finish(x, p);
    assert(touched(p, 7 * MiB, 0, UINT64_MAX));
    pool_destroy(p);

    cfg.track_touched = false;          /* not kept: all touched */
    assert(pool_create(&cfg, x, nbdx_info(x)->size, &p) == 0);
    assert(touched(p, 0, 0, UINT64_MAX));
    pool_destroy(p);
    fake_close(x);
    printf("ok touched_ranges\n");
}

/* test-pool [NAME | SEEDS]: every test, one by name, or more seeds. */
int main(int argc, char **argv)
{
    static const struct { const char *name; void (*fn)(void); } tests[] = {
        { "zero_waits_write_lands", test_zero_waits_write_lands },
        { "materialize_waits_write_lands", test_materialize_waits_write_lands },
        { "read_races_materialize", test_read_races_materialize },
        { "drain_during_fill", test_drain_during_fill },
        { "alloc_fail_empty_pool", test_alloc_fail_empty_pool },
        { "alloc_fail_pending_split", test_alloc_fail_pending_split },
        { "overlap_waits_for_reply", test_overlap_waits_for_reply },
        { "buffer_freed_after_reply", test_buffer_freed_after_reply },
        { "touched_ranges", test_touched_ranges },
    };
    const char *only = argc > 1 && (argv[1][0] < '0' || argv[1][0] > '9')
                           ? argv[1] : NULL;

    alarm(600);                   /* a hang fails the test */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (!only || strcmp(only, tests[i].name) == 0)
            tests[i].fn();
    if (!only || strcmp(only, "model") == 0)
        test_model(argc > 1 && !only ? (unsigned) atoi(argv[1]) : 6);
    return 0;
}
