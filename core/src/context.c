/* context.c - the public API: init/finalize, request submission, handles.
 *
 * Application threads only touch the queue and the handle table, under one
 * mutex; the background thread (engine.c) does everything that talks to other
 * ranks. Waiting on a handle is a condition-variable wait (the Python binding
 * releases the GIL around it).
 *
 * Lifetime: every entry point holds `life` for reading while it uses the
 * context; tnt_finalize first stops the engine (which fails every pending
 * request, so every waiter returns), then takes `life` for writing before it
 * frees anything: no thread can be inside the context while it goes.
 *
 * fork(): the child of an initialized process shares the parent's segment and
 * rank but has no engine thread. It must neither take part in collectives nor
 * touch the shared segment on exit, so every call in it fails with a clear
 * error and its tnt_finalize only forgets the context. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "dtype.h"

tnt_ctx_t tnt_ctx;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t life = PTHREAD_RWLOCK_INITIALIZER;
static int was_finalized;
static _Atomic int forked_child;    /* this process is a fork() child of an initialized one */
static pid_t parent_pid;            /* the process that initialized, for the fork error */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void) {
  if (atomic_load(&tnt_ctx.initialized)) atomic_store(&forked_child, 1);
}
static void register_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }

const char *tnt_version(void) { return "0.1.0"; }

static tnt_result_t in_forked_child(void) {
  return tnt_fail(TNT_ERR_INVALID_USAGE,
                  "Tarantella cannot be used in a forked child process (pid %d; rank %d lives in pid %d): the child "
                  "shares its parent's rank. Call collectives from the parent, or start workers with the 'spawn' "
                  "method (multiprocessing.set_start_method('spawn'))",
                  (int)getpid(), tnt_ctx.pl.rank, (int)parent_pid);
}

static tnt_result_t not_initialized(void) {
  if (atomic_load(&forked_child)) return in_forked_child();
  return tnt_fail(TNT_ERR_INVALID_USAGE, was_finalized
                                             ? "Tarantella was finalized on this rank: call tnt_init (Python: tnt.init()) again first"
                                             : "Tarantella is not initialized: call tnt_init (Python: tnt.init()) first");
}

/* Enter the context for a call: fails (without the lock) when it is not usable. */
static tnt_result_t enter(void) {
  if (atomic_load(&forked_child)) return in_forked_child();
  pthread_rwlock_rdlock(&life);
  if (!atomic_load(&tnt_ctx.initialized)) {
    pthread_rwlock_unlock(&life);
    return not_initialized();
  }
  return TNT_SUCCESS;
}
static void leave(void) { pthread_rwlock_unlock(&life); }

/* A field of the placement, or -1 when there is no usable context. */
static int placement_field(const int *field) {
  if (atomic_load(&forked_child) || !atomic_load(&tnt_ctx.initialized)) return -1;
  pthread_rwlock_rdlock(&life);
  int v = atomic_load(&tnt_ctx.initialized) ? *field : -1;
  pthread_rwlock_unlock(&life);
  return v;
}

int tnt_initialized(void) { return !atomic_load(&forked_child) && atomic_load(&tnt_ctx.initialized); }
int tnt_rank(void) { return placement_field(&tnt_ctx.pl.rank); }
int tnt_size(void) { return placement_field(&tnt_ctx.pl.size); }
int tnt_local_rank(void) { return placement_field(&tnt_ctx.pl.local_rank); }
int tnt_local_size(void) { return placement_field(&tnt_ctx.pl.local_size); }
const char *tnt_transport_name(void) {
  if (!tnt_initialized()) return "none";
  return tnt_ctx.transport ? tnt_ctx.transport->name : "self";
}

