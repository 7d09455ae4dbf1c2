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
 * to `slots` pieces are in flight on the link (over the network it sends up to
 * ring->lookahead pieces before its first receive); with N ranks, every rank moves
 * 2(N-1)/N of the buffer, which is why bus bandwidth is reported that way.
 *
 * Past the cache (stream_store.h) the last reduce-scatter step and the first
 * allgather step run as one (last_reduce_step), and final values are written
 * with streaming stores. */
#include <string.h>

#include "common.h"
#include "copy_unaliased.h"
#include "dtype.h"
#include "ring.h"
#include "stream_store.h"

typedef struct {
  int64_t count;  /* elements in the whole buffer */
  const int64_t *bounds; /* segment offsets (ring.h), NULL: even split */
  int N;          /* ranks = segments */
  int64_t P;      /* pieces per segment */
  size_t esz;
  tnt_dtype_t dtype;
  double prescale; /* this rank's factor on its own input */
  int stream;      /* final values go out with streaming stores (stream_store.h) */
} plan_t;

static int64_t seg_begin(const plan_t *p, int j) { return tnt_segment_begin(p->bounds, p->count, p->N, j); }

/* Send piece k of the segment [sb, sb + sl) of `from`, scaled by p->prescale
 * when `scale_out`: straight into what is sent (the transport's buffer, else a
 * cache-resident staging slot), not a pass over the input. */
static tnt_result_t send_piece(tnt_ring_t *ring, const plan_t *p, const uint8_t *from, int scale_out, int64_t sb,
                               int64_t sl, int64_t k, double deadline) {
  int64_t pb, pl;
  tnt_piece(sb, sl, k, p->P, &pb, &pl);
  const uint8_t *piece_out = from + pb * (int64_t)p->esz;
  if (scale_out) {
    uint8_t *buf;
    TNT_CHECK(tnt_ring_stage(ring, (size_t)pl * p->esz, deadline, &buf));
    tnt_put_scale(&ring->copier, p->dtype, buf, piece_out, p->prescale, (size_t)pl);
    piece_out = buf;
  }
  return tnt_ring_send(ring, piece_out, (size_t)pl * p->esz, deadline);
}

/* One step of the ring: send segment `send_seg` of `from` (scaled by
 * p->prescale on the way out when `scale_out`); receive segment `recv_seg`
 * into `dst`: added to the scaled `addend` and divided by `divisor`
 * (reduce-scatter), or copied as is (allgather: addend NULL). Piece k is sent
 * before piece k is received, so both directions of the link stay busy.
 * What the allgather copies is final, written past the cache when the plan
 * says so; a partial sum is read again by the next step. */
static tnt_result_t ring_step(tnt_ring_t *ring, const plan_t *p, const uint8_t *from, int scale_out, int send_seg,
                              uint8_t *dst, const uint8_t *addend, int divisor, int recv_seg, double deadline) {
  int64_t sb = seg_begin(p, send_seg), sl = seg_begin(p, send_seg + 1) - sb;
  int64_t rb = seg_begin(p, recv_seg), rl = seg_begin(p, recv_seg + 1) - rb;
  int64_t sent = 0;
  for (int64_t k = 0; k < p->P; k++) {
    int64_t pb, pl;
    /* the send segment is complete before the step starts, so its pieces may
     * run up to ring->lookahead ahead of the receives: never more than the
     * slots, so that every rank can always take its next piece (no cycle of
     * ranks that all wait for a free slot) */
    for (; sent < p->P && sent < k + ring->lookahead; sent++)
      TNT_CHECK(send_piece(ring, p, from, scale_out, sb, sl, sent, deadline));
    const void *piece;
    tnt_piece(rb, rl, k, p->P, &pb, &pl);
    TNT_CHECK(tnt_ring_recv(ring, (size_t)pl * p->esz, &piece, deadline));
    uint8_t *at = dst + pb * (int64_t)p->esz;
    /* partial sum of the earlier ranks first, then ours: the order of the ring */
    if (addend)
      tnt_reduce_scaled(p->dtype, at, piece, addend + pb * (int64_t)p->esz, p->prescale, divisor, (size_t)pl);
    else if (p->stream)
      tnt_copy_streaming(at, piece, (size_t)pl * p->esz);
    else
      tnt_copy_unaliased(at, piece, (size_t)pl * p->esz);
    TNT_CHECK(tnt_ring_release(ring));
  }
  return TNT_SUCCESS;
}

