/* common/unitlist.h: the allocated units (grains, clusters) a format's
 * synthesizer stores, as an increasing array of unit numbers that the
 * allocate calls (data extents in disk order) append to.  No I/O. */
#pragma once
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* Append u to a[0..*n) (room for *cap, grown by doubling): 0, also when
 * u is already the last (extents share a unit); -EINVAL when u is below
 * the last (extents out of order); -ENOMEM. */
static inline int unitlist_push(uint32_t **a, uint64_t *n, uint64_t *cap,
                                uint32_t u)
{
    if (*n && (*a)[*n - 1] >= u)
        return (*a)[*n - 1] == u ? 0 : -EINVAL;
    if (*n == *cap) {
        uint64_t c = *cap ? *cap * 2 : 256;
        uint32_t *p = realloc(*a, c * sizeof *p);
        if (!p)
            return -ENOMEM;
        *a = p;
        *cap = c;
    }
    (*a)[(*n)++] = u;
    return 0;
}

/* A synthesizer's allocate: the units of 'unit' bytes that the data
 * extent [off, off+len) of a disk of disk_size bytes touches; -EINVAL
 * for an extent not inside the disk, else as unitlist_push(). */
static inline int unitlist_allocate(uint32_t **a, uint64_t *n, uint64_t *cap,
                                    uint64_t disk_size, uint64_t unit,
                                    uint64_t off, uint64_t len)
{
    if (off >= disk_size || len == 0 || len > disk_size - off)
        return -EINVAL;
    for (uint64_t u = off / unit; u <= (off + len - 1) / unit; u++) {
        int r = unitlist_push(a, n, cap, (uint32_t) u);
        if (r < 0)
            return r;
    }
    return 0;
}
