/* test_core.c - the C core without Python: API misuse, a size-1 job, and the
 * float16/bfloat16 arithmetic of the reduction kernels. Built and run by
 * test/common/test_c_core.py (or `make -C core test`). Prints "N passed, N failed". */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "copy_unaliased.h"
#include "dtype.h"
#include "expect.h"
#include "common.h"
#include "namemap.h"
#include "pause.h"
#include "shape_layout.h"
#include "stream_store.h"
#include "transport/put_copy.h"
#include "tarantella.h"


static uint16_t f16_bits(float f) {
  uint16_t out;
  tnt_scale(TNT_FLOAT16, &out, &(uint16_t){0x3c00} /* 1.0 */, f, 1);
  return out;
}

static void test_half_precision(void) {
  /* 1.0 * f rounds f to the nearest float16 */
  EXPECT(f16_bits(1.0f) == 0x3c00);
  EXPECT(f16_bits(-2.0f) == 0xc000);
  EXPECT(f16_bits(65504.0f) == 0x7bff);       /* largest finite */
  EXPECT(f16_bits(70000.0f) == 0x7c00);       /* overflow -> inf */
  EXPECT(f16_bits(5.9604645e-8f) == 0x0001);  /* smallest subnormal */
  EXPECT(f16_bits(1.0009765625f) == 0x3c01);  /* 1 + 2^-10 */
  EXPECT(f16_bits(1.00048828125f) == 0x3c00); /* halfway, ties to even */
  uint16_t a[3] = {0x3c00, 0x4000, 0x0001}, b[3] = {0x3c00, 0xc000, 0x0001}, d[3];
  tnt_reduce_sum(TNT_FLOAT16, d, a, b, 3); /* 1+1, 2-2, tiny+tiny */
  EXPECT(d[0] == 0x4000 && d[1] == 0x0000 && d[2] == 0x0002);
  uint16_t x[2] = {0x3f80, 0x4000}, y[2] = {0x3f80, 0x3f80}, z[2]; /* bfloat16 1, 2 */
  tnt_reduce_sum(TNT_BFLOAT16, z, x, y, 2);
  EXPECT(z[0] == 0x4000 && z[1] == 0x4040); /* 2, 3 */
  int32_t i[2] = {-7, 7}, o[2];
  tnt_divide(TNT_INT32, o, i, 2, 2); /* floor division, like NumPy's // */
  EXPECT(o[0] == -4 && o[1] == 3);
}

/* The streaming copy writes exactly what memcpy writes, at every alignment of
 * the destination (head and tail take memcpy), and nothing around it. */
static void test_streaming_copy(void) {
  static uint8_t src[400], want[400], got[400];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 37 + 11);
  int mismatches = 0;
  for (int off = 0; off < 16; off++)
    for (size_t len = 0; len < 300; len += 7) {
      memset(want, 0x11, sizeof want);
      memset(got, 0x11, sizeof got);
      memcpy(want + off, src + 3, len);
      tnt_copy_streaming(got + off, src + 3, len);
      mismatches += memcmp(want, got, sizeof want) != 0;
    }
  EXPECT(mismatches == 0);
}

/* A put's copier (transport/put_copy.h). The verdict, from given costs: far
 * only after PUT_SAMPLES slow plain copies in a row, near again at the first
 * fast one. The copies, whatever the verdict: every one writes what memcpy
 * writes; while far, only every PUT_PROBE_EVERY-th is a (timed) plain copy;
 * pieces under 16 KiB are never timed. Defects guarded against: one slow
 * (preempted) copy turning streaming stores on, and a copier that stays far
 * without ever looking again. No check depends on how long a copy takes. */
