/* verify/ranges.c: naming where two sides differ (sink.h). */
#include <errno.h>
#include <stdlib.h>

#include "verify/sink.h"

static int push_range(struct verify_range **v, size_t *n, size_t *cap,
                      uint64_t off, uint64_t len)
{
    if (*n && (*v)[*n - 1].off + (*v)[*n - 1].len == off) {
        (*v)[*n - 1].len += len;
        return 0;
    }
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        struct verify_range *nv = realloc(*v, c * sizeof *nv);
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = (struct verify_range) { off, len };
    return 0;
}

int verify_name_ranges(size_t nregions, uint64_t region, uint64_t length,
                       bool (*differs)(const void *ctx, size_t i),
                       const void *ctx, struct verify_range **out, size_t *n,
                       uint64_t *bytes)
{
    size_t cap = 0;

    *out = NULL;
    *n = 0;
    *bytes = 0;
    for (size_t i = 0; i < nregions; i++) {
        if (!differs(ctx, i))
            continue;
        uint64_t off = (uint64_t) i * region;
        uint64_t len = length - off < region ? length - off : region;
        if (push_range(out, n, &cap, off, len) < 0) {
            verify_err("out of memory");
            return -ENOMEM;
        }
        *bytes += len;
    }
    return 0;
}
