/* allreduce_pair_direct.c - allreduce of two ranks across the network in the
 * network engine's direct messages (transport.h's sendrecv): two ranks on two
 * hosts, and the link between 2 hosts of the hierarchical allreduce.
 *
 * Up to TNT_PAIR_SWAP_BYTES each rank sends the other its whole buffer and
 * adds the one it receives: one phase. Above, halves (the ring's
 * reduce-scatter and allgather for N = 2): position 0 sums the first half,
 * position 1 the second, each sending the half it does not sum, then they swap
 * the summed halves; each rank adds only half the buffer, and no message is
 * larger than half of it. Over TCP a swap of a whole buffer each way can fall
 * off a cliff, and where it falls moves from one machine to the next: on one
 * test bed 1 MB took 0.55 ms, on another 1.1-1.3 ms where 768 KB took
 * 0.5-0.7 ms and halves of the 1 MB 0.58-0.67 ms (docs/benchmarks.md, "The
 * pair's swap up to 512 KiB"); on a third, halves were 1.5-2x as fast as the
 * swap at 512 KB, and 1.3-1.5x on 2 x 2 at 1 MB (slices of 512 KB), where
 * at 192 and 256 KB the swap stayed 1.4x ahead ("The pair's swap up to 256
 * KiB"). Halves cost one message latency more where the swap would have been
 * fine; a swap past the cliff costs up to twice the time.
 *
 * Each message is one send and one receive, the send
 * posted first, nothing else with the bytes; the ring's pieces instead each
 * wait for their PUT to be read before their receive is posted
 * (docs/benchmarks.md, "A pair of ranks in direct MPI messages": 2 hosts x 1
 * rank, 256 KB in 0.17 ms by the swap, 0.33 by halves, 0.37 by the ring).
 *
 * The bits are the ring's (ring.h): with two ranks every element is one
 * addition of two (already scaled) operands, position 0's first, whichever rank
 * adds. The addition of every dtype (tnt_reduce_sum; float16 and bfloat16
 * through float) is commutative but for NaNs: of two NaNs the sum keeps one,
 * and which one depends on the operand order of the machine code, so that
 * both ranks of a swap adding "mine + theirs" kept each its own NaN. */
#include "common.h"
#include "dtype.h"
#include "ring.h"

#define TNT_PAIR_SWAP_BYTES (256 << 10)
/* No message of the pair is larger than `piece_bytes` (TNT_MPI_PAIR_PIECE_KB,
 * 256 KiB unless set): both phases go in pieces of at most this much, one
 * message each way per piece, each piece's sum made before the next piece's
 * messages. Open MPI over TCP sends a message from
 * 192 KiB on in its "RDMA pipeline" (the bulk of it one emulated put), and a
 * pair of ranks on the test bed moved 8 MB each way at 1.5-1.8 GB/s in
 * messages of 1-8 MB against 2.0-3.1 GB/s in pieces of 256-512 KB (a C
 * program, without Tarantella; 128 KB pieces: 1.5-1.8); in the allreduce,
 * pieces of 256 KB made 2 x 1 1.3-2x as fast at 1-16 MB, and 2 x 2 1.3-1.6x
 * at 2-16 MB (docs/benchmarks.md, "The pair's messages in pieces"). In
 * place, what the peer sends lands in the ring's scratch, one piece of it.
 * Where an MPI moves large messages at full speed (not measured here), each
 * piece costs a round trip: TNT_MPI_PAIR_PIECE_KB raises the size. */

tnt_result_t tnt_allreduce_pair_direct(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                       double prescale, size_t piece_bytes, double deadline) {
  const tnt_transport_t *t = ring->t;
  const int64_t esz = (int64_t)tnt_dtype_size(dtype);
  if (prescale != 1.0) { /* scaled into the output first, then summed in place */
    tnt_scale(dtype, out, in, prescale, (size_t)count);
    in = out;
  }
  /* what this rank sums (mine) and sends (theirs): all of it, or halves */
  const int swap = count * esz <= TNT_PAIR_SWAP_BYTES, second = !swap && ring->rank == 1;
  const int64_t half = swap ? 0 : count / 2;
  const int64_t mine_at = second ? half : 0, mine_n = swap ? count : second ? count - half : half;
  const int64_t theirs_at = second ? 0 : half, theirs_n = swap ? count : count - mine_n;
  const uint8_t *src = in;
  uint8_t *dst = out;
  /* the peer's part of mine lands in `out`, unless `out` is the input still
   * being sent (in place): then in the ring's scratch; both ranks cut both
   * halves into the same number of pieces, so that piece k of what one sends
   * is piece k of what the other receives (a swap is one piece) */
  const int64_t most = mine_n > theirs_n ? mine_n : theirs_n;
  const int64_t piece_elems = (int64_t)piece_bytes / esz > 0 ? (int64_t)piece_bytes / esz : 1;
  const int64_t P = most <= piece_elems ? 1 : (most + piece_elems - 1) / piece_elems;
  uint8_t *scratch = NULL;
  if (in == out) TNT_CHECK(tnt_ring_scratch(ring, (size_t)((mine_n + P - 1) / P * esz), &scratch));
  int64_t mb, ml, tb, tl; /* piece k of mine and of theirs */
  for (int64_t k = 0; k < P; k++) {
    tnt_piece(mine_at, mine_n, k, P, &mb, &ml);
    tnt_piece(theirs_at, theirs_n, k, P, &tb, &tl);
    uint8_t *land = scratch ? scratch : dst + mb * esz;
    TNT_CHECK(t->sendrecv(ring->ts, ring->next, src + tb * esz, (size_t)(tl * esz), land, (size_t)(ml * esz),
                          deadline));
    const uint8_t *mine = src + mb * esz; /* position 0's operand first (see above) */
    tnt_reduce_sum(dtype, dst + mb * esz, ring->rank == 0 ? mine : land, ring->rank == 0 ? land : mine, (size_t)ml);
  }
  if (swap) return TNT_SUCCESS; /* every element summed here */
  for (int64_t k = 0; k < P; k++) { /* the summed halves, piece by piece */
    tnt_piece(mine_at, mine_n, k, P, &mb, &ml);
    tnt_piece(theirs_at, theirs_n, k, P, &tb, &tl);
    TNT_CHECK(t->sendrecv(ring->ts, ring->next, dst + mb * esz, (size_t)(ml * esz), dst + tb * esz,
                          (size_t)(tl * esz), deadline));
  }
  return TNT_SUCCESS;
}
