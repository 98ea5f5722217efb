/* digest/verify-log.c: the one place the verify library writes diagnostics.
 * The hook is set once, before any thread uses the library. */
#include <stdarg.h>
#include <stdio.h>

#include "digest/verify-sink.h"

static void (*log_fn)(const char *line);

void verify_set_log(void (*fn)(const char *line))
{
    log_fn = fn;
}

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
    if (log_fn)
        log_fn(msg);
    else    /* one stdio call: lines from two worker threads don't mix */
        fprintf(stderr, "nbdferry-verify: %s\n", msg);
}
