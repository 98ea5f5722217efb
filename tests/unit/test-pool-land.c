/* tests/unit/test-pool-land.c: landings (pool_land_begin/commit/end),
 * where the FUSE receive loop reads a write's payload straight into the
 * pool buffer it is sent from, over the scripted transport in
 * fake-nbdx.c (which also checks that no overlapping writes are in
 * flight together and that no write buffer changes before its reply).
 *
 * The promises under test: a landing is never where committed bytes
 * are, and nothing else writes into it while it lasts; the buffer under
 * a landing is still sent (a drain or fsync never waits for the next
 * request to arrive); a landed write takes effect exactly as the same
 * write through pool_write() would (order against other writes, zero
 * runs as write-zeroes), in place when it can and never wrongly; a
 * landing that is not used leaves no trace.  Every test checks the bytes
 * that reached the disk.
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

static struct nbdx *open_disk(uint64_t size, enum fake_auto mode)
{
    struct nbdx *x = fake_open(size, true, 0);
    memset(fake_disk(x), 0, size);
    fake_set_auto(x, mode, 0);
    return x;
}

static struct pool *make_pool(struct nbdx *x, size_t request, size_t total)
{
    struct pool_config cfg = { .request_size = request, .pool_size = total,
                               .depth = 8, .idle_ms = 60000 };
    struct pool *p;
    int r = pool_create(&cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
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

/* What the receive loop does for a write that arrives: the kernel puts
 * the payload at l->mem, then commit. */
static ssize_t land(struct pool *p, struct pool_landing *l, uint64_t off,
                    size_t len, unsigned seed, bool hold, struct pool_fill *f)
{
    assert(len <= l->room);
    fill_pattern(l->mem, off, len, seed);
    return pool_land_commit(p, l, off, len, hold, f);
}

static uint64_t landed(struct pool *p)
{
    struct pool_stats st;
    pool_get_stats(p, &st);
    return st.bytes_landed;
}

/* A sequential writer: the first write lands in a whole buffer, the next
 * in its tail, in place (the hold is the landing itself), and the two
 * leave as one request. */
static void test_sequential_in_place(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_FIFO);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_landing l;
    struct pool_fill f, f1;
    struct fake_counts c;

    assert(pool_land_begin(p, 0, 16 * K, false, &l) == 0);
    assert(l.room == 64 * K);
    void *first = l.mem;
    assert(land(p, &l, 128 * K, 16 * K, 1, true, &f1) == 16 * K);
    assert(f1.nhold == 1 && f1.hold[0].mem == first);
    pool_land_end(p, &l);
    assert(l.req == NULL);
    assert(pool_land_begin(p, 144 * K, 16 * K, false, &l) == 0);
    assert(l.room == 48 * K && (char *) l.mem == (char *) first + 16 * K);
    assert(land(p, &l, 144 * K, 16 * K, 2, true, &f) == 16 * K);
    assert(f.nhold == 1 && f.hold[0].mem == (char *) first + 16 * K);
    pool_land_end(p, &l);
    assert(landed(p) == 32 * K);
    assert(has_pattern(first, 128 * K, 16 * K, 1));
    pool_hold_release(f1.hold[0].ref);
    pool_hold_release(f.hold[0].ref);
    pool_drain(p);
    fake_quiesce(x, &c);
    assert(c.writes == 1 && c.write_bytes == 32 * K);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d + 128 * K, 128 * K, 16 * K, 1));
    assert(has_pattern(d + 144 * K, 144 * K, 16 * K, 2));
    assert(is_zero(d, 128 * K) && is_zero(d + 160 * K, (1u << 20) - 160 * K));
    pool_destroy(p);
    fake_close(x);
}

/* The buffer under a landing is sent when a drain wants it (the loop
 * may wait for the next request for ever); the landing then cannot be
 * committed in place, and its bytes are still intact for the copy. */
