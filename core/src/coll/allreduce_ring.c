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

static int64_t seg_begin(int64_t count, int N, int j) { return count * j / N; }

tnt_result_t tnt_allreduce_ring(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                double deadline) {
  const int N = ring->size, r = ring->rank;
  const size_t esz = tnt_dtype_size(dtype);
  const uint8_t *src = in;
  uint8_t *dst = out;
  if (N == 1) {
    if (in != out) memcpy(out, in, (size_t)count * esz);
    return TNT_SUCCESS;
  }
  int64_t max_seg = (count + N - 1) / N;
  int64_t slot_elems = (int64_t)(ring->slot_bytes / esz);
  int64_t P = max_seg > 0 ? (max_seg + slot_elems - 1) / slot_elems : 1;

  for (int s = 0; s < N - 1; s++) { /* reduce-scatter */
    int send_seg = (r - s + 2 * N) % N, recv_seg = (r - s - 1 + 2 * N) % N;
    const uint8_t *send_from = s == 0 ? src : dst;
    int64_t sb = seg_begin(count, N, send_seg), sl = seg_begin(count, N, send_seg + 1) - sb;
    int64_t rb = seg_begin(count, N, recv_seg), rl = seg_begin(count, N, recv_seg + 1) - rb;
    for (int64_t k = 0; k < P; k++) {
      int64_t pb, pl;
      tnt_piece(sb, sl, k, P, &pb, &pl);
      TNT_CHECK(tnt_ring_send(ring, send_from + pb * esz, (size_t)pl * esz, deadline));
      const void *piece;
      TNT_CHECK(tnt_ring_recv(ring, &piece, deadline));
      tnt_piece(rb, rl, k, P, &pb, &pl);
      /* partial sum of earlier ranks first, then ours: the order of the ring */
      tnt_reduce_sum(dtype, dst + pb * esz, piece, src + pb * esz, (size_t)pl);
      TNT_CHECK(tnt_ring_release(ring));
    }
  }
  for (int s = 0; s < N - 1; s++) { /* allgather */
    int send_seg = (r + 1 - s + 2 * N) % N, recv_seg = (r - s + 2 * N) % N;
    int64_t sb = seg_begin(count, N, send_seg), sl = seg_begin(count, N, send_seg + 1) - sb;
    int64_t rb = seg_begin(count, N, recv_seg), rl = seg_begin(count, N, recv_seg + 1) - rb;
    for (int64_t k = 0; k < P; k++) {
      int64_t pb, pl;
      tnt_piece(sb, sl, k, P, &pb, &pl);
      TNT_CHECK(tnt_ring_send(ring, dst + pb * esz, (size_t)pl * esz, deadline));
      const void *piece;
      TNT_CHECK(tnt_ring_recv(ring, &piece, deadline));
      tnt_piece(rb, rl, k, P, &pb, &pl);
      memcpy(dst + pb * esz, piece, (size_t)pl * esz);
      TNT_CHECK(tnt_ring_release(ring));
    }
  }
  return TNT_SUCCESS;
}
