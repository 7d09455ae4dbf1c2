/* transport.h - the one interface between the collective algorithms and whatever
 * carries the bytes (docs/transport.md explains it).
 *
 * Model (interface version 2): every rank exposes a receive *window* of
 * window_bytes. A rank `put`s a block into a peer's window at an offset
 * (asynchronously: `fence` says when the source may be reused, and
 * `send_buffer` lends the transport's registered memory to write a piece
 * into), then `notify`s the peer, which
 * increments one of the peer's counters (kind, source rank); the peer `wait`s
 * until that counter reaches a target value. Counters only grow, so a wait never
 * misses a notification. This is GPI-2's write + notify + waitsome one to one,
 * MPI's Put + flush + a counter (or Isend/Irecv), and plain memcpy + futex over
 * shared memory. `exchange` is a small allgather of a few bytes that the
 * negotiation uses once per cycle; the doorbell lets an idle background thread
 * sleep until a local request or another rank needs a cycle.
 *
 * Every wait has a deadline; peer death (detected directly where possible) fails
 * the wait with TNT_ERR_PEER_LOST naming the rank. Transports never throw,
 * never exit, never block without a deadline. */
#ifndef TNT_TRANSPORT_H
#define TNT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "params.h"

/* Counters come in pairs, one pair per *channel*: a ring on channel c uses
 * kinds DATA + 2c and CREDIT + 2c, and region c of the window (regions of equal
 * size, window_bytes / regions). Channels keep rings that share a transport
 * apart: the flat ring (channel 0) and, across hosts, the ring inside a host
 * (1) and the ring between hosts (2); a peer that is one step ahead in the
 * next ring can then never overwrite a slot or bump a counter of this one. */
enum { TNT_NOTIFY_DATA = 0, TNT_NOTIFY_CREDIT = 1, TNT_CHANNELS = 3, TNT_NOTIFY_KINDS = 2 * TNT_CHANNELS };
enum { TNT_CHANNEL_FLAT = 0, TNT_CHANNEL_HOST = 1, TNT_CHANNEL_NET = 2 };
#define TNT_EXCHANGE_MAX (128 * 1024) /* bytes per rank per exchange (the negotiation's message, with one-round payloads) */

typedef struct tnt_transport tnt_transport_t;

/* A payload that rides in a bit round's messages (and_post_ride): a cached
 * allreduce's scaled input, summed along the AND's steps, so that a round
 * that finds every rank ready for it is also its allreduce. What is added to
 * what, in which order, is the core's (`combine`); the transport only carries
 * each sender's running sum beside its words, with the set of ranks in it. */
typedef struct tnt_ride {
  uint64_t tag; /* what the payload is (the core's: slot and size): sums of different tags are never added */
  size_t bytes;
  /* The ranks that read a rank's own payload where it lies (the ranks of its
   * host, over shared memory: transport.h's ride_shared): to one of them a
   * rank that holds only its own payload sends no bytes, and the receiver's
   * combine gets b = NULL for it. */
  uint64_t shared;
  /* out = a + b, in the job's order of additions; `a_ranks`/`b_ranks`: bit r
   * set where rank r's input is in it (disjoint); b NULL: rank b_ranks's own
   * payload, which the core reads where it lies. 0: these two cannot be added
   * in that order (the transport then carries no sum from here on). */
  int (*combine)(void *ctx, void *out, const void *a, uint64_t a_ranks, const void *b, uint64_t b_ranks);
  void *ctx;
} tnt_ride_t;