static void test_put_copier(void) {
  tnt_put_copier_t v = {0};
  for (int i = 0; i < PUT_SAMPLES - 1; i++) tnt_put_copier_record(&v, 1.0);
  EXPECT(v.far == 0); /* three slow copies are not enough */
  tnt_put_copier_record(&v, 1.0);
  EXPECT(v.far == 1);
  tnt_put_copier_record(&v, 0.01);
  EXPECT(v.far == 0); /* one fast copy is */
  tnt_put_copier_record(&v, 1.0);
  EXPECT(v.far == 0); /* and the fast one is still among the last four */

  enum { LEN = 64 << 10 };
  static uint8_t src[LEN + 64], dst[LEN + 64];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 13 + 5);
  tnt_put_copier_t c = {.samples = PUT_SAMPLES, .far = 1};
  int mismatches = 0;
  for (int k = 1; k < PUT_PROBE_EVERY; k++) {
    memset(dst, 0, sizeof dst);
    tnt_put_copy(&c, dst + 3, src + k, LEN);
    mismatches += memcmp(dst + 3, src + k, LEN) != 0 || dst[2] || dst[LEN + 3];
  }
  EXPECT(mismatches == 0);
  EXPECT(c.samples == PUT_SAMPLES); /* streamed, untimed */
  tnt_put_copy(&c, dst, src, LEN);  /* the probe: a plain, timed copy */
  EXPECT(c.samples == PUT_SAMPLES + 1 && memcmp(dst, src, LEN) == 0);
  tnt_put_copy(&c, dst, src + 1, 1000);
  EXPECT(c.samples == PUT_SAMPLES + 1 && memcmp(dst, src + 1, 1000) == 0); /* small: not timed */
}

/* A scale into a peer's window (tnt_put_scale): the bits of tnt_scale
 * whichever way it writes (plain, or L1 blocks streamed out, also with an
 * unaligned destination and a count that ends mid-block), and nothing around
 * it. Timed only for float32/float64 (a float16 scale follows the verdict
 * without giving one, and never counts as a probe); pieces under 16 KiB never.
 * Defects guarded against: a streamed block written short or shifted, and a
 * scalar float16 scale's cost taken for the cores' placement. */
static void test_put_scale(void) {
  enum { N = (40 << 10) + 7 }; /* elements: 160 KiB of float32, blocks of 8 KiB and a ragged end */
  static float src[N], want[N], got[N + 2];
  static uint16_t hsrc[N], hwant[N], hgot[N + 2];
  for (int i = 0; i < N; i++) src[i] = (float)(i % 1000) * 0.37f - 100.0f, hsrc[i] = (uint16_t)(0x3c00 + i % 977);
  tnt_scale(TNT_FLOAT32, want, src, 0.25, N);
  tnt_scale(TNT_FLOAT16, hwant, hsrc, 0.25, N);
  int mismatches = 0;
  for (int far = 0; far <= 1; far++) {
    tnt_put_copier_t c = {.samples = PUT_SAMPLES, .far = far};
    for (int k = 1; k < PUT_PROBE_EVERY; k++) { /* far: every one streamed; near: plain and timed */
      memset(got, 0xAB, sizeof got);
      tnt_put_scale(&c, TNT_FLOAT32, got + 1, src, 0.25, N); /* 4 bytes past a 16-byte boundary */
      mismatches += memcmp(got + 1, want, sizeof want) != 0 || memcmp(got, "\xAB\xAB\xAB\xAB", 4) ||
                    memcmp(got + N + 1, "\xAB\xAB\xAB\xAB", 4);
      c.far = far; /* near: the timed samples may say anything on a busy machine */
    }
    EXPECT(c.samples == (uint32_t)(far ? PUT_SAMPLES : PUT_SAMPLES + PUT_PROBE_EVERY - 1));
    const uint32_t samples = c.samples, puts = c.puts;
    memset(hgot, 0, sizeof hgot);
    tnt_put_scale(&c, TNT_FLOAT16, hgot + 1, hsrc, 0.25, N);
    mismatches += memcmp(hgot + 1, hwant, sizeof hwant) != 0 || hgot[0] || hgot[N + 1];
    EXPECT(c.samples == samples && c.puts == puts); /* float16: untimed either way */
  }
  tnt_put_copier_t c = {.samples = PUT_SAMPLES, .far = 1};
  c.puts = PUT_PROBE_EVERY - 1; /* the next put is the probe */
  tnt_put_scale(&c, TNT_FLOAT32, got, src, 0.25, N);
  EXPECT(c.samples == PUT_SAMPLES + 1 && memcmp(got, want, sizeof want) == 0);
  tnt_put_scale(&c, TNT_FLOAT32, got, src, 0.25, 1000); /* small: not timed */
  EXPECT(c.samples == PUT_SAMPLES + 1 && memcmp(got, want, 4000) == 0);
  EXPECT(mismatches == 0);
}