static void test_drain_sends_under_landing(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_FIFO);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_landing l;
    struct pool_fill f;
    struct fake_counts c;

    assert(write_pattern(p, 0, 16 * K, 1) == 16 * K);
    assert(pool_land_begin(p, 16 * K, 16 * K, false, &l) == 0);
    assert(l.room == 48 * K);
    memset(l.mem, 0xee, l.room);
    pool_drain(p);                /* returns: the landing is not waited on */
    fake_quiesce(x, &c);
    assert(c.writes == 1 && c.write_bytes == 16 * K);
    struct pool_stats st;         /* answered: in use only by the landing */
    pool_get_stats(p, &st);
    assert(st.bufs_in_use == 0 && st.bytes_acked == 16 * K);
    fill_pattern(l.mem, 16 * K, 16 * K, 2);
    assert(pool_land_commit(p, &l, 16 * K, 16 * K, false, &f) == -EAGAIN);
    /* The loop's fallback: the usual path, from a copy of the landing. */
    unsigned char copy[16 * K];
    memcpy(copy, l.mem, sizeof copy);
    pool_land_end(p, &l);
    assert(pool_write(p, 16 * K, copy, sizeof copy) == 16 * K);
    pool_drain(p);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 16 * K, 1));
    assert(has_pattern(d + 16 * K, 16 * K, 16 * K, 2));
    assert(is_zero(d + 32 * K, (1u << 20) - 32 * K));
    assert(landed(p) == 0);
    pool_destroy(p);
    fake_close(x);
}

/* While a landing lasts, no other write lands in it, not even one that
 * extends that buffer exactly where the landing is: it goes to a buffer
 * of its own.  A landed write committed after it at the same offset is
 * newer, and wins on the disk. */
static void test_others_never_write_into_landing(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_FIFO);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_landing l;
    struct pool_fill f;

    assert(write_pattern(p, 0, 16 * K, 1) == 16 * K);
    assert(pool_land_begin(p, 16 * K, 16 * K, false, &l) == 0);
    memset(l.mem, 0xee, l.room);
    assert(write_pattern(p, 16 * K, 32 * K, 3) == 32 * K);  /* older */
    for (size_t i = 0; i < l.room; i++)
        assert(((unsigned char *) l.mem)[i] == 0xee);
    assert(land(p, &l, 16 * K, 16 * K, 4, false, &f) == 16 * K);   /* newer */
    pool_land_end(p, &l);
    pool_drain(p);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 16 * K, 1));
    assert(has_pattern(d + 16 * K, 16 * K, 16 * K, 4));
    assert(has_pattern(d + 32 * K, 32 * K, 16 * K, 3));
    pool_destroy(p);
    fake_close(x);
}

/* A whole-buffer landing takes a write anywhere, also over buffered
 * bytes (those are older: sent first).  A tail landing takes only the
 * write that extends its buffer. */
static void test_where_landings_apply(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_FIFO);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_landing l;
    struct pool_fill f;

    assert(write_pattern(p, 256 * K, 32 * K, 1) == 32 * K);
    assert(pool_land_begin(p, 0, 48 * K, false, &l) == 0);
    assert(l.room == 64 * K);                   /* no tail with 48K room */
    assert(land(p, &l, 264 * K, 16 * K, 2, false, &f) == 16 * K);
    pool_land_end(p, &l);
    assert(pool_land_begin(p, 280 * K, 16 * K, false, &l) == 0);
    assert(l.room == 48 * K);                   /* the tail of that one */
    fill_pattern(l.mem, 400 * K, 16 * K, 3);
    assert(pool_land_commit(p, &l, 400 * K, 16 * K, false, &f) == -EAGAIN);
    pool_land_end(p, &l);
    pool_drain(p);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d + 256 * K, 256 * K, 8 * K, 1));
    assert(has_pattern(d + 264 * K, 264 * K, 16 * K, 2));
    assert(has_pattern(d + 280 * K, 280 * K, 8 * K, 1));
    assert(is_zero(d + 288 * K, (1u << 20) - 288 * K));
    assert(landed(p) == 16 * K);
    pool_destroy(p);
    fake_close(x);
}

/* Zero runs in a landed write become write-zeroes, as through
 * pool_write(); the hold is a private copy. */
