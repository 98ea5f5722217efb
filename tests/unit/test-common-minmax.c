/* Unit test for common/minmax.h: results, types, one evaluation each. */
#undef NDEBUG
#include <assert.h>
#include <stdint.h>
#include <stdio.h>

#include "common/minmax.h"

static int calls;
static uint64_t counted(uint64_t v) { calls++; return v; }

int main(void)
{
    assert(MIN(1, 2) == 1 && MIN(2, 1) == 1 && MIN(3, 3) == 3);
    assert(MAX(1, 2) == 2 && MAX(2, 1) == 2 && MAX(-1, -5) == -1);
    assert(MIN(UINT64_MAX, (uint64_t) 1 << 40) == (uint64_t) 1 << 40);
    assert(MAX(UINT64_MAX, (uint64_t) 0) == UINT64_MAX);
    assert(MIN(0.5, 0.25) == 0.25);

    uint64_t a = 10;
    assert(MIN(counted(a), counted(20)) == 10 && calls == 2);
    assert(MAX(counted(a), counted(20)) == 20 && calls == 4);
    int i = 0;
    assert(MIN(i++, 5) == 0 && i == 1);     /* side effect once */
    /* Nested uses do not shadow each other's temporaries. */
    assert(MIN(MAX(1, 7), MIN(9, MAX(3, 4))) == 4);
    printf("minmax: ok\n");
    return 0;
}
