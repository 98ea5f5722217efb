/* tests/unit/test-pool-own.c: buffer ownership, seen from the bytes,
 * over the scripted transport in fake-nbdx.c.
 *
 * The promises under test, each the way a broken one would show in a
 * plain build (no sanitizer needed): memory the pool lends stays the
 * borrower's, byte for byte, while the rest of the pool is written
 * through, sent, answered and reused many times over with other bytes.
 *  - a landing (pool_land_begin() .. pool_land_end()): its memory, whether
 *    a buffer's free tail or a whole buffer, committed or not, and also
 *    after its buffer was sent and answered;
 *  - a fill's hold (pool_fill_commit(..., hold = true)), in place or a
 *    private copy (a write with zero chunks), until pool_hold_release();
 *  - a landed write's hold (pool_land_commit(..., hold = true)), which
 *    outlives pool_land_end().
 * A pool that gave such memory back early hands it to the next write,
 * whose different pattern shows here.  Every test also checks the bytes
 * that reached the disk.
 */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake-nbdx.h"
#include "pool-pattern.h"
#include "common/iszero.h"
#include "transport/pool.h"

#define K 1024u
#define REQ (64 * K)              /* request size: one buffer */
#define NBUFS 4
#define DISK (4u << 20)
#define CHURN_OFF (1u << 20)      /* where the churn writes go */
#define CHURN_BUFS 32             /* eight times the pool */
#define CHURN_SEED 77
#define ZERO_OFF (3u << 20)       /* past the churn */

static struct nbdx *open_disk(void)
{
    struct nbdx *x = fake_open(DISK, true, 0);
    memset(fake_disk(x), 0, DISK);
    fake_set_auto(x, FAKE_FIFO, 0);       /* replies flow, oldest first */
    return x;
}

static struct pool *make_pool(struct nbdx *x)
{
    struct pool_config cfg = { .request_size = REQ, .pool_size = NBUFS * REQ,
                               .depth = 8, .idle_ms = 60000 };
    struct pool *p;
    int r = pool_create(&cfg, x, nbdx_info(x)->size, &p);
    assert(r == 0);
    return p;
}

static void write_pattern(struct pool *p, uint64_t off, size_t len,
                          unsigned seed)
{
    unsigned char *src = malloc(len);
    fill_pattern(src, off, len, seed);
    assert(pool_write(p, off, src, len) == (ssize_t) len);
    free(src);
}

/* Everything the pool does not lend out is written whole, sent, answered
 * and reused, over and over: whole-buffer writes (each seals its buffer),
 * drained two at a time, so every free buffer comes back each round. */
static void churn(struct pool *p)
{
    for (unsigned i = 0; i < CHURN_BUFS; i++) {
        write_pattern(p, CHURN_OFF + (uint64_t) i * REQ, REQ, CHURN_SEED);
        if (i % 2)
            pool_drain(p);
    }
    pool_drain(p);
}

static void assert_churn_landed(struct nbdx *x)
{
    fake_quiesce(x, NULL);
    assert(has_pattern(fake_disk(x) + CHURN_OFF, CHURN_OFF,
                       (size_t) CHURN_BUFS * REQ, CHURN_SEED));
}

static bool all_bytes(const void *mem, size_t len, unsigned char c)
{
    const unsigned char *b = mem;
    for (size_t i = 0; i < len; i++)
        if (b[i] != c)
            return false;
    return true;
}

/* The free tail of a buffer lent to the receive loop, the buffer then
 * sent and answered (a drain does not wait for the landing), the pool
 * churned: the tail still holds what the loop put there. */
static void test_tail_landing_outlives_reply(void)
{
    struct nbdx *x = open_disk();
    struct pool *p = make_pool(x);
    struct pool_landing l;

    write_pattern(p, 0, 16 * K, 1);
    assert(pool_land_begin(p, 16 * K, 16 * K, false, &l) == 0);
    assert(l.room == REQ - 16 * K);       /* the tail of that buffer */
    memset(l.mem, 0xee, l.room);
    pool_drain(p);
    struct pool_stats st;
    pool_get_stats(p, &st);
    assert(st.bytes_acked == 16 * K);     /* its buffer was answered */
    churn(p);
    assert(all_bytes(l.mem, l.room, 0xee));
    pool_land_end(p, &l);
    assert_churn_landed(x);
    assert(has_pattern(fake_disk(x), 0, 16 * K, 1));
    assert(is_zero(fake_disk(x) + 16 * K, CHURN_OFF - 16 * K));
    pool_destroy(p);
    fake_close(x);
}

/* A whole buffer lent and never used: nobody else writes into it. */
static void test_whole_landing_unused(void)
{
    struct nbdx *x = open_disk();
    struct pool *p = make_pool(x);
    struct pool_landing l;

    assert(pool_land_begin(p, 0, 16 * K, false, &l) == 0);
    assert(l.room == REQ);
    memset(l.mem, 0xee, l.room);
    churn(p);
    assert(all_bytes(l.mem, l.room, 0xee));
    pool_land_end(p, &l);
    assert_churn_landed(x);
    assert(is_zero(fake_disk(x), CHURN_OFF));
    pool_destroy(p);
    fake_close(x);
}

/* A write committed where it landed, without a hold: sent, answered,
 * the pool churned, and until pool_land_end() the landing's memory still
 * holds the write (committed bytes) and what the loop put past it. */
