/* transport/extmap.c: range sets as treaps with subtree sums.
 *
 * Updates work by cutting the tree at the affected keys (split), editing
 * the few nodes at the cut, and joining the parts again (merge); both
 * recompute the subtree sums on their way back up, so a node is never
 * edited in place while it sits inside a tree.
 */
#include "transport/extmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct ext_node {
    uint64_t start, end;
    uint64_t bytes;                      /* of this subtree */
    size_t count;                        /* ranges in this subtree */
    uint32_t prio;
    struct ext_node *l, *r;
};

static uint64_t bytes_of(const struct ext_node *t) { return t ? t->bytes : 0; }
static size_t count_of(const struct ext_node *t) { return t ? t->count : 0; }

static void pull(struct ext_node *t)
{
    t->bytes = (t->end - t->start) + bytes_of(t->l) + bytes_of(t->r);
    t->count = 1 + count_of(t->l) + count_of(t->r);
}

static uint32_t next_prio(struct extmap *m)
{
    uint32_t x = m->rng;                 /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return m->rng = x;
}

/* Nodes with start < key go to *a, the others to *b. */
static void split(struct ext_node *t, uint64_t key, struct ext_node **a,
                  struct ext_node **b)
{
    if (!t) {
        *a = *b = NULL;
    } else if (t->start < key) {
        split(t->r, key, &t->r, b);
        pull(t);
        *a = t;
    } else {
        split(t->l, key, a, &t->l);
        pull(t);
        *b = t;
    }
}

/* Every key of a is below every key of b. */
static struct ext_node *merge(struct ext_node *a, struct ext_node *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    if (a->prio > b->prio) {
        a->r = merge(a->r, b);
        pull(a);
        return a;
    }
    b->l = merge(a, b->l);
    pull(b);
    return b;
}

static void free_tree(struct ext_node *t)
{
    while (t) {
        free_tree(t->l);
        struct ext_node *r = t->r;
        free(t);
        t = r;
    }
}

/* Detach the last node of *t; NULL if *t is empty. */
static struct ext_node *pop_last(struct ext_node **t)
{
    struct ext_node *n = *t, *last;

    if (!n)
        return NULL;
    while (n->r)
        n = n->r;
    split(*t, n->start, t, &last);
    return last;                         /* a single node */
}

static struct ext_node *node_new(struct extmap *m, uint64_t start,
                                 uint64_t end)
{
    struct ext_node *n = malloc(sizeof *n);
    if (!n)
        return NULL;
    *n = (struct ext_node){ .start = start, .end = end, .prio = next_prio(m) };
    pull(n);
    return n;
}

/* Reset a detached node to [start, end). */
static struct ext_node *node_set(struct ext_node *n, uint64_t start,
                                 uint64_t end)
{
    n->start = start;
    n->end = end;
    n->l = n->r = NULL;
    pull(n);
    return n;
}

void extmap_init(struct extmap *m, size_t max, bool lossy)
{
    memset(m, 0, sizeof *m);
    m->max = max ? max : 1;
    m->lossy = lossy;
    m->rng = 2463534242u;
}

void extmap_free(struct extmap *m)
{
    free_tree(m->root);
    m->root = NULL;
}

size_t extmap_count(const struct extmap *m) { return count_of(m->root); }

int extmap_add(struct extmap *m, uint64_t start, uint64_t end)
{
    struct ext_node *a, *b, *mid, *rest;

    if (start >= end)
        return 0;
    split(m->root, start, &a, &b);
    /* mid: the ranges starting in [start, end], swallowed whole. */
    if (end == UINT64_MAX) {
        mid = b;
        rest = NULL;
    } else
        split(b, end + 1, &mid, &rest);
    struct ext_node *left = pop_last(&a);
    if (left && left->end < start) {
        a = merge(a, left);              /* does not touch */
        left = NULL;
    }
    size_t after = count_of(a) + 1 + count_of(rest);
    struct ext_node *n = NULL;
    uint64_t s = start, e = end;

    if (left) {
        s = left->start;
        if (left->end > e)
            e = left->end;
    }
    struct ext_node *mid_last = pop_last(&mid);
    if (mid_last && mid_last->end > e)
        e = mid_last->end;
    if (left || mid_last) {
        n = left ? left : mid_last;      /* reuse: no allocation */
        if (n == left && mid_last)
            free(mid_last);
    } else if (after <= m->max)
        n = node_new(m, s, e);
    if (!n) {                            /* at max, or out of memory */
        m->root = merge(a, rest);
        return m->lossy ? 0 : after > m->max ? -ENOSPC : -ENOMEM;
    }
    free_tree(mid);
    m->root = merge(merge(a, node_set(n, s, e)), rest);
    return 0;
}

int extmap_remove(struct extmap *m, uint64_t start, uint64_t end)
{
    struct ext_node *a, *b, *mid, *rest;

    if (start >= end)
        return 0;
    split(m->root, start, &a, &b);
    split(b, end, &mid, &rest);          /* mid: starting in [start, end) */
    struct ext_node *left = pop_last(&a);
    struct ext_node *mid_last = pop_last(&mid);

    if (left && left->end > end) {
        /* One range covers [start, end) and more on both sides: two
         * pieces remain, one more range than before. */
        size_t now = count_of(a) + 1 + count_of(rest);
        struct ext_node *right = NULL;
        if (now < m->max)
            right = node_new(m, end, left->end);
        if (!right && !m->lossy) {
            m->root = merge(merge(a, left), rest);
            return now >= m->max ? -ENOSPC : -ENOMEM;
        }
        if (!right && start - left->start < left->end - end) {
            right = node_set(left, end, left->end);   /* forget the left */
            left = NULL;
        }
        if (left)
            node_set(left, left->start, start);
        m->root = merge(merge(a, left), merge(right, rest));
        return 0;
    }
    if (left && left->end > start)
        node_set(left, left->start, start);
    if (mid_last && mid_last->end > end)
        rest = merge(node_set(mid_last, end, mid_last->end), rest);
    else
        free(mid_last);
    free_tree(mid);
    m->root = merge(merge(a, left), rest);
    return 0;
}

bool extmap_next(const struct extmap *m, uint64_t pos, struct ext *out)
{
    const struct ext_node *best = NULL;

    for (const struct ext_node *t = m->root; t;) {
        if (t->end > pos) {
            best = t;
            t = t->l;
        } else
            t = t->r;
    }
    if (best)
        *out = (struct ext){ best->start, best->end };
    return best != NULL;
}

/* Bytes of the set below x. */
static uint64_t bytes_below(const struct ext_node *t, uint64_t x)
{
    uint64_t total = 0;

    while (t) {
        if (t->start >= x) {
            t = t->l;
            continue;
        }
        total += bytes_of(t->l) + ((t->end < x ? t->end : x) - t->start);
        t = t->r;
    }
    return total;
}

uint64_t extmap_covered(const struct extmap *m, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    return bytes_below(m->root, end) - bytes_below(m->root, start);
}

size_t extmap_count_in(const struct extmap *m, uint64_t start, uint64_t end)
{
    size_t starts_before_end = 0, ends_by_start = 0;

    if (start >= end)
        return 0;
    for (const struct ext_node *t = m->root; t;) {
        if (t->start < end) {
            starts_before_end += count_of(t->l) + 1;
            t = t->r;
        } else
            t = t->l;
    }
    for (const struct ext_node *t = m->root; t;) {
        if (t->end <= start) {
            ends_by_start += count_of(t->l) + 1;
            t = t->r;
        } else
            t = t->l;
    }
    return starts_before_end - ends_by_start;
}
