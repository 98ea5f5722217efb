/* tools/verify/log.c: the one place that writes diagnostics. */
#include <stdarg.h>
#include <stdio.h>

#include "tools/verify/verify.h"

void verify_err(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *c = msg; *c; c++)        /* keep it to exactly one line */
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    /* A single stdio call: lines from the two worker threads don't mix. */
    fprintf(stderr, "nbdferry-verify: %s\n", msg);
}
