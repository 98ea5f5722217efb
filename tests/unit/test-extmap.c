/* tests/unit/test-extmap.c: transport/extmap.c against a bitmap model.
 *
 * Random adds and removes over a small universe of units (each unit a
 * block of bytes, placed low or right below UINT64_MAX), with maps of
 * small and large bounds, and with allocations that fail at random.
 * After every operation:
 *  - an exact map holds exactly the model (an update it refused left the
 *    map and the model as they were);
 *  - a lossy map holds a subset of the model, and exactly the model while
 *    it has never been at its bound;
 *  - the tree is well formed: ranges sorted, disjoint, not touching, the
 *    count within the bound; next(), covered() and count_in() agree with
 *    a walk of the ranges.
 */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/extmap.h"

#define UNITS 300

/* Link-time wrapper (-Wl,--wrap=malloc): fail when told to. */
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static unsigned fail_percent;
static uint32_t rng = 12345;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

void *__wrap_malloc(size_t n)
{
    if (fail_percent && rnd() % 100 < fail_percent)
        return NULL;
    return __real_malloc(n);
}

struct world {
    uint64_t base, unit;
    bool model[UNITS];
};

static uint64_t at(const struct world *w, unsigned u) { return w->base + u * w->unit; }

/* Read the map back into a bitmap, checking its shape on the way. */
static void read_back(const struct world *w, const struct extmap *m,
                      bool out[UNITS])
{
    struct ext e;
    uint64_t pos = 0;
    size_t n = 0;
    uint64_t prev_end = 0;
    bool first = true;

    memset(out, 0, UNITS);
    while (extmap_next(m, pos, &e)) {
        assert(e.start < e.end);
        assert(first || e.start > prev_end);        /* disjoint, apart */
        assert((e.start - w->base) % w->unit == 0);
        assert((e.end - w->base) % w->unit == 0);
        for (uint64_t u = (e.start - w->base) / w->unit;
             u < (e.end - w->base) / w->unit; u++) {
            assert(u < UNITS);
            out[u] = true;
        }
        assert(extmap_covered(m, e.start, e.end) == e.end - e.start);
        assert(extmap_count_in(m, e.start, e.end) == 1);
        prev_end = e.end;
        first = false;
        n++;
        if (e.end == UINT64_MAX)
            break;
        pos = e.end;
    }
    assert(n == extmap_count(m));
    assert(n <= m->max);
}

static void check_queries(const struct world *w, const struct extmap *m,
                          const bool have[UNITS])
{
    for (int k = 0; k < 20; k++) {
        unsigned a = rnd() % (UNITS + 1), b = rnd() % (UNITS + 1);
        if (a > b) {
            unsigned t = a;
            a = b;
            b = t;
        }
        uint64_t bytes = 0;
        size_t runs = 0;
        for (unsigned u = a; u < b; u++) {
            bytes += have[u] ? w->unit : 0;
            if (have[u] && (u == a || !have[u - 1]))
                runs++;
        }
        /* A run cut by a at its start still counts once. */
        assert(extmap_covered(m, at(w, a), at(w, b)) == bytes);
        assert(extmap_count_in(m, at(w, a), at(w, b)) == runs);
        /* next() from the middle of a unit. */
        if (a < UNITS) {
            struct ext e;
            bool got = extmap_next(m, at(w, a) + w->unit / 2, &e);
            unsigned u = a;
            while (u < UNITS && !have[u])
                u++;
            assert(got == (u < UNITS));
            if (got)
                assert(e.start <= at(w, u) + (u == a ? w->unit / 2 : 0) &&
                       e.end > at(w, u));
        }
    }
}

static void run(uint64_t base, uint64_t unit, size_t max, bool lossy,
                unsigned fail, unsigned ops)
{
    struct world w = { .base = base, .unit = unit };
    struct extmap m;
    bool have[UNITS];
    bool ever_full = false;

    extmap_init(&m, max, lossy);
    for (unsigned i = 0; i < ops; i++) {
        unsigned a = rnd() % UNITS, len = 1 + rnd() % (rnd() % 4 ? 8 : UNITS);
        unsigned b = a + len > UNITS ? UNITS : a + len;
        bool add = rnd() % 2;
        size_t count = extmap_count(&m);

        fail_percent = fail;
        int r = add ? extmap_add(&m, at(&w, a), at(&w, b))
                    : extmap_remove(&m, at(&w, a), at(&w, b));
        fail_percent = 0;
        assert(r == 0 || (!lossy && (r == -ENOMEM || r == -ENOSPC)));
        if (r == -ENOSPC)
            assert(count >= max);
        if (count >= max - 1)
            ever_full = true;
        if (r == 0)
            for (unsigned u = a; u < b; u++)
                w.model[u] = add;
        read_back(&w, &m, have);
        for (unsigned u = 0; u < UNITS; u++) {
            if (!lossy || (!ever_full && !fail))
                assert(have[u] == w.model[u]);
            else
                assert(!have[u] || w.model[u]);     /* never more */
        }
        check_queries(&w, &m, have);
    }
    /* Whole-universe queries on the way out. */
    uint64_t total = 0;
    for (unsigned u = 0; u < UNITS; u++)
        total += have[u] ? unit : 0;
    assert(extmap_covered(&m, 0, UINT64_MAX) == total);
    extmap_free(&m);
    assert(extmap_count(&m) == 0);
}

int main(void)
{
    static const uint64_t bases[] = { 0, 4096, UINT64_MAX - UNITS * 4096ull };
    unsigned runs = 0;

    for (unsigned b = 0; b < 3; b++)
        for (int lossy = 0; lossy < 2; lossy++) {
            run(bases[b], 4096, SIZE_MAX, lossy, 0, 3000);
            run(bases[b], 4096, 4, lossy, 0, 3000);
            run(bases[b], 1, 17, lossy, 0, 3000);
            run(bases[b], 512, 1000, lossy, 20, 3000);
            run(bases[b], 512, 3, lossy, 30, 3000);
            runs += 5;
        }
    /* Big: O(log n) updates make 200k scattered splits quick. */
    struct extmap m;
    extmap_init(&m, 1 << 16, true);
    assert(extmap_add(&m, 0, 1ull << 40) == 0);
    for (uint64_t i = 0; i < 200000; i++) {
        uint64_t off = ((uint64_t) rnd() << 12) % (1ull << 40);
        assert(extmap_remove(&m, off, off + 4096) == 0);
    }
    assert(extmap_count(&m) <= 1 << 16 && extmap_count(&m) > 1 << 15);
    assert(extmap_covered(&m, 0, 1ull << 40) < 1ull << 40);
    extmap_free(&m);
    printf("test-extmap: %u model runs of 3000 operations: ok\n", runs);
    return 0;
}
