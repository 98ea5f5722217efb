/* Unit test for common/uuid.h: version and variant bits, and no two
 * alike in a few thousand. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/uuid.h"

#define N 4096

static int cmp(const void *a, const void *b) { return memcmp(a, b, 16); }

int main(void)
{
    static uint8_t u[N][16];

    for (int i = 0; i < N; i++) {
        uuid_v4(u[i]);
        assert((u[i][6] & 0xf0) == 0x40);
        assert((u[i][8] & 0xc0) == 0x80);
    }
    qsort(u, N, 16, cmp);
    for (int i = 1; i < N; i++)
        assert(memcmp(u[i - 1], u[i], 16) != 0);
    printf("uuid: ok\n");
    return 0;
}
