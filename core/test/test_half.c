/* test_half.c - the vector float16/bfloat16 kernels (half_simd.c) give the
 * scalar code's bits. Every operation of dtype.h that takes float16/bfloat16
 * (sum, scale, divide, the fused reduce_scaled, in place or not) runs at the
 * scalar level and at each vector level this CPU has, on every length 0..67 and
 * a large one, on arrays mixing NaNs (quiet, signalling, negative, with
 * payloads), infinities, subnormals, values that overflow and exact ties with
 * random bit patterns; the outputs must be equal bit for bit and nothing past
 * the n-th element may be written. Plus every float16 value against a set of
 * partners, and a few results written out (NaN is canonical, ties go to even).
 * Built and run by test/common/test_c_core.py (or `make -C core test`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "expect.h"
#include "tarantella.h"


/* Awkward float16 and bfloat16 bit patterns: signed zeros, the subnormal range's
 * ends, the largest finite values, infinities, NaNs of every kind, and pairs whose
 * sums or halves are exact ties (2048 + 1 in float16, 256 + 1 in bfloat16). */
static const uint16_t f16_awkward[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x0401, 0x3c00, 0x3c01,
                                       0xbc00, 0x7bff, 0xfbff, 0x7bfe, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01,
                                       0x7d55, 0xffff, 0x6800, 0x6801, 0x0002, 0x0003, 0x3555, 0x7a00};
static const uint16_t bf16_awkward[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x0081, 0x3f80, 0x3f81,
                                        0xbf80, 0x7f7f, 0xff7f, 0x7f7e, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81,
                                        0x7faa, 0xffff, 0x4380, 0x4381, 0x0002, 0x0003, 0x3eab, 0x7f00};
enum { N_AWKWARD = sizeof f16_awkward / sizeof f16_awkward[0] };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint16_t next_random(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint16_t)(rng >> 48);
}

/* half awkward values, half random patterns, in a shuffled order */
static void fill(tnt_dtype_t dtype, uint16_t *p, size_t n) {
  const uint16_t *awk = dtype == TNT_FLOAT16 ? f16_awkward : bf16_awkward;
  for (size_t i = 0; i < n; i++) p[i] = (next_random() & 1) ? awk[next_random() % N_AWKWARD] : next_random();
}

enum { OP_SUM, OP_SUM_INTO_A, OP_SUM_INTO_B, OP_SCALE, OP_SCALE_IN_PLACE, OP_DIVIDE, OP_DIVIDE_IN_PLACE, OP_SCALED,
       OP_SCALED_INTO_A, OP_SCALED_INTO_B, OP_COUNT };

/* Runs operation `op` at the level in use: out gets dst (n elements + canaries). */
static void run_op(int op, tnt_dtype_t dt, uint16_t *out, const uint16_t *a, const uint16_t *b, double factor,
                   int divisor, size_t n) {
  const size_t bytes = n * 2;
  uint16_t *x = malloc(bytes + 2), *y = malloc(bytes + 2);
  memcpy(x, a, bytes);
  memcpy(y, b, bytes);
  switch (op) {
    case OP_SUM: tnt_reduce_sum(dt, out, x, y, n); break;
    case OP_SUM_INTO_A: tnt_reduce_sum(dt, x, x, y, n); memcpy(out, x, bytes); break;
    case OP_SUM_INTO_B: tnt_reduce_sum(dt, y, x, y, n); memcpy(out, y, bytes); break;
    case OP_SCALE: tnt_scale(dt, out, y, factor, n); break;
    case OP_SCALE_IN_PLACE: tnt_scale(dt, y, y, factor, n); memcpy(out, y, bytes); break;
    case OP_DIVIDE: tnt_divide(dt, out, y, divisor, n); break;
    case OP_DIVIDE_IN_PLACE: tnt_divide(dt, y, y, divisor, n); memcpy(out, y, bytes); break;
    case OP_SCALED: tnt_reduce_scaled(dt, out, x, y, factor, divisor, n); break;
    case OP_SCALED_INTO_A: tnt_reduce_scaled(dt, x, x, y, factor, divisor, n); memcpy(out, x, bytes); break;
    case OP_SCALED_INTO_B: tnt_reduce_scaled(dt, y, x, y, factor, divisor, n); memcpy(out, y, bytes); break;
  }
  free(x);
  free(y);
}

