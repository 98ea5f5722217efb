/* common/err.h: the one error channel of the format libraries (vhd/, vmdk/,
 * qcow2/, vhdx/) and the readers over them.  A function that validates input
 * returns a negative errno and, given a 'struct nbdf_err *' (may be NULL),
 * writes one human-readable line naming the rule that was broken.  Callers
 * print err.msg once, where they report the failure. */
#pragma once
#include <stdarg.h>
#include <stdio.h>

struct nbdf_err {
    char msg[1024];                 /* one line, cut to fit; "" when no error */
};

/* Printf into err (if any) and return code.  Always returns code. */
static inline int nbdf_errf(struct nbdf_err *err, int code, const char *fmt,
                            ...) __attribute__((format(printf, 3, 4)));
static inline int nbdf_errf(struct nbdf_err *err, int code, const char *fmt,
                            ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* A decoder's sticky error: the first code and message stay (*code 0:
 * none yet); returns *code, the first one. */
static inline int nbdf_latchf(int *code, struct nbdf_err *err, int c,
                              const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int nbdf_latchf(int *code, struct nbdf_err *err, int c,
                              const char *fmt, ...)
{
    if (*code == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        *code = c;
    }
    return *code;
}
