/* allreduce_small.c - allreduce of a few kilobytes in one exchange.
 *
 * A ring moves small buffers in 2(N-1) dependent hops, and each hop is a
 * wake-up of another process: with 8 ranks on 2 cores that is 14 scheduler
 * round trips for 4 bytes. Here every rank publishes its whole (scaled)
 * contribution in one transport exchange and then adds all N contributions
 * itself, segment j in the ring's order j, j+1, ..., j+N-1 (ring.h): every rank
 * performs the same additions in the same order as the ring would, so a tensor
 * gets the same bits whichever algorithm its fusion group took. */
#include <string.h>

#include "common.h"
#include "dtype.h"
#include "ring.h"

tnt_result_t tnt_allreduce_small(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 const int64_t *bounds, void *scratch, double deadline) {
  const int N = ring->size;
  const size_t esz = tnt_dtype_size(dtype), bytes = (size_t)count * esz;
  size_t lens[N];
  TNT_CHECK(ring->t->exchange(ring->ts, in, bytes, scratch, bytes, lens, deadline));
  const uint8_t *all = scratch;
  uint8_t *dst = out;
  for (int j = 0; j < N; j++) {
    int64_t b = tnt_segment_begin(bounds, count, N, j), len = tnt_segment_begin(bounds, count, N, j + 1) - b;
    if (len <= 0) continue;
    size_t at = (size_t)b * esz;
    memcpy(dst + at, all + (size_t)j * bytes + at, (size_t)len * esz);
    for (int k = 1; k < N; k++)
      tnt_reduce_sum(dtype, dst + at, dst + at, all + (size_t)((j + k) % N) * bytes + at, (size_t)len);
  }
  return TNT_SUCCESS;
}
