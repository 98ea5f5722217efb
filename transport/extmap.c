#include "transport/extmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void extmap_init(struct extmap *m) { memset(m, 0, sizeof *m); }

void extmap_free(struct extmap *m)
{
    free(m->v);
    extmap_init(m);
}

void extmap_clear(struct extmap *m) { m->n = 0; }

size_t extmap_find(const struct extmap *m, uint64_t pos)
{
    size_t lo = 0, hi = m->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->v[mid].end > pos)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static int reserve(struct extmap *m, size_t extra)
{
    if (m->n + extra <= m->cap)
        return 0;
    size_t cap = m->cap ? m->cap * 2 : 16;
    while (cap < m->n + extra)
        cap *= 2;
    struct ext *v = realloc(m->v, cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    m->v = v;
    m->cap = cap;
    return 0;
}

/* Replace v[i, j) with the k ranges in repl. */
static void splice(struct extmap *m, size_t i, size_t j,
                   const struct ext *repl, size_t k)
{
    memmove(&m->v[i + k], &m->v[j], (m->n - j) * sizeof *m->v);
    memcpy(&m->v[i], repl, k * sizeof *repl);
    m->n = m->n - (j - i) + k;
}

int extmap_add(struct extmap *m, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    if (reserve(m, 1) < 0)
        return -ENOMEM;

    /* First range that touches or follows start (end >= start). */
    size_t i = extmap_find(m, start);
    if (i > 0 && m->v[i - 1].end == start)
        i--;
    size_t j = i;
    struct ext e = { start, end };
    while (j < m->n && m->v[j].start <= end) {
        if (m->v[j].start < e.start)
            e.start = m->v[j].start;
        if (m->v[j].end > e.end)
            e.end = m->v[j].end;
        j++;
    }
    splice(m, i, j, &e, 1);
    return 0;
}

int extmap_remove(struct extmap *m, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    size_t i = extmap_find(m, start);
    if (i == m->n || m->v[i].start >= end)
        return 0;
    if (reserve(m, 1) < 0)
        return -ENOMEM;

    struct ext keep[2];
    size_t k = 0;
    if (m->v[i].start < start)
        keep[k++] = (struct ext){ m->v[i].start, start };
    size_t j = i;
    while (j < m->n && m->v[j].start < end)
        j++;
    if (m->v[j - 1].end > end)
        keep[k++] = (struct ext){ end, m->v[j - 1].end };
    splice(m, i, j, keep, k);
    return 0;
}

uint64_t extmap_covered(const struct extmap *m, uint64_t start, uint64_t end)
{
    uint64_t total = 0;

    for (size_t i = extmap_find(m, start); i < m->n && m->v[i].start < end;
         i++) {
        uint64_t s = m->v[i].start > start ? m->v[i].start : start;
        uint64_t e = m->v[i].end < end ? m->v[i].end : end;
        total += e - s;
    }
    return total;
}

bool extmap_contains(const struct extmap *m, uint64_t start, uint64_t end)
{
    if (start >= end)
        return true;
    size_t i = extmap_find(m, start);
    return i < m->n && m->v[i].start <= start && m->v[i].end >= end;
}

bool extmap_intersects(const struct extmap *m, uint64_t start, uint64_t end)
{
    size_t i = extmap_find(m, start);
    return start < end && i < m->n && m->v[i].start < end;
}
