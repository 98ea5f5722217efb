/* common/rounding.h: rounding to a multiple.  ROUND_UP, ROUND_DOWN and
 * IS_ALIGNED want a power of two (a mask does the work); DIV_ROUND_UP
 * takes any non-zero divisor.  Callers keep x far enough below the type's
 * maximum that x + n - 1 does not wrap. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

#define IS_POWER_OF_2(x) ((x) != 0 && ((x) & ((x) - 1)) == 0)

#define ROUND_UP(x, n) (((x) + (n) - 1) & ~((__typeof__(x)) (n) - 1))
#define ROUND_DOWN(x, n) ((x) & ~((__typeof__(x)) (n) - 1))
#define IS_ALIGNED(x, n) (((x) & ((__typeof__(x)) (n) - 1)) == 0)

#define DIV_ROUND_UP(x, n) (((x) + (n) - 1) / (n))
