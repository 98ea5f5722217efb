/* transport/extmap.h: a set of byte ranges, kept sorted and merged.
 *
 * Used for the ranges known to read as zero and the ranges that must be
 * zeroed before the next flush.  Not thread-safe: the owner locks.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ext {
    uint64_t start, end;                 /* [start, end), start < end */
};

struct extmap {
    struct ext *v;                       /* sorted, disjoint, not touching */
    size_t n, cap;
};

void extmap_init(struct extmap *m);
void extmap_free(struct extmap *m);
void extmap_clear(struct extmap *m);

/* Add or remove [start, end).  -ENOMEM leaves the map as it was. */
int extmap_add(struct extmap *m, uint64_t start, uint64_t end);
int extmap_remove(struct extmap *m, uint64_t start, uint64_t end);

/* Index of the first range that ends after pos (n if none). */
size_t extmap_find(const struct extmap *m, uint64_t pos);

/* Bytes of [start, end) that are in the set. */
uint64_t extmap_covered(const struct extmap *m, uint64_t start, uint64_t end);

/* True if every byte of [start, end) is in the set. */
bool extmap_contains(const struct extmap *m, uint64_t start, uint64_t end);

/* True if any byte of [start, end) is in the set. */
bool extmap_intersects(const struct extmap *m, uint64_t start, uint64_t end);
