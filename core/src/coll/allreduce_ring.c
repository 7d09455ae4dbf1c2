/* allreduce_ring.c - ring allreduce: reduce-scatter, then allgather.
 *
 * The buffer is cut into N segments (N = ranks; lengths differ by at most one
 * element) and every segment into P pieces of at most one window slot, P the
 * same for every segment so that sends and receives pair up one to one.
 *
 * Reduce-scatter, step s = 0..N-2: rank r sends segment r-s and receives
 * segment r-s-1, adding its own input to it. Segment j therefore accumulates in
 * the fixed order j, j+1, ..., j+N-1 (mod N): the sum is the same on every run,
 * and after the allgather every rank holds the same bits. Step 0 sends straight
 * from the input, and each receive writes `out = in + piece`, so the input is
 * never copied into the output first (in == out is fine: each element is read
 * before it is written).
 *
 * Allgather, step s = 0..N-2: rank r sends segment r+1-s (the one it completed
 * or just received) and copies segment r-s into place.
 *
 * Pieces are pipelined: the loop sends piece k, then receives piece k, while up
 * to `slots` pieces are in flight on the link; with N ranks, every rank moves
 * 2(N-1)/N of the buffer, which is why bus bandwidth is reported that way. */
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "ring.h"

typedef struct {
  int64_t count;  /* elements in the whole buffer */
  const int64_t *bounds; /* segment offsets (ring.h), NULL: even split */
  int N;          /* ranks = segments */
  int64_t P;      /* pieces per segment */
  size_t esz;
  tnt_dtype_t dtype;
  double prescale; /* this rank's factor on its own input */
} plan_t;

static int64_t seg_begin(const plan_t *p, int j) { return tnt_segment_begin(p->bounds, p->count, p->N, j); }

/* One step of the ring: send segment `send_seg` of `from` (scaled by
 * p->prescale on the way out when `scale_out`); receive segment `recv_seg`
 * into `dst`: added to the scaled `addend` and divided by `divisor`
 * (reduce-scatter), or copied as is (allgather: addend NULL). Piece k is sent
 * before piece k is received, so both directions of the link stay busy. */
static tnt_result_t ring_step(tnt_ring_t *ring, const plan_t *p, const uint8_t *from, int scale_out, int send_seg,
                              uint8_t *dst, const uint8_t *addend, int divisor, int recv_seg, double deadline) {
  int64_t sb = seg_begin(p, send_seg), sl = seg_begin(p, send_seg + 1) - sb;
  int64_t rb = seg_begin(p, recv_seg), rl = seg_begin(p, recv_seg + 1) - rb;
  for (int64_t k = 0; k < p->P; k++) {
    int64_t pb, pl;
    tnt_piece(sb, sl, k, p->P, &pb, &pl);
    const uint8_t *piece_out = from + pb * (int64_t)p->esz;
    if (scale_out) { /* scaled straight into what is sent (the transport's buffer, else a
                      * cache-resident staging slot), not a pass over the input */
      uint8_t *buf;
      TNT_CHECK(tnt_ring_stage(ring, (size_t)pl * p->esz, deadline, &buf));
      tnt_scale(p->dtype, buf, piece_out, p->prescale, (size_t)pl);
      piece_out = buf;
    }
    TNT_CHECK(tnt_ring_send(ring, piece_out, (size_t)pl * p->esz, deadline));
    const void *piece;
    TNT_CHECK(tnt_ring_recv(ring, &piece, deadline));
    tnt_piece(rb, rl, k, p->P, &pb, &pl);
    uint8_t *at = dst + pb * (int64_t)p->esz;
    /* partial sum of the earlier ranks first, then ours: the order of the ring */
    if (addend)
      tnt_reduce_scaled(p->dtype, at, piece, addend + pb * (int64_t)p->esz, p->prescale, divisor, (size_t)pl);
    else
      memcpy(at, piece, (size_t)pl * p->esz);
    TNT_CHECK(tnt_ring_release(ring));
  }
  return TNT_SUCCESS;
}

static plan_t make_plan(const tnt_ring_t *ring, int64_t count, tnt_dtype_t dtype, double prescale,
                        const int64_t *bounds) {
  plan_t p = {count, bounds, ring->size, 1, tnt_dtype_size(dtype), dtype, prescale};
  int64_t max_seg = 0, slot_elems = (int64_t)(ring->slot_bytes / p.esz);
  for (int j = 0; j < p.N; j++)
    if (seg_begin(&p, j + 1) - seg_begin(&p, j) > max_seg) max_seg = seg_begin(&p, j + 1) - seg_begin(&p, j);
  if (max_seg > 0) p.P = (max_seg + slot_elems - 1) / slot_elems;
  return p;
}

/* reduce-scatter: step 0 sends straight from the input (scaled on the way);
 * the last step completes a segment, so it divides (average) right there and
 * the allgather spreads the final values: no pass before, none after */
static tnt_result_t reduce_scatter(tnt_ring_t *ring, const plan_t *p, const uint8_t *src, uint8_t *dst, int divisor,
                                   double deadline) {
  const int N = p->N, r = ring->rank;
  for (int s = 0; s < N - 1; s++)
    TNT_CHECK(ring_step(ring, p, s == 0 ? src : dst, s == 0 && p->prescale != 1.0, (r - s + 2 * N) % N, dst, src,
                        s == N - 2 ? divisor : 1, (r - s - 1 + 2 * N) % N, deadline));
  /* what was sent may be written next: the allgather overwrites segments sent
   * as partial sums (and, in place, the input) */
  return tnt_ring_flush(ring, deadline);
}

static tnt_result_t allgather(tnt_ring_t *ring, const plan_t *p, uint8_t *dst, double deadline) {
  const int N = p->N, r = ring->rank;
  for (int s = 0; s < N - 1; s++)
    TNT_CHECK(ring_step(ring, p, dst, 0, (r + 1 - s + 2 * N) % N, dst, NULL, 1, (r - s + 2 * N) % N, deadline));
  return tnt_ring_flush(ring, deadline); /* the caller owns dst once we return */
}

tnt_result_t tnt_allreduce_ring(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                double prescale, int divisor, const int64_t *bounds, double deadline) {
  if (ring->size == 1) {
    tnt_scale(dtype, out, in, prescale, (size_t)count);
    if (divisor > 1) tnt_divide(dtype, out, out, divisor, (size_t)count);
    return TNT_SUCCESS;
  }
  plan_t p = make_plan(ring, count, dtype, prescale, bounds);
  TNT_CHECK(reduce_scatter(ring, &p, in, out, divisor, deadline));
  return allgather(ring, &p, out, deadline);
}

tnt_result_t tnt_reduce_scatter_ring(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                     double prescale, const int64_t *bounds, double deadline) {
  if (ring->size == 1) {
    tnt_scale(dtype, out, in, prescale, (size_t)count);
    return TNT_SUCCESS;
  }
  plan_t p = make_plan(ring, count, dtype, prescale, bounds);
  return reduce_scatter(ring, &p, in, out, 1, deadline);
}

tnt_result_t tnt_allgather_segments_ring(tnt_ring_t *ring, void *out, int64_t count, tnt_dtype_t dtype,
                                         const int64_t *bounds, double deadline) {
  if (ring->size == 1) return TNT_SUCCESS;
  plan_t p = make_plan(ring, count, dtype, 1.0, bounds);
  return allgather(ring, &p, out, deadline);
}
