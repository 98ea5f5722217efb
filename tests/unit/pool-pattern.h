/* tests/unit/pool-pattern.h: the byte pattern the pool unit tests
 * write and look for: a function of the disk offset and a seed, never
 * 0 (so a zeroed or stale byte shows). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline unsigned char pattern(uint64_t off, unsigned seed)
{
    return (unsigned char) ((off * 7 + seed * 31) % 251 + 1);
}

static inline void fill_pattern(unsigned char *buf, uint64_t off, size_t len,
                                unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(off + i, seed);
}

static inline bool has_pattern(const unsigned char *buf, uint64_t off,
                               size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != pattern(off + i, seed))
            return false;
    return true;
}
