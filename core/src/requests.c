/* requests.c - the handle table (requests.h).
 *
 * A handle is (generation << 32 | slot): a released slot is reused with the
 * next generation, so a stale handle is refused instead of reading someone
 * else's result. Generations run 1 .. 2^31 - 1 and wrap, so a handle stays a
 * positive int64. Every failure after a slot was taken gives it back.
 *
 * Generations go on across contexts (tnt_finalize, then tnt_init): a new
 * table's slots start above every generation the last table used. They
 * started at 1 again, so a handle kept across a shutdown and re-init (Python's
 * Handle of a request pending at shutdown, or one a dropped Handle left to be
 * reaped) named the new context's request in the same slot: waiting on it
 * returned its own never-written result as a success and released the other
 * request's handle under its owner. */
#include "requests.h"

#include "common.h"

#include <stdlib.h>
#include <string.h>

/* The generation the next table's new slots start from (process-wide; init
 * and destroy run under context.c's init_mu, one table at a time). */
static uint32_t generation_floor;

static uint32_t next_generation(uint32_t g) { return g >= 0x7fffffffu ? 1u : g + 1u; }

void tnt_requests_init(tnt_requests_t *q, int size) {
  memset(q, 0, sizeof *q);
  pthread_mutex_init(&q->mu, NULL);
  tnt_cond_init_monotonic(&q->done_cond);
  tnt_namemap_init(&q->active);
  q->free_slot = -1;
  q->size = size;
}

static void free_slot(tnt_handle_slot_t *h) {
  free(h->message);
  free(h->result_buf);
  free(h->rank_counts);
  free(h->req);
  h->message = NULL;
  h->result_buf = NULL;
  h->rank_counts = NULL;
  h->req = NULL;
}

void tnt_requests_destroy(tnt_requests_t *q) {
  for (int i = 0; i < q->nslots; i++) {
    free_slot(&q->slots[i]);
    /* (a slot whose generations wrapped restarts below: as rare as a wrap within one table) */
    if (q->slots[i].generation > generation_floor) generation_floor = q->slots[i].generation;
  }
  free(q->slots);
  tnt_namemap_free(&q->active);
  pthread_cond_destroy(&q->done_cond);
  pthread_mutex_destroy(&q->mu);
  memset(q, 0, sizeof *q);
}

static tnt_handle_t slot_alloc(tnt_requests_t *q, tnt_request_t *req) {
  int i = q->free_slot;
  if (i >= 0) {
    q->free_slot = (int)q->slots[i].result_count; /* the free list is threaded through result_count */
  } else {
    if (q->nslots == q->capslots) {
      int cap = q->capslots ? q->capslots * 2 : 256;
      tnt_handle_slot_t *s = realloc(q->slots, (size_t)cap * sizeof *s);
      if (!s) return -1;
      q->slots = s;
      q->capslots = cap;
    }
    i = q->nslots++;
    q->slots[i].generation = generation_floor; /* above every handle of an earlier table */
  }
  tnt_handle_slot_t *h = &q->slots[i];
  uint32_t gen = next_generation(h->generation);
  memset(h, 0, sizeof *h);
  h->generation = gen;
  h->used = 1;
  h->req = req;
  h->peer = -1;
  return (tnt_handle_t)(((uint64_t)gen << 32) | (uint64_t)(uint32_t)i);
}

tnt_handle_slot_t *tnt_requests_get(tnt_requests_t *q, tnt_handle_t handle) {
  int64_t i = handle & 0xffffffff;
  uint32_t gen = (uint32_t)((uint64_t)handle >> 32);
  if (handle < 0 || i >= q->nslots || !q->slots[i].used || q->slots[i].generation != gen) return NULL;
  return &q->slots[i];
}

void tnt_requests_release(tnt_requests_t *q, tnt_handle_t handle) {
  int i = (int)(handle & 0xffffffff);
  tnt_handle_slot_t *h = &q->slots[i];
  free_slot(h);
  h->used = 0;
  h->result_count = q->free_slot;
  q->free_slot = i;
}