tnt_result_t tnt_init(void) {
  if (atomic_load(&forked_child)) return in_forked_child();
  pthread_once(&atfork_once, register_atfork);
  pthread_mutex_lock(&init_mu);
  tnt_ctx_t *c = &tnt_ctx;
  tnt_result_t res = TNT_SUCCESS;
  if (atomic_load(&c->initialized)) goto out;
  pthread_rwlock_wrlock(&life);
  memset(c, 0, sizeof *c);
  pthread_rwlock_unlock(&life);
  parent_pid = getpid();
  c->free_handle = -1;
  tnt_log_init(0);
  if ((res = tnt_placement_read(&c->pl)) != TNT_SUCCESS) goto out;
  tnt_log_init(c->pl.rank);
  if ((res = tnt_params_read(&c->params)) != TNT_SUCCESS) goto out;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->progress, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->done_cond, &ca);
  pthread_condattr_destroy(&ca);
  tnt_namemap_init(&c->active);
  if ((res = tnt_timeline_open(&c->timeline, c->params.timeline, c->pl.rank, c->pl.size)) != TNT_SUCCESS) goto out;
  if (c->pl.size > 1) {
    if ((res = tnt_transport_select(&c->pl, &c->params, &c->transport)) != TNT_SUCCESS) goto out;
    size_t window = (size_t)c->params.shm_slot_bytes * (size_t)c->params.shm_slots;
    if ((res = c->transport->init(&c->pl, &c->params, window, &c->ts)) != TNT_SUCCESS) goto out;
    if ((res = tnt_ring_setup(&c->ring, c->transport, c->ts, c->pl.rank, c->pl.size, (size_t)c->params.shm_slot_bytes,
                              c->params.shm_slots, c->params.timeout_s)) != TNT_SUCCESS ||
        (res = tnt_engine_setup(c)) != TNT_SUCCESS) {
      tnt_ring_teardown(&c->ring);
      c->transport->finalize(c->ts);
      goto out;
    }
    if (pthread_create(&c->thread, NULL, tnt_engine_main, c) != 0) {
      tnt_engine_teardown(c);
      tnt_ring_teardown(&c->ring);
      c->transport->finalize(c->ts);
      res = tnt_fail(TNT_ERR_SYSTEM, "cannot start the background thread: %s", strerror(errno));
      goto out;
    }
    c->thread_started = 1;
    c->spin_s = tnt_spin_seconds(&c->params, &c->pl);
  }
  atomic_store(&c->initialized, 1);
  TNT_INFO("initialized: rank %d of %d, transport %s", c->pl.rank, c->pl.size, tnt_transport_name());
out:
  if (res != TNT_SUCCESS && c->timeline) {
    tnt_timeline_close(c->timeline);
    c->timeline = NULL;
  }
  pthread_mutex_unlock(&init_mu);
  return res;
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

tnt_result_t tnt_finalize(void) {
  tnt_ctx_t *c = &tnt_ctx;
  if (atomic_load(&forked_child)) {
    /* the parent's segment, threads and locks are not ours: forget, touch nothing */
    atomic_store(&c->initialized, 0);
    return TNT_SUCCESS;
  }
  pthread_mutex_lock(&init_mu);
  if (!atomic_load(&c->initialized)) {
    pthread_mutex_unlock(&init_mu);
    return TNT_SUCCESS;
  }
  pthread_mutex_lock(&c->mu);
  c->stop = 1; /* new submissions fail from here on */
  pthread_mutex_unlock(&c->mu);
  if (c->thread_started) {
    c->transport->wake_local(c->ts);
    pthread_join(c->thread, NULL); /* its last step failed every pending request */
  }
  pthread_mutex_lock(&c->mu);
  pthread_cond_broadcast(&c->done_cond);
  pthread_mutex_unlock(&c->mu);
  pthread_rwlock_wrlock(&life); /* every waiter has returned */
  atomic_store(&c->initialized, 0);
  if (c->thread_started) {
    tnt_engine_teardown(c);
    tnt_ring_teardown(&c->ring);
  }
  if (c->transport) c->transport->finalize(c->ts);
  tnt_timeline_close(c->timeline);
  /* requests nobody waited for: their slots go with the context */
  for (int i = 0; i < c->nhandles; i++) free_slot(&c->handles[i]);
  free(c->handles);
  tnt_namemap_free(&c->active);
  pthread_cond_destroy(&c->done_cond);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->progress);
  memset(c, 0, sizeof *c);
  was_finalized = 1;
  pthread_rwlock_unlock(&life);
  pthread_mutex_unlock(&init_mu);
  return TNT_SUCCESS;
}

