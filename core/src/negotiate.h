/* negotiate.h - one negotiation cycle: which named requests are ready on every
 * rank, do they agree, and in which order to run them (identical everywhere).
 * The negotiator owns the announcement table, the response cache and the
 * message buffers; it reads the engine's pending table. */
#ifndef TNT_NEGOTIATE_H
#define TNT_NEGOTIATE_H

#include <stdatomic.h>

#include "and_allreduce.h"
#include "namemap.h"
#include "params.h"
#include "pending.h"
#include "request.h"
#include "ride.h"
#include "transport.h"

/* One name being negotiated through announcements (identical on every rank). */
typedef struct {
  char name[TNT_MAX_NAME];
  tnt_meta_t *metas;   /* [size] */
  uint8_t *announced;  /* [size] */
  int n_announced;
  int64_t first_us;    /* local time it was first seen, for stall reports */
  int live;
} tnt_gentry_t;

/* A negotiated name whose plan every rank remembers: later submissions cost one bit. */
typedef struct {
  int valid;
  char name[TNT_MAX_NAME];
  tnt_meta_t meta;      /* this rank's meta */
  int64_t *rank_counts; /* [size], for allgather */
  uint64_t last_used;
  uint8_t *ready;       /* [size]: rank reported it ready since the last run */
  int nready;
} tnt_cache_entry_t;

/* An agreed response of one cycle (identical on every rank). */
typedef struct {
  char name[TNT_MAX_NAME];
  tnt_meta_t meta;
  int64_t *rank_counts; /* allgather: [size]; owned by the response */
  tnt_result_t error;   /* TNT_ERR_MISMATCH, or success */
  char *error_msg;
  int cache_slot;       /* slot it is (or becomes) cached in, -1 if none */
  int one_round;        /* the payloads it needs (every rank's; a broadcast's root's) rode with this cycle's messages:
                         * 1: in a full round (tnt_negotiate_payload), 2: summed in the bit round (tnt_negotiate_ride_sum) */
} tnt_response_t;

/* A cached allreduce of at most this many bytes carries its (scaled) payload
 * in the negotiation message beside its readiness bit: when every rank's
 * payload is in the cycle that makes it ready, the cycle is the only round. */
#define TNT_ONE_ROUND_BYTES (16 * 1024)
/* ... and across hosts, for up to 4 ranks and without the hierarchical
 * allreduce: there the ring pays 2(N-1) network latencies where the one round
 * pays one, and the one round's N-1 copies of the payload are at most twice
 * the ring's bytes. */
#define TNT_ONE_ROUND_NET_BYTES (64 * 1024)
/* ... and on one host over shm, for more than 2 ranks (tnt_one_round_bytes) ... */
#define TNT_ONE_ROUND_SHM_BYTES (64 * 1024)
/* ... but an allreduce only up to this: beyond it the direct allreduce's two
 * exchanges, where each rank adds 1/N of the payloads, beat the one round,
 * where each adds all N (tnt_one_round_bytes). */
#define TNT_ONE_ROUND_SHM_ALLREDUCE_BYTES (24 * 1024)
/* What a negotiation message holds beside its payloads: header, readiness
 * bits, announcements (those that do not fit go in the next cycle). */
#define TNT_MESSAGE_ROOM (48 * 1024)

/* The one-round limit of a job (the same on every rank: it depends on the
 * transport, the size and whether the allreduce is hierarchical, which every
 * rank agrees on), for an allreduce or, where `allreduce` is 0, for a
 * broadcast or allgather (the larger, which also sizes the messages). */
size_t tnt_one_round_bytes(const tnt_transport_t *t, int size, int hierarchical, int allreduce);
_Static_assert(TNT_ONE_ROUND_NET_BYTES + TNT_MESSAGE_ROOM <= TNT_EXCHANGE_MAX, "a negotiation message must fit an exchange");
_Static_assert(TNT_ONE_ROUND_SHM_BYTES + TNT_MESSAGE_ROOM <= TNT_EXCHANGE_MAX, "a negotiation message must fit an exchange");

