/* dtype.h - element sizes and the arithmetic of reductions. */
#ifndef TNT_DTYPE_H
#define TNT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "tarantella.h"

int tnt_dtype_valid(int dtype);
const char *tnt_dtype_name(tnt_dtype_t dtype);

/* dst[i] = a[i] + b[i] for n elements (dst may alias a or b). float16/bfloat16
 * are added in float32 and rounded to nearest even, as NCCL does. */
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

#endif
