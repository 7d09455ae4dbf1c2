/* allreduce_direct.c - allreduce through memory every rank can read (shm), in
 * two exchange rounds per chunk instead of the ring's 2(N-1) hand-offs.
 *
 * Round 1: every rank builds its (scaled) chunk in its own exchange buffer
 * (transport.h, exchange_buffer) and publishes it. Every rank then adds its
 * part of the chunk (1/N of it), reading every rank's chunk where it lies
 * (exchange_view), and writes the sum straight into its next exchange buffer.
 * Round 2 publishes the sums, and every rank copies all parts into its result.
 *
 * The bits are the ring's: every element is added in the order of its segment
 * (ring.h: segment j as j, j+1, ..., j+N-1), whichever rank adds it, so a
 * tensor gets the same result on this path, the ring and the one-round path.
 *
 * Why: with N ranks the ring hands pieces on 2(N-1) times, and once ranks
 * outnumber cores every hand-off is a wake-up; here there are two waits per
 * chunk, each one arrival counter for the whole host. It also moves fewer
 * bytes from 3 ranks up: each rank copies in the (N-1)/N of its input that
 * others add (its own part it reads where it lies, unless scaled), reads N
 * parts of 1/N, writes 1/N, and copies the whole result out (under 4 passes
 * of the buffer), where the ring's 2(N-1) steps make about 2(N-1)/N x 3.
 *
 * Rounds are the transport's exchange rounds: collective, in the same order on
 * every rank as every other exchange. A peer overwrites its buffer of round k
 * only after posting round k+1, which needs this rank's post of round k+1:
 * every read below happens before this rank's next post. */
#include <string.h>

#include "common.h"
#include "copy_unaliased.h"
#include "dtype.h"
#include "ring.h"
#include "stream_store.h"
#include "transport/put_copy.h"

/* How this rank copies (or scales) its chunk into its exchange buffer, whose
 * lines the other ranks read last: plainly, or with streaming stores while its
 * core is far from theirs (put_copy.h). The engine runs one collective at a time. */
static tnt_put_copier_t copier;

/* out = the N contributions added, for the elements [lo, hi) of a buffer of
 * `count`, each in the ring's order of its segment. `out` holds the buffer's
 * elements from out_at on, every contrib[q] those from in_at on. */
void tnt_reduce_range_in_ring_order(tnt_dtype_t dtype, void *out, int64_t out_at, const void *const *contrib,
                                    int64_t in_at, int64_t lo, int64_t hi, int64_t count, int N, const int64_t *bounds) {
  const size_t esz = tnt_dtype_size(dtype);
  for (int j = 0; j < N; j++) {
    int64_t b = tnt_segment_begin(bounds, count, N, j), e = tnt_segment_begin(bounds, count, N, j + 1);
    if (b < lo) b = lo;
    if (e > hi) e = hi;
    if (e <= b) continue;
    const size_t len = (size_t)(e - b);
    uint8_t *dst = (uint8_t *)out + (size_t)(b - out_at) * esz;
#define C(q) ((const uint8_t *)contrib[(q) % N] + (size_t)(b - in_at) * esz)
    if (N == 1) {
      memcpy(dst, C(j), len * esz);
      continue;
    }
    /* the first two added in one pass: the same bits as copying the first and adding the second */
    tnt_reduce_sum(dtype, dst, C(j), C(j + 1), len);
    for (int k = 2; k < N; k++) tnt_reduce_sum(dtype, dst, dst, C(j + k), len);
#undef C
  }
}

/* Rank r's part of the chunk [cb, cb + cl): the elements it adds. */
static void part_of(int64_t cb, int64_t cl, int r, int N, int64_t *pb, int64_t *pl) {
  tnt_piece(cb, cl, r, N, pb, pl);
}

int tnt_allreduce_direct_possible(const tnt_transport_t *t) { return t->exchange_view && t->exchange_buffer; }

tnt_result_t tnt_exchange_in_place(const tnt_transport_t *t, void *ts, int N, const uint8_t *mine, size_t len,
                                   const uint8_t **msgs, size_t cap, double deadline) {
  size_t lens[N];
  TNT_CHECK(t->exchange_post(ts, mine, len, deadline));
  TNT_CHECK(t->exchange_view(ts, msgs, lens, cap, deadline));
  for (int q = 0; q < N; q++)
    if (lens[q] != len)
      return tnt_fail(TNT_ERR_INTERNAL, "rank %d published %zu bytes where every rank publishes %zu: the ranks have "
                      "diverged", q, lens[q], len);
  return TNT_SUCCESS;
}

