/* Unit test for common/err.h: the code comes back with or without a
 * message buffer, the message is formatted, and a long one is cut to fit. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"

int main(void)
{
    struct nbdf_err err = { "" };
    char long_arg[2000];

    assert(nbdf_errf(NULL, -EINVAL, "ignored %d", 1) == -EINVAL);
    assert(nbdf_errf(&err, -EFBIG, "size %u over %s", 7u, "limit") == -EFBIG);
    assert(strcmp(err.msg, "size 7 over limit") == 0);
    memset(long_arg, 'x', sizeof long_arg - 1);
    long_arg[sizeof long_arg - 1] = 0;
    assert(nbdf_errf(&err, -EINVAL, "%s", long_arg) == -EINVAL);
    assert(strlen(err.msg) == sizeof err.msg - 1);
    printf("err: ok\n");
    return 0;
}
