/* tests/unit/stream-cuts.h: feed a whole image file to a forward-only
 * stream decoder the way copy tools do, cut by a seed: pieces of 1 to
 * maxp bytes (maxp 0: the file in one piece); all-zero pieces become
 * forward gaps, holes, or gaps re-punched backwards; a trailing gap is
 * sent as a hole.  For the unit tests and the fuzz targets of every
 * format.  Header-only. */
#ifndef NBDFERRY_STREAM_CUTS_H
#define NBDFERRY_STREAM_CUTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/iszero.h"

struct cuts_stream {
    int (*feed)(void *s, uint64_t off, const void *buf, size_t len);
    int (*hole)(void *s, uint64_t off, uint64_t len);
    uint64_t (*position)(const void *s);
};

/* const struct cuts_stream var over a library's P_stream_feed, _hole
 * and _position. */
#define CUTS_STREAM(var, P)                                                  \
    static int var##_f(void *s, uint64_t o, const void *b, size_t n)         \
    {                                                                        \
        return P##_stream_feed(s, o, b, n);                                  \
    }                                                                        \
    static int var##_h(void *s, uint64_t o, uint64_t n)                      \
    {                                                                        \
        return P##_stream_hole(s, o, n);                                     \
    }                                                                        \
    static uint64_t var##_p(const void *s) { return P##_stream_position(s); }\
    static const struct cuts_stream var = { var##_f, var##_h, var##_p }

static inline uint32_t cuts_next(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

/* The first error, or 0 (the caller finishes the stream). */
static inline int cuts_feed(const struct cuts_stream *c, void *s,
                            const uint8_t *f, size_t len, uint32_t seed,
                            unsigned maxp)
{
    uint32_t x = seed | 1;
    size_t off = 0, gap_at = 0, gap_len = 0;
    int r = 0;
    while (off < len && r == 0) {
        size_t n = maxp ? 1 + cuts_next(&x) % maxp : len;
        if (n > len - off)
            n = len - off;
        unsigned how = maxp ? cuts_next(&x) % 4 : 0;
        if (is_zero(f + off, n) && how) {
            if (how == 1)
                r = c->hole(s, off, n);
            if (!gap_len)
                gap_at = off;
            gap_len = off + n - gap_at;
        } else {
            r = c->feed(s, off, f + off, n);
            if (r == 0 && gap_len && how == 3)
                r = c->hole(s, gap_at, gap_len);        /* re-punch */
            gap_len = 0;
        }
        off += n;
    }
    if (r == 0 && c->position(s) < len)                 /* trailing gap */
        r = c->hole(s, c->position(s), len - c->position(s));
    return r;
}

#endif /* NBDFERRY_STREAM_CUTS_H */