typedef struct {
  const tnt_placement_t *pl;
  const tnt_params_t *params;
  const tnt_transport_t *transport;
  void *ts;
  tnt_pending_t *pending;      /* the engine's: read, and request states advanced */
  tnt_gentry_t *gtable;
  int ngtable, capgtable;
  tnt_namemap_t gtable_by_name;
  tnt_cache_entry_t *cache;
  int cache_cap;
  tnt_namemap_t cache_by_name;
  uint64_t cycles;             /* cycles completed */
  size_t one_round_bytes;      /* tnt_one_round_bytes: of a broadcast or allgather */
  size_t one_round_allreduce_bytes; /* ... and of an allreduce */
  size_t msg_max;              /* bytes of one rank's message at most: one_round_bytes + TNT_MESSAGE_ROOM */
  uint8_t *msg_out, *msg_all;  /* exchange buffers */
  uint8_t *msg_mine;           /* this rank's message of the cycle: msg_out, or the transport's exchange_buffer */
  size_t *msg_lens;
  const uint8_t **msg_at;      /* [size] rank q's message of the last full round: in msg_all, or where the
                                * transport holds it (exchange_view), valid until the next post */
  size_t msg_out_len;
  int cycle_posted;            /* this cycle's message is published, not yet collected */
  int cycle_bits;              /* the cycle in flight is a bit round (else full) */
  int next_full;               /* the kind of the next cycle, agreed by every rank in this one */
  int refresh;                 /* this rank wants a full round: who is ready for what, for a stall report */
  _Atomic int busy;            /* this rank is in a section of its own (tnt_set_busy): sent in full rounds */
  _Atomic double busy_since;   /* when its section began (tnt_now), valid while busy */
  double busy_warned;          /* busy_since of the section the engine warned about (engine.c) */
  uint8_t *peer_busy;          /* [size]: rank q was busy so in the last full round */
  double full_round_at;        /* when the last full round ended (tnt_now), 0 before the first */
  uint64_t *bits_out, *bits_and; /* a bit round's words: this rank's, every rank's AND */
  tnt_and_scratch_t and_scratch; /* for a transport with no AND of its own: the exchange buffers */
  uint64_t responses_digest;   /* of the last cycle's responses: sent with the next message */
  _Atomic int64_t cache_hits;    /* requests that cost one bit (read by tnt_get_stats) */
  _Atomic int64_t announcements; /* requests announced in full */
  _Atomic int64_t one_round;     /* allreduces, broadcasts and allgathers whose payload rode with their readiness bit */
  _Atomic int64_t bit_rounds;    /* cycles that were an AND of readiness bits */
  _Atomic int64_t full_rounds;   /* cycles that exchanged every rank's message */
  tnt_rides_t rides;             /* which allreduces ride in their bit round (ride.h) */
  int ride_slot;                 /* the slot riding in the bit round in flight, -1: none */
  const void *ride_sum;          /* its sum, where the last cycle's ride reached every rank (one_round 2) */
  uint32_t *payload_at;          /* [cache_cap * size]: offset of rank q's payload for a slot in its message */
  uint64_t *payload_cycle;       /* [cache_cap * size]: the cycle (+1) that carried it */
} tnt_negotiator_t;

/* `hier_topo`: the engine's topology where its allreduce across hosts is
 * hierarchical (tnt_one_round_bytes, ride.h), else NULL. */
tnt_result_t tnt_negotiate_setup(tnt_negotiator_t *c, const tnt_placement_t *pl, const tnt_params_t *params,
                                 const tnt_transport_t *transport, void *ts, tnt_pending_t *pending,
                                 const tnt_topology_t *hier_topo);
void tnt_negotiate_teardown(tnt_negotiator_t *c);
/* 1 when this rank has something the others have not heard of yet. */
int tnt_negotiate_has_news(tnt_negotiator_t *c);
/* Bit rounds tell every rank only which slots all ranks are ready for; a stall
 * report needs who is missing: ask for a full round (news until one is done). */
