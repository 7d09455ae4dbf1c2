/* half_simd.c - float16/bfloat16 arithmetic in vector registers: F16C + AVX2
 * (8 lanes) and AVX-512F (16 lanes), compiled for those targets function by
 * function so that the rest of the core runs on any x86-64; dtype.c calls them
 * only where the CPU has the instructions (tnt_half_level_best).
 *
 * The software conversions in half.h cost ~10 operations and a branch per
 * element and do not vectorize; here a conversion is one instruction per 8 or
 * 16 elements. The results are the scalar code's bits (test_half.c checks every
 * length 0..67 and a large one on NaN, infinities, subnormals, overflow and
 * ties):
 *  - float16 <-> float32 is vcvtph2ps / vcvtps2ph with round-to-nearest-even,
 *    which convert subnormals exactly (MXCSR's flush-to-zero does not apply);
 *  - bfloat16 -> float32 is a shift, float32 -> bfloat16 the same integer
 *    rounding as the scalar code (AVX512-BF16's vcvtneps2bf16 would flush
 *    float32 subnormals to zero);
 *  - products are taken in double and rounded to float32, as tnt_scale does;
 *  - NaN lanes become the canonical quiet NaN before a conversion (half.h).
 * The last partial vector goes through the same code from a zero-padded copy. */
#include "half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c")))
#define AVX512 __attribute__((target("avx512f,avx2,f16c")))

/* The tail: the last n % W elements, padded with zeros to one vector, through
 * the same one-vector step, so no element takes a different instruction. */
#define APPLY_LOOP(W, HALF_T, ONE, STORE)                                                    \
  do {                                                                                       \
    size_t i = 0;                                                                            \
    for (; i + W <= n; i += W) {                                                             \
      HALF_T h = ONE(bf16, b + i, op->a ? op->a + i : NULL, op, f, div);                    \
      STORE(dst + i, h);                                                                     \
    }                                                                                        \
    if (i < n) {                                                                             \
      uint16_t tb[W] = {0}, ta[W] = {0}, td[W];                                              \
      memcpy(tb, b + i, (n - i) * 2);                                                        \
      if (op->a) memcpy(ta, op->a + i, (n - i) * 2);                                         \
      STORE(td, ONE(bf16, tb, op->a ? ta : NULL, op, f, div));                               \
      memcpy(dst + i, td, (n - i) * 2);                                                      \
    }                                                                                        \
  } while (0)

/* ---- F16C + AVX2: 8 lanes ---- */

static inline AVX2 __m256 load8(int bf16, const uint16_t *p) {
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

static inline AVX2 __m128i to_half8(int bf16, __m256 v) {
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
  v = _mm256_blendv_ps(v, nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  if (!bf16) return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256i x = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  x = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

static inline AVX2 __m256 from_half8(int bf16, __m128i h) {
  if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

static inline AVX2 __m256 round8(int bf16, __m256 v) { return from_half8(bf16, to_half8(bf16, v)); }

static inline AVX2 __m256 scale8(__m256 v, __m256d f) {
  __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), f));
  __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), f));
  return _mm256_set_m128(hi, lo);
}

/* One vector of the pass in half.h: each step rounds to the format before the next. */
static inline AVX2 __m128i one8(int bf16, const uint16_t *b, const uint16_t *a, const tnt_half_op_t *op, __m256d f,
                                __m256 div) {
  __m256 v = load8(bf16, b);
  if (op->scale) {
    v = scale8(v, f);
    if (a || op->divide) v = round8(bf16, v);
  }
  if (a) {
    v = _mm256_add_ps(load8(bf16, a), v);
    if (op->divide) v = round8(bf16, v);
  }
  if (op->divide) v = _mm256_div_ps(v, div);
  return to_half8(bf16, v);
}

static inline AVX2 void store8(uint16_t *p, __m128i h) { _mm_storeu_si128((__m128i *)p, h); }

AVX2 void tnt_half_apply_avx2(int bf16, uint16_t *dst, const uint16_t *b, const tnt_half_op_t *op, size_t n) {
  const __m256d f = _mm256_set1_pd(op->factor);
  const __m256 div = _mm256_set1_ps((float)op->divisor);
  APPLY_LOOP(8, __m128i, one8, store8);
}

/* ---- AVX-512F: 16 lanes, the same steps ---- */

static inline AVX512 __m512 from_half16(int bf16, __m256i h) {
  if (bf16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

static inline AVX512 __m512 load16(int bf16, const uint16_t *p) {
  return from_half16(bf16, _mm256_loadu_si256((const __m256i *)p));
}

static inline AVX512 __m256i to_half16(int bf16, __m512 v) {
  v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v,
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  if (!bf16) return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512i x = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  x = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  return _mm512_cvtepi32_epi16(x);
}

static inline AVX512 __m512 round16(int bf16, __m512 v) { return from_half16(bf16, to_half16(bf16, v)); }

static inline AVX512 __m512 scale16(__m512 v, __m512d f) {
  __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), f));
  __m256 hi = _mm512_cvtpd_ps(
      _mm512_mul_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))), f));
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

static inline AVX512 __m256i one16(int bf16, const uint16_t *b, const uint16_t *a, const tnt_half_op_t *op,
                                   __m512d f, __m512 div) {
  __m512 v = load16(bf16, b);
  if (op->scale) {
    v = scale16(v, f);
    if (a || op->divide) v = round16(bf16, v);
  }
  if (a) {
    v = _mm512_add_ps(load16(bf16, a), v);
    if (op->divide) v = round16(bf16, v);
  }
  if (op->divide) v = _mm512_div_ps(v, div);
  return to_half16(bf16, v);
}

static inline AVX512 void store16(uint16_t *p, __m256i h) { _mm256_storeu_si256((__m256i *)p, h); }

AVX512 void tnt_half_apply_avx512(int bf16, uint16_t *dst, const uint16_t *b, const tnt_half_op_t *op, size_t n) {
  const __m512d f = _mm512_set1_pd(op->factor);
  const __m512 div = _mm512_set1_ps((float)op->divisor);
  APPLY_LOOP(16, __m256i, one16, store16);
}

#else /* not x86: tnt_half_level_best() is scalar, these are never called */

void tnt_half_apply_avx2(int bf16, uint16_t *dst, const uint16_t *b, const tnt_half_op_t *op, size_t n) {}
void tnt_half_apply_avx512(int bf16, uint16_t *dst, const uint16_t *b, const tnt_half_op_t *op, size_t n) {}

#endif