static const double factors[] = {1.0, 0.5, 0.25, 1.0 / 3, 3.0, -1.0, 0.0, 1e5, 1e-7, 65520.0 / 65504, 1e300};
static const int divisors[] = {1, 2, 3, 7, 8};
enum { N_FACTORS = sizeof factors / sizeof factors[0], N_DIVISORS = sizeof divisors / sizeof divisors[0] };

/* Compares every vector level the CPU has with the scalar level on arrays of n;
 * returns the number of mismatching cases. */
static int compare_levels(tnt_dtype_t dt, size_t n) {
  const uint16_t canary = 0xa5a5;
  uint16_t *a = malloc(n * 2 + 2), *b = malloc(n * 2 + 2), *want = malloc(n * 2 + 2), *got = malloc(n * 2 + 2);
  int bad = 0;
  fill(dt, a, n);
  fill(dt, b, n);
  for (int op = 0; op < OP_COUNT; op++)
    for (int fi = 0; fi < N_FACTORS; fi++)
      for (int di = 0; di < N_DIVISORS; di++) {
        int uses_factor = op == OP_SCALE || op == OP_SCALE_IN_PLACE || op >= OP_SCALED;
        int uses_divisor = op >= OP_DIVIDE;
        if ((!uses_factor && fi > 0) || (!uses_divisor && di > 0)) continue;
        want[n] = canary;
        tnt_half_level_set(TNT_HALF_SCALAR);
        run_op(op, dt, want, a, b, factors[fi], divisors[di], n);
        for (int level = TNT_HALF_AVX2; level <= (int)tnt_half_level_best(); level++) {
          got[n] = canary;
          if (tnt_half_level_set((tnt_half_level_t)level) != (tnt_half_level_t)level) bad++;
          run_op(op, dt, got, a, b, factors[fi], divisors[di], n);
          if (memcmp(want, got, n * 2) || got[n] != canary) {
            size_t i = 0;
            while (i < n && want[i] == got[i]) i++;
            if (bad++ < 5)
              fprintf(stderr, "%s n=%zu op=%d factor=%g divisor=%d level=%d: element %zu a=%#06x b=%#06x scalar %#06x "
                      "vector %#06x%s\n", tnt_dtype_name(dt), n, op, factors[fi], divisors[di], level, i,
                      i < n ? a[i] : 0, i < n ? b[i] : 0, i < n ? want[i] : 0, i < n ? got[i] : 0,
                      got[n] != canary ? " (wrote past n)" : "");
          }
        }
      }
  free(a);
  free(b);
  free(want);
  free(got);
  return bad;
}

static void test_every_length_and_a_large_one(void) {
  for (int d = 0; d < 2; d++) {
    tnt_dtype_t dt = d ? TNT_BFLOAT16 : TNT_FLOAT16;
    int bad = 0;
    for (size_t n = 0; n <= 67; n++) bad += compare_levels(dt, n);
    bad += compare_levels(dt, 100003);
    EXPECT(bad == 0);
  }
}

/* every one of the 65536 values as a, against awkward partners as b */
static void test_every_value(void) {
  enum { N = 65536 };
  for (int d = 0; d < 2; d++) {
    tnt_dtype_t dt = d ? TNT_BFLOAT16 : TNT_FLOAT16;
    const uint16_t *awk = d ? bf16_awkward : f16_awkward;
    static uint16_t a[N], b[N], want[N + 1], got[N + 1];
    int bad = 0;
    for (size_t i = 0; i < N; i++) a[i] = (uint16_t)i;
    for (int k = 0; k < N_AWKWARD; k++) {
      for (size_t i = 0; i < N; i++) b[i] = awk[k];
      for (int op = OP_SUM; op <= OP_SCALED; op += OP_SCALED - OP_SUM) {
        tnt_half_level_set(TNT_HALF_SCALAR);
        run_op(op, dt, want, b, a, factors[k % N_FACTORS], 1 + k % 5, N);
        for (int level = TNT_HALF_AVX2; level <= (int)tnt_half_level_best(); level++) {
          tnt_half_level_set((tnt_half_level_t)level);
          run_op(op, dt, got, b, a, factors[k % N_FACTORS], 1 + k % 5, N);
          bad += memcmp(want, got, sizeof a) != 0;
        }
      }
    }
    EXPECT(bad == 0);
  }
}

