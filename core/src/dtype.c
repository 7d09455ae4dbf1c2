/* dtype.c - reduction kernels. Written as plain loops over restrict pointers so
 * that -O3 vectorizes them. float16/bfloat16 go to the vector kernels of
 * half_simd.c where the CPU has F16C/AVX2 or AVX-512 (chosen once, or forced by
 * TNT_SIMD / tnt_half_level_set), else convert in software (half.h); both give
 * the same bits. Integer sums and (whole) prescales wrap (two's complement),
 * with no undefined behaviour. */
#include "dtype.h"

#include <math.h>
#include <string.h>

#include "half.h"

int tnt_dtype_valid(int d) { return d >= TNT_FLOAT16 && d <= TNT_INT64; }

size_t tnt_dtype_size(tnt_dtype_t d) {
  switch (d) {
    case TNT_FLOAT16:
    case TNT_BFLOAT16: return 2;
    case TNT_FLOAT32:
    case TNT_INT32: return 4;
    case TNT_FLOAT64:
    case TNT_INT64: return 8;
  }
  return 0;
}

const char *tnt_dtype_name(tnt_dtype_t d) {
  static const char *names[] = {"float16", "bfloat16", "float32", "float64", "int32", "int64"};
  return tnt_dtype_valid(d) ? names[d] : "invalid";
}

/* ---- which code does float16/bfloat16 arithmetic ---- */

static int half_level = -1; /* a tnt_half_level_t; -1 until the first use. Atomic: any thread may read it. */

tnt_half_level_t tnt_half_level_best(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init(); /* also checks that the OS saves the vector registers (XGETBV) */
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f")) return TNT_HALF_AVX512;
  if (avx2) return TNT_HALF_AVX2;
#endif
  return TNT_HALF_SCALAR;
}

tnt_half_level_t tnt_half_level_set(tnt_half_level_t level) {
  tnt_half_level_t best = tnt_half_level_best();
  if ((int)level > (int)best || (int)level < 0) level = best;
  __atomic_store_n(&half_level, (int)level, __ATOMIC_RELAXED);
  return level;
}

tnt_half_level_t tnt_half_level(void) {
  int level = __atomic_load_n(&half_level, __ATOMIC_RELAXED);
  return level >= 0 ? (tnt_half_level_t)level : tnt_half_level_set(tnt_half_level_best());
}

/* 1 when a vector kernel did the whole pass, 0 when the caller's scalar loop must. */
static int half_vector(tnt_dtype_t dtype, void *dst, const void *b, const tnt_half_op_t *op, size_t n) {
  const int bf16 = dtype == TNT_BFLOAT16;
  if (dtype != TNT_FLOAT16 && dtype != TNT_BFLOAT16) return 0;
  switch (tnt_half_level()) {
    case TNT_HALF_AVX512: tnt_half_apply_avx512(bf16, dst, b, op, n); return 1;
    case TNT_HALF_AVX2: tnt_half_apply_avx2(bf16, dst, b, op, n); return 1;
    case TNT_HALF_SCALAR: break;
  }
  return 0;
}

#define SUM_LOOP(T, UT)                                                              \
  do {                                                                               \
    T *restrict d_ = (T *)dst;                                                       \
    const T *a_ = (const T *)a, *b_ = (const T *)b;                                  \
    for (size_t i = 0; i < n; i++) d_[i] = (T)((UT)a_[i] + (UT)b_[i]);               \
  } while (0)

void tnt_reduce_sum(tnt_dtype_t dtype, void *dst, const void *a, const void *b, size_t n) {
  if (half_vector(dtype, dst, b, &(tnt_half_op_t){.a = a}, n)) return;
  switch (dtype) {
    case TNT_FLOAT32: SUM_LOOP(float, float); break;
    case TNT_FLOAT64: SUM_LOOP(double, double); break;
    case TNT_INT32: SUM_LOOP(int32_t, uint32_t); break;
    case TNT_INT64: SUM_LOOP(int64_t, uint64_t); break;
    case TNT_FLOAT16: {
      uint16_t *d = dst;
      const uint16_t *x = a, *y = b;
      for (size_t i = 0; i < n; i++) d[i] = tnt_f32_to_f16(tnt_f16_to_f32(x[i]) + tnt_f16_to_f32(y[i]));
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *d = dst;
      const uint16_t *x = a, *y = b;
      for (size_t i = 0; i < n; i++) d[i] = tnt_f32_to_bf16(tnt_bf16_to_f32(x[i]) + tnt_bf16_to_f32(y[i]));
      break;
    }
  }
}

/* in place, or between distinct buffers through restrict pointers (vectorized) */
#define SCALE_LOOP(T)                                                 \
  do {                                                                \
    const T f_ = (T)factor;                                           \
    if (dst == src) {                                                 \
      T *d_ = dst;                                                    \
      for (size_t i = 0; i < n; i++) d_[i] *= f_;                     \
    } else {                                                          \
      T *restrict d_ = dst;                                           \
      const T *restrict s_ = src;                                     \
      for (size_t i = 0; i < n; i++) d_[i] = s_[i] * f_;              \
    }                                                                 \
  } while (0)