struct tnt_transport {
  const char *name;
  /* 1 if this transport can serve the placement (e.g. shm: every rank on this host). */
  int (*can_serve)(const tnt_placement_t *pl);
  tnt_result_t (*init)(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes, void **state);
  /* Start copying len bytes from src into `peer`'s window at `offset`. Asynchronous:
   * src must stay unchanged until the next fence(peer) (shm copies at once; mpi
   * sends from src; gpi2 writes from its registered segment). A src returned by
   * send_buffer(peer, offset, len) costs no copy. */
  tnt_result_t (*put)(void *state, int peer, size_t offset, const void *src, size_t len);
  /* Local completion: every put to `peer` so far has left its source, which the
   * caller may now change. Ordering with the peer is notify's job, not this. */
  tnt_result_t (*fence)(void *state, int peer, double deadline);
  /* Memory of the transport's own that a piece bound for (peer, offset, len) may be
   * written into before its put, so that scaling or reduction writes straight
   * into what the engine sends (shm: the peer's window itself; gpi2: its
   * registered segment; mpi: a send buffer). The caller must have waited for the
   * slot at (peer, offset) to be free, and must put from it before asking for
   * another. NULL: none here, stage the piece in memory of your own. */
  void *(*send_buffer)(void *state, int peer, size_t offset, size_t len);
  /* Pointer to this rank's own window (what peers put into). */
  void *(*window)(void *state);
  /* Increment counter (kind, my rank) at `peer`; ordered after earlier puts to that peer. */
  tnt_result_t (*notify)(void *state, int peer, int kind);
  /* Wait until my counter (kind, from) has reached `target` (wrapping compare). */
  tnt_result_t (*wait)(void *state, int kind, int from, uint32_t target, double deadline);
  /* Allgather of len <= TNT_EXCHANGE_MAX bytes: all[r*stride...] receives rank r's
   * bytes and lens[r] their length. Collective: every rank calls it in the same order. */
  tnt_result_t (*exchange)(void *state, const void *mine, size_t len, void *all, size_t stride, size_t *lens,
                           double deadline);
  /* The same in two halves, so that a thread with a shorter wait of its own can
   * leave a round that is waiting for a slow rank and another thread resume it:
   * post publishes (bounded by `deadline`), collect waits until `until` (then
   * TNT_IN_PROGRESS) or the post's deadline (then TNT_ERR_TIMEOUT). */
  tnt_result_t (*exchange_post)(void *state, const void *mine, size_t len, double deadline);
  tnt_result_t (*exchange_collect)(void *state, void *all, size_t stride, size_t *lens, double until);
  /* Ask every rank to run cycle `cycle` (and wake this rank's own thread). */
  void (*ring_doorbell)(void *state, uint64_t cycle);
  /* 1 if some rank asked for a cycle after `done`. */
  int (*cycle_wanted)(void *state, uint64_t done);
  /* Sleep until a cycle > done is wanted, or wake_local was called, or `deadline`. */
  void (*wait_doorbell)(void *state, uint64_t done, double deadline);
  /* TNT_SUCCESS while every peer is alive; else PEER_LOST naming the lost one.
   * Called by the engine while it sleeps with requests pending. A clean shutdown
   * counts as lost only for the ranks with awaited[r] set (NULL: every rank). */
  tnt_result_t (*check_peers)(void *state, const uint8_t *awaited);
  /* What rank `peer`'s process is doing, for errors about it ("rank 1 (pid 42)
   * is stopped (SIGSTOP...)"); "" when the transport cannot tell. */
  void (*describe_peer)(void *state, int peer, char *out, size_t len);
  /* Wake this rank's own sleeping background thread (a local request arrived). */
  void (*wake_local)(void *state);
  /* Mark this rank failed (peers fail fast with `reason`); root_peer is the rank
   * whose loss caused it (-1: this rank itself), so peers name the root cause. */
  void (*abort)(void *state, const char *reason, int root_peer);
  void (*finalize)(void *state);
  /* Bitwise AND of `nwords` 64-bit words over every rank (the negotiation's
   * bit round: docs/design.md), in two halves like the exchange: post bounded
   * by `deadline`, collect until `until` (TNT_IN_PROGRESS) or the post's
   * deadline (TNT_ERR_TIMEOUT). Collective, in the same order on every rank
   * as the exchanges. NULL: the core ANDs the words of an exchange instead
   * (and_allreduce.c), which is what shared memory does best anyway. */
  tnt_result_t (*and_post)(void *state, const uint64_t *mine, int nwords, double deadline);
  tnt_result_t (*and_collect)(void *state, uint64_t *out, double until);
  /* exchange_collect without the copy: msgs[r] points at rank r's bytes where
   * the transport holds them (lens[r] their length, at most `max`), valid until
   * this rank's next exchange_post. NULL where the bytes must be copied (a
   * network transport receives them into the caller's buffer anyway); shm
   * reads every rank's message in place, which is what lets a payload of tens
   * of kilobytes ride with the negotiation (negotiate.c). */
  tnt_result_t (*exchange_view)(void *state, const uint8_t **msgs, size_t *lens, size_t max, double until);
  /* Where this rank's next exchange_post reads its bytes from without a copy
   * (*capacity of them, at least TNT_EXCHANGE_MAX; such a post may be that
   * long): build the message there and post that pointer. Valid from the end
   * of a collect (or init) until that post. NULL: none. */
  void *(*exchange_buffer)(void *state, size_t *capacity);
  /* How this rank's waits that found their word not yet reached ended: within
   * the spin, while yielding the core, or asleep (tnt_get_stats). NULL: not
   * counted (zeros). */
  void (*wait_stats)(void *state, int64_t *spun, int64_t *yielded, int64_t *slept);
  /* Direct messages with one peer (a pair of ranks across the network; each
   * calls it with the other as `peer`): this rank's `send_bytes` at `send` go
   * to `peer` while `recv_bytes` from `peer` land at `recv` (not overlapping
   * `send`). Returns once both are complete: `send` may change, `recv` may be
   * read. Calls match the peer's calls in order. The send starts before the
   * receive is posted, and nothing else goes with the bytes, where the ring's
   * pieces each wait for a PUT to be read (allreduce_pair_direct.c). Bounded
   * by `deadline` like every wait, a lost peer named; a failed call leaves
   * nothing in flight that could still read `send` or write `recv`. At most
   * INT_MAX bytes each way. NULL: none (shm, gpi2). */
  tnt_result_t (*sendrecv)(void *state, int peer, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
                           double deadline);
  /* The cores of the waits' budget: the CPUs that the ranks sharing this
   * rank's host (shm) or machine (the network plugins: its kernel) may run
   * on, the union of their affinity masks (host_load.h's tnt_cpus_t), the
   * same count on each of them. The completion wait's rule (tnt_spin_seconds)
   * reads it after init. NULL: the machine's online CPUs. */
  long (*cores)(void *state);
  /* and_post whose messages also carry `ride` (docs/design.md, "Rides"):
   * `payload` (ride->bytes) starts this rank's running sum; every step's message carries the sender's sum and
   * its ranks where the sender still holds one, and a step whose partner sent
   * one of the same tag adds it (ride->combine); a message without one, or of
   * another tag, ends this rank's sum. `ride` and `payload` stay valid until
   * the collect. A plain and_post takes a ride message as its words alone.
   * NULL: none. */
  tnt_result_t (*and_post_ride)(void *state, const uint64_t *mine, int nwords, const tnt_ride_t *ride,
                                const void *payload, double deadline);
  /* After an and_collect: the running sum this rank ended the round with and
   * its ranks (*ranks), or NULL where it holds none. Valid until the next
   * and_post. */
  const void *(*ride_result)(void *state, uint64_t *ranks);
  /* Where `rank`'s payload of a ride lies in memory this rank reads too (a
   * rank of its host: ride->shared), for rides of cycle parity `parity`;
   * *capacity its bytes. A rank writes its own there before its post; a peer
   * reads it in the round, and the writer reuses it two rounds on, after the
   * reader has posted the next. NULL: not here. */
  void *(*ride_shared)(void *state, int rank, int parity, size_t *capacity);
};