/* The ring's fused last step while the cores are far apart
 * (tnt_reduce_scaled_streaming): the slot and the result both get
 * tnt_reduce_scaled's bits, float32 and bfloat16, with an unaligned
 * destination, a ragged last block, and in place (the result is the addend,
 * as when the caller's output is its input: each block read before it is
 * written), and nothing around them. Defects guarded against: a block written
 * to one destination only, or shifted. */
static void test_reduce_scaled_streaming(void) {
  enum { N = (24 << 10) + 5 };
  static float a[N], b[N], want[N], slot[N + 2], res[N + 2], inplace[N];
  static uint16_t ha[N], hb[N], hwant[N], hslot[N], hres[N];
  for (int i = 0; i < N; i++) {
    a[i] = (float)(i % 313) * 0.11f, b[i] = (float)(i % 97) - 40.0f;
    ha[i] = (uint16_t)(0x3f80 + i % 300), hb[i] = (uint16_t)(0x4000 + i % 211);
  }
  tnt_reduce_scaled(TNT_FLOAT32, want, a, b, 0.5, 2, N);
  tnt_reduce_scaled(TNT_BFLOAT16, hwant, ha, hb, 0.5, 2, N);
  int mismatches = 0;
  memset(slot, 0xAB, sizeof slot), memset(res, 0xAB, sizeof res);
  tnt_reduce_scaled_streaming(TNT_FLOAT32, slot + 1, res + 1, a, b, 0.5, 2, N);
  mismatches += memcmp(slot + 1, want, sizeof want) != 0 || memcmp(res + 1, want, sizeof want) != 0;
  mismatches += memcmp(slot, "\xAB\xAB\xAB\xAB", 4) || memcmp(res + N + 1, "\xAB\xAB\xAB\xAB", 4);
  memcpy(inplace, b, sizeof b);
  tnt_reduce_scaled_streaming(TNT_FLOAT32, slot, inplace, a, inplace, 0.5, 2, N);
  mismatches += memcmp(slot, want, sizeof want) != 0 || memcmp(inplace, want, sizeof want) != 0;
  tnt_reduce_scaled_streaming(TNT_BFLOAT16, hslot, hres, ha, hb, 0.5, 2, N);
  mismatches += memcmp(hslot, hwant, sizeof hwant) != 0 || memcmp(hres, hwant, sizeof hwant) != 0;
  tnt_reduce_scaled_streaming(TNT_FLOAT32, slot, NULL, b, a, 1.0, 1, N); /* no second destination */
  tnt_reduce_scaled(TNT_FLOAT32, want, b, a, 1.0, 1, N);
  mismatches += memcmp(slot, want, sizeof want) != 0;
  EXPECT(mismatches == 0);
}

/* tnt_copy_unaliased writes exactly what memcpy writes, both
 * when it copies forwards and when the destination lies 1-255 bytes past the
 * source modulo 4 KiB (copied backwards), and nothing around it. */
static void test_copy_unaliased(void) {
  static uint8_t src[4096 + 700] __attribute__((aligned(4096))), want[8192 + 700], got[8192 + 700];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 37 + 11);
  int mismatches = 0;
  const size_t dst_offs[] = {0, 1, 16, 63, 64, 200, 255, 256, 257, 1040, 4095};
  for (size_t k = 0; k < sizeof dst_offs / sizeof dst_offs[0]; k++)
    for (size_t len = 0; len < 700; len += 13) {
      /* got/want + 4096 - (their own page offset) + dst_offs[k]: the destination's page offset is dst_offs[k] */
      size_t at = 4096 - ((uintptr_t)got & 4095) + dst_offs[k], wat = at;
      memset(want, 0x11, sizeof want);
      memset(got, 0x11, sizeof got);
      memcpy(want + wat, src, len);
      tnt_copy_unaliased(got + at, src, len);
      mismatches += memcmp(want, got, sizeof want) != 0;
    }
  EXPECT(mismatches == 0);
}