/* Results written out, at every level: the scalar code itself must be right too. */
static void test_known_results(void) {
  for (int level = TNT_HALF_SCALAR; level <= (int)tnt_half_level_best(); level++) {
    tnt_half_level_set((tnt_half_level_t)level);
    uint16_t a[6] = {0x7c01, 0xfe00, 0x7c00, 0x6800, 0x7bff, 0x0001}; /* sNaN, -qNaN, inf, 2048, 65504, tiny */
    uint16_t b[6] = {0x3c00, 0x3c00, 0xfc00, 0x3c00, 0x5000, 0x8001}; /* 1, 1, -inf, 1, 32, -tiny */
    uint16_t d[6];
    tnt_reduce_sum(TNT_FLOAT16, d, a, b, 6);
    /* NaN canonical, inf-inf NaN, 2049 ties to 2048, 65536 overflows, +0 */
    EXPECT(d[0] == 0x7e00 && d[1] == 0x7e00 && d[2] == 0x7e00 && d[3] == 0x6800 && d[4] == 0x7c00 && d[5] == 0);
    uint16_t x[4] = {0xffc1, 0x4380, 0x7f7f, 0x0001}, y[4] = {0x3f80, 0x3f80, 0x7f7f, 0x0001}, z[4];
    tnt_reduce_sum(TNT_BFLOAT16, z, x, y, 4); /* NaN, 256 + 1 ties to 256, overflow, subnormals add */
    EXPECT(z[0] == 0x7fc0 && z[1] == 0x4380 && z[2] == 0x7f80 && z[3] == 0x0002);
    uint16_t s[2] = {0x0001, 0x3c00}, t[2];
    tnt_scale(TNT_FLOAT16, t, s, 0.5, 2); /* half the smallest subnormal is a tie: to even (0) */
    EXPECT(t[0] == 0x0000 && t[1] == 0x3800);
    tnt_divide(TNT_FLOAT16, t, s, 3, 2); /* 1/3 rounds to nearest */
    EXPECT(t[0] == 0x0000 && t[1] == 0x3555);
  }
}

static void test_levels(void) {
  tnt_half_level_t best = tnt_half_level_best();
  EXPECT(tnt_half_level_set(TNT_HALF_SCALAR) == TNT_HALF_SCALAR && tnt_half_level() == TNT_HALF_SCALAR);
  EXPECT(tnt_half_level_set((tnt_half_level_t)99) == best && tnt_half_level() == best);
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) EXPECT(best >= TNT_HALF_AVX2);
  if (best == TNT_HALF_SCALAR) printf("note: this CPU has no F16C+AVX2: only the scalar level was tested\n");
#endif
}

/* tnt_init applies TNT_SIMD (a serial job: no placement variables) */
static void test_environment_sets_the_level(void) {
  setenv("TNT_SIMD", "0", 1);
  EXPECT(tnt_init() == TNT_SUCCESS && tnt_half_level() == TNT_HALF_SCALAR);
  EXPECT(tnt_finalize() == TNT_SUCCESS);
  setenv("TNT_SIMD", "2", 1);
  EXPECT(tnt_init() == TNT_SUCCESS && tnt_half_level() == tnt_half_level_best());
  EXPECT(tnt_finalize() == TNT_SUCCESS);
  setenv("TNT_SIMD", "3", 1);
  EXPECT(tnt_init() == TNT_ERR_INVALID_ARGUMENT && strstr(tnt_last_error(), "TNT_SIMD") != NULL);
  unsetenv("TNT_SIMD");
}

int main(void) {
  test_levels();
  test_environment_sets_the_level();
  test_known_results();
  test_every_length_and_a_large_one();
  test_every_value();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