void tnt_scale(tnt_dtype_t dtype, void *dst, const void *src, double factor, size_t n) {
  if (half_vector(dtype, dst, src, &(tnt_half_op_t){.scale = 1, .factor = factor}, n)) return;
  switch (dtype) {
    case TNT_FLOAT32: SCALE_LOOP(float); break;
    case TNT_FLOAT64: SCALE_LOOP(double); break;
    case TNT_INT32: { /* a whole factor (the API refuses others), wrapping like the sum */
      int32_t *d = dst;
      const int32_t *s = src;
      const uint32_t k = (uint32_t)(int64_t)factor;
      for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)s[i] * k);
      break;
    }
    case TNT_INT64: {
      int64_t *d = dst;
      const int64_t *s = src;
      const uint64_t k = (uint64_t)(int64_t)factor;
      for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)s[i] * k);
      break;
    }
    case TNT_FLOAT16: {
      uint16_t *d = dst;
      const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = tnt_f32_to_f16((float)(tnt_f16_to_f32(s[i]) * factor));
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *d = dst;
      const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = tnt_f32_to_bf16((float)(tnt_bf16_to_f32(s[i]) * factor));
      break;
    }
  }
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

void tnt_divide(tnt_dtype_t dtype, void *dst, const void *src, int divisor, size_t n) {
  if (half_vector(dtype, dst, src, &(tnt_half_op_t){.divide = 1, .divisor = divisor}, n)) return;
  switch (dtype) {
    case TNT_INT32: {
      int32_t *d = dst;
      const int32_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = (int32_t)floor_div(s[i], divisor);
      break;
    }
    case TNT_INT64: {
      int64_t *d = dst;
      const int64_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = floor_div(s[i], divisor);
      break;
    }
    case TNT_FLOAT32: { /* a true division, like NumPy's mean, not a multiply by 1/N */
      float *d = dst, f = (float)divisor;
      const float *s = src;
      for (size_t i = 0; i < n; i++) d[i] = s[i] / f;
      break;
    }
    case TNT_FLOAT64: {
      double *d = dst, f = (double)divisor;
      const double *s = src;
      for (size_t i = 0; i < n; i++) d[i] = s[i] / f;
      break;
    }
    case TNT_FLOAT16: {
      uint16_t *d = dst;
      const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = tnt_f32_to_f16(tnt_f16_to_f32(s[i]) / (float)divisor);
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *d = dst;
      const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = tnt_f32_to_bf16(tnt_bf16_to_f32(s[i]) / (float)divisor);
      break;
    }
  }
}

/* The common cases in one vectorizable loop each; the build disables FMA
 * contraction (-ffp-contract=off), so the product is rounded before the sum,
 * as in tnt_scale followed by tnt_reduce_sum. */
#define SCALED_LOOP(T)                                                          \
  do {                                                                          \
    T *restrict d_ = (T *)dst;                                                  \
    const T *restrict a_ = (const T *)a, *restrict b_ = (const T *)b;           \
    const T f_ = (T)factor, n_ = (T)divisor;                                    \
    if (divisor > 1)                                                            \
      for (size_t i = 0; i < n; i++) d_[i] = (a_[i] + b_[i] * f_) / n_;         \
    else                                                                        \
      for (size_t i = 0; i < n; i++) d_[i] = a_[i] + b_[i] * f_;                \
  } while (0)

void tnt_reduce_scaled(tnt_dtype_t dtype, void *dst, const void *a, const void *b, double factor, int divisor, size_t n) {
  enum { BLOCK = 2048 };
  if (dtype == TNT_FLOAT32 && dst != b) {
    SCALED_LOOP(float);
    return;
  }
  if (dtype == TNT_FLOAT64 && dst != b) {
    SCALED_LOOP(double);
    return;
  }
  const tnt_half_op_t op = {.a = a, .scale = factor != 1.0, .factor = factor, .divide = divisor > 1, .divisor = divisor};
  if (half_vector(dtype, dst, b, &op, n)) return; /* one pass in registers, the same roundings */
  uint64_t scaled[BLOCK]; /* 16 KiB: one block of the largest dtype stays in L1 */
  const size_t esz = tnt_dtype_size(dtype);
  for (size_t done = 0; done < n; done += BLOCK) {
    size_t len = n - done < BLOCK ? n - done : BLOCK;
    uint8_t *d = (uint8_t *)dst + done * esz;
    const uint8_t *x = (const uint8_t *)a + done * esz, *y = (const uint8_t *)b + done * esz;
    if (factor != 1.0) {
      tnt_scale(dtype, scaled, y, factor, len);
      y = (const uint8_t *)scaled;
    }
    tnt_reduce_sum(dtype, d, x, y, len);
    if (divisor > 1) tnt_divide(dtype, d, d, divisor, len);
  }
}
