/* ring.h - a rank's link to its ring neighbours, over the transport interface.
 *
 * Every collective here moves data around one ring: rank r puts pieces into the
 * window of next = r+1 and receives pieces from prev = r-1. The window is cut
 * into `slots` slots of `slot_bytes`; piece number i of the link goes to slot
 * i % slots. Puts are asynchronous (transport.h): a piece's source may change
 * only after a fence, which the ring takes for its own memory and
 * tnt_ring_flush for the caller's. Flow control is one counter each way: DATA
 * (pieces delivered, bumped by the sender) and CREDIT (pieces consumed, bumped
 * by the receiver).
 * The sender of piece i waits until piece i - slots has been consumed, so up to
 * `slots` pieces are in flight and a slow rank never has its slot overwritten.
 * The counters persist across collectives, so no reset handshake is needed.
 * A piece of at most half a slot does not always start at its slot's
 * beginning: it moves through the slot from one use of the slot to the next
 * (slot_offset in ring.c), so that a loop of small messages writes lines the
 * receiver's core has not read lately.
 *
 * A ring is any cyclic order of some of the transport's ranks: `rank`/`size`
 * are this rank's position in it and its length (what the algorithms use),
 * `next`/`prev` the transport's ids of the neighbours. Several rings may share
 * one transport on different channels (transport.h): their own counters and
 * their own region of the window. */
#ifndef TNT_RING_H
#define TNT_RING_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "transport/put_copy.h"

typedef struct {
  const tnt_transport_t *t;
  void *ts;
  int rank, size, next, prev; /* position and length; neighbours as transport peer ids */
  int kind_data, kind_credit; /* this ring's channel's counters */
  size_t region;              /* where this channel's region starts in every window */
  size_t slot_bytes;
  int slots;
  int lookahead; /* pieces a step sends before it waits for its first receive (ring_step) */
  uint64_t tx_seq; /* pieces put to next */
  uint64_t rx_seq; /* pieces consumed from prev */
  uint64_t slot_free_for; /* tx_seq + 1 once the slot of piece tx_seq is known to be free */
  double timeout_s;
  uint8_t *window;
  uint8_t *staging; /* one slot: a piece scaled on its way out */
  tnt_put_copier_t copier; /* how pieces are scaled into next's window: plainly, or streaming while far (put_copy.h) */
  uint8_t *scratch; /* tnt_ring_scratch: grows to the largest size asked, kept until teardown */
  size_t scratch_bytes;
} tnt_ring_t;

tnt_result_t tnt_ring_setup(tnt_ring_t *ring, const tnt_transport_t *t, void *ts, int rank, int size, size_t slot_bytes,
                            int slots, double timeout_s);
/* A ring at position `pos` of `size`, its neighbours the transport's ranks
 * next/prev, on `channel` (tnt_ring_setup: the flat ring of every rank, channel 0). */
tnt_result_t tnt_ring_setup_on(tnt_ring_t *ring, const tnt_transport_t *t, void *ts, int pos, int size, int next,
                               int prev, int channel, size_t slot_bytes, int slots, double timeout_s);
void tnt_ring_teardown(tnt_ring_t *ring);

/* Put one piece (len <= slot_bytes) into next's window, waiting for a free slot.
 * The put is asynchronous: a buffer of the caller's must stay unchanged until
 * tnt_ring_flush (the ring's own staging slot and window are handled here). */
tnt_result_t tnt_ring_send(tnt_ring_t *ring, const void *src, size_t len, double deadline);
/* Wait for the next piece's slot at next, and say where to write the piece so
 * that sending it costs no copy: the transport's send buffer (registered
 * memory, or next's window itself over shm) or the ring's staging slot. Then
 * tnt_ring_send(ring, *buf, len). */
tnt_result_t tnt_ring_stage(tnt_ring_t *ring, size_t len, double deadline, uint8_t **buf);
/* Local completion of every piece sent so far: the caller's buffers that were
 * sent from may change. Every collective calls it before it returns or writes
 * over what it sent. */
tnt_result_t tnt_ring_flush(tnt_ring_t *ring, double deadline);
/* Wait for the next piece from prev, `len` bytes long (what prev passed to
 * tnt_ring_send for it: a small piece's place in its slot depends on its
 * length, see slot_offset); *piece points into this rank's window. */
