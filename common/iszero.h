/* common/iszero.h: is this buffer all zero bytes?  As nbdkit's iszero.h:
 * check the first 16 bytes by hand (most non-zero data fails there), then
 * let memcmp() compare the buffer with itself shifted by 16, which the C
 * library does a word or a vector at a time. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static inline bool is_zero(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    size_t head = len < 16 ? len : 16;

    for (size_t i = 0; i < head; i++)
        if (p[i])
            return false;
    return len <= 16 || memcmp(p, p + 16, len - 16) == 0;
}
