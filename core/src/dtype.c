/* dtype.c - reduction kernels. Written as plain loops over restrict pointers so
 * that -O3 vectorizes them; float16/bfloat16 convert in software (portable, and
 * the memory traffic dominates anyway). Integer sums and (whole) prescales wrap
 * (two's complement), with no undefined behaviour. */
#include "dtype.h"

#include <math.h>
#include <string.h>

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

static inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff);
  uint32_t man = x & 0x7fffff;
  if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0)); /* inf / nan */
  int32_t e = exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);                         /* overflow -> inf */
  if (e <= 0) {                                                          /* subnormal or zero */
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = (uint32_t)(e << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into the exponent: correct */
  return (uint16_t)(sign | half);
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#define SUM_LOOP(T, UT)                                                              \
  do {                                                                               \
    T *restrict d_ = (T *)dst;                                                       \
    const T *a_ = (const T *)a, *b_ = (const T *)b;                                  \
    for (size_t i = 0; i < n; i++) d_[i] = (T)((UT)a_[i] + (UT)b_[i]);               \
  } while (0)

void tnt_reduce_sum(tnt_dtype_t dtype, void *dst, const void *a, const void *b, size_t n) {
  switch (dtype) {
    case TNT_FLOAT32: SUM_LOOP(float, float); break;
    case TNT_FLOAT64: SUM_LOOP(double, double); break;
    case TNT_INT32: SUM_LOOP(int32_t, uint32_t); break;
    case TNT_INT64: SUM_LOOP(int64_t, uint64_t); break;
    case TNT_FLOAT16: {
      uint16_t *d = dst;
      const uint16_t *x = a, *y = b;
      for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(f16_to_f32(x[i]) + f16_to_f32(y[i]));
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *d = dst;
      const uint16_t *x = a, *y = b;
      for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
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
      for (size_t i = 0; i < n; i++) d[i] = f32_to_f16((float)(f16_to_f32(s[i]) * factor));
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *d = dst;
      const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16((float)(bf16_to_f32(s[i]) * factor));
      break;
    }
  }
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

void tnt_divide(tnt_dtype_t dtype, void *dst, const void *src, int divisor, size_t n) {
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
      for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(f16_to_f32(s[i]) / (float)divisor);
      break;
    }
    case TNT_BFLOAT16: {
      uint16_t *d = dst;
      const uint16_t *s = src;
      for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(bf16_to_f32(s[i]) / (float)divisor);
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
