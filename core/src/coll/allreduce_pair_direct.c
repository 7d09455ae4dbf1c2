/* allreduce_pair_direct.c - allreduce of two ranks across the network in the
 * network engine's direct messages (transport.h's sendrecv): two ranks on two
 * hosts, and the link between 2 hosts of the hierarchical allreduce.
 *
 * Up to TNT_PAIR_SWAP_BYTES each rank sends the other its whole buffer and
 * adds the one it receives: one phase. Above, halves (the ring's
 * reduce-scatter and allgather for N = 2): position 0 sums the first half,
 * position 1 the second, each sending the half it does not sum, then they swap
 * the summed halves; each rank adds only half the buffer, which on the test
 * bed's two cores (shared with the kernel's TCP copies) is worth the second
 * phase from 2-4 MB on. Each message is one send and one receive, the send
 * posted first, nothing else with the bytes; the ring's pieces instead each
 * wait for their PUT to be read before their receive is posted
 * (docs/benchmarks.md, "A pair of ranks in direct MPI messages": 2 hosts x 1
 * rank, 256 KB in 0.17 ms by the swap, 0.33 by halves, 0.37 by the ring).
 *
 * The bits are the ring's (ring.h): with two ranks every element is one
 * addition of two (already scaled) operands, and the addition of every dtype
 * (tnt_reduce_sum; float16 and bfloat16 through float) is commutative, so it
 * does not matter which rank adds. */
#include "common.h"
#include "dtype.h"
#include "ring.h"

#define TNT_PAIR_SWAP_BYTES (1 << 20)

tnt_result_t tnt_allreduce_pair_direct(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                       double prescale, double deadline) {
  const tnt_transport_t *t = ring->t;
  const size_t esz = tnt_dtype_size(dtype);
  if (prescale != 1.0) { /* scaled into the output first, then summed in place */
    tnt_scale(dtype, out, in, prescale, (size_t)count);
    in = out;
  }
  /* what this rank sums (mine) and sends (theirs): all of it, or halves */
  const int swap = (size_t)count * esz <= TNT_PAIR_SWAP_BYTES, second = !swap && ring->rank == 1;
  const int64_t half = swap ? 0 : count / 2;
  const int64_t mine_at = second ? half : 0, mine_n = swap ? count : second ? count - half : half;
  const int64_t theirs_at = second ? 0 : half, theirs_n = swap ? count : count - mine_n;
  const uint8_t *src = in;
  uint8_t *dst = out;
  /* the peer's part of mine lands in `out`, unless `out` is the input still
   * being sent (in place): then in the ring's scratch */
  uint8_t *landing = dst + mine_at * (int64_t)esz;
  if (in == out) TNT_CHECK(tnt_ring_scratch(ring, (size_t)mine_n * esz, &landing));
  TNT_CHECK(t->sendrecv(ring->ts, ring->next, src + theirs_at * (int64_t)esz, (size_t)theirs_n * esz, landing,
                        (size_t)mine_n * esz, deadline));
  tnt_reduce_sum(dtype, dst + mine_at * (int64_t)esz, src + mine_at * (int64_t)esz, landing, (size_t)mine_n);
  if (swap) return TNT_SUCCESS; /* every element summed here */
  return t->sendrecv(ring->ts, ring->next, dst + mine_at * (int64_t)esz, (size_t)mine_n * esz,
                     dst + theirs_at * (int64_t)esz, (size_t)theirs_n * esz, deadline);
}
