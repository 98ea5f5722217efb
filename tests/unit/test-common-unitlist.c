/* Unit test for common/unitlist.h: extents in disk order fill an
 * increasing list, a unit two extents share is stored once, extents out
 * of order or outside the disk are refused, the list grows past its
 * first allocation. */
#undef NDEBUG
#include <assert.h>
#include <stdio.h>

#include "common/unitlist.h"

int main(void)
{
    uint32_t *a = NULL;
    uint64_t n = 0, cap = 0, size = 1 << 20, u = 4096;

    assert(unitlist_allocate(&a, &n, &cap, size, u, 0, 1) == 0);
    assert(n == 1 && a[0] == 0);
    assert(unitlist_allocate(&a, &n, &cap, size, u, 100, 8000) == 0);
    assert(n == 2 && a[1] == 1);                      /* 0 shared */
    assert(unitlist_allocate(&a, &n, &cap, size, u, 0, 1) == -EINVAL);
    assert(unitlist_allocate(&a, &n, &cap, size, u, size, 1) == -EINVAL);
    assert(unitlist_allocate(&a, &n, &cap, size, u, 8192, 0) == -EINVAL);
    assert(unitlist_allocate(&a, &n, &cap, size, u, 8192, size) == -EINVAL);
    assert(unitlist_allocate(&a, &n, &cap, size, 1, 8192, size - 8192) == 0);
    assert(n == 2 + size - 8192 && cap >= n);
    for (uint64_t i = 1; i < n; i++)
        assert(a[i] > a[i - 1]);
    free(a);
    printf("unitlist: ok\n");
    return 0;
}
