/* requests.h - the handle table: requests from submission to release, their
 * completion, and the job's first fatal error. Below both the API (context.c)
 * and the engine: the API adds and waits, the engine completes. */
#ifndef TNT_REQUESTS_H
#define TNT_REQUESTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "namemap.h"
#include "request.h"

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

typedef struct {
  pthread_mutex_t mu;           /* guards everything below */
  pthread_cond_t done_cond;     /* broadcast at every completion */
  tnt_handle_slot_t *slots;
  int nslots, capslots;
  int free_slot;                /* head of the free list, -1 when empty */
  tnt_namemap_t active;         /* names submitted and not completed on this rank */
  int size;                     /* ranks: the length of an allgather's rank counts */
  tnt_result_t fatal;           /* first fatal error: every later request fails with it */
  char fatal_msg[1024];
  int fatal_peer;
  int fatal_met;                /* a call of the program's got it: a wait or test returned a request's failure
                                 * while the job had failed, or a new request was refused with it */
  _Atomic uint64_t completions; /* bumped at every completion: what a spinning waiter watches */
} tnt_requests_t;

void tnt_requests_init(tnt_requests_t *q, int size);
/* Frees every slot (requests nobody waited for go with the table). */
void tnt_requests_destroy(tnt_requests_t *q);

/* Under q->mu. Add a request: fails (and frees it) on a fatal job, a name
 * already in flight, or no memory; else *handle names it. */
tnt_result_t tnt_requests_add(tnt_requests_t *q, tnt_request_t *req, int rank, tnt_handle_t *handle);
/* Under q->mu: the slot of a live handle, or NULL. */
tnt_handle_slot_t *tnt_requests_get(tnt_requests_t *q, tnt_handle_t handle);
/* Under q->mu: the slot's result, recorded as this thread's last error; a failure while the job has
 * failed reached the program (fatal_met). */
tnt_result_t tnt_requests_result(tnt_requests_t *q, tnt_handle_slot_t *h);
/* Under q->mu: give a completed handle back, with everything it owns. */
void tnt_requests_release(tnt_requests_t *q, tnt_handle_t handle);

/* Takes q->mu: complete a request's handle (result_buf becomes the handle's). */
void tnt_requests_complete(tnt_requests_t *q, tnt_request_t *req, tnt_result_t result, const char *message, int peer,
                           void *result_buf, int64_t result_count, const int64_t *rank_counts);
/* Under q->mu: sleep until the next completion (or wake-up), at most until `until` on tnt_now's
 * clock when it is not NULL: ETIMEDOUT then, else 0. */
int tnt_requests_wait_completion(tnt_requests_t *q, const struct timespec *until);
/* Takes q->mu: wake every thread in tnt_requests_wait_completion, so that it looks again (shutdown). */
void tnt_requests_wake_waiters(tnt_requests_t *q);
/* Any thread, no lock: a counter bumped at every completion, for a waiter that spins on it. */
static inline uint64_t tnt_requests_completions(tnt_requests_t *q) { return atomic_load(&q->completions); }
/* Takes q->mu: record the job's fatal error; 1 if it is the first. */
int tnt_requests_set_fatal(tnt_requests_t *q, tnt_result_t result, const char *message, int peer);
/* Takes q->mu: the fatal error so far (TNT_SUCCESS if none), its message and peer. */
tnt_result_t tnt_requests_fatal(tnt_requests_t *q, char *message, size_t len, int *peer);
/* Takes q->mu: as tnt_requests_fatal, but TNT_SUCCESS unless a request of this rank failed
 * with it (refused at submission, or completed with an error once the job had failed). */
tnt_result_t tnt_requests_fatal_met(tnt_requests_t *q, char *message, size_t len, int *peer);

#endif