static void tnt_set_fatal_quiet(tnt_ctx_t *c, tnt_result_t result, const char *message, int peer);

tnt_result_t tnt_abort(const char *reason) {
  tnt_ctx_t *c = &tnt_ctx;
  if (atomic_load(&forked_child)) return TNT_SUCCESS; /* a child's failure is not its parent's */
  if (enter() != TNT_SUCCESS) return TNT_SUCCESS;
  if (c->transport) c->transport->abort(c->ts, reason, -1);
  char msg[1024];
  snprintf(msg, sizeof msg, "rank %d aborted: %s", c->pl.rank, reason ? reason : "");
  /* no ERROR log: the caller (e.g. Python's excepthook) reports the reason itself */
  tnt_set_fatal_quiet(c, TNT_ERR_PEER_LOST, msg, c->pl.rank);
  leave();
  return TNT_SUCCESS;
}

/* ---- handles (callers hold c->mu) ---- */

static tnt_handle_t handle_alloc(tnt_ctx_t *c, tnt_request_t *req) {
  int i = c->free_handle;
  if (i >= 0) {
    c->free_handle = (int)c->handles[i].result_count; /* the free list is threaded through result_count */
  } else {
    if (c->nhandles == c->caphandles) {
      int cap = c->caphandles ? c->caphandles * 2 : 256;
      tnt_handle_slot_t *h = realloc(c->handles, (size_t)cap * sizeof *h);
      if (!h) return -1;
      c->handles = h;
      c->caphandles = cap;
    }
    i = c->nhandles++;
    c->handles[i].generation = 0;
  }
  tnt_handle_slot_t *h = &c->handles[i];
  /* generations run 1 .. 2^31-1 and wrap: a handle stays a positive int64 */
  uint32_t gen = h->generation >= 0x7fffffffu ? 1u : h->generation + 1u;
  memset(h, 0, sizeof *h);
  h->generation = gen;
  h->used = 1;
  h->req = req;
  h->peer = -1;
  return (tnt_handle_t)(((uint64_t)gen << 32) | (uint64_t)(uint32_t)i);
}

/* Give a slot back to the free list, with everything it owns. */
static void handle_return(tnt_ctx_t *c, tnt_handle_t handle) {
  int i = (int)(handle & 0xffffffff);
  tnt_handle_slot_t *h = &c->handles[i];
  free_slot(h);
  h->used = 0;
  h->result_count = c->free_handle;
  c->free_handle = i;
}

static tnt_handle_slot_t *handle_get(tnt_ctx_t *c, tnt_handle_t handle) {
  int64_t i = handle & 0xffffffff;
  uint32_t gen = (uint32_t)((uint64_t)handle >> 32);
  if (handle < 0 || i >= c->nhandles || !c->handles[i].used || c->handles[i].generation != gen) return NULL;
  return &c->handles[i];
}

void tnt_complete(tnt_ctx_t *c, tnt_request_t *req, tnt_result_t result, const char *message, int peer,
                  void *result_buf, int64_t result_count, const int64_t *rank_counts) {
  pthread_mutex_lock(&c->mu);
  tnt_handle_slot_t *h = handle_get(c, req->handle);
  tnt_namemap_del(&c->active, req->name);
  if (h) {
    h->done = 1;
    h->result = result;
    h->peer = peer;
    h->message = message ? strdup(message) : NULL;
    h->result_buf = result_buf;
    h->result_count = result_count;
    if (rank_counts) {
      h->rank_counts = malloc(sizeof(int64_t) * (size_t)c->pl.size);
      if (h->rank_counts) memcpy(h->rank_counts, rank_counts, sizeof(int64_t) * (size_t)c->pl.size);
    }
  } else {
    free(result_buf);
  }
  atomic_fetch_add(&c->completions, 1);
  pthread_cond_broadcast(&c->done_cond);
  pthread_mutex_unlock(&c->mu);
}