tnt_result_t tnt_allreduce_direct(const tnt_transport_t *t, void *ts, int rank, int N, const void *in, void *out,
                                  int64_t count, tnt_dtype_t dtype, double prescale, const int64_t *bounds,
                                  double deadline) {
  const size_t esz = tnt_dtype_size(dtype);
  /* what the host holds is N ranks' buffers: the cache runs out at 1/N of a
   * ring's size (4 ranks on 2 cores: streaming from 1 MB 1.2-1.5x faster, on
   * 2026-11-27). While this rank's plain copies find the cores near each
   * other (tnt_put_copier_near: the cache they share holds more), only from
   * 1.5x that: near, 4 ranks at 1 MB (4 MiB on the host) wrote their results
   * 1.2-1.3x faster plainly, where 3 ranks at 2 MB (6 MiB) were 1.1x slower
   * so and 8 ranks at 1 MB as fast or slower; far, 4 ranks at 1 MB were
   * 1.15x slower plainly (docs/benchmarks.md, 2026-12-01). Without a verdict
   * (the first calls, and inputs scaled in a dtype whose scales are not
   * timed: put_copy.h), from the threshold, as measured before. Each rank
   * chooses alone: the bits are the same. */
  const size_t host_bytes = (size_t)count * esz * (size_t)N;
  const int stream = tnt_stream_wanted(tnt_put_copier_near(&copier) ? host_bytes / 3 * 2 : host_bytes);
  const uint8_t *msgs[N];
  size_t lens[N];
  for (int64_t cb = 0; cb < count;) {
    size_t cap = 0;
    uint8_t *mine = t->exchange_buffer(ts, &cap);
    if (!mine || cap < esz * (size_t)N) return tnt_fail(TNT_ERR_INTERNAL, "direct allreduce: no exchange buffer");
    const int64_t cl = count - cb < (int64_t)(cap / esz) ? count - cb : (int64_t)(cap / esz);
    /* round 1: this rank's chunk, scaled on its way in. Unscaled, the part
     * this rank adds itself is not copied: no other rank reads it, and this
     * rank reads it where it lies (1/N of the copy saved) */
    const uint8_t *src = (const uint8_t *)in + (size_t)cb * esz;
    int64_t pb, pl;
    part_of(cb, cl, rank, N, &pb, &pl);
    if (prescale != 1.0) {
      tnt_put_scale(&copier, dtype, mine, src, prescale, (size_t)cl);
    } else {
      const size_t before = (size_t)(pb - cb) * esz, after = (size_t)(pb - cb + pl) * esz;
      tnt_put_copy(&copier, mine, src, before);
      tnt_put_copy(&copier, mine + after, src + after, (size_t)cl * esz - after);
    }
    TNT_CHECK(tnt_exchange_in_place(t, ts, N, mine, (size_t)cl * esz, msgs, cap, deadline));
    if (prescale == 1.0) msgs[rank] = src;
    /* this rank's part, added from every rank's chunk in place into the next buffer */
    uint8_t *sums = t->exchange_buffer(ts, &cap);
    if (!sums) return tnt_fail(TNT_ERR_INTERNAL, "direct allreduce: no exchange buffer");
    tnt_reduce_range_in_ring_order(dtype, sums, pb, (const void *const *)msgs, cb, pb, pb + pl, count, N, bounds);
    /* round 2: every rank's sums, into the result */
    TNT_CHECK(t->exchange_post(ts, sums, (size_t)pl * esz, deadline));
    TNT_CHECK(t->exchange_view(ts, msgs, lens, cap, deadline));
    for (int q = 0; q < N; q++) {
      int64_t qb, ql;
      part_of(cb, cl, q, N, &qb, &ql);
      if (lens[q] != (size_t)ql * esz)
        return tnt_fail(TNT_ERR_INTERNAL, "direct allreduce: rank %d published %zu bytes of sums, not %lld", q, lens[q],
                        (long long)(ql * (int64_t)esz));
      uint8_t *dst = (uint8_t *)out + (size_t)qb * esz;
      if (stream) tnt_copy_streaming(dst, msgs[q], lens[q]);
      else tnt_copy_unaliased(dst, msgs[q], lens[q]);
    }
    cb += cl;
  }
  return TNT_SUCCESS;
}