tnt_result_t tnt_requests_add(tnt_requests_t *q, tnt_request_t *req, int rank, tnt_handle_t *handle) {
  if (q->fatal != TNT_SUCCESS) {
    tnt_set_last_error(q->fatal_msg, q->fatal_peer);
    q->fatal_met = 1;
    free(req);
    return q->fatal;
  }
  if (tnt_namemap_get(&q->active, req->name) >= 0) {
    tnt_result_t r = tnt_fail(TNT_ERR_INVALID_USAGE,
                              "a collective named '%s' is already in flight on rank %d: wait for it before submitting the "
                              "name again, or use another name",
                              req->name, rank);
    free(req);
    return r;
  }
  tnt_handle_t h = slot_alloc(q, req);
  if (h >= 0 && tnt_namemap_put(&q->active, req->name, 1)) {
    q->slots[h & 0xffffffff].req = NULL; /* freed below, once */
    tnt_requests_release(q, h);
    h = -1;
  }
  if (h < 0) {
    free(req);
    return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  req->handle = h;
  *handle = h;
  return TNT_SUCCESS;
}

tnt_result_t tnt_requests_result(tnt_requests_t *q, tnt_handle_slot_t *h) {
  if (h->result != TNT_SUCCESS) {
    tnt_set_last_error(h->message, h->peer);
    if (q->fatal != TNT_SUCCESS) q->fatal_met = 1;
  }
  return h->result;
}

void tnt_requests_complete(tnt_requests_t *q, tnt_request_t *req, tnt_result_t result, const char *message, int peer,
                           void *result_buf, int64_t result_count, const int64_t *rank_counts) {
  pthread_mutex_lock(&q->mu);
  tnt_handle_slot_t *h = tnt_requests_get(q, req->handle);
  tnt_namemap_del(&q->active, req->name);
  if (h) {
    h->done = 1;
    h->result = result;
    h->peer = peer;
    h->message = message ? strdup(message) : NULL;
    h->result_buf = result_buf;
    h->result_count = result_count;
    if (rank_counts) {
      h->rank_counts = malloc(sizeof(int64_t) * (size_t)q->size);
      if (h->rank_counts) memcpy(h->rank_counts, rank_counts, sizeof(int64_t) * (size_t)q->size);
    }
  } else {
    free(result_buf);
  }
  atomic_fetch_add(&q->completions, 1);
  pthread_cond_broadcast(&q->done_cond);
  pthread_mutex_unlock(&q->mu);
}

int tnt_requests_set_fatal(tnt_requests_t *q, tnt_result_t result, const char *message, int peer) {
  pthread_mutex_lock(&q->mu);
  int first = q->fatal == TNT_SUCCESS;
  if (first) {
    q->fatal = result;
    snprintf(q->fatal_msg, sizeof q->fatal_msg, "%s", message);
    q->fatal_peer = peer;
  }
  pthread_mutex_unlock(&q->mu);
  return first;
}

tnt_result_t tnt_requests_fatal(tnt_requests_t *q, char *message, size_t len, int *peer) {
  pthread_mutex_lock(&q->mu);
  tnt_result_t r = q->fatal;
  if (r != TNT_SUCCESS) snprintf(message, len, "%s", q->fatal_msg); /* asked on every engine step: only then */
  else if (len) message[0] = '\0';
  *peer = q->fatal_peer;
  pthread_mutex_unlock(&q->mu);
  return r;
}

int tnt_requests_wait_completion(tnt_requests_t *q, const struct timespec *until) {
  return until ? pthread_cond_timedwait(&q->done_cond, &q->mu, until) : pthread_cond_wait(&q->done_cond, &q->mu);
}

void tnt_requests_wake_waiters(tnt_requests_t *q) {
  pthread_mutex_lock(&q->mu);
  pthread_cond_broadcast(&q->done_cond);
  pthread_mutex_unlock(&q->mu);
}

tnt_result_t tnt_requests_fatal_met(tnt_requests_t *q, char *message, size_t len, int *peer) {
  pthread_mutex_lock(&q->mu);
  int met = q->fatal_met;
  pthread_mutex_unlock(&q->mu);
  if (!met) {
    if (len) message[0] = '\0';
    *peer = -1;
    return TNT_SUCCESS;
  }
  return tnt_requests_fatal(q, message, len, peer);
}