static void set_fatal(tnt_ctx_t *c, tnt_result_t result, const char *message, int peer, int log) {
  pthread_mutex_lock(&c->mu);
  if (c->fatal == TNT_SUCCESS) {
    c->fatal = result;
    snprintf(c->fatal_msg, sizeof c->fatal_msg, "%s", message);
    c->fatal_peer = peer;
    if (log) TNT_ERROR("%s", message);
  }
  pthread_mutex_unlock(&c->mu);
  if (c->transport) c->transport->wake_local(c->ts);
}

void tnt_set_fatal(tnt_ctx_t *c, tnt_result_t result, const char *message, int peer) {
  set_fatal(c, result, message, peer, 1);
}

static void tnt_set_fatal_quiet(tnt_ctx_t *c, tnt_result_t result, const char *message, int peer) {
  set_fatal(c, result, message, peer, 0);
}

/* ---- submission ---- */

/* Queue a request (or run it, on one rank); the caller holds `life`. */
static tnt_result_t submit(tnt_request_t *req, tnt_handle_t *handle) {
  tnt_ctx_t *c = &tnt_ctx;
  if (!handle) {
    free(req);
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "handle pointer is NULL");
  }
  req->submit_time = tnt_now();
  req->submit_us = tnt_now_us();
  pthread_mutex_lock(&c->mu);
  if (c->fatal != TNT_SUCCESS) {
    tnt_result_t r = c->fatal;
    int peer = c->fatal_peer;
    char msg[sizeof c->fatal_msg];
    snprintf(msg, sizeof msg, "%.1000s", c->fatal_msg);
    pthread_mutex_unlock(&c->mu);
    free(req);
    tnt_set_last_error(msg, peer);
    return r;
  }
  if (c->stop) {
    pthread_mutex_unlock(&c->mu);
    free(req);
    return not_initialized();
  }
  if (tnt_namemap_get(&c->active, req->name) >= 0) {
    pthread_mutex_unlock(&c->mu);
    tnt_result_t r = tnt_fail(TNT_ERR_INVALID_USAGE,
                              "a collective named '%s' is already in flight on rank %d: wait for it before submitting the "
                              "name again, or use another name",
                              req->name, c->pl.rank);
    free(req);
    return r;
  }
  tnt_handle_t h = handle_alloc(c, req);
  if (h >= 0 && tnt_namemap_put(&c->active, req->name, 1)) {
    c->handles[h & 0xffffffff].req = NULL; /* freed below, once */
    handle_return(c, h); /* every failure after the slot was taken gives it back */
    h = -1;
  }
  if (h < 0) {
    pthread_mutex_unlock(&c->mu);
    free(req);
    return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  req->handle = h;
  *handle = h;
  if (c->pl.size == 1) {
    pthread_mutex_unlock(&c->mu);
    return tnt_execute_local(c, req);
  }
  req->next = NULL;
  if (c->queue_tail) c->queue_tail->next = req;
  else c->queue_head = req;
  c->queue_tail = req;
  pthread_mutex_unlock(&c->mu);
  c->transport->wake_local(c->ts);
  return TNT_SUCCESS;
}

static tnt_result_t new_request(const char *name, tnt_coll_t coll, int dtype, int64_t count, tnt_request_t **out) {
  if (!name || !*name) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "a collective needs a non-empty name");
  if (strlen(name) >= TNT_MAX_NAME)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "name '%.40s...' is %zu bytes long; at most %d are allowed", name, strlen(name),
                    TNT_MAX_NAME - 1);
  if (!tnt_dtype_valid(dtype))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "unsupported dtype code %d for '%s': use float16, bfloat16, float32, float64, int32 or int64",
                    dtype, name);
  if (count < 0) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "negative element count %lld for '%s'", (long long)count, name);
  tnt_request_t *req = calloc(1, sizeof *req);
  if (!req) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  snprintf(req->name, sizeof req->name, "%s", name);
  req->meta.coll = (uint8_t)coll;
  req->meta.dtype = (uint8_t)dtype;
  req->meta.count = count;
  req->prescale = 1.0;
  req->cache_slot = -1;
  *out = req;
  return TNT_SUCCESS;
}

