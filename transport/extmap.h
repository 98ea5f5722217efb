/* transport/extmap.h: a set of byte ranges, kept sorted and merged, with
 * a bound on the number of ranges it holds.
 *
 * Used for the ranges known to read as zero (a lossy map: it may forget
 * ranges, which only costs a read or a zeroing that was not needed) and
 * the ranges that must be zeroed before the next flush (an exact map: it
 * never forgets, and refuses an update instead).  A treap (a binary
 * search tree balanced by random priorities) keyed by start, each node
 * also holding its subtree's byte and range counts: every operation below
 * is O(log n) expected, plus O(k) for the k ranges an update swallows.
 * Not thread-safe: the owner locks.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ext {
    uint64_t start, end;                 /* [start, end), start < end */
};

struct ext_node;

struct extmap {
    struct ext_node *root;               /* disjoint, not touching */
    size_t max;                          /* most ranges held */
    bool lossy;                          /* forget rather than refuse */
    uint32_t rng;                        /* treap priorities */
};

/* max: most ranges held (at least 1).  A lossy map keeps within it by
 * forgetting ranges (a subset of the set is always what it holds); an
 * exact map refuses the update that would pass it (-ENOSPC). */
void extmap_init(struct extmap *m, size_t max, bool lossy);
void extmap_free(struct extmap *m);

/* Add or remove [start, end).  An exact map returns -ENOMEM or -ENOSPC
 * and is left as it was; a lossy map never fails (on an allocation
 * failure or at max it forgets: the range added, or the smaller piece
 * of a range split by a removal). */
int extmap_add(struct extmap *m, uint64_t start, uint64_t end);
int extmap_remove(struct extmap *m, uint64_t start, uint64_t end);

/* The first range that ends after pos, if any. */
bool extmap_next(const struct extmap *m, uint64_t pos, struct ext *out);

/* Bytes of [start, end) that are in the set. */
uint64_t extmap_covered(const struct extmap *m, uint64_t start, uint64_t end);

/* Ranges in the set, and ranges that intersect [start, end). */
size_t extmap_count(const struct extmap *m);
size_t extmap_count_in(const struct extmap *m, uint64_t start, uint64_t end);