tnt_result_t tnt_ring_recv(tnt_ring_t *ring, size_t len, const void **piece, double deadline);
/* Give the slot of the last received piece back to prev. */
tnt_result_t tnt_ring_release(tnt_ring_t *ring);
/* *buf: `bytes` of the ring's own memory, for an algorithm's use until it
 * returns (kept between calls, so a steady loop allocates nothing). */
tnt_result_t tnt_ring_scratch(tnt_ring_t *ring, size_t bytes, uint8_t **buf);

/* floor(len * k / P) without forming len * k, which passes 2^63 for a collective of a few
 * hundred GB cut into small pieces (len 2^38 bytes, P 2^26 pieces of 4 KiB) */
static inline int64_t tnt_piece_offset(int64_t len, int64_t k, int64_t P) {
  return len / P * k + len % P * k / P;
}

/* Start and end of piece k of P of the element range [begin, begin + len). */
static inline void tnt_piece(int64_t begin, int64_t len, int64_t k, int64_t P, int64_t *pb, int64_t *pl) {
  int64_t a = begin + tnt_piece_offset(len, k, P), b = begin + tnt_piece_offset(len, k + 1, P);
  *pb = a;
  *pl = b - a;
}

/* The order of additions. The buffer is cut into N segments at `bounds`
 * (N + 1 element offsets; NULL: an even split, count * j / N); every element of
 * segment j is summed in the order j, j+1, ..., j+N-1 (mod N), whichever
 * algorithm runs. A fused buffer passes the union of its tensors' own even
 * splits, so an element's order of additions depends only on its tensor and N,
 * never on what it was fused with: results are the same bits every run. */
static inline int64_t tnt_segment_begin(const int64_t *bounds, int64_t count, int N, int j) {
  return bounds ? bounds[j] : count * j / N;
}

/* The collectives (one file each). `deadline` bounds the whole operation.
 * allreduce: out = sum over ranks of (prescale_r * in_r), divided by `divisor`
 * (1: a plain sum); the scaling and the division cost no extra pass. */
tnt_result_t tnt_allreduce_ring(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                double prescale, int divisor, const int64_t *bounds, double deadline);
/* Two ranks across the network (allreduce_pair.c): each sends the other its
 * whole input and adds the two, the ring's bits in one phase instead of two.
 * Up to TNT_PAIR_MAX_BYTES: one piece of the default slot, where the ring
 * pays two pieces' latency one after the other (2 hosts x 1 rank: 1.2-1.5x
 * the ring's speed at 128 and 256 KB; level from 512 KB, where each rank's
 * extra pass over the buffer costs what the phase saves). */
#define TNT_PAIR_MAX_BYTES (256 * 1024)
/* Two ranks on one host swap whole buffers too, above TNT_SHM_PAIR_MIN_BYTES
 * and up to TNT_SHM_PAIR_MAX_BYTES (engine.c, pair_on_host): the ring's two
 * hand-offs, each the other core waiting for lines this one writes, cost
 * more there than the swap's extra pass (0.76-0.91x the ring's time at
 * 64-128 KB on 2 cores; level at 32-48 KB and 160-192 KB, 1.15-1.22x at 256
 * KB: docs/benchmarks.md). */
#define TNT_SHM_PAIR_MIN_BYTES (48 * 1024)
#define TNT_SHM_PAIR_MAX_BYTES (128 * 1024)
tnt_result_t tnt_allreduce_pair(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                double prescale, const int64_t *bounds, double deadline);
/* Two ranks across the network in the transport's direct messages
 * (allreduce_pair_direct.c, transport.h's sendrecv, which the caller checks is
 * there), none larger than `piece_bytes` (TNT_MPI_PAIR_PIECE_KB, the same on
 * both ranks): the ring's bits, at most INT_MAX bytes. */
tnt_result_t tnt_allreduce_pair_direct(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                       double prescale, size_t piece_bytes, double deadline);
/* The two halves of tnt_allreduce_ring. After the reduce-scatter, position r
 * holds the complete segment tnt_ring_owned(ring) = (r + 1) % N in `out` (the
 * others hold partial sums); the allgather spreads every owned segment. */