static void test_zero_runs(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_FIFO);
    struct pool *p = make_pool(x, 256 * K, 1024 * K);
    struct pool_landing l;
    struct pool_fill f;
    struct fake_counts c;

    memset(fake_disk(x), 0xaa, 1u << 20);
    assert(pool_land_begin(p, 0, 192 * K, false, &l) == 0);
    fill_pattern(l.mem, 0, 192 * K, 5);
    memset((char *) l.mem + 64 * K, 0, 64 * K);
    static unsigned char want[192 * K];
    memcpy(want, l.mem, sizeof want);
    const void *landing_mem = l.mem;
    assert(pool_land_commit(p, &l, 0, 192 * K, true, &f) == 192 * K);
    assert(f.nhold == 1 && f.hold[0].len == 192 * K);
    assert(f.hold[0].mem != landing_mem);             /* a private copy */
    assert(memcmp(f.hold[0].mem, want, 192 * K) == 0);
    pool_land_end(p, &l);
    pool_drain(p);
    fake_quiesce(x, &c);
    assert(memcmp(fake_disk(x), want, sizeof want) == 0);
    assert(c.zero_bytes == 64 * K && c.write_bytes == 128 * K);
    assert(landed(p) == 0);
    pool_hold_release(f.hold[0].ref);
    pool_destroy(p);
    fake_close(x);
}

/* An unused landing leaves nothing behind: no buffer in use, nothing
 * sent, and a tail landing's buffer can be extended again. */
static void test_unused_landing(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_FIFO);
    struct pool *p = make_pool(x, 64 * K, 256 * K);
    struct pool_landing l;
    struct pool_stats st;
    struct fake_counts c;

    assert(pool_land_begin(p, 0, 16 * K, false, &l) == 0);
    memset(l.mem, 0xee, 16 * K);
    pool_get_stats(p, &st);       /* holds nothing of anyone's: not in use */
    assert(st.bufs_in_use == 0);
    pool_land_end(p, &l);
    pool_get_stats(p, &st);
    assert(st.bufs_in_use == 0);
    assert(write_pattern(p, 0, 16 * K, 1) == 16 * K);
    assert(pool_land_begin(p, 16 * K, 16 * K, false, &l) == 0);
    pool_land_end(p, &l);
    assert(write_pattern(p, 16 * K, 16 * K, 2) == 16 * K);
    pool_drain(p);
    fake_quiesce(x, &c);
    assert(c.writes == 1 && c.write_bytes == 32 * K);   /* one buffer */
    pool_get_stats(p, &st);
    assert(st.bufs_in_use == 0 && st.bytes_landed == 0);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 16 * K, 1) && has_pattern(d + 16 * K, 16 * K,
                                                        16 * K, 2));
    assert(is_zero(d + 32 * K, (1u << 20) - 32 * K));
    pool_destroy(p);
    fake_close(x);
}

/* A small pool never gives its last buffer to a landing (a writer
 * waiting for one would wait on the next request); a pool of four or
 * more does, and without wait there is no landing when none is free. */
static void test_last_buffer(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_MANUAL);
    struct pool *p = make_pool(x, 64 * K, 128 * K);   /* two buffers */
    struct pool_landing l;

    assert(write_pattern(p, 0, 64 * K, 1) == 64 * K); /* sealed, in flight */
    assert(pool_land_begin(p, 64 * K, 16 * K, true, &l) == -EAGAIN);
    assert(l.req == NULL);
    fake_complete_all(x);
    pool_drain(p);
    pool_destroy(p);
    fake_close(x);

    x = open_disk(1u << 20, FAKE_MANUAL);
    p = make_pool(x, 64 * K, 256 * K);                /* four buffers */
    for (unsigned i = 0; i < 3; i++)
        assert(write_pattern(p, i * 64 * K, 64 * K, 1) == 64 * K);
    assert(pool_land_begin(p, 192 * K, 16 * K, false, &l) == 0);
    struct pool_landing l2;
    assert(pool_land_begin(p, 0, 16 * K, false, &l2) == -EAGAIN);
    pool_land_end(p, &l);
    fake_complete_all(x);
    pool_drain(p);
    assert(has_pattern(fake_disk(x), 0, 192 * K, 1));
    pool_destroy(p);
    fake_close(x);
}

struct waiter {
    struct pool *p;
    struct pool_landing l;
    atomic_bool done;
    int r;
};

static void *wait_landing(void *arg)
{
    struct waiter *w = arg;
    w->r = pool_land_begin(w->p, 0, 16 * K, true, &w->l);
    atomic_store(&w->done, true);
    return NULL;
}

