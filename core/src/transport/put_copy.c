/* put_copy.c - plain or streaming copies into a peer's window (put_copy.h). */
#include "put_copy.h"

#include <stdatomic.h>
#include <string.h>

#include "common.h"
#include "stream_store.h"

/* Pieces smaller than this are copied plainly and not timed: a clock read
 * costs more than the choice could save. */
#define PUT_TIMED_MIN (16 << 10)
/* A plain float scale into a peer's window slower than this per byte took its
 * lines from a far core: bench/window_writes.c (64 KiB, 2026-12-01) had it at
 * 0.12-0.16 ns near and 0.50-0.58 far, where memcpy took 0.07-0.10 and
 * 0.47-0.55. Its samples are recorded in a copy's terms (scaled by
 * PUT_FAR_NS_PER_BYTE / this), so one verdict reads both. */
#define PUT_SCALE_FAR_NS_PER_BYTE 0.3

static _Atomic int placement = TNT_PUT_TIMED;
static _Atomic int64_t streamed; /* bytes, for tnt_get_stats */

void tnt_put_init(tnt_put_placement_t p) {
  atomic_store_explicit(&placement, (int)p, memory_order_relaxed);
  atomic_store_explicit(&streamed, 0, memory_order_relaxed);
}

int64_t tnt_put_bytes_streamed(void) { return atomic_load_explicit(&streamed, memory_order_relaxed); }

static void count_streamed(size_t bytes) { atomic_fetch_add_explicit(&streamed, (int64_t)bytes, memory_order_relaxed); }

static tnt_put_placement_t given(void) { return (tnt_put_placement_t)atomic_load_explicit(&placement, memory_order_relaxed); }

static int all_slow(const tnt_put_copier_t *c) {
  if (c->samples < PUT_SAMPLES) return 0;
  for (int i = 0; i < PUT_SAMPLES; i++)
    if (c->ns_per_byte[i] <= PUT_FAR_NS_PER_BYTE) return 0;
  return 1;
}

/* While far, every piece but each PUT_PROBE_EVERY-th goes out streaming. */
static int streams_next(tnt_put_copier_t *c) { return c->far && ++c->puts % PUT_PROBE_EVERY; }

void tnt_put_copy(tnt_put_copier_t *c, void *dst, const void *src, size_t len) {
  const tnt_put_placement_t p = given();
  if (len < PUT_TIMED_MIN || p == TNT_PUT_NEAR) {
    memcpy(dst, src, len);
    return;
  }
  if (p == TNT_PUT_FAR || streams_next(c)) {
    tnt_copy_streaming(dst, src, len);
    count_streamed(len);
    return;
  }
  const double t0 = tnt_now();
  memcpy(dst, src, len);
  tnt_put_copier_record(c, (tnt_now() - t0) * 1e9 / (double)len);
}

/* Computed in blocks that stay in L1, each written out with streaming stores:
 * the same bits as the whole call, one fence at the end. */
enum { BLOCK_BYTES = 8192 };

static void scale_streaming(tnt_dtype_t dtype, void *dst, const void *src, double factor, size_t n) {
  uint64_t block[BLOCK_BYTES / sizeof(uint64_t)];
  const size_t esz = tnt_dtype_size(dtype), per = BLOCK_BYTES / esz;
  for (size_t done = 0; done < n; done += per) {
    const size_t m = n - done < per ? n - done : per;
    tnt_scale(dtype, block, (const uint8_t *)src + done * esz, factor, m);
    tnt_copy_streaming_unfenced((uint8_t *)dst + done * esz, block, m * esz);
  }
  tnt_stream_fence();
  count_streamed(n * esz);
}

void tnt_reduce_scaled_streaming(tnt_dtype_t dtype, void *dst, void *also, const void *a, const void *b, double factor,
                                 int divisor, size_t n) {
  uint64_t block[BLOCK_BYTES / sizeof(uint64_t)];
  const size_t esz = tnt_dtype_size(dtype), per = BLOCK_BYTES / esz;
  for (size_t done = 0; done < n; done += per) {
    const size_t m = n - done < per ? n - done : per, at = done * esz;
    tnt_reduce_scaled(dtype, block, (const uint8_t *)a + at, (const uint8_t *)b + at, factor, divisor, m);
    tnt_copy_streaming_unfenced((uint8_t *)dst + at, block, m * esz);
    if (also) tnt_copy_streaming_unfenced((uint8_t *)also + at, block, m * esz);
  }
  tnt_stream_fence();
  count_streamed(n * esz * (also ? 2 : 1));
}

void tnt_put_scale(tnt_put_copier_t *c, tnt_dtype_t dtype, void *dst, const void *src, double factor, size_t n) {
  const size_t len = n * tnt_dtype_size(dtype);
  const int timed = dtype == TNT_FLOAT32 || dtype == TNT_FLOAT64;
  const tnt_put_placement_t p = given();
  if (len < PUT_TIMED_MIN || p == TNT_PUT_NEAR || (p == TNT_PUT_TIMED && !timed && !c->far)) {
    tnt_scale(dtype, dst, src, factor, n);
  } else if (p == TNT_PUT_FAR || !timed || streams_next(c)) {
    scale_streaming(dtype, dst, src, factor, n);
  } else {
    const double t0 = tnt_now();
    tnt_scale(dtype, dst, src, factor, n);
    tnt_put_copier_record(c, (tnt_now() - t0) * 1e9 / (double)len * (PUT_FAR_NS_PER_BYTE / PUT_SCALE_FAR_NS_PER_BYTE));
  }
}

void tnt_put_copier_record(tnt_put_copier_t *c, double ns_per_byte) {
  c->ns_per_byte[c->samples++ % PUT_SAMPLES] = ns_per_byte;
  c->far = ns_per_byte > PUT_FAR_NS_PER_BYTE && all_slow(c);
}

int tnt_put_copier_near(const tnt_put_copier_t *c) {
  const tnt_put_placement_t p = given();
  return p == TNT_PUT_TIMED ? c->samples >= PUT_SAMPLES && !c->far : p == TNT_PUT_NEAR;
}

int tnt_put_copier_far(const tnt_put_copier_t *c) {
  const tnt_put_placement_t p = given();
  return p == TNT_PUT_TIMED ? c->far : p == TNT_PUT_FAR;
}