static tnt_result_t allreduce_async_in(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 tnt_reduce_op_t op, double prescale, tnt_handle_t *handle) {
  tnt_request_t *req = NULL;
  if (op != TNT_SUM && op != TNT_AVERAGE)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "unsupported reduce op %d: use TNT_SUM or TNT_AVERAGE", (int)op);
  if (count > 0 && (!in || !out)) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allreduce '%s': NULL buffer", name ? name : "");
  if ((dtype == TNT_INT32 || dtype == TNT_INT64) && prescale != 1.0)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allreduce '%s': prescale=%g on an integer dtype cannot be exact; scale "
                    "integers yourself, or use a floating-point dtype", name ? name : "", prescale);
  if (!isfinite(prescale))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allreduce '%s': prescale must be a finite number. Received: %g",
                    name ? name : "", prescale);
  TNT_CHECK(new_request(name, COLL_ALLREDUCE, dtype, count, &req));
  req->meta.op = (uint8_t)op;
  req->prescale = prescale;
  req->in = in;
  req->out = out;
  return submit(req, handle);
}

static tnt_result_t broadcast_async_in(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype, int root,
                                 tnt_handle_t *handle) {
  tnt_request_t *req = NULL;
  if (root < 0 || root >= tnt_ctx.pl.size)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "broadcast '%s': root must be a rank between 0 and %d. Received: root=%d",
                    name ? name : "", tnt_ctx.pl.size - 1, root);
  if (count > 0 && (!out || (root == tnt_ctx.pl.rank && !in)))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "broadcast '%s': NULL buffer", name ? name : "");
  TNT_CHECK(new_request(name, COLL_BROADCAST, dtype, count, &req));
  req->meta.root = root;
  req->in = in;
  req->out = out;
  return submit(req, handle);
}

static tnt_result_t allgather_async_in(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                 tnt_handle_t *handle) {
  tnt_request_t *req = NULL;
  if (row_elems < 0 || (row_elems > 0 && count % row_elems) || (row_elems == 0 && count))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allgather '%s': count %lld is not a multiple of the row size %lld",
                    name ? name : "", (long long)count, (long long)row_elems);
  if (count > 0 && !in) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allgather '%s': NULL buffer", name ? name : "");
  TNT_CHECK(new_request(name, COLL_ALLGATHER, dtype, count, &req));
  req->meta.row_elems = row_elems;
  req->in = in;
  return submit(req, handle);
}

static tnt_result_t barrier_async_in(const char *name, tnt_handle_t *handle) {
  tnt_request_t *req = NULL;
  TNT_CHECK(new_request(name, COLL_BARRIER, TNT_INT32, 0, &req));
  return submit(req, handle);
}

/* ---- completion ---- */

static tnt_result_t bad_handle(tnt_handle_t handle) {
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "unknown or released handle %lld", (long long)handle);
}

static tnt_result_t finish_locked(tnt_handle_slot_t *h) {
  if (h->result != TNT_SUCCESS) tnt_set_last_error(h->message, h->peer);
  return h->result;
}

static tnt_result_t test_in(tnt_handle_t handle) {
  tnt_ctx_t *c = &tnt_ctx;
  pthread_mutex_lock(&c->mu);
  tnt_handle_slot_t *h = handle_get(c, handle);
  tnt_result_t r = !h ? bad_handle(handle) : !h->done ? TNT_IN_PROGRESS : finish_locked(h);
  pthread_mutex_unlock(&c->mu);
  return r;
}

/* Wait for a handle; `c->mu` is held on entry and exit. Another thread may wait
 * on the same handle, or release it meanwhile: the slot is looked up again
 * after every unlock. */
