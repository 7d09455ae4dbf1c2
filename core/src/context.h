/* context.h - the per-process context: placement, transport, request queue,
 * handle table, and the state only the background thread touches. */
#ifndef TNT_CONTEXT_H
#define TNT_CONTEXT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "coll/ring.h"
#include "common.h"
#include "namemap.h"
#include "params.h"
#include "timeline.h"
#include "transport.h"

typedef enum { COLL_ALLREDUCE = 0, COLL_BROADCAST = 1, COLL_ALLGATHER = 2, COLL_BARRIER = 3 } tnt_coll_t;

/* What every rank must agree on for one name. For allgather `count` is this
 * rank's own count (it may differ between ranks) and row_elems must agree. */
typedef struct {
  uint8_t coll, dtype, op, pad;
  int32_t root;
  int64_t count;
  int64_t row_elems;
} tnt_meta_t;

/* NEW: just taken; TO_ANNOUNCE: name+meta go out next cycle; ANNOUNCED: sent, waiting
 * for the other ranks; CACHED: matches a cache slot, bit goes out next cycle;
 * CACHED_SENT: bit sent, waiting for the other ranks. */
enum { REQ_NEW = 0, REQ_TO_ANNOUNCE, REQ_ANNOUNCED, REQ_CACHED, REQ_CACHED_SENT };

typedef struct tnt_request {
  tnt_handle_t handle;
  char name[TNT_MAX_NAME];
  tnt_meta_t meta;
  double prescale;
  const void *in;
  void *out;
  int state;       /* REQ_* (background thread only) */
  int cache_slot;  /* when REQ_CACHED */
  double submit_time;
  int64_t submit_us;
  int stall_warned;
  struct tnt_request *next;
} tnt_request_t;

typedef struct {
  uint32_t generation;
  int used, done;
  tnt_result_t result;
  int peer;
  char *message;
  tnt_request_t *req;
  void *result_buf; /* allgather */
  int64_t result_count;
  int64_t *rank_counts;
} tnt_handle_slot_t;

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
} tnt_response_t;

typedef struct {
  _Atomic int initialized;
  tnt_placement_t pl;
  tnt_params_t params;
  const tnt_transport_t *transport;
  void *ts;
  tnt_ring_t ring;

  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;          /* guards everything down to the engine section */
  pthread_cond_t done_cond;
  tnt_request_t *queue_head, *queue_tail;
  tnt_namemap_t active;        /* names submitted and not completed on this rank */
  int stop;
  tnt_result_t fatal;          /* first fatal error; every later request fails with it */
  char fatal_msg[1024];
  int fatal_peer;
  tnt_handle_slot_t *handles;
  int nhandles, caphandles;
  int free_handle;             /* head of the free list, -1 when empty */
  _Atomic uint64_t completions; /* bumped at every completion: what tnt_wait spins on */
  double spin_s;

  /* --- engine: only the thread holding `progress` (the background thread, or
   * an application thread driving its own blocking wait) --- */
  pthread_mutex_t progress;
  double next_liveness;
  tnt_request_t **pending;     /* requests taken from the queue, not executed */
  int npending, cappending;
  tnt_namemap_t pending_by_name;
  tnt_gentry_t *gtable;
  int ngtable, capgtable;
  tnt_namemap_t gtable_by_name;
  tnt_cache_entry_t *cache;
  int cache_cap;
  tnt_namemap_t cache_by_name;
  uint64_t cycles;
  uint8_t *fusion_buf;
  uint8_t *small_scratch;      /* N * TNT_SMALL_ALLREDUCE_BYTES: small allreduces */
  size_t fusion_cap;
  tnt_timeline_t *timeline;
  uint8_t *msg_out, *msg_all;  /* exchange buffers */
  size_t *msg_lens;
  size_t msg_out_len;
  int cycle_posted;            /* this cycle's message is published, not yet collected */
  uint64_t responses_digest;   /* of the last cycle's responses: sent with the next message */
} tnt_ctx_t;

extern tnt_ctx_t tnt_ctx;

/* engine.c */
/* WORKED: ran a cycle; IDLE: nothing to do; STOP: shut down; BLOCKED: a cycle
 * waits for other ranks past the caller's `until` (the next step resumes it). */
enum { TNT_STEP_WORKED = 0, TNT_STEP_IDLE = 1, TNT_STEP_STOP = 2, TNT_STEP_BLOCKED = 3 };
void *tnt_engine_main(void *arg);
/* One step (take requests, negotiate, execute); the caller holds c->progress.
 * `until`: when the calling thread must be back (the background thread: never). */
int tnt_engine_step(tnt_ctx_t *c, double until);
tnt_result_t tnt_engine_setup(tnt_ctx_t *c);
void tnt_engine_teardown(tnt_ctx_t *c);

/* context.c: complete a request's handle (takes the lock). */
void tnt_complete(tnt_ctx_t *c, tnt_request_t *req, tnt_result_t result, const char *message, int peer,
                  void *result_buf, int64_t result_count, const int64_t *rank_counts);
/* Record a fatal error (first one wins) and fail everything queued. */
void tnt_set_fatal(tnt_ctx_t *c, tnt_result_t result, const char *message, int peer);
/* Size-1 jobs: run a request inline, no thread. */
tnt_result_t tnt_execute_local(tnt_ctx_t *c, tnt_request_t *req);

#endif
