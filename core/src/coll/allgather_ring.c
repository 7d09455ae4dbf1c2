/* allgather_ring.c - ring allgather of blocks of different sizes.
 *
 * out is the concatenation of every rank's block in rank order. Step s = 0..N-2:
 * rank r sends block r-s (its own at step 0, then the one it just received) and
 * receives block r-s-1. Every block is cut into the same number P of pieces (P
 * from the largest block) so that each send pairs with one receive; pieces of a
 * small block may be empty, which costs one notification. */
#include <string.h>

#include "common.h"
#include "copy_unaliased.h"
#include "ring.h"

tnt_result_t tnt_allgather_ring(tnt_ring_t *ring, const void *in, void *out, const int64_t *bytes, double deadline) {
  const int N = ring->size, r = ring->rank;
  uint8_t *dst = out;
  int64_t offset[N + 1], max_bytes = 0;
  offset[0] = 0;
  for (int q = 0; q < N; q++) {
    offset[q + 1] = offset[q] + bytes[q];
    if (bytes[q] > max_bytes) max_bytes = bytes[q];
  }
  if (bytes[r]) tnt_copy_unaliased(dst + offset[r], in, (size_t)bytes[r]);
  int64_t P = max_bytes > 0 ? (max_bytes + (int64_t)ring->slot_bytes - 1) / (int64_t)ring->slot_bytes : 1;
  for (int s = 0; s < N - 1; s++) {
    int send_blk = (r - s + 2 * N) % N, recv_blk = (r - s - 1 + 2 * N) % N;
    for (int64_t k = 0; k < P; k++) {
      int64_t pb, pl;
      tnt_piece(offset[send_blk], bytes[send_blk], k, P, &pb, &pl);
      TNT_CHECK(tnt_ring_send(ring, dst + pb, (size_t)pl, deadline));
      const void *piece;
      tnt_piece(offset[recv_blk], bytes[recv_blk], k, P, &pb, &pl);
      TNT_CHECK(tnt_ring_recv(ring, (size_t)pl, &piece, deadline));
      tnt_copy_unaliased(dst + pb, piece, (size_t)pl);
      TNT_CHECK(tnt_ring_release(ring));
    }
  }
  return tnt_ring_flush(ring, deadline);
}