static tnt_result_t wait_in(tnt_handle_t handle, double timeout_s) {
  tnt_ctx_t *c = &tnt_ctx;
  /* negative, NaN or infinite: no bound of the caller's own (the core still
   * fails a stalled request after TNT_TIMEOUT_S) */
  const int bounded = timeout_s >= 0 && isfinite(timeout_s);
  const double deadline = bounded ? tnt_now() + timeout_s : INFINITY;
  struct timespec until = {0, 0};
  if (bounded) {
    clock_gettime(CLOCK_MONOTONIC, &until);
    double t = (double)until.tv_sec + until.tv_nsec * 1e-9 + timeout_s;
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
  }
  tnt_handle_slot_t *h = handle_get(c, handle);
  if (!h) return bad_handle(handle);
  if (!h->done && c->spin_s > 0) {
    /* small collectives complete within microseconds: spin on the completion
     * counter briefly to save the condition variable's sleep and wake-up */
    double spin_until = tnt_now() + c->spin_s;
    while (h && !h->done && tnt_now() < spin_until) {
      uint64_t seen = atomic_load(&c->completions);
      pthread_mutex_unlock(&c->mu);
      for (int i = 0; i < 4096 && atomic_load(&c->completions) == seen; i++) {
        tnt_cpu_relax();
        if ((i & 63) == 63 && tnt_now() > spin_until) break;
      }
      pthread_mutex_lock(&c->mu);
      h = handle_get(c, handle);
    }
  }
  /* Drive the engine ourselves while nobody else does: a blocking collective
   * then needs no hand-off to the background thread and no wake-up back. A
   * cycle still waiting for other ranks at our deadline is left to the
   * background thread (TNT_STEP_BLOCKED), so a bounded wait ends on time. */
  while (h && !h->done && c->thread_started && !c->stop && pthread_mutex_trylock(&c->progress) == 0) {
    int step = TNT_STEP_WORKED, done = 0;
    pthread_mutex_unlock(&c->mu);
    while (step == TNT_STEP_WORKED) {
      step = tnt_engine_step(c, deadline);
      pthread_mutex_lock(&c->mu);
      h = handle_get(c, handle);
      done = !h || h->done;
      pthread_mutex_unlock(&c->mu);
      if (done || tnt_now() > deadline) break;
    }
    pthread_mutex_unlock(&c->progress);
    if (step == TNT_STEP_BLOCKED) c->transport->wake_local(c->ts); /* hand the cycle over */
    pthread_mutex_lock(&c->mu);
    h = handle_get(c, handle);
    if (step != TNT_STEP_WORKED || tnt_now() > deadline) break; /* idle: the background thread goes on */
  }
  while (h && !h->done) {
    int err = bounded ? pthread_cond_timedwait(&c->done_cond, &c->mu, &until) : pthread_cond_wait(&c->done_cond, &c->mu);
    h = handle_get(c, handle); /* the table may have been reallocated, the handle released */
    if (h && err == ETIMEDOUT && !h->done)
      return tnt_fail(TNT_ERR_TIMEOUT, "tnt_wait gave up after %.3g s; the request '%s' is still pending", timeout_s,
                      h->req ? h->req->name : "?");
  }
  if (!h)
    return tnt_fail(TNT_ERR_INVALID_USAGE, "handle %lld was released by another thread while this one waited for it",
                    (long long)handle);
  return finish_locked(h);
}

tnt_result_t tnt_wait(tnt_handle_t handle, double timeout_s) {
  TNT_CHECK(enter());
  pthread_mutex_lock(&tnt_ctx.mu);
  tnt_result_t r = wait_in(handle, timeout_s);
  pthread_mutex_unlock(&tnt_ctx.mu);
  leave();
  return r;
}

/* The slot of a completed request, under c->mu (the caller unlocks). */
static tnt_result_t completed_slot(tnt_ctx_t *c, tnt_handle_t handle, tnt_handle_slot_t **out) {
  tnt_handle_slot_t *h = handle_get(c, handle);
  if (!h) return bad_handle(handle);
  if (!h->done) return tnt_fail(TNT_ERR_INVALID_USAGE, "request not complete: wait for it first");
  *out = h;
  return TNT_SUCCESS;
}

static tnt_result_t result_count_in(tnt_handle_t handle, int64_t *count) {
  tnt_ctx_t *c = &tnt_ctx;
  tnt_handle_slot_t *h = NULL;
  pthread_mutex_lock(&c->mu);
  tnt_result_t r = completed_slot(c, handle, &h);
  if (r == TNT_SUCCESS) *count = h->result_count;
  pthread_mutex_unlock(&c->mu);
  return r;
}

