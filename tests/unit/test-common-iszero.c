/* Unit test for common/iszero.h: every length up to past the 16-byte
 * head, a single non-zero byte at every position, unaligned starts. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "common/iszero.h"

int main(void)
{
    static unsigned char buf[4096 + 64];

    assert(is_zero(buf, 0));
    assert(is_zero(NULL, 0));
    for (size_t start = 0; start < 8; start++)
        for (size_t len = 1; len <= 80; len++) {
            assert(is_zero(buf + start, len));
            for (size_t i = 0; i < len; i++) {
                buf[start + i] = 0x01;
                assert(!is_zero(buf + start, len));
                buf[start + i] = 0x80;
                assert(!is_zero(buf + start, len));
                buf[start + i] = 0;
            }
            /* A non-zero byte just outside the range is not looked at. */
            buf[start + len] = 1;
            assert(is_zero(buf + start, len));
            buf[start + len] = 0;
        }
    /* Long buffers: a lone byte in the memcmp part, at the very end. */
    buf[4095] = 7;
    assert(!is_zero(buf, 4096));
    assert(is_zero(buf, 4095));
    buf[4095] = 0;
    assert(is_zero(buf, sizeof buf));
    printf("iszero: ok\n");
    return 0;
}