static inline void tnt_negotiate_refresh(tnt_negotiator_t *c) { c->refresh = 1; }
/* A request Tarantella named for a call without name= in a thread other than the main one ends in
 * "@<thread name>" (request_names.py: "tnt.tape@Thread-3 (train)"), so that each thread pairs with its
 * namesake on the other ranks. The name that `peer` has announced, and this rank has not, for the same
 * call in a thread of another default name (Thread-N): the job cannot go on, since a rank that started
 * one more thread before (a callback, a data loader) numbered its training thread otherwise. NULL if none.
 * Valid until the next cycle. */
const char *tnt_negotiate_thread_twin(const tnt_negotiator_t *c, const char *name, int peer);

/* A name that `peer` has reported ready and this rank has not (a collective it waits in while this
 * rank waits in another: the two will never meet), as the last full round or announcement told;
 * *coll its kind. NULL if none is known. Valid until the next cycle. */
const char *tnt_negotiate_peer_waits_for(const tnt_negotiator_t *c, int peer, tnt_coll_t *coll);
/* 1 if every rank that has not reported `req` said in the last full round
 * (at full_round_at) that it was busy in a section of its own; 0 if some
 * such rank did not, or none is known. */
int tnt_negotiate_missing_busy(const tnt_negotiator_t *c, const tnt_request_t *req);
static inline int tnt_negotiate_refreshing(const tnt_negotiator_t *c) { return c->refresh; }
/* When the last full round ended (tnt_now), 0 before the first. */
static inline double tnt_negotiate_full_round_at(const tnt_negotiator_t *c) { return c->full_round_at; }
/* This rank is (1) or is no longer (0) in a section of its own: said in the next full round.
 * Any thread (tnt_set_busy). */
static inline void tnt_negotiate_set_busy(tnt_negotiator_t *c, int busy) {
  if (busy) atomic_store(&c->busy_since, tnt_now()); /* first: a reader that sees busy sees its start */
  atomic_store(&c->busy, busy ? 1 : 0);
}
/* Cycles completed (the transport's doorbell counts them): under the engine's progress lock. */
static inline uint64_t tnt_negotiate_cycles(const tnt_negotiator_t *c) { return c->cycles; }
/* The negotiation's counters of tnt_get_stats (any thread: a stale read is fine for stats). */
void tnt_negotiate_stats(const tnt_negotiator_t *c, tnt_stats_t *stats);
/* Run one cycle: exchange, merge, and fill *responses (caller frees with
 * tnt_responses_free). Fails on transport errors and on ranks that diverged.
 * TNT_IN_PROGRESS when the other ranks did not answer by `until` (a caller's
 * own shorter wait): the next call resumes the same cycle. */
tnt_result_t tnt_negotiate_cycle(tnt_negotiator_t *c, tnt_response_t **responses, int *nresponses, double until);
void tnt_responses_free(tnt_response_t *responses, int n);
/* 1 while a cycle is posted and not yet collected. */
static inline int tnt_negotiate_in_cycle(const tnt_negotiator_t *c) { return c->cycle_posted; }
/* Rank q's scaled payload for a one_round response of the last cycle (valid
 * until this rank's next exchange: read every one before any other collective
 * runs, engine.c). */
const void *tnt_negotiate_payload(const tnt_negotiator_t *c, int slot, int q);
/* The sum of a one_round 2 response of the last cycle: its result, valid
 * until this rank's next bit round (engine.c reads it first). */
static inline const void *tnt_negotiate_ride_sum(const tnt_negotiator_t *c) { return c->ride_sum; }
/* awaited[r] = 1 for every peer some pending request still waits for. */
void tnt_negotiate_awaited(tnt_negotiator_t *c, uint8_t *awaited);
/* The ranks (as text, e.g. "1, 3") that have not submitted `req` yet, as far as
 * this rank knows; for stall reports. */
void tnt_negotiate_missing(tnt_negotiator_t *c, const tnt_request_t *req, char *out, size_t len);
const char *tnt_coll_name(int coll);

#endif
