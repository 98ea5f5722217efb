/* digest/verify-ranges.c: naming where two sides differ (verify-sink.h). */
#include <errno.h>
#include <stdlib.h>

#include "common/vector.h"
#include "digest/verify-sink.h"

DEFINE_VECTOR_TYPE(range_vector, struct verify_range, 16);

static int push_range(struct range_vector *v, uint64_t off, uint64_t len)
{
    if (v->len && v->ptr[v->len - 1].off + v->ptr[v->len - 1].len == off) {
        v->ptr[v->len - 1].len += len;
        return 0;
    }
    if (range_vector_append(v, (struct verify_range) { off, len }) < 0)
        return -ENOMEM;
    return 0;
}

int verify_name_ranges(size_t nregions, uint64_t region, uint64_t length,
                       bool (*differs)(const void *ctx, size_t i),
                       const void *ctx, struct verify_range **out, size_t *n,
                       uint64_t *bytes)
{
    struct range_vector v = { 0 };
    int r = 0;

    *bytes = 0;
    for (size_t i = 0; i < nregions; i++) {
        if (!differs(ctx, i))
            continue;
        uint64_t off = (uint64_t) i * region;
        uint64_t len = length - off < region ? length - off : region;
        if (push_range(&v, off, len) < 0) {
            verify_err("out of memory");
            r = -ENOMEM;
            break;
        }
        *bytes += len;
    }
    *out = v.ptr;                 /* on failure too: the ranges so far */
    *n = v.len;
    return r;
}