static void test_committed_landing_until_end(void)
{
    struct nbdx *x = open_disk();
    struct pool *p = make_pool(x);
    struct pool_landing l;
    struct pool_fill f;

    assert(pool_land_begin(p, 0, 16 * K, false, &l) == 0);
    assert(l.room == REQ);
    memset(l.mem, 0xee, l.room);
    fill_pattern(l.mem, 512 * K, 32 * K, 2);
    assert(pool_land_commit(p, &l, 512 * K, 32 * K, false, &f) == 32 * K);
    assert(f.nhold == 0);
    pool_drain(p);
    churn(p);
    assert(has_pattern(l.mem, 512 * K, 32 * K, 2));
    assert(all_bytes((char *) l.mem + 32 * K, REQ - 32 * K, 0xee));
    pool_land_end(p, &l);
    assert_churn_landed(x);
    assert(has_pattern(fake_disk(x) + 512 * K, 512 * K, 32 * K, 2));
    pool_destroy(p);
    fake_close(x);
}

/* A landed write's hold outlives the landing: after pool_land_end(), the
 * reply and the churn, it still reads the write, until released. */
static void test_landing_hold_until_release(void)
{
    struct nbdx *x = open_disk();
    struct pool *p = make_pool(x);
    struct pool_landing l;
    struct pool_fill f;

    write_pattern(p, 0, 16 * K, 1);
    assert(pool_land_begin(p, 16 * K, 16 * K, false, &l) == 0);
    fill_pattern(l.mem, 16 * K, 16 * K, 3);
    assert(pool_land_commit(p, &l, 16 * K, 16 * K, true, &f) == 16 * K);
    assert(f.nhold == 1 && f.hold[0].mem == l.mem);   /* in place */
    pool_land_end(p, &l);
    pool_drain(p);
    churn(p);
    assert(f.hold[0].off == 16 * K && f.hold[0].len == 16 * K);
    assert(has_pattern(f.hold[0].mem, 16 * K, 16 * K, 3));
    pool_hold_release(f.hold[0].ref);
    churn(p);                             /* released: the pool has it back */
    assert_churn_landed(x);
    assert(has_pattern(fake_disk(x), 0, 16 * K, 1));
    assert(has_pattern(fake_disk(x) + 16 * K, 16 * K, 16 * K, 3));
    pool_destroy(p);
    fake_close(x);
}

/* Reserve, fill from src, commit with a hold. */
static void fill_held(struct pool *p, uint64_t off, const unsigned char *src,
                      size_t len, struct pool_fill *f)
{
    assert(pool_fill_begin(p, off, len, f) == 0);
    size_t pos = 0;
    for (unsigned i = 0; i < f->nseg; pos += f->seg[i++].len)
        memcpy(f->seg[i].mem, src + pos, f->seg[i].len);
    assert(pos == len);
    assert(pool_fill_commit(p, f, 0, true) == (ssize_t) len);
}

/* A fill's holds, in place across two buffers and as a private copy
 * (zero chunks go as write-zeroes), read the write after its reply and
 * the churn, until released. */
static void test_fill_holds_until_release(void)
{
    struct nbdx *x = open_disk();
    struct pool *p = make_pool(x);
    struct pool_fill f, fz;
    unsigned char *src = malloc(REQ + 32 * K);
    unsigned char *zsrc = malloc(2 * REQ);

    fill_pattern(src, 32 * K, REQ + 32 * K, 4);
    write_pattern(p, 0, 32 * K, 1);       /* the fill extends this buffer */
    fill_held(p, 32 * K, src, REQ + 32 * K, &f);
    assert(f.nhold == 2);                 /* one hold per buffer */
    fill_pattern(zsrc, ZERO_OFF, 2 * REQ, 5);
    memset(zsrc + REQ, 0, REQ);          /* a zero chunk */
    fill_held(p, ZERO_OFF, zsrc, 2 * REQ, &fz);
    assert(fz.nhold == 1 && fz.hold[0].len == 2 * REQ);
    pool_drain(p);
    churn(p);
    size_t pos = 0;
    for (unsigned i = 0; i < f.nhold; pos += f.hold[i++].len) {
        assert(f.hold[i].off == 32 * K + pos);
        assert(memcmp(f.hold[i].mem, src + pos, f.hold[i].len) == 0);
    }
    assert(pos == REQ + 32 * K);
    assert(memcmp(fz.hold[0].mem, zsrc, 2 * REQ) == 0);
    for (unsigned i = 0; i < f.nhold; i++)
        pool_hold_release(f.hold[i].ref);
    pool_hold_release(fz.hold[0].ref);
    churn(p);
    assert_churn_landed(x);
    const unsigned char *d = fake_disk(x);
    assert(has_pattern(d, 0, 32 * K, 1));
    assert(memcmp(d + 32 * K, src, REQ + 32 * K) == 0);
    assert(memcmp(d + ZERO_OFF, zsrc, 2 * REQ) == 0);
    free(src);
    free(zsrc);
    pool_destroy(p);
    fake_close(x);
}

/* test-pool-own [NAME]: every test, or only the one named (to see which
 * of them a broken pool fails). */
int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        { "tail-landing", test_tail_landing_outlives_reply },
        { "whole-landing", test_whole_landing_unused },
        { "committed-landing", test_committed_landing_until_end },
        { "landing-hold", test_landing_hold_until_release },
        { "fill-holds", test_fill_holds_until_release },
    };
    unsigned ran = 0;

    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (argc < 2 || strcmp(argv[1], tests[i].name) == 0) {
            tests[i].fn();
            ran++;
        }
    assert(ran > 0);
    printf("test-pool-own: ok\n");
    return 0;
}
