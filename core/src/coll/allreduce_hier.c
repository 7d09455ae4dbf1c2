/* allreduce_hier.c - allreduce across H hosts of L ranks each (H, L > 1).
 *
 *   1. reduce-scatter inside the host (ring over shm): the buffer is cut into
 *      L slices; host position i ends up with the host's partial sum of
 *      slice (i + 1) % L (tnt_ring_owned);
 *   2. allreduce of that slice across hosts, by the ranks at position i of
 *      every host (their own ring over the network; between 2 hosts, with
 *      `pair`, the pair's direct messages, allreduce_pair_direct.c): all L
 *      positions use the network at once, each for 1/L of the bytes;
 *   3. allgather inside the host: every rank gets every finished slice.
 * Each rank sends 2(L-1)/L of the buffer over shm and 2(H-1)/(H L) over the
 * network, against 2(N-1)/N over a flat ring whose links all wait on the
 * slowest (network) hop.
 *
 * The order of additions (ring.h's promise, kept): the buffer's N = H * L
 * segments are those of the flat ring (the caller's bounds, fused or not);
 * slice s is segments s*H .. s*H + H-1, and segment s*H + k of it is summed
 *   over hosts h = k, k+1, ..., k+H-1 (mod H) of
 *     host h's sum over positions s, s+1, ..., s+L-1 (mod L),
 * each sum from the left, each input scaled first. tnt_allreduce_hier_small
 * adds in exactly this order, so a tensor gets the same bits whatever it is
 * fused with and whichever path its buffer takes; every rank receives the
 * owner's bits, so every rank holds the same ones. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "ring.h"

/* Segment bounds of the slices (L + 1) and of slice s's H segments, from the
 * job's N segments. */
static void slice_bounds(const int64_t *bounds, int64_t count, int H, int L, int64_t *lb) {
  for (int s = 0; s <= L; s++) lb[s] = tnt_segment_begin(bounds, count, H * L, s * H);
}

tnt_result_t tnt_allreduce_hier(tnt_ring_t *host_ring, tnt_ring_t *net_ring, const void *in, void *out, int64_t count,
                                tnt_dtype_t dtype, double prescale, const int64_t *bounds, size_t pair_piece,
                                double deadline) {
  const int L = host_ring->size, H = net_ring->size;
  const size_t esz = tnt_dtype_size(dtype);
  int64_t lb[L + 1], cb[H + 1];
  slice_bounds(bounds, count, H, L, lb);
  TNT_CHECK(tnt_reduce_scatter_ring(host_ring, in, out, count, dtype, prescale, lb, deadline));
  const int s = tnt_ring_owned(host_ring);
  for (int k = 0; k <= H; k++) cb[k] = tnt_segment_begin(bounds, count, H * L, s * H + k) - lb[s];
  uint8_t *slice = (uint8_t *)out + (size_t)lb[s] * esz;
  if (pair_piece) /* 2 hosts: one addition per element, whoever adds */
    TNT_CHECK(tnt_allreduce_pair_direct(net_ring, slice, slice, lb[s + 1] - lb[s], dtype, 1.0, pair_piece, deadline));
  else
    TNT_CHECK(tnt_allreduce_ring(net_ring, slice, slice, lb[s + 1] - lb[s], dtype, 1.0, 1, cb, deadline));
  return tnt_allgather_segments_ring(host_ring, out, count, dtype, lb, deadline);
}

tnt_result_t tnt_reduce_in_hier_order(tnt_dtype_t dtype, void *out, const void *const *contrib, int64_t count,
                                      const int *rank_at, int H, int L, const int64_t *bounds) {
  const int N = H * L;
  const size_t esz = tnt_dtype_size(dtype);
  uint8_t *dst = out;
  uint8_t *part = malloc(count > 0 ? (size_t)count * esz : 1); /* one host's partial sum */
  if (!part) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  for (int s = 0; s < L; s++)
    for (int k = 0; k < H; k++) {
      int64_t b = tnt_segment_begin(bounds, count, N, s * H + k);
      int64_t len = tnt_segment_begin(bounds, count, N, s * H + k + 1) - b;
      if (len <= 0) continue;
      const size_t at = (size_t)b * esz;
      for (int j = 0; j < H; j++) {
        const int h = (k + j) % H;
        uint8_t *acc = j == 0 ? dst + at : part;
        memcpy(acc, (const uint8_t *)contrib[rank_at[h * L + s]] + at, (size_t)len * esz);
        for (int i = 1; i < L; i++)
          tnt_reduce_sum(dtype, acc, acc, (const uint8_t *)contrib[rank_at[h * L + (s + i) % L]] + at, (size_t)len);
        if (j > 0) tnt_reduce_sum(dtype, dst + at, dst + at, part, (size_t)len);
      }
    }
  free(part);
  return TNT_SUCCESS;
}

tnt_result_t tnt_allreduce_hier_small(tnt_ring_t *flat, const int *rank_at, int H, int L, const void *in, void *out,
                                      int64_t count, tnt_dtype_t dtype, const int64_t *bounds, void *scratch,
                                      double deadline) {
  const int N = flat->size;
  const size_t bytes = (size_t)count * tnt_dtype_size(dtype);
  size_t lens[N];
  TNT_CHECK(flat->t->exchange(flat->ts, in, bytes, scratch, bytes, lens, deadline));
  const void *contrib[N];
  for (int q = 0; q < N; q++) contrib[q] = (const uint8_t *)scratch + (size_t)q * bytes;
  return tnt_reduce_in_hier_order(dtype, out, contrib, count, rank_at, H, L, bounds);
}
