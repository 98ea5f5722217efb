/* Unit test for common/bigbuf.h: a multiple of 2 MiB comes aligned to
 * 2 MiB (so the kernel can back it with huge pages), anything else to a
 * page; every byte is writable and reads back; size 0 still allocates. */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/bigbuf.h"

static void check(size_t len, size_t align)
{
    unsigned char *b = bigbuf_alloc(len);

    assert(b);
    assert((uintptr_t) b % align == 0);
    memset(b, 0x5a, len);
    for (size_t i = 0; i < len; i += 4093)
        assert(b[i] == 0x5a);
    if (len)
        assert(b[len - 1] == 0x5a);
    free(b);
}

int main(void)
{
    check(2u << 20, BIGBUF_HUGE_PAGE);
    check(8u << 20, BIGBUF_HUGE_PAGE);
    check(1u << 20, 4096);
    check(3 * 4096 + 17, 4096);
    check(0, 4096);
    printf("test-common-bigbuf: ok\n");
    return 0;
}
