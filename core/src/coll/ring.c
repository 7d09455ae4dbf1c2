/* ring.c - piece transfer on the ring link (see ring.h for the protocol). */
#include "ring.h"

#include <stdlib.h>

#include "common.h"

tnt_result_t tnt_ring_setup(tnt_ring_t *ring, const tnt_transport_t *t, void *ts, int rank, int size, size_t slot_bytes,
                            int slots, double timeout_s) {
  return tnt_ring_setup_on(ring, t, ts, rank, size, (rank + 1) % size, (rank + size - 1) % size, TNT_CHANNEL_FLAT,
                           slot_bytes, slots, timeout_s);
}

tnt_result_t tnt_ring_setup_on(tnt_ring_t *ring, const tnt_transport_t *t, void *ts, int pos, int size, int next,
                               int prev, int channel, size_t slot_bytes, int slots, double timeout_s) {
  ring->t = t;
  ring->ts = ts;
  ring->rank = pos;
  ring->size = size;
  ring->next = next;
  ring->prev = prev;
  ring->kind_data = TNT_NOTIFY_DATA + 2 * channel;
  ring->kind_credit = TNT_NOTIFY_CREDIT + 2 * channel;
  ring->slot_bytes = slot_bytes;
  ring->slots = slots;
  /* over the network a put leaves while this rank goes on: a step sends up to
   * every slot's worth of pieces before it waits for the first from prev, so
   * the link never idles for a round trip between pieces. Over shared memory
   * a put is the sender's own copy, and sending piece k just before receiving
   * piece k keeps both in cache. */
  ring->lookahead = tnt_transport_remote(t, ts, next) ? slots : 1;
  ring->tx_seq = 0;
  ring->rx_seq = 0;
  ring->slot_free_for = 0;
  ring->copier = (tnt_put_copier_t){0};
  ring->timeout_s = timeout_s;
  /* this channel's region of every window: of next's, which we put into, and of
   * the one prev puts into */
  ring->region = (size_t)channel * slot_bytes * (size_t)slots;
  ring->window = (uint8_t *)tnt_transport_window_for(t, ts, prev) + ring->region;
  ring->scratch = NULL;
  ring->scratch_bytes = 0;
  ring->staging = malloc(slot_bytes);
  return ring->staging ? TNT_SUCCESS : tnt_fail(TNT_ERR_SYSTEM, "out of memory");
}

void tnt_ring_teardown(tnt_ring_t *ring) {
  free(ring->staging);
  ring->staging = NULL;
  free(ring->scratch);
  ring->scratch = NULL;
  ring->scratch_bytes = 0;
}

tnt_result_t tnt_ring_scratch(tnt_ring_t *ring, size_t bytes, uint8_t **buf) {
  TNT_CHECK(tnt_grow_buffer(&ring->scratch, &ring->scratch_bytes, bytes, "scratch"));
  *buf = ring->scratch;
  return TNT_SUCCESS;
}

/* Wait until the slot of the next piece is free at next: piece seq - slots has
 * been consumed. Once per piece (tnt_ring_stage may have waited already). */
static tnt_result_t wait_slot(tnt_ring_t *ring, double deadline) {
  uint64_t seq = ring->tx_seq;
  if (ring->slot_free_for == seq + 1) return TNT_SUCCESS;
  if (seq >= (uint64_t)ring->slots)
    TNT_CHECK(ring->t->wait(ring->ts, ring->kind_credit, ring->next, (uint32_t)(seq - (uint64_t)ring->slots + 1), deadline));
  ring->slot_free_for = seq + 1;
  return TNT_SUCCESS;
}

/* Where piece `seq` of `len` bytes goes in the windows (from the start of a
 * window: this channel's region, its slot, its place in the slot).
 *
 * Why a small piece moves through its slot: a line that the receiving core
 * has read stays in its cache, and writing it again waits for that copy to be
 * invalidated. On the 2-vCPU VM of docs/benchmarks.md a loop of 64 KiB swaps
 * between two ranks took 11 us when each piece went to the start of its slot
 * (the 8 slots' first 64 KiB: 512 KiB, the size of a core's L2) and 7 us when
 * consecutive uses of a slot moved through its 256 KiB (2 MiB in all: lines
 * the reader's L2 has since let go of). A piece of more than half a slot
 * always starts at its slot's beginning. Both ends compute the same place:
 * the sender from tx_seq, the receiver from rx_seq and the same length. */
static size_t slot_offset(const tnt_ring_t *ring, uint64_t seq, size_t len) {
  const size_t slot = ring->region + (size_t)(seq % (uint64_t)ring->slots) * ring->slot_bytes;
  const size_t span = (len + 4095) & ~(size_t)4095; /* whole pages: the places never share a line */
  if (span == 0 || span > ring->slot_bytes / 2) return slot;
  const size_t places = ring->slot_bytes / span;
  return slot + (size_t)((seq / (uint64_t)ring->slots) % places) * span;
}

tnt_result_t tnt_ring_stage(tnt_ring_t *ring, size_t len, double deadline, uint8_t **buf) {
  TNT_CHECK(wait_slot(ring, deadline));
  void *lent = ring->t->send_buffer(ring->ts, ring->next, slot_offset(ring, ring->tx_seq, len), len);
  *buf = lent ? (uint8_t *)lent : ring->staging;
  return TNT_SUCCESS;
}

tnt_result_t tnt_ring_send(tnt_ring_t *ring, const void *src, size_t len, double deadline) {
  TNT_CHECK(wait_slot(ring, deadline));
  uint64_t seq = ring->tx_seq;
  if (len) TNT_CHECK(ring->t->put(ring->ts, ring->next, slot_offset(ring, seq, len), src, len));
  TNT_CHECK(ring->t->notify(ring->ts, ring->next, ring->kind_data));
  ring->tx_seq = seq + 1;
  /* the put is asynchronous: memory of the ring's own (the staging slot, reused
   * by the next piece; a received piece forwarded from the window, whose slot is
   * released next) must have left before it changes */
  const uint8_t *from = src, *win = ring->window;
  int ours = from == ring->staging || (from >= win && from < win + ring->slot_bytes * (size_t)ring->slots);
  if (len && ours) TNT_CHECK(ring->t->fence(ring->ts, ring->next, deadline));
  return TNT_SUCCESS;
}

tnt_result_t tnt_ring_flush(tnt_ring_t *ring, double deadline) {
  return ring->size > 1 ? ring->t->fence(ring->ts, ring->next, deadline) : TNT_SUCCESS;
}

tnt_result_t tnt_ring_recv(tnt_ring_t *ring, size_t len, const void **piece, double deadline) {
  uint64_t seq = ring->rx_seq;
  TNT_CHECK(ring->t->wait(ring->ts, ring->kind_data, ring->prev, (uint32_t)(seq + 1), deadline));
  *piece = ring->window + (slot_offset(ring, seq, len) - ring->region);
  return TNT_SUCCESS;
}

tnt_result_t tnt_ring_release(tnt_ring_t *ring) {
  ring->rx_seq++;
  return ring->t->notify(ring->ts, ring->prev, ring->kind_credit);
}
