/* allreduce_small.c - allreduce of a few kilobytes in one exchange.
 *
 * A ring moves small buffers in 2(N-1) dependent hops, and each hop is a
 * wake-up of another process: with 8 ranks on 2 cores that is 14 scheduler
 * round trips for 4 bytes. Here every rank publishes its whole (scaled)
 * contribution in one transport exchange and then adds all N contributions
 * itself, segment j in the ring's order j, j+1, ..., j+N-1 (ring.h): every rank
 * performs the same additions in the same order as the ring would, so a tensor
 * gets the same bits whichever algorithm its fusion group took. The one-round
 * path (negotiate.c: payloads that rode with the negotiation) adds the same
 * way from the negotiation's messages, through tnt_reduce_in_ring_order. */
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "ring.h"

void tnt_reduce_in_ring_order(tnt_dtype_t dtype, void *out, const void *const *contrib, int64_t count, int N,
                              const int64_t *bounds) {
  tnt_reduce_range_in_ring_order(dtype, out, 0, contrib, 0, 0, count, count, N, bounds);
}

/* The exchange in place (shm: transport.h's exchange_buffer and exchange_view):
 * the contribution is built where it is published, and every rank's is added
 * where it lies, instead of N copies into scratch. 0: not offered here. */
static int small_in_place(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                          const int64_t *bounds, double deadline, tnt_result_t *res) {
  const tnt_transport_t *t = ring->t;
  const int N = ring->size;
  const size_t bytes = (size_t)count * tnt_dtype_size(dtype);
  size_t cap = 0;
  uint8_t *mine = tnt_allreduce_direct_possible(t) ? t->exchange_buffer(ring->ts, &cap) : NULL;
  if (!mine || cap < bytes) return 0;
  const uint8_t *msgs[N];
  memcpy(mine, in, bytes);
  *res = tnt_exchange_in_place(t, ring->ts, N, mine, bytes, msgs, cap, deadline);
  if (*res == TNT_SUCCESS) tnt_reduce_in_ring_order(dtype, out, (const void *const *)msgs, count, N, bounds);
  return 1;
}

tnt_result_t tnt_allreduce_small(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 const int64_t *bounds, void *scratch, double deadline) {
  const int N = ring->size;
  const size_t bytes = (size_t)count * tnt_dtype_size(dtype);
  size_t lens[N];
  const void *contrib[N];
  tnt_result_t res;
  if (small_in_place(ring, in, out, count, dtype, bounds, deadline, &res)) return res;
  TNT_CHECK(ring->t->exchange(ring->ts, in, bytes, scratch, bytes, lens, deadline));
  for (int q = 0; q < N; q++) contrib[q] = (const uint8_t *)scratch + (size_t)q * bytes;
  tnt_reduce_in_ring_order(dtype, out, contrib, count, N, bounds);
  return TNT_SUCCESS;
}