tnt_result_t tnt_reduce_scatter_ring(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                     double prescale, const int64_t *bounds, double deadline);
tnt_result_t tnt_allgather_segments_ring(tnt_ring_t *ring, void *out, int64_t count, tnt_dtype_t dtype,
                                         const int64_t *bounds, double deadline);
static inline int tnt_ring_owned(const tnt_ring_t *ring) { return (ring->rank + 1) % ring->size; }
/* Allreduce of at most TNT_SMALL_ALLREDUCE_BYTES through one exchange of the
 * (already scaled) inputs, added in the ring's order; scratch holds N * count
 * elements. */
#define TNT_SMALL_ALLREDUCE_BYTES (16 * 1024)
tnt_result_t tnt_allreduce_small(tnt_ring_t *ring, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 const int64_t *bounds, void *scratch, double deadline);
/* Allreduce over H hosts of L ranks (allreduce_hier.c): host_ring joins this
 * host's ranks, net_ring the ranks at this rank's position on every host;
 * `pair_piece` (H = 2 only; 0: their ring): their link sums by
 * tnt_allreduce_pair_direct in messages of at most this many bytes. */
tnt_result_t tnt_allreduce_hier(tnt_ring_t *host_ring, tnt_ring_t *net_ring, const void *in, void *out, int64_t count,
                                tnt_dtype_t dtype, double prescale, const int64_t *bounds, size_t pair_piece,
                                double deadline);
/* Its small-buffer path: one exchange over the flat ring's transport of the
 * (already scaled) inputs, added in tnt_allreduce_hier's order; rank_at[h * L + i]
 * is the rank at position i of host h; scratch holds N * count elements. */
/* out = the N contributions (already scaled) added in tnt_allreduce_hier's
 * order (the one-round path adds the negotiation's payloads this way). */
tnt_result_t tnt_reduce_in_hier_order(tnt_dtype_t dtype, void *out, const void *const *contrib, int64_t count,
                                      const int *rank_at, int H, int L, const int64_t *bounds);
tnt_result_t tnt_allreduce_hier_small(tnt_ring_t *flat, const int *rank_at, int H, int L, const void *in, void *out,
                                      int64_t count, tnt_dtype_t dtype, const int64_t *bounds, void *scratch,
                                      double deadline);
/* out = the N contributions (already scaled) added segment by segment in the
 * ring's order: segment j is contrib[j] + contrib[j+1] + ... (ring.h's rule),
 * the same bits on every rank and on every path that adds this way. */
void tnt_reduce_in_ring_order(tnt_dtype_t dtype, void *out, const void *const *contrib, int64_t count, int N,
                              const int64_t *bounds);
/* The same for the elements [lo, hi) only (allreduce_direct.c): `out` holds the
 * buffer's elements from out_at on, every contrib[q] those from in_at on. */
void tnt_reduce_range_in_ring_order(tnt_dtype_t dtype, void *out, int64_t out_at, const void *const *contrib,
                                    int64_t in_at, int64_t lo, int64_t hi, int64_t count, int N, const int64_t *bounds);
/* Allreduce through memory every rank reads in place (allreduce_direct.c): two
 * exchange rounds per chunk, the ring's bits. Needs the transport's
 * exchange_view and exchange_buffer (tnt_allreduce_direct_possible). */
int tnt_allreduce_direct_possible(const tnt_transport_t *t);
/* One exchange round in place: post `mine` (len bytes, built in the
 * transport's exchange_buffer of capacity `cap`), then msgs[q] = every rank's
 * bytes where they lie; an error unless every rank published len bytes. */
tnt_result_t tnt_exchange_in_place(const tnt_transport_t *t, void *ts, int N, const uint8_t *mine, size_t len,
                                   const uint8_t **msgs, size_t cap, double deadline);
tnt_result_t tnt_allreduce_direct(const tnt_transport_t *t, void *ts, int rank, int N, const void *in, void *out,
                                  int64_t count, tnt_dtype_t dtype, double prescale, const int64_t *bounds,
                                  double deadline);
tnt_result_t tnt_broadcast_ring(tnt_ring_t *ring, const void *in, void *out, size_t bytes, int root, double deadline);
tnt_result_t tnt_allgather_ring(tnt_ring_t *ring, const void *in, void *out, const int64_t *bytes_per_rank,
                                double deadline);

#endif
