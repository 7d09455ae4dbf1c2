/* dtype.h - element sizes and the arithmetic of reductions. */
#ifndef TNT_DTYPE_H
#define TNT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "tarantella.h"

int tnt_dtype_valid(int dtype);
const char *tnt_dtype_name(tnt_dtype_t dtype);

/* dst[i] = a[i] + b[i] for n elements (dst may alias a or b). float16/bfloat16
 * are added in float32 and rounded to nearest even, as NCCL does; a NaN result
 * is the format's positive quiet NaN (half.h says why). */
void tnt_reduce_sum(tnt_dtype_t dtype, void *dst, const void *a, const void *b, size_t n);
/* dst[i] = src[i] * factor (integers: rounded toward zero after a double product). */
void tnt_scale(tnt_dtype_t dtype, void *dst, const void *src, double factor, size_t n);
/* dst[i] = src[i] / divisor, the average's final step (integers: floor division). */
void tnt_divide(tnt_dtype_t dtype, void *dst, const void *src, int divisor, size_t n);

/* dst[i] = (a[i] + scale(b[i], factor)) / divisor, with exactly the roundings
 * of tnt_scale, tnt_reduce_sum and tnt_divide applied one after the other
 * (factor 1 and divisor 1 skip their step). Done in L1-sized blocks, so the
 * three steps cost one pass over memory. */
void tnt_reduce_scaled(tnt_dtype_t dtype, void *dst, const void *a, const void *b, double factor, int divisor, size_t n);

/* Which code does float16/bfloat16 arithmetic (the values of TNT_SIMD). Every
 * level gives the same bits (core/test/test_half.c); the vector ones are several
 * times faster. */
typedef enum { TNT_HALF_SCALAR, TNT_HALF_AVX2, TNT_HALF_AVX512 } tnt_half_level_t;
/* The fastest level this CPU (and OS) supports: AVX-512F, F16C + AVX2, or scalar. */
tnt_half_level_t tnt_half_level_best(void);
/* Use `level` from now on, process-wide (one above the best this CPU has, or an
 * invalid one, means the best); returns the level in use. tnt_init applies
 * TNT_SIMD with it. */
tnt_half_level_t tnt_half_level_set(tnt_half_level_t level);
/* The level in use (the best until one is set). */
tnt_half_level_t tnt_half_level(void);

#endif