/* Streaming writes: with wait, a landing waits for a buffer as the
 * write would, and gets the first one back. */
static void test_wait_for_buffer(void)
{
    struct nbdx *x = open_disk(1u << 20, FAKE_MANUAL);
    struct pool *p = make_pool(x, 64 * K, 256 * K);   /* four buffers */
    struct waiter w = { .p = p };
    pthread_t t;
    struct pool_fill f;

    for (unsigned i = 0; i < 4; i++)
        assert(write_pattern(p, i * 64 * K, 64 * K, 1) == 64 * K);
    fake_reset_sleepers();
    assert(pthread_create(&t, NULL, wait_landing, &w) == 0);
    fake_wait_sleeper("landing", 1);
    assert(!atomic_load(&w.done));
    fake_complete(x, fake_wait_op(x, NBDX_OP_WRITE), 0);
    pthread_join(t, NULL);
    assert(w.r == 0 && w.l.room == 64 * K);
    assert(land(p, &w.l, 512 * K, 64 * K, 2, false, &f) == 64 * K);
    pool_land_end(p, &w.l);
    fake_set_auto(x, FAKE_FIFO, 0);
    pool_drain(p);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 256 * K, 1));
    assert(has_pattern(d + 512 * K, 512 * K, 64 * K, 2));
    pool_destroy(p);
    fake_close(x);
}

/* Random sequences of landed and copied writes, drains and unused
 * landings, against a model of the disk. */
static void test_model(unsigned seed)
{
    const uint64_t size = 1u << 20;
    struct nbdx *x = open_disk(size, FAKE_RANDOM);
    struct pool *p = make_pool(x, 64 * K, 512 * K);
    unsigned char *model = calloc(1, size);
    uint64_t next = 0;

    srand(seed);
    fake_set_auto(x, FAKE_RANDOM, seed);
    for (unsigned op = 0; op < 3000; op++) {
        int k = rand() % 10;
        uint64_t off = rand() % 3 ? next
                                  : (uint64_t) (rand() % (size / 512)) * 512;
        size_t len = (size_t) (rand() % 64 + 1) * 512;
        if (off + len > size)
            len = (size_t) (size - off);
        if (k == 0) {
            pool_drain(p);
            continue;
        }
        if (k < 6) {
            struct pool_landing l;
            struct pool_fill f;
            if (pool_land_begin(p, next, 32 * K, rand() % 2, &l) < 0)
                goto copy;
            if (rand() % 5 == 0) {            /* not a write */
                pool_land_end(p, &l);
                continue;
            }
            if (len > l.room)
                len = l.room;
            fill_pattern(l.mem, off, len, op);
            if (rand() % 8 == 0)
                memset(l.mem, 0, len);
            memcpy(model + off, l.mem, len);
            ssize_t r = pool_land_commit(p, &l, off, len, false, &f);
            if (r == -EAGAIN) {
                unsigned char *copy = malloc(len);
                memcpy(copy, l.mem, len);
                pool_land_end(p, &l);
                assert(pool_write(p, off, copy, len) == (ssize_t) len);
                free(copy);
            } else {
                assert(r == (ssize_t) len);
                pool_land_end(p, &l);
            }
            next = off + len;
            continue;
        }
    copy:
        {
            unsigned char *src = malloc(len);
            fill_pattern(src, off, len, op);
            memcpy(model + off, src, len);
            assert(pool_write(p, off, src, len) == (ssize_t) len);
            free(src);
            next = off + len;
        }
    }
    pool_drain(p);
    fake_quiesce(x, NULL);
    assert(memcmp(fake_disk(x), model, size) == 0);
    struct pool_stats st;
    pool_get_stats(p, &st);
    assert(st.bytes_landed > 0 && st.bufs_in_use == 0);
    free(model);
    pool_destroy(p);
    fake_close(x);
}

int main(void)
{
    test_sequential_in_place();
    test_drain_sends_under_landing();
    test_others_never_write_into_landing();
    test_where_landings_apply();
    test_zero_runs();
    test_unused_landing();
    test_last_buffer();
    test_wait_for_buffer();
    for (unsigned seed = 1; seed <= 20; seed++)
        test_model(seed);
    printf("test-pool-land: ok\n");
    return 0;
}