/* tnt_shape_layout: 0 below 2 dimensions; else never 0 and never odd (a
 * structure's digest is), and different for different shapes of one count;
 * the exact ones read back as the shape, the hashed ones (too many or too
 * large dimensions) say how many dimensions. */
static void test_shape_layout(void) {
  const int64_t d23[2] = {2, 3}, d32[2] = {3, 2}, d16[2] = {1, 6}, d61[2] = {6, 1}, d03[2] = {0, 3}, d30[2] = {3, 0};
  const int64_t d123[3] = {1, 2, 3}, d132[3] = {1, 3, 2}, big[2] = {INT64_C(1) << 40, 1}, big2[2] = {1, INT64_C(1) << 40};
  const int64_t edge[2] = {(INT64_C(1) << 29) - 1, 1}, past[2] = {INT64_C(1) << 29, 1};
  int64_t many[12], many2[12];
  for (int i = 0; i < 12; i++) many[i] = many2[i] = 2;
  many2[11] = 3;
  EXPECT(tnt_shape_layout(0, NULL) == 0 && tnt_shape_layout(1, d16) == 0 && tnt_shape_layout(1, d61) == 0);
  const uint64_t all[] = {tnt_shape_layout(2, d23), tnt_shape_layout(2, d32), tnt_shape_layout(2, d16),
                          tnt_shape_layout(2, d61), tnt_shape_layout(2, d03), tnt_shape_layout(2, d30),
                          tnt_shape_layout(3, d123), tnt_shape_layout(3, d132), tnt_shape_layout(2, big),
                          tnt_shape_layout(2, big2), tnt_shape_layout(2, edge), tnt_shape_layout(2, past),
                          tnt_shape_layout(12, many), tnt_shape_layout(12, many2)};
  enum { N = sizeof all / sizeof all[0] };
  int distinct = 1, tagged = 1;
  for (int i = 0; i < N; i++) {
    tagged &= all[i] != 0 && (all[i] & 1) == 0 && tnt_shape_layout_is_shape(all[i]);
    for (int j = 0; j < i; j++) distinct &= all[i] != all[j];
  }
  EXPECT(distinct && tagged);
  EXPECT(tnt_shape_layout(2, d23) == all[0]); /* the same shape, the same layout */
  EXPECT(!tnt_shape_layout_is_shape(0) && !tnt_shape_layout_is_shape(all[0] | 1));
  char text[128];
  EXPECT(tnt_shape_layout_text(all[0], text, sizeof text) && !strcmp(text, "shape (2, 3)"));
  EXPECT(tnt_shape_layout_text(all[5], text, sizeof text) && !strcmp(text, "shape (3, 0)"));
  EXPECT(tnt_shape_layout_text(all[7], text, sizeof text) && !strcmp(text, "shape (1, 3, 2)"));
  EXPECT(tnt_shape_layout_text(all[10], text, sizeof text) && !strcmp(text, "shape (536870911, 1)"));
  EXPECT(tnt_shape_layout_text(all[11], text, sizeof text) && strstr(text, "a 2-dimensional shape (digest "));
  EXPECT(tnt_shape_layout_text(all[12], text, sizeof text) && strstr(text, "a 12-dimensional shape (digest "));
  EXPECT(!tnt_shape_layout_text(0x1234567, text, sizeof text) && !strcmp(text, "")); /* odd: a structure's */
}

/* A name map that sees many names come and go (a training loop naming each step's
 * collective apart: the handle table's, the pending table's, the negotiation's maps) stays
 * the size of what it holds; it doubled at every rebuild, tombstones and all: 1M names
 * through it left a table of 1M slots holding none. */