static tnt_result_t result_rank_counts_in(tnt_handle_t handle, int64_t *counts) {
  tnt_ctx_t *c = &tnt_ctx;
  tnt_handle_slot_t *h = NULL;
  pthread_mutex_lock(&c->mu);
  tnt_result_t r = completed_slot(c, handle, &h);
  if (r == TNT_SUCCESS && !h->rank_counts) r = tnt_fail(TNT_ERR_INVALID_USAGE, "no per-rank counts: not an allgather");
  if (r == TNT_SUCCESS) memcpy(counts, h->rank_counts, sizeof(int64_t) * (size_t)c->pl.size);
  pthread_mutex_unlock(&c->mu);
  return r;
}

static tnt_result_t result_copy_in(tnt_handle_t handle, void *dst) {
  tnt_ctx_t *c = &tnt_ctx;
  tnt_handle_slot_t *h = NULL;
  pthread_mutex_lock(&c->mu);
  tnt_result_t r = completed_slot(c, handle, &h);
  if (r == TNT_SUCCESS && h->result_buf && h->req)
    memcpy(dst, h->result_buf, (size_t)h->result_count * tnt_dtype_size((tnt_dtype_t)h->req->meta.dtype));
  pthread_mutex_unlock(&c->mu);
  return r;
}

static tnt_result_t release_in(tnt_handle_t handle) {
  tnt_ctx_t *c = &tnt_ctx;
  pthread_mutex_lock(&c->mu);
  tnt_handle_slot_t *h = handle_get(c, handle);
  if (!h) {
    pthread_mutex_unlock(&c->mu);
    return bad_handle(handle);
  }
  if (!h->done) {
    pthread_mutex_unlock(&c->mu);
    return tnt_fail(TNT_ERR_INVALID_USAGE, "cannot release a request that is still in flight: wait for it first");
  }
  handle_return(c, handle);
  pthread_mutex_unlock(&c->mu);
  return TNT_SUCCESS;
}

tnt_result_t tnt_allreduce_async(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 tnt_reduce_op_t op, double prescale, tnt_handle_t *handle) {
  TNT_CHECK(enter());
  tnt_result_t r = allreduce_async_in(name, in, out, count, dtype, op, prescale, handle);
  leave();
  return r;
}

tnt_result_t tnt_broadcast_async(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype, int root,
                                 tnt_handle_t *handle) {
  TNT_CHECK(enter());
  tnt_result_t r = broadcast_async_in(name, in, out, count, dtype, root, handle);
  leave();
  return r;
}

tnt_result_t tnt_allgather_async(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                 tnt_handle_t *handle) {
  TNT_CHECK(enter());
  tnt_result_t r = allgather_async_in(name, in, count, row_elems, dtype, handle);
  leave();
  return r;
}

tnt_result_t tnt_barrier_async(const char *name, tnt_handle_t *handle) {
  TNT_CHECK(enter());
  tnt_result_t r = barrier_async_in(name, handle);
  leave();
  return r;
}

tnt_result_t tnt_test(tnt_handle_t handle) {
  TNT_CHECK(enter());
  tnt_result_t r = test_in(handle);
  leave();
  return r;
}

tnt_result_t tnt_result_count(tnt_handle_t handle, int64_t *count) {
  TNT_CHECK(enter());
  tnt_result_t r = result_count_in(handle, count);
  leave();
  return r;
}

tnt_result_t tnt_result_rank_counts(tnt_handle_t handle, int64_t *counts) {
  TNT_CHECK(enter());
  tnt_result_t r = result_rank_counts_in(handle, counts);
  leave();
  return r;
}

tnt_result_t tnt_result_copy(tnt_handle_t handle, void *dst) {
  TNT_CHECK(enter());
  tnt_result_t r = result_copy_in(handle, dst);
  leave();
  return r;
}

tnt_result_t tnt_release(tnt_handle_t handle) {
  if (!tnt_initialized()) return TNT_SUCCESS; /* finalize freed every slot already */
  TNT_CHECK(enter());
  tnt_result_t r = release_in(handle);
  leave();
  return r;
}
