/* common/minmax.h: MIN and MAX that evaluate each argument once (so
 * MIN(len, next_len()) calls next_len() once). */
#pragma once

#define MINMAX_CAT2(a, b) a##b
#define MINMAX_CAT(a, b) MINMAX_CAT2(a, b)

#define MINMAX_(op, x, y, n)                                                 \
    ({                                                                       \
        __typeof__(x) MINMAX_CAT(minmax_x_, n) = (x);                        \
        __typeof__(y) MINMAX_CAT(minmax_y_, n) = (y);                        \
        MINMAX_CAT(minmax_x_, n) op MINMAX_CAT(minmax_y_, n)                 \
            ? MINMAX_CAT(minmax_x_, n) : MINMAX_CAT(minmax_y_, n);           \
    })

#undef MIN
#undef MAX
#define MIN(x, y) MINMAX_(<, x, y, __COUNTER__)
#define MAX(x, y) MINMAX_(>, x, y, __COUNTER__)
