/* Unit test for common/rounding.h, against the plain arithmetic. */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>

#include "common/rounding.h"

int main(void)
{
    for (uint64_t n = 1; n <= (1u << 12); n <<= 1) {
        assert(IS_POWER_OF_2(n));
        for (uint64_t x = 0; x < 3 * n + 5; x++) {
            assert(ROUND_UP(x, n) == (x + n - 1) / n * n);
            assert(ROUND_DOWN(x, n) == x / n * n);
            assert(IS_ALIGNED(x, n) == (x % n == 0));
            assert(DIV_ROUND_UP(x, n) == (x + n - 1) / n);
        }
    }
    assert(!IS_POWER_OF_2(0) && !IS_POWER_OF_2(3) && !IS_POWER_OF_2(96));
    /* Large 64-bit values keep their high bits (the mask is widened to
     * x's type before it is inverted). */
    uint64_t big = (1ull << 40) + 5;
    assert(ROUND_DOWN(big, 4096u) == 1ull << 40);
    assert(ROUND_UP(big, 4096u) == (1ull << 40) + 4096);
    assert(IS_ALIGNED(1ull << 40, 1u << 20));
    assert(DIV_ROUND_UP(10u, 3u) == 4 && DIV_ROUND_UP(9u, 3u) == 3);
    printf("rounding: ok\n");
    return 0;
}
