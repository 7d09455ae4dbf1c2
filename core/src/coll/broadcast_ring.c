/* broadcast_ring.c - pipelined chain broadcast: root -> root+1 -> ... -> root-1.
 *
 * The message is cut into pieces of one window slot; each rank copies a piece
 * out and forwards it to its successor at once, so the chain streams and the time is
 * about bytes/bandwidth + N pieces of latency, whatever N is. */
#include <string.h>

#include "common.h"
#include "copy_unaliased.h"
#include "ring.h"

tnt_result_t tnt_broadcast_ring(tnt_ring_t *ring, const void *in, void *out, size_t bytes, int root, double deadline) {
  const int N = ring->size;
  const int pos = (ring->rank - root + N) % N; /* distance from the root along the ring */
  int64_t P = bytes > 0 ? (int64_t)((bytes + ring->slot_bytes - 1) / ring->slot_bytes) : 1;
  for (int64_t k = 0; k < P; k++) {
    int64_t pb, pl;
    tnt_piece(0, (int64_t)bytes, k, P, &pb, &pl);
    if (pos == 0) {
      if (N > 1) TNT_CHECK(tnt_ring_send(ring, (const uint8_t *)in + pb, (size_t)pl, deadline));
      if (in != out) memcpy((uint8_t *)out + pb, (const uint8_t *)in + pb, (size_t)pl);
      continue;
    }
    const void *piece;
    TNT_CHECK(tnt_ring_recv(ring, (size_t)pl, &piece, deadline));
    /* forwarded from out, not from the window: the put is asynchronous, and the
     * window slot goes back to prev at once */
    tnt_copy_unaliased((uint8_t *)out + pb, piece, (size_t)pl);
    TNT_CHECK(tnt_ring_release(ring));
    if (pos < N - 1) TNT_CHECK(tnt_ring_send(ring, (const uint8_t *)out + pb, (size_t)pl, deadline));
  }
  return tnt_ring_flush(ring, deadline);
}
