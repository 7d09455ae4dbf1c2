/* allreduce_pair.c - allreduce of two ranks across the network: each sends
 * its whole (scaled) input to the other, and each adds the two.
 *
 * With two ranks the ring sends half the buffer each way, adds, then sends the
 * other half each way: the same bytes as here, but in two phases, and the
 * second cannot start before the first's pieces have arrived and been added.
 * Over the network every phase pays the transport's latency per piece in
 * flight (a control message, a rendezvous), so the ring's middle is idle
 * link. Here every piece leaves as soon as its slot at the peer is free (up to
 * ring->lookahead ahead of the receives), and each arriving piece is added
 * while the next ones travel. Each rank adds every element instead of half of
 * them: one more pass over the buffer, which the saved phase pays for only up
 * to TNT_PAIR_MAX_BYTES (ring.h: measured on 2 hosts whose ranks share the
 * cores with the "network").
 *
 * The bits are the ring's (ring.h): an element of segment j is added in the
 * order j, j+1, so both ranks compute each element with the same operands in
 * the same order.
 *
 * Puts are asynchronous: what is sent straight from `in` must not change until
 * it has left, so when the result overwrites the input (in == out) every piece
 * is staged (copied, and scaled, into the transport's send buffer) instead. */
#include "common.h"
#include "dtype.h"
#include "ring.h"

/* out[0, n) = the segment's first contribution + its second, where this rank's
 * (`mine`, scaled by `factor` here: the peer's arrived scaled) is the first when
 * `mine_first`. Both ranks sum an element through this one call of
 * tnt_reduce_sum, with the same operands in the same places and over the same
 * blocks of the same ranges, so that they get the same bits also where both
 * operands are NaN: the sum then keeps one of the two NaNs, and which one
 * depends on the operand order of the machine code (x86 keeps the first
 * source's), which the compiler picks per loop. The rank whose contribution came
 * second used to add through tnt_reduce_scaled, the other through
 * tnt_reduce_sum: with NaNs of other signs or payloads on the two ranks (2 ranks
 * on one host, 48-128 KiB), each rank kept its own NaN. Blockwise through the
 * stack whatever the factor (which each rank has its own of), so that both
 * ranks' calls cover the same elements; the product is rounded before the sum,
 * as everywhere else. */
static void add_in_segment_order(tnt_dtype_t dtype, uint8_t *out, const uint8_t *mine, const uint8_t *peer,
                                 double factor, int mine_first, size_t n) {
  enum { BLOCK = 2048 };
  uint64_t scaled[BLOCK]; /* 16 KiB: one block of the largest dtype stays in L1 */
  const size_t esz = tnt_dtype_size(dtype);
  for (size_t done = 0; done < n; done += BLOCK) {
    const size_t len = n - done < BLOCK ? n - done : BLOCK;
    const uint8_t *m = mine + done * esz, *p = peer + done * esz;
    if (factor != 1.0) { /* x * 1 is x: then mine is its own operand */
      tnt_scale(dtype, scaled, m, factor, len);
      m = (const uint8_t *)scaled;
    }
    tnt_reduce_sum(dtype, out + done * esz, mine_first ? m : p, mine_first ? p : m, len);
  }
}

tnt_result_t tnt_allreduce_pair(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                double prescale, const int64_t *bounds, double deadline) {
  const size_t esz = tnt_dtype_size(dtype);
  const int64_t slot_elems = (int64_t)(ring->slot_bytes / esz);
  const int64_t P = count > 0 ? (count + slot_elems - 1) / slot_elems : 0;
  /* segment 0 is [0, split), summed as rank 0's + rank 1's; segment 1 the other way */
  const int64_t split = tnt_segment_begin(bounds, count, 2, 1);
  const int me = ring->rank;
  const int stage = prescale != 1.0 || in == out;
  const uint8_t *src = in;
  uint8_t *dst = out;
  int64_t sent = 0;
  for (int64_t k = 0; k < P; k++) {
    for (; sent < P && sent < k + ring->lookahead; sent++) {
      int64_t pb, pl;
      tnt_piece(0, count, sent, P, &pb, &pl);
      const uint8_t *piece_out = src + pb * (int64_t)esz;
      if (stage) {
        uint8_t *buf;
        TNT_CHECK(tnt_ring_stage(ring, (size_t)pl * esz, deadline, &buf));
        tnt_put_scale(&ring->copier, dtype, buf, piece_out, prescale, (size_t)pl);
        piece_out = buf;
      }
      TNT_CHECK(tnt_ring_send(ring, piece_out, (size_t)pl * esz, deadline));
    }
    const void *got;
    int64_t pb, pl;
    tnt_piece(0, count, k, P, &pb, &pl);
    TNT_CHECK(tnt_ring_recv(ring, (size_t)pl * esz, &got, deadline));
    const uint8_t *theirs = got;
    /* [pb, pb + pl) may straddle the split: each side in its segment's order */
    for (int64_t lo = pb; lo < pb + pl;) {
      const int seg = lo < split ? 0 : 1;
      const int64_t hi = seg == 0 && split < pb + pl ? split : pb + pl;
      const size_t n = (size_t)(hi - lo);
      uint8_t *at = dst + lo * (int64_t)esz;
      const uint8_t *mine = src + lo * (int64_t)esz, *peer = theirs + (lo - pb) * (int64_t)esz;
      add_in_segment_order(dtype, at, mine, peer, prescale, seg == me, n);
      lo = hi;
    }
    TNT_CHECK(tnt_ring_release(ring));
  }
  return tnt_ring_flush(ring, deadline); /* the caller owns `in` once we return */
}