static plan_t make_plan(const tnt_ring_t *ring, int64_t count, tnt_dtype_t dtype, double prescale,
                        const int64_t *bounds) {
  plan_t p = {count, bounds, ring->size, 1, tnt_dtype_size(dtype), dtype, prescale, 0};
  p.stream = tnt_stream_wanted((size_t)count * p.esz);
  int64_t max_seg = 0, slot_elems = (int64_t)(ring->slot_bytes / p.esz);
  for (int j = 0; j < p.N; j++)
    if (seg_begin(&p, j + 1) - seg_begin(&p, j) > max_seg) max_seg = seg_begin(&p, j + 1) - seg_begin(&p, j);
  if (max_seg > 0) p.P = (max_seg + slot_elems - 1) / slot_elems;
  return p;
}

/* The reduce-scatter's last step and the allgather's first, fused: each piece
 * completed here is the piece the allgather sends on first, so it is reduced
 * straight into the slot that carries it to next (the transport's buffer, else
 * the staging slot) and copied from there into dst with streaming stores (the
 * plan counts as past the cache whenever this runs), instead of being written
 * into dst and read back out of it by the allgather (a pass over memory saved:
 * see docs/benchmarks.md "Past the cache"). In the same iteration the piece
 * coming the other way, the allgather's first from prev, is copied into dst:
 * both ranks of every link run this same sequence (RS piece k, AG piece k, RS
 * piece k+1, ...), so sends and receives still pair up. */
static tnt_result_t last_reduce_step(tnt_ring_t *ring, const plan_t *p, const uint8_t *from, int scale_out,
                                     uint8_t *dst, const uint8_t *src, int divisor, double deadline) {
  const int N = p->N, r = ring->rank;
  const int send_seg = (r - (N - 2) + 2 * N) % N; /* the reduce-scatter's last send */
  const int done_seg = (r + 1) % N;               /* completed here, and the allgather's first send */
  const int got_seg = r;                          /* the allgather's first receive, completed by prev */
  /* dst in place of src: the input sent in step 0 is overwritten by the
   * allgather's pieces, so every send must have left before (a no-op on shm) */
  const int in_place = src == dst;
  int64_t sb = seg_begin(p, send_seg), sl = seg_begin(p, send_seg + 1) - sb;
  int64_t db = seg_begin(p, done_seg), dl = seg_begin(p, done_seg + 1) - db;
  int64_t gb = seg_begin(p, got_seg), gl = seg_begin(p, got_seg + 1) - gb;
  for (int64_t k = 0; k < p->P; k++) {
    int64_t pb, pl;
    TNT_CHECK(send_piece(ring, p, from, scale_out, sb, sl, k, deadline));
    const void *piece;
    tnt_piece(db, dl, k, p->P, &pb, &pl);
    const size_t bytes = (size_t)pl * p->esz;
    TNT_CHECK(tnt_ring_recv(ring, bytes, &piece, deadline));
    uint8_t *carry;
    TNT_CHECK(tnt_ring_stage(ring, bytes, deadline, &carry));
    uint8_t *done = dst + pb * (int64_t)p->esz;
    const uint8_t *addend = src + pb * (int64_t)p->esz;
    /* An average's step, while far: into the slot and dst at once, both
     * streamed from L1 (2 ranks at 16 MiB 2.16x faster far). A sum keeps its
     * plain step: streamed, it was 0.91-0.96 of it far in 9 pairs
     * (docs/benchmarks.md, placement_ab 2026-12-02). */
    const int scales = divisor != 1 || p->prescale != 1.0;
    if (scales && tnt_put_copier_far(&ring->copier)) {
      tnt_reduce_scaled_streaming(p->dtype, carry, done, piece, addend, p->prescale, divisor, (size_t)pl);
      TNT_CHECK(tnt_ring_release(ring));
    } else {
      tnt_reduce_scaled(p->dtype, carry, piece, addend, p->prescale, divisor, (size_t)pl);
      TNT_CHECK(tnt_ring_release(ring));
      tnt_copy_streaming(done, carry, bytes);
    }
    TNT_CHECK(tnt_ring_send(ring, carry, bytes, deadline));
    tnt_piece(gb, gl, k, p->P, &pb, &pl);
    TNT_CHECK(tnt_ring_recv(ring, (size_t)pl * p->esz, &piece, deadline));
    if (in_place) TNT_CHECK(tnt_ring_flush(ring, deadline));
    tnt_copy_streaming(dst + pb * (int64_t)p->esz, piece, (size_t)pl * p->esz);
    TNT_CHECK(tnt_ring_release(ring));
  }
  return TNT_SUCCESS;
}