static void test_namemap_churn(void) {
  tnt_namemap_t m;
  tnt_namemap_init(&m);
  char key[32];
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof key, "kept-%d", i);
    EXPECT(tnt_namemap_put(&m, key, i) == 0);
  }
  int ok = 1;
  for (int i = 0; i < 200000; i++) {
    snprintf(key, sizeof key, "step-%d", i);
    ok &= tnt_namemap_put(&m, key, i) == 0 && tnt_namemap_get(&m, key) == i;
    tnt_namemap_del(&m, key);
    ok &= tnt_namemap_get(&m, key) == -1;
  }
  EXPECT(ok);
  EXPECT(m.cap <= 256 && m.used == 10);
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof key, "kept-%d", i);
    EXPECT(tnt_namemap_get(&m, key) == i);
  }
  /* growing with what it holds still works */
  for (int i = 0; i < 5000; i++) {
    snprintf(key, sizeof key, "many-%d", i);
    ok &= tnt_namemap_put(&m, key, i) == 0;
  }
  for (int i = 0; i < 5000; i++) {
    snprintf(key, sizeof key, "many-%d", i);
    ok &= tnt_namemap_get(&m, key) == i;
  }
  EXPECT(ok && m.used == 5010);
  tnt_namemap_free(&m);
}

/* A message cut at its buffer's end after a user's value of multi-byte characters ends on a
 * whole character: Python decodes it (a UnicodeDecodeError before, for 1 or 2 leading bytes). */
static void test_cut_message_is_utf8(void) {
  for (int pad = 0; pad < 3; pad++) {
    char value[2000];
    int at = 0;
    for (int i = 0; i < pad; i++) value[at++] = 'a';
    for (int i = 0; i < 600; i++) at += snprintf(value + at, sizeof value - at, "\xe2\x82\xac"); /* the euro sign */
    EXPECT(tnt_param_check("TNT_TIMEOUT_S", value) == TNT_ERR_INVALID_ARGUMENT);
    const unsigned char *m = (const unsigned char *)tnt_last_error();
    size_t n = strlen((const char *)m), i = 0;
    int whole = n > 900;
    while (whole && i < n) { /* every character complete */
      const size_t len = m[i] < 0x80 ? 1 : m[i] >= 0xF0 ? 4 : m[i] >= 0xE0 ? 3 : 2;
      for (size_t k = 1; k < len; k++) whole &= i + k < n && (m[i + k] & 0xC0) == 0x80;
      i += len;
    }
    EXPECT(whole && i == n);
  }
}

