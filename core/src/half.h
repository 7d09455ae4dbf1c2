/* half.h - float16 and bfloat16: the scalar conversions (the reference every
 * vector kernel must match bit for bit) and the vector kernels' interface.
 *
 * Conversions to float32 are exact. Conversions from float32 round to nearest,
 * ties to even, overflow to infinity and keep subnormals (no flush to zero).
 * Every NaN result is the one positive quiet NaN of the format (float16 0x7e00,
 * bfloat16 0x7fc0): the sign and payload of a NaN coming out of the hardware's
 * float32 arithmetic depend on the order in which the compiler put the operands
 * of an addition, so keeping them would let two builds of the same sum, or the
 * scalar and vector code, disagree. */
#ifndef TNT_HALF_H
#define TNT_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { TNT_F16_NAN = 0x7e00, TNT_BF16_NAN = 0x7fc0 };

static inline float tnt_f16_to_f32(uint16_t h) {
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

static inline uint16_t tnt_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff);
  uint32_t man = x & 0x7fffff;
  if (exp == 255) return man ? (uint16_t)TNT_F16_NAN : (uint16_t)(sign | 0x7c00); /* nan / inf */
  int32_t e = exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);                                 /* overflow -> inf */
  if (e <= 0) {                                                                  /* subnormal or zero */
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

static inline float tnt_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t tnt_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return TNT_BF16_NAN;
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* One pass of the vector kernels: per element i,
 *   v = b[i]; if scale: v = half(float(v * factor)) (the product in double);
 *   if a: v = half(a[i] + v); if divide: v = half(v / (float)divisor); dst[i] = v
 * which are the roundings of tnt_scale, tnt_reduce_sum and tnt_divide (dtype.h)
 * applied one after the other. dst may alias a or b. */
typedef struct {
  const uint16_t *a; /* the addend, or NULL */
  int scale, divide;
  double factor;
  int divisor;
} tnt_half_op_t;

/* Kernels exist only where the compiler targets x86; callers check
 * tnt_half_level_best() (dtype.h) before calling one. */
void tnt_half_apply_avx2(int bf16, uint16_t *dst, const uint16_t *b, const tnt_half_op_t *op, size_t n);
void tnt_half_apply_avx512(int bf16, uint16_t *dst, const uint16_t *b, const tnt_half_op_t *op, size_t n);

#endif