/* reduce-scatter: step 0 sends straight from the input (scaled on the way);
 * the last step completes a segment, so it divides (average) right there.
 * `then_allgather`: the last step is fused with the allgather's first
 * (last_reduce_step), which the caller then skips. */
static tnt_result_t reduce_scatter(tnt_ring_t *ring, const plan_t *p, const uint8_t *src, uint8_t *dst, int divisor,
                                   int then_allgather, double deadline) {
  const int N = p->N, r = ring->rank;
  for (int s = 0; s < N - 1; s++) {
    const uint8_t *from = s == 0 ? src : dst;
    const int scale_out = s == 0 && p->prescale != 1.0, last = s == N - 2;
    if (last && then_allgather)
      TNT_CHECK(last_reduce_step(ring, p, from, scale_out, dst, src, divisor, deadline));
    else
      TNT_CHECK(ring_step(ring, p, from, scale_out, (r - s + 2 * N) % N, dst, src, last ? divisor : 1,
                          (r - s - 1 + 2 * N) % N, deadline));
  }
  /* what was sent may be written next: the allgather overwrites segments sent
   * as partial sums (and, in place, the input) */
  return tnt_ring_flush(ring, deadline);
}

/* allgather steps first..N-2 (step 0 may have run fused with the reduce-scatter) */
static tnt_result_t allgather(tnt_ring_t *ring, const plan_t *p, uint8_t *dst, int first, double deadline) {
  const int N = p->N, r = ring->rank;
  for (int s = first; s < N - 1; s++)
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
  /* fused only past the cache: at 4 MiB on 2 and 4 ranks reducing into the
   * peer's slot cost 10 % against reducing into our own cached output */
  const int fuse = p.stream;
  TNT_CHECK(reduce_scatter(ring, &p, in, out, divisor, fuse, deadline));
  return allgather(ring, &p, out, fuse, deadline);
}

tnt_result_t tnt_reduce_scatter_ring(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                     double prescale, const int64_t *bounds, double deadline) {
  if (ring->size == 1) {
    tnt_scale(dtype, out, in, prescale, (size_t)count);
    return TNT_SUCCESS;
  }
  plan_t p = make_plan(ring, count, dtype, prescale, bounds);
  return reduce_scatter(ring, &p, in, out, 1, 0, deadline);
}

tnt_result_t tnt_allgather_segments_ring(tnt_ring_t *ring, void *out, int64_t count, tnt_dtype_t dtype,
                                         const int64_t *bounds, double deadline) {
  if (ring->size == 1) return TNT_SUCCESS;
  plan_t p = make_plan(ring, count, dtype, 1.0, bounds);
  return allgather(ring, &p, out, 0, deadline);
}