static void test_misuse_before_init(void) {
  float buf[4] = {0};
  tnt_handle_t h;
  EXPECT(tnt_allreduce_async("x", buf, buf, 4, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_ERR_INVALID_USAGE);
  EXPECT(strstr(tnt_last_error(), "not initialized") != NULL);
  EXPECT(tnt_wait(0, 1.0) == TNT_ERR_INVALID_USAGE);
  EXPECT(tnt_rank() == -1 && tnt_initialized() == 0);
}

/* The counts of unnamed calls (tnt_sequence_counter): one per key, at one address for good, taken
 * atomically by whoever asks (the Python API and the TensorFlow ops), set to 0 by a new context. */
static void test_sequences(void) {
  int64_t *a = tnt_sequence_counter("test.allreduce"), *b = tnt_sequence_counter("test.allreduce@worker");
  EXPECT(a != NULL && b != NULL && a != b && tnt_sequence_counter("test.allreduce") == a);
  EXPECT(tnt_sequence_next(a) == 0 && tnt_sequence_next(a) == 1 && tnt_sequence_next(b) == 0);
  EXPECT(__atomic_fetch_add(a, 1, __ATOMIC_SEQ_CST) == 2 && tnt_sequence_next(a) == 3);
  for (int i = 0; i < 1000; i++) { /* many keys: every one keeps its counter */
    char key[32];
    snprintf(key, sizeof key, "test.k%d", i);
    int64_t *c = tnt_sequence_counter(key);
    EXPECT(c != NULL && tnt_sequence_next(c) == 0);
  }
  EXPECT(tnt_sequence_counter("test.allreduce") == a && tnt_sequence_next(a) == 4);
  tnt_sequence_restart();
  EXPECT(tnt_sequence_next(a) == 0 && tnt_sequence_next(b) == 0 && tnt_sequence_counter(NULL) == NULL);
  EXPECT(tnt_name_in_flight("test") == 0); /* without a context: none */
}

static void test_serial_job(void) {
  EXPECT(tnt_init() == TNT_SUCCESS);
  EXPECT(tnt_rank() == 0 && tnt_size() == 1 && !strcmp(tnt_transport_name(), "self"));
  double in[3] = {1, 2, 3}, out[3];
  tnt_handle_t h;
  EXPECT(tnt_allreduce_async("w", in, out, 3, TNT_FLOAT64, TNT_AVERAGE, 0.5, &h) == TNT_SUCCESS);
  EXPECT(tnt_wait(h, -1) == TNT_SUCCESS && out[2] == 1.5);
  EXPECT(tnt_release(h) == TNT_SUCCESS);
  EXPECT(tnt_release(h) == TNT_ERR_INVALID_ARGUMENT); /* released twice */
  EXPECT(tnt_wait(h, 0) == TNT_ERR_INVALID_ARGUMENT);
  EXPECT(tnt_allreduce_async("bad", in, out, 3, (tnt_dtype_t)42, TNT_SUM, 1.0, &h) == TNT_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(tnt_last_error(), "unsupported dtype") != NULL);
  EXPECT(tnt_broadcast_async("b", in, out, 3, TNT_FLOAT64, 1, &h) == TNT_ERR_INVALID_ARGUMENT);
  /* empty collectives may pass NULL buffers: nothing is copied (memcpy was given NULL) */
  EXPECT(tnt_allreduce("e1", NULL, out, 0, TNT_FLOAT64, TNT_SUM, 1.0, -1, &h) == TNT_SUCCESS);
  EXPECT(tnt_allreduce("e2", NULL, out, 0, TNT_FLOAT64, TNT_SUM, 2.0, -1, &h) == TNT_SUCCESS);
  EXPECT(tnt_broadcast("e3", NULL, out, 0, TNT_FLOAT64, 0, -1, &h) == TNT_SUCCESS);
  EXPECT(tnt_allgather_into("e4", NULL, 0, 1, TNT_FLOAT64, NULL, 0, -1, &h) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
  /* a count whose byte size is beyond any buffer (count x 8 wraps around to 8 bytes, or to
   * almost 2^64) is refused, not copied as its wrapped size */
  EXPECT(tnt_allreduce_async("wraps", in, out, (INT64_C(1) << 61) + 1, TNT_FLOAT64, TNT_SUM, 1.0, &h) ==
         TNT_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(tnt_last_error(), "larger than any buffer") != NULL);
  EXPECT(tnt_allreduce("wraps", in, out, INT64_MAX, TNT_FLOAT32, TNT_SUM, 1.0, -1, &h) == TNT_ERR_INVALID_ARGUMENT);
  EXPECT(tnt_broadcast_async("wraps", in, out, INT64_MAX / 2 + 1, TNT_FLOAT16, 0, &h) == TNT_ERR_INVALID_ARGUMENT);
  EXPECT(tnt_allgather_async("wraps", in, INT64_MAX / 4, 1, TNT_INT64, &h) == TNT_ERR_INVALID_ARGUMENT);
  int64_t rows[4] = {1, 2, 3, 4}, count = 0;
  EXPECT(tnt_allgather_async("g", rows, 4, 2, TNT_INT64, &h) == TNT_SUCCESS);
  EXPECT(tnt_wait(h, -1) == TNT_SUCCESS && tnt_result_count(h, &count) == TNT_SUCCESS && count == 4);
  EXPECT(tnt_release(h) == TNT_SUCCESS);
  EXPECT(tnt_allgather_async("g2", rows, 3, 2, TNT_INT64, &h) == TNT_ERR_INVALID_ARGUMENT); /* 3 is not rows of 2 */
  int64_t into[4] = {0}, kept[4] = {0};
  EXPECT(tnt_allgather_into_async("g3", rows, 4, 2, TNT_INT64, into, 4, &h) == TNT_SUCCESS); /* the guess is right */
  EXPECT(tnt_wait(h, -1) == TNT_SUCCESS && tnt_result_count(h, &count) == TNT_SUCCESS && count == 4);
  EXPECT(into[0] == 1 && into[3] == 4);
  EXPECT(tnt_release(h) == TNT_SUCCESS);
  into[0] = 0;
  EXPECT(tnt_allgather_into_async("g4", rows, 2, 2, TNT_INT64, into, 4, &h) == TNT_SUCCESS); /* wrong: the handle keeps it */
  EXPECT(tnt_wait(h, -1) == TNT_SUCCESS && tnt_result_count(h, &count) == TNT_SUCCESS && count == 2);
  EXPECT(into[0] == 0 && tnt_result_copy(h, kept) == TNT_SUCCESS && kept[0] == 1 && kept[1] == 2);
  EXPECT(tnt_release(h) == TNT_SUCCESS);
  EXPECT(tnt_allgather_into_async("g5", rows, 4, 2, TNT_INT64, NULL, 4, &h) == TNT_ERR_INVALID_ARGUMENT);
  /* the blocking forms: done on return; an allgather's handle is kept for its result */
  into[3] = 0;
  EXPECT(tnt_allgather_into("g6", rows, 4, 2, TNT_INT64, into, 4, -1, &h) == TNT_SUCCESS && into[3] == 4);
  EXPECT(tnt_result_count(h, &count) == TNT_SUCCESS && count == 4 && tnt_release(h) == TNT_SUCCESS);
  out[0] = 0;
  EXPECT(tnt_broadcast("b2", in, out, 3, TNT_FLOAT64, 0, -1, &h) == TNT_SUCCESS && out[0] == in[0]);
  EXPECT(tnt_release(h) == TNT_ERR_INVALID_ARGUMENT); /* already released */
  EXPECT(tnt_barrier("bar", -1, &h) == TNT_SUCCESS && tnt_release(h) == TNT_ERR_INVALID_ARGUMENT);
  EXPECT(tnt_barrier("bar2", -1, NULL) == TNT_ERR_INVALID_ARGUMENT);
  EXPECT(tnt_finalize() == TNT_SUCCESS);
  EXPECT(tnt_allreduce_async("x", in, out, 3, TNT_FLOAT64, TNT_SUM, 1.0, &h) == TNT_ERR_INVALID_USAGE);
  EXPECT(strstr(tnt_last_error(), "finalized") != NULL);
}

/* pause.c: a child stopped (SIGSTOP) and continued does not count the pause on tnt_now's
 * clock, and the program's own SIGCONT handler still runs; a gap without a SIGCONT counts. */
static volatile sig_atomic_t program_saw_cont;
static void program_on_cont(int sig) { (void)sig; program_saw_cont = 1; }

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_pause_does_not_count(void) {
  int ready[2];
  if (pipe(ready) != 0) {
    EXPECT(!"pipe");
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);
    signal(SIGCONT, program_on_cont); /* the program's, installed before the core's */
    tnt_pause_arm();
    const double t0 = tnt_now(), m0 = mono_s();
    const struct timespec tick = {0, 5000000};
    while (mono_s() - m0 < 0.5) nanosleep(&tick, NULL), tnt_now(); /* a waiter reading its clock */
    if (write(ready[1], "r", 1) != 1) _exit(3);
    while (!program_saw_cont) nanosleep(&tick, NULL), tnt_now(); /* stopped in here for 2 s */
    const double paused = (mono_s() - m0) - (tnt_now() - t0);
    /* a gap without a SIGCONT (this process did not run, or read no clock) counts as before */
    const double t1 = tnt_now();
    sleep(2);
    const double unpaused = tnt_now() - t1;
    _exit(paused > 1.5 && unpaused > 1.9 ? 0 : (fprintf(stderr, "paused %g unpaused %g\n", paused, unpaused), 1));
  }
  char c;
  EXPECT(pid > 0 && read(ready[0], &c, 1) == 1);
  kill(pid, SIGSTOP);
  sleep(2);
  kill(pid, SIGCONT);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(ready[0]);
  close(ready[1]);
}

int main(void) {
  test_half_precision();
  test_streaming_copy();
  test_put_copier();
  test_put_scale();
  test_reduce_scaled_streaming();
  test_copy_unaliased();
  test_shape_layout();
  test_namemap_churn();
  test_cut_message_is_utf8();
  test_misuse_before_init();
  test_sequences();
  test_serial_job();
  test_pause_does_not_count();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
