/* tools/sync/err.c: nbdferry-sync's error messages (sync.h), below every
 * file of the program that reports one. */
#include <stdarg.h>
#include <stdio.h>

#include "tools/sync/sync.h"

void sync_err(const char *fmt, ...)
{
    va_list ap;

    fputs("nbdferry-sync: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
