/* engine.h - the engine: the submission queue, the background thread, and
 * everything that talks to other ranks (pending table, negotiator, fusion,
 * ring). The API (context.c) submits to it and may drive it from a waiting
 * thread; it completes requests through the requests table. */
#ifndef TNT_ENGINE_H
#define TNT_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "coll/ring.h"
#include "fusion.h"
#include "negotiate.h"
#include "params.h"
#include "pending.h"
#include "requests.h"
#include "timeline.h"
#include "topology.h"
#include "transport.h"

typedef struct {
  const tnt_placement_t *pl;
  const tnt_params_t *params;
  const tnt_transport_t *transport;
  void *ts;
  tnt_timeline_t *timeline;
  tnt_requests_t *requests;

  pthread_mutex_t queue_mu;    /* guards the queue, `stop` and `wakes` */
  pthread_cond_t woken;        /* signalled with every wake-up of the thread (tnt_engine_wake) */
  uint64_t wakes;
  int left_behind;             /* the last drive left requests in the engine */
  tnt_request_t *queue_head, *queue_tail;
  int stop;
  pthread_t thread;
  int thread_started;

  /* --- only the thread holding `progress` (the background thread, or an
   * application thread driving its own blocking wait) --- */
  pthread_mutex_t progress;
  double next_liveness;
  tnt_pending_t pending;
  tnt_negotiator_t neg;
  tnt_fusion_t fusion;
  tnt_ring_t ring;             /* every rank, in rank order (channel 0) */
  tnt_topology_t topo;         /* which ranks share a host */
  int hier;                    /* allreduce hierarchically: host_ring, then net_ring, then host_ring */
  tnt_ring_t host_ring;        /* this host's ranks (channel 1) */
  tnt_ring_t net_ring;         /* the ranks at this rank's position on every host (channel 2) */
  uint8_t *small_scratch;      /* N * TNT_SMALL_ALLREDUCE_BYTES: small allreduces */
  _Atomic int64_t executed;    /* collectives completed by execution (tnt_get_stats) */
  _Atomic int64_t bytes_reduced; /* their allreduces' count x element size (tnt_get_stats) */
  _Atomic int64_t pair_sums;   /* allreduces of a pair in direct messages (allreduce_pair_direct.c; tnt_get_stats) */
  _Atomic int64_t pair_swaps;  /* allreduces of a pair that swapped whole buffers (allreduce_pair.c; tnt_get_stats) */
} tnt_engine_t;

/* WORKED: ran a cycle; IDLE: nothing to do; STOP: shut down; BLOCKED: a cycle
 * waits for other ranks past the caller's `until` (the background thread takes
 * it over); BUSY: another thread holds the engine. */
enum { TNT_STEP_WORKED = 0, TNT_STEP_IDLE = 1, TNT_STEP_STOP = 2, TNT_STEP_BLOCKED = 3, TNT_STEP_BUSY = 4 };

/* Set up (ring, negotiator, the settings check with every rank) and start the
 * background thread. On failure nothing is left running or allocated. */
tnt_result_t tnt_engine_start(tnt_engine_t *e, const tnt_placement_t *pl, const tnt_params_t *params,
                              const tnt_transport_t *transport, void *ts, tnt_requests_t *requests,
                              tnt_timeline_t *timeline);
/* Refuse new requests, fail the pending ones, join the thread. */
void tnt_engine_stop(tnt_engine_t *e);
void tnt_engine_free(tnt_engine_t *e);
/* Queue a request added to the requests table (fails once the engine stops). */
tnt_result_t tnt_engine_submit(tnt_engine_t *e, tnt_request_t *req);
/* The same for a request whose submitting thread waits for it at once and
 * drives the engine itself: the background thread is not woken (the wait
 * hands over to it if it stops driving before the request completes). */
tnt_result_t tnt_engine_submit_driven(tnt_engine_t *e, tnt_request_t *req);
/* One step by the calling thread if nobody else drives the engine (else
 * TNT_STEP_BUSY); a cycle left BLOCKED at `until` is handed to the thread. */
int tnt_engine_drive(tnt_engine_t *e, double until);
/* Wake the background thread: a request for it, or a cycle handed over to it. */
void tnt_engine_wake(tnt_engine_t *e);
/* An application thread stops driving (its own request done or not): the
 * background thread, which sleeps meanwhile, takes over what is left. */
void tnt_engine_leave(tnt_engine_t *e, int own_done);
/* Fail this rank for `reason` (peers fail fast, naming root_peer when it is not -1). */
void tnt_engine_abort(tnt_engine_t *e, const char *reason, int root_peer, int log);

/* The counters of tnt_get_stats (any thread). */
void tnt_engine_stats(tnt_engine_t *e, tnt_stats_t *stats);

/* Size-1 jobs: run a request inline, no thread and no transport. */
void tnt_execute_local(tnt_requests_t *requests, tnt_timeline_t *timeline, tnt_request_t *req);

#endif