extern const tnt_transport_t tnt_transport_shm;
/* shm for a group of ranks: `global[i]` is the job-wide rank of group member i,
 * used in every message (pl->rank/size are the member's index and the group's
 * size; pl->job_id must name this group's segment). */
tnt_result_t tnt_shm_init_group(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes,
                                const int *global, void **state);
/* Buffer `parity` of the exchange area of the group's member `rank` (its
 * index), *capacity its bytes: for a user of the group that runs no exchange
 * rounds over it (transport/hier.c's rides). */
void *tnt_shm_exchange_area(void *state, int rank, int parity, size_t *capacity);
/* shm within each host, mpi between hosts (transport/hier.c). */
extern const tnt_transport_t tnt_transport_hier;
/* The window that `peer`'s puts land in (differs per peer for tnt_transport_hier). */
void *tnt_transport_window_for(const tnt_transport_t *t, void *ts, int peer);
/* 1 if puts to `peer` cross the network (the plugin's engine moves them while
 * this rank goes on), 0 if they are copies into shared memory made at once. */
int tnt_transport_remote(const tnt_transport_t *t, void *ts, int peer);
/* For tnt_transport_hier (a no-op on any other): while `on`, nothing this rank
 * waits for over shm depends on its MPI progress (no put to or from another
 * host is in flight: the hierarchical allreduce's phases inside the host around
 * its pair's direct messages), so those waits sleep in long slices instead of
 * waking to poll MPI within microseconds. */
void tnt_transport_quiet(const tnt_transport_t *t, void *ts, int on);
/* How many window regions (channels) a transport instance gets: 1 on one host
 * over shm (the flat ring only), TNT_CHANNELS where a hierarchy is possible. */
int tnt_transport_regions(const tnt_transport_t *t);
/* The transport's `cores` (the CPUs of the waits' budget), or the machine's
 * online CPUs where it has none. */
long tnt_transport_cores(const tnt_transport_t *t, void *ts);

/* Pick the transport named by params->transport ("auto": the first that can serve). */
tnt_result_t tnt_transport_select(const tnt_placement_t *pl, const tnt_params_t *params, const tnt_transport_t **out);

#endif
