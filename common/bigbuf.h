/* common/bigbuf.h: a large data buffer (a pool buffer, a read-ahead
 * chunk) that the kernel fills and we copy out of.  When its size is a
 * multiple of a transparent huge page it is aligned to one and advised
 * MADV_HUGEPAGE: one page fault per 2 MiB on first touch instead of 512,
 * and fewer TLB misses in the copies.  The advice is only advice: a
 * kernel without THP gives small pages.  Free with free(). */
#pragma once
#include <stdlib.h>
#include <sys/mman.h>

#define BIGBUF_HUGE_PAGE (2u << 20)  /* x86-64 and arm64 (4K pages) */

static inline void *bigbuf_alloc(size_t len)
{
    size_t align = len % BIGBUF_HUGE_PAGE == 0 ? BIGBUF_HUGE_PAGE : 4096;
    void *b;

    if (posix_memalign(&b, align, len ? len : 1) != 0)
        return NULL;
    if (align == BIGBUF_HUGE_PAGE)
        (void) madvise(b, len, MADV_HUGEPAGE);
    return b;
}
