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
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "context.h"
#include "pause.h"
#include "setup_interrupt.h"
#include "transport/host_marks.h"
#include "transport/job_void.h"
#include "transport/put_copy.h"
#include "copy_unaliased.h"
#include "dtype.h"
#include "stream_store.h"

tnt_ctx_t tnt_ctx;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t life = PTHREAD_RWLOCK_INITIALIZER;
static int was_finalized;
static _Atomic int forked_child;    /* this process is a fork() child of an initialized one */
static pid_t parent_pid;            /* the process that initialized, for the fork error */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A thread of this process is inside tnt_init (it holds init_mu): a fork() child made meanwhile
 * by another thread has no such thread, and init_mu stays held in it for good. */
static _Atomic int in_init;

static void on_fork_child(void) {
  /* forked while another thread was in tnt_init (a thread starting the core while the main one
   * forks a data loader's workers): the child's first call waited for that thread's init_mu
   * forever. It is the child of a rank all the same, and fails as one */
  if (atomic_load(&tnt_ctx.initialized) || atomic_load(&in_init)) atomic_store(&forked_child, 1);
}

/* The process and thread whose tnt_init is in the transport's set-up (waiting for the other
 * ranks), else 0: what the exit handler looks for. A fork() child inherits the pid, not the
 * thread: it has nothing to clean up. */
static _Atomic pid_t setting_up_pid;
static pthread_t setting_up_thread;
#define EXIT_WAIT_S 5.0 /* how long exit() waits for that set-up to give up (it looks every 0.1 s) */

/* exit() (a program's end, sys.exit) while another thread is in tnt_init's set-up: Python ends
 * at the end of its main thread whatever a daemon thread does, and an interrupted
 * Thread.join() of 3.11 returns at once. The process then ended with the set-up half done: rank 0's
 * segment /dev/shm/tnt-<job id> and the host's marks stayed for good (only `tntrun --cleanup`
 * or rm removed them), and a rank still to come found no mark and waited until TNT_TIMEOUT_S. The
 * set-up's waits now fail at their next check, and the set-up's own failure path does what it
 * does for a Ctrl-C: removes the names, marks this rank failed in the segment, and leaves the
 * job's mark for the ranks still to come. Exit waits for that, briefly (a set-up inside a
 * plugin's MPI_Init cannot be ended, and the exit then goes on as before). */
static void at_exit(void) {
  if (atomic_load(&setting_up_pid) != getpid() || pthread_equal(setting_up_thread, pthread_self())) return;
  tnt_setup_interrupt_exiting();
  const double until = tnt_now() + EXIT_WAIT_S;
  const struct timespec nap = {0, 2000000};
  while (atomic_load(&setting_up_pid) == getpid() && tnt_now() < until) nanosleep(&nap, NULL);
}

static void register_atfork(void) {
  pthread_atfork(NULL, NULL, on_fork_child);
  atexit(at_exit);
}

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

/* The body of a public entry point: `call` runs inside the context. */
#define WITH_CONTEXT(call)                \
  do {                                    \
    TNT_CHECK(enter());                   \
    tnt_result_t with_context_r_ = (call); \
    leave();                              \
    return with_context_r_;               \
  } while (0)

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

/* The marks of failed starts that no longer count (job_void.h) are swept by the shm transport's rank
 * 0 before it makes a segment. A job on another transport alone (TNT_TRANSPORT=mpi or gpi2 under
 * mpirun or srun, whose job ids are new every launch, and no tntrun to remove them) swept none: the
 * mark of every failed start (a bad setting, the mpi set-up refused) stayed in /dev/shm for good
 * where every job takes that transport. The first rank of each host sweeps them here instead. */
static void sweep_stale_marks(const tnt_ctx_t *c) {
  if (c->pl.local_rank == 0 && strcmp(c->transport->name, "shm") != 0) tnt_job_void_sweep_stale();
}

tnt_result_t tnt_init(void) {
  if (atomic_load(&forked_child)) return in_forked_child();
  pthread_once(&atfork_once, register_atfork);
  pthread_mutex_lock(&init_mu);
  parent_pid = getpid(); /* before in_init: a child forked from here on names it */
  atomic_store(&in_init, 1);
  tnt_ctx_t *c = &tnt_ctx;
  tnt_result_t res = TNT_SUCCESS;
  int joining = 0; /* the transport's set-up began: from there its own waits and marks tell the others */
  if (atomic_load(&c->initialized)) goto out;
  pthread_rwlock_wrlock(&life);
  memset(c, 0, sizeof *c);
  pthread_rwlock_unlock(&life);
  parent_pid = getpid();
  tnt_log_init(0);
  if ((res = tnt_placement_read(&c->pl)) != TNT_SUCCESS) goto out;
  tnt_log_init(c->pl.rank);
  if ((res = tnt_params_read(&c->params)) != TNT_SUCCESS) goto out;
  tnt_half_level_set((tnt_half_level_t)c->params.simd); /* clamped to what the CPU has */
  tnt_stream_min_set((size_t)c->params.stream_min_bytes);
  tnt_put_init((tnt_put_placement_t)c->params.shm_placement);
  if ((res = tnt_timeline_open(&c->timeline, c->params.timeline, c->pl.rank, c->pl.size)) != TNT_SUCCESS) goto out;
  tnt_requests_init(&c->requests, c->pl.size);
  if (c->pl.size > 1) {
    /* ranks stopped together and continued (Ctrl+Z through tntrun, kill -STOP/-CONT) do
     * not fail their waits for the time they were stopped (pause.c) */
    tnt_pause_arm();
    tnt_setup_interrupt_arm(); /* Ctrl-C ends the waits for the other ranks (setup_interrupt.h) */
    setting_up_thread = pthread_self();
    atomic_store(&setting_up_pid, getpid()); /* exit() meanwhile: at_exit */
    /* the ranks of this host must take one transport (host_marks.h): checked before the
     * set-up, where each would wait for the others until TNT_TIMEOUT_S */
    if ((res = tnt_transport_select(&c->pl, &c->params, &c->transport)) != TNT_SUCCESS ||
        (sweep_stale_marks(c), res = tnt_host_marks_begin(&c->pl, c->params.transport, c->transport->name)) != TNT_SUCCESS ||
        (joining = 1, res = c->transport->init(&c->pl, &c->params,
                                  (size_t)c->params.shm_slot_bytes * (size_t)c->params.shm_slots *
                                      (size_t)tnt_transport_regions(c->transport),
                                  &c->ts)) != TNT_SUCCESS) {
      /* Only the shm transport's set-up tells the ranks of this host that wait in theirs (its
       * segment, its marks). Another's failure (mpi's "MPI sees only this process", a rank given
       * TNT_LOCAL_SIZE=1 by hand while the others of its host took shm) reached none of them: they
       * waited for it until TNT_TIMEOUT_S. Its failure is marked as one before joining */
      if (joining && strcmp(c->transport->name, "shm") != 0) joining = 0;
      tnt_host_marks_end();
      tnt_setup_interrupt_disarm();
      c->transport = NULL;
      goto out;
    }
    tnt_host_marks_end();
    res = tnt_engine_start(&c->engine, &c->pl, &c->params, c->transport, c->ts, &c->requests, c->timeline);
    tnt_setup_interrupt_disarm();
    if (res != TNT_SUCCESS) {
      /* joined (the transport is set up), then failed here (its background thread, memory, a
       * peer lost in the ring's set-up, Ctrl-C): a failure, not a normal end. A finalize alone
       * told the peers this rank had "shut down" (every rank must make the same calls before
       * shutdown), and they said so at their first collective, or waited for it */
      char why[1024];
      snprintf(why, sizeof why, "%s", tnt_last_error());
      c->transport->abort(c->ts, why, tnt_last_error_rank());
      c->transport->finalize(c->ts);
      c->transport = NULL;
      goto out;
    }
    c->spin_s = tnt_spin_seconds(&c->params, &c->pl, tnt_transport_cores(c->transport, c->ts));
  }
  atomic_store(&c->initialized, 1);
  TNT_INFO("initialized: rank %d of %d, transport %s", c->pl.rank, c->pl.size, tnt_transport_name());
out:
  if (res != TNT_SUCCESS) {
    /* failed before it joined the others (a bad setting of its own): they waited for it until
     * TNT_TIMEOUT_S. Once in the transport's set-up, its failure reaches them there (shm: a rank
     * marked failed in the segment, or the job's mark for those still to come), or theirs is the
     * same (the settings' check) */
    if (!joining && !tnt_worker_of()) {
      char why[512];
      snprintf(why, sizeof why, "%s", tnt_last_error());
      /* the mark counts for the job's TNT_TIMEOUT_S (a stale one is swept: job_void.h): read on its own
       * where the rank failed before its settings were read (a bad placement, or a bad setting read
       * first, such as TNT_FUSION_THRESHOLD_KB); the mark of a rank whose TNT_TIMEOUT_S itself is bad
       * counts for the default, the one value it can tell */
      tnt_job_void_note_failed_start(&c->pl, c->params.timeout_s > 0 ? c->params.timeout_s : tnt_params_timeout_s(),
                                     why);
    }
    tnt_timeline_close(c->timeline);
    c->timeline = NULL;
    if (c->requests.size) tnt_requests_destroy(&c->requests);
  }
  atomic_store(&setting_up_pid, 0); /* last: an exit waiting for the set-up goes on once it has cleaned up */
  atomic_store(&in_init, 0);
  pthread_mutex_unlock(&init_mu);
  return res;
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
  if (c->transport) tnt_engine_stop(&c->engine); /* its last step failed every pending request */
  tnt_requests_wake_waiters(&c->requests);
  pthread_rwlock_wrlock(&life); /* every waiter has returned */
  atomic_store(&c->initialized, 0);
  if (c->transport) {
    tnt_engine_free(&c->engine);
    c->transport->finalize(c->ts);
  }
  tnt_timeline_close(c->timeline);
  tnt_requests_destroy(&c->requests); /* requests nobody waited for go with it */
  memset(c, 0, sizeof *c);
  was_finalized = 1;
  pthread_rwlock_unlock(&life);
  pthread_mutex_unlock(&init_mu);
  return TNT_SUCCESS;
}

tnt_result_t tnt_abort(const char *reason) {
  tnt_ctx_t *c = &tnt_ctx;
  if (atomic_load(&forked_child)) return TNT_SUCCESS; /* a child's failure is not its parent's */
  if (enter() != TNT_SUCCESS) return TNT_SUCCESS;
  char msg[1024];
  snprintf(msg, sizeof msg, "rank %d aborted: %s", c->pl.rank, reason ? reason : "");
  /* no ERROR log: the caller (e.g. Python's excepthook) reports the reason itself */
  tnt_requests_set_fatal(&c->requests, TNT_ERR_PEER_LOST, msg, c->pl.rank); /* first: this message wins */
  if (c->transport) tnt_engine_abort(&c->engine, reason ? reason : "aborted", -1, 0);
  leave();
  return TNT_SUCCESS;
}

void tnt_set_busy(int busy) {
  if (enter() != TNT_SUCCESS) return;
  if (tnt_ctx.transport) tnt_negotiate_set_busy(&tnt_ctx.engine.neg, busy); /* sent with the next full round */
  leave();
}

double tnt_clock(void) { return tnt_now(); }

tnt_result_t tnt_job_error(void) {
  tnt_ctx_t *c = &tnt_ctx;
  if (enter() != TNT_SUCCESS) return TNT_SUCCESS;
  char msg[1024];
  int peer = -1;
  tnt_result_t r = tnt_requests_fatal_met(&c->requests, msg, sizeof msg, &peer);
  if (r != TNT_SUCCESS) tnt_set_last_error(msg, peer);
  leave();
  return r;
}

/* ---- submission ---- */

/* Queue a request (or run it, on one rank); the caller holds `life`. */
static tnt_result_t submit(tnt_request_t *req, tnt_handle_t *handle, int driven) {
  tnt_ctx_t *c = &tnt_ctx;
  if (!handle) {
    free(req);
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "handle pointer is NULL");
  }
  req->submit_time = tnt_now();
  req->submit_us = tnt_now_us();
  pthread_mutex_lock(&c->requests.mu);
  tnt_result_t r = tnt_requests_add(&c->requests, req, c->pl.rank, handle);
  pthread_mutex_unlock(&c->requests.mu);
  if (r != TNT_SUCCESS) return r;
  if (!c->transport) {
    tnt_execute_local(&c->requests, c->timeline, req);
    return TNT_SUCCESS;
  }
  r = driven ? tnt_engine_submit_driven(&c->engine, req) : tnt_engine_submit(&c->engine, req);
  if (r != TNT_SUCCESS) { /* shutting down: the slot goes back, with the request */
    tnt_requests_complete(&c->requests, req, r, tnt_last_error(), -1, NULL, 0, NULL);
    pthread_mutex_lock(&c->requests.mu);
    tnt_requests_release(&c->requests, *handle);
    pthread_mutex_unlock(&c->requests.mu);
  }
  return r;
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
  /* its byte size (count x element size) must fit: a count beyond this bound is no real
   * buffer's, and its size would wrap around */
  if (count > PTRDIFF_MAX / (int64_t)tnt_dtype_size((tnt_dtype_t)dtype))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "element count %lld for '%s' is larger than any buffer of %s can be",
                    (long long)count, name, tnt_dtype_name((tnt_dtype_t)dtype));
  tnt_request_t *req = calloc(1, sizeof *req);
  if (!req) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  tnt_copy_str(req->name, sizeof req->name, name);
  req->meta.coll = (uint8_t)coll;
  req->meta.dtype = (uint8_t)dtype;
  req->meta.count = count;
  req->prescale = 1.0;
  req->cache_slot = -1;
  *out = req;
  return TNT_SUCCESS;
}

static tnt_result_t allreduce_async_in(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 tnt_reduce_op_t op, double prescale, uint64_t layout, tnt_handle_t *handle, int driven) {
  tnt_request_t *req = NULL;
  if (op != TNT_SUM && op != TNT_AVERAGE)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "unsupported reduce op %d: use TNT_SUM or TNT_AVERAGE", (int)op);
  if (count > 0 && (!in || !out)) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allreduce '%s': NULL buffer", name ? name : "");
  if ((dtype == TNT_INT32 || dtype == TNT_INT64) && !(prescale == trunc(prescale) && fabs(prescale) < 9.2e18))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allreduce '%s': prescale=%g on an integer dtype must be a whole number "
                    "of magnitude below 9.2e18 (integer products wrap like the sum; a fraction cannot be exact, and a "
                    "larger factor has no 64-bit integer): scale the integers yourself, or use a floating-point dtype. "
                    "Received: prescale=%g for %s",
                    name ? name : "", prescale, prescale, tnt_dtype_name(dtype));
  if (!isfinite(prescale))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allreduce '%s': prescale must be a finite number. Received: %g",
                    name ? name : "", prescale);
  TNT_CHECK(new_request(name, COLL_ALLREDUCE, dtype, count, &req));
  req->meta.op = (uint8_t)op;
  req->meta.layout = layout;
  req->prescale = prescale;
  req->in = in;
  req->out = out;
  return submit(req, handle, driven);
}

static tnt_result_t broadcast_async_in(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype, int root,
                                       uint64_t layout, tnt_handle_t *handle, int driven) {
  tnt_request_t *req = NULL;
  if (root < 0 || root >= tnt_ctx.pl.size)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "broadcast '%s': root must be a rank between 0 and %d. Received: root=%d",
                    name ? name : "", tnt_ctx.pl.size - 1, root);
  if (count > 0 && (!out || (root == tnt_ctx.pl.rank && !in)))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "broadcast '%s': NULL buffer", name ? name : "");
  TNT_CHECK(new_request(name, COLL_BROADCAST, dtype, count, &req));
  req->meta.root = root;
  req->meta.layout = layout;
  req->in = in;
  req->out = out;
  return submit(req, handle, driven);
}

static tnt_result_t allgather_async_in(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                       void *out, int64_t out_count, uint64_t layout, tnt_handle_t *handle, int driven) {
  tnt_request_t *req = NULL;
  if (row_elems < 0 || (row_elems > 0 && count % row_elems) || (row_elems == 0 && count))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allgather '%s': count %lld is not a multiple of the row size %lld",
                    name ? name : "", (long long)count, (long long)row_elems);
  if (count > 0 && !in) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allgather '%s': NULL buffer", name ? name : "");
  if (out_count < 0 || (out_count > 0 && !out))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "allgather '%s': output of %lld elements at %p", name ? name : "",
                    (long long)out_count, out);
  TNT_CHECK(new_request(name, COLL_ALLGATHER, dtype, count, &req));
  req->meta.row_elems = row_elems;
  req->meta.layout = layout;
  req->in = in;
  req->out = out;
  req->out_count = out ? out_count : -1;
  return submit(req, handle, driven);
}

static tnt_result_t barrier_async_in(const char *name, tnt_handle_t *handle, int driven) {
  tnt_request_t *req = NULL;
  TNT_CHECK(new_request(name, COLL_BARRIER, TNT_INT32, 0, &req));
  return submit(req, handle, driven);
}

/* ---- completion ---- */

static tnt_result_t bad_handle(tnt_handle_t handle) {
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "unknown or released handle %lld: released already, or made before tnt_finalize (Python: "
                  "tnt.shutdown()), which failed and released every request in flight",
                  (long long)handle);
}


static tnt_result_t test_in(tnt_handle_t handle) {
  tnt_ctx_t *c = &tnt_ctx;
  pthread_mutex_lock(&c->requests.mu);
  tnt_handle_slot_t *h = tnt_requests_get(&c->requests, handle);
  tnt_result_t r = !h ? bad_handle(handle) : !h->done ? TNT_IN_PROGRESS : tnt_requests_result(&c->requests, h);
  pthread_mutex_unlock(&c->requests.mu);
  return r;
}

/* Wait for a handle; the requests lock is held on entry and exit. Another thread may wait
 * on the same handle, or release it meanwhile: the slot is looked up again
 * after every unlock. */
static tnt_result_t wait_in(tnt_handle_t handle, double timeout_s) {
  tnt_ctx_t *c = &tnt_ctx;
  /* negative, NaN, infinite or beyond a timespec (1e9 s: 30 years): no bound of
   * the caller's own (the core still fails a stalled request after TNT_TIMEOUT_S) */
  const int bounded = timeout_s >= 0 && timeout_s < 1e9;
  const double deadline = bounded ? tnt_now() + timeout_s : INFINITY;
  /* the deadline on the done condition's clock, CLOCK_MONOTONIC (tnt_now's, less the pauses) */
  struct timespec until = bounded ? tnt_deadline_timespec(deadline) : (struct timespec){0, 0};
  tnt_handle_slot_t *h = tnt_requests_get(&c->requests, handle);
  if (!h) return bad_handle(handle);
  /* Drive the engine ourselves while nobody else does: a blocking collective
   * then needs no hand-off to the background thread and no wake-up back. A
   * cycle still waiting for other ranks at our deadline is left to the
   * background thread (TNT_STEP_BLOCKED), so a bounded wait ends on time. */
  while (h && !h->done && c->transport) {
    int step = TNT_STEP_WORKED, done = 0;
    pthread_mutex_unlock(&c->requests.mu);
    while (step == TNT_STEP_WORKED) {
      step = tnt_engine_drive(&c->engine, deadline);
      pthread_mutex_lock(&c->requests.mu);
      h = tnt_requests_get(&c->requests, handle);
      done = !h || h->done;
      pthread_mutex_unlock(&c->requests.mu);
      if (done || tnt_now() > deadline) break;
    }
    pthread_mutex_lock(&c->requests.mu);
    h = tnt_requests_get(&c->requests, handle);
    if (step != TNT_STEP_WORKED || tnt_now() > deadline) break; /* idle or busy: the background thread goes on */
  }
  /* a request submitted without waking the background thread (tnt_allreduce)
   * is its business from here on, as are other threads' requests that this
   * one left in the engine */
  if (c->transport) tnt_engine_leave(&c->engine, !h || h->done);
  if (h && !h->done && c->spin_s > 0) {
    /* another thread drives (or was just woken to): small collectives complete
     * within microseconds, so spin on the completion counter briefly to save
     * the condition variable's sleep and wake-up. Only here, after driving:
     * a caller that drives its own collective has nobody to wait for. */
    double spin_until = tnt_now() + c->spin_s;
    while (h && !h->done && tnt_now() < spin_until) {
      uint64_t seen = tnt_requests_completions(&c->requests);
      pthread_mutex_unlock(&c->requests.mu);
      for (int i = 0; i < 4096 && tnt_requests_completions(&c->requests) == seen; i++) {
        tnt_cpu_relax();
        if ((i & 63) == 63 && tnt_now() > spin_until) break;
      }
      pthread_mutex_lock(&c->requests.mu);
      h = tnt_requests_get(&c->requests, handle);
    }
  }
  while (h && !h->done) {
    int err = tnt_requests_wait_completion(&c->requests, bounded ? &until : NULL);
    h = tnt_requests_get(&c->requests, handle); /* the table may have been reallocated, the handle released */
    if (h && err == ETIMEDOUT && !h->done && tnt_now() <= deadline) {
      until = tnt_deadline_timespec(deadline); /* the process was stopped meanwhile: that did not count */
      continue;
    }
    if (h && err == ETIMEDOUT && !h->done)
      return tnt_fail(TNT_ERR_TIMEOUT, "tnt_wait gave up after %.3g s; the request '%s' is still pending", timeout_s,
                      h->req ? h->req->name : "?");
  }
  if (!h)
    return tnt_fail(TNT_ERR_INVALID_USAGE, "handle %lld was released by another thread while this one waited for it",
                    (long long)handle);
  return tnt_requests_result(&c->requests, h);
}

tnt_result_t tnt_wait(tnt_handle_t handle, double timeout_s) {
  TNT_CHECK(enter());
  pthread_mutex_lock(&tnt_ctx.requests.mu);
  tnt_result_t r = wait_in(handle, timeout_s);
  pthread_mutex_unlock(&tnt_ctx.requests.mu);
  leave();
  return r;
}

/* The slot of a completed request, under the requests lock (the caller unlocks). */
static tnt_result_t completed_slot(tnt_ctx_t *c, tnt_handle_t handle, tnt_handle_slot_t **out) {
  tnt_handle_slot_t *h = tnt_requests_get(&c->requests, handle);
  if (!h) return bad_handle(handle);
  if (!h->done) return tnt_fail(TNT_ERR_INVALID_USAGE, "request not complete: wait for it first");
  *out = h;
  return TNT_SUCCESS;
}

static tnt_result_t result_count_in(tnt_handle_t handle, int64_t *count) {
  tnt_ctx_t *c = &tnt_ctx;
  tnt_handle_slot_t *h = NULL;
  pthread_mutex_lock(&c->requests.mu);
  tnt_result_t r = completed_slot(c, handle, &h);
  if (r == TNT_SUCCESS) *count = h->result_count;
  pthread_mutex_unlock(&c->requests.mu);
  return r;
}

static tnt_result_t result_rank_counts_in(tnt_handle_t handle, int64_t *counts) {
  tnt_ctx_t *c = &tnt_ctx;
  tnt_handle_slot_t *h = NULL;
  pthread_mutex_lock(&c->requests.mu);
  tnt_result_t r = completed_slot(c, handle, &h);
  if (r == TNT_SUCCESS && !h->rank_counts) r = tnt_fail(TNT_ERR_INVALID_USAGE, "no per-rank counts: not an allgather");
  if (r == TNT_SUCCESS) memcpy(counts, h->rank_counts, sizeof(int64_t) * (size_t)c->pl.size);
  pthread_mutex_unlock(&c->requests.mu);
  return r;
}

static tnt_result_t result_copy_in(tnt_handle_t handle, void *dst) {
  tnt_ctx_t *c = &tnt_ctx;
  tnt_handle_slot_t *h = NULL;
  pthread_mutex_lock(&c->requests.mu);
  tnt_result_t r = completed_slot(c, handle, &h);
  if (r == TNT_SUCCESS && h->result_buf && h->req)
    tnt_copy_unaliased(dst, h->result_buf, (size_t)h->result_count * tnt_dtype_size((tnt_dtype_t)h->req->meta.dtype));
  pthread_mutex_unlock(&c->requests.mu);
  return r;
}

static tnt_result_t release_in(tnt_handle_t handle) {
  tnt_ctx_t *c = &tnt_ctx;
  pthread_mutex_lock(&c->requests.mu);
  tnt_handle_slot_t *h = tnt_requests_get(&c->requests, handle);
  if (!h) {
    pthread_mutex_unlock(&c->requests.mu);
    return bad_handle(handle);
  }
  if (!h->done) {
    pthread_mutex_unlock(&c->requests.mu);
    return tnt_fail(TNT_ERR_INVALID_USAGE, "cannot release a request that is still in flight: wait for it first");
  }
  tnt_requests_release(&c->requests, handle);
  pthread_mutex_unlock(&c->requests.mu);
  return TNT_SUCCESS;
}

tnt_result_t tnt_allreduce_async(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 tnt_reduce_op_t op, double prescale, tnt_handle_t *handle) {
  WITH_CONTEXT(allreduce_async_in(name, in, out, count, dtype, op, prescale, 0, handle, 0));
}

/* The blocking calls: submitted without waking the background thread, then
 * waited for here, the calling thread driving the engine: in the steady state
 * of a loop no other thread of this rank wakes up. A request still pending
 * after timeout_s is the caller's to wait on (TNT_IN_PROGRESS); one that is
 * done is released, but for a successful one that `keep` says to keep (an
 * allgather, whose result the caller reads from the handle). A NULL handle
 * pointer never gets here: submit() refuses it. */
static tnt_result_t wait_driven(tnt_handle_t handle, double timeout_s, int keep) {
  tnt_ctx_t *c = &tnt_ctx;
  pthread_mutex_lock(&c->requests.mu);
  tnt_result_t r = wait_in(handle, timeout_s);
  tnt_handle_slot_t *h = tnt_requests_get(&c->requests, handle);
  if (h && !h->done) {
    r = TNT_IN_PROGRESS; /* the caller's slice ended: it waits on the handle */
  } else if (h) {
    r = tnt_requests_result(&c->requests, h); /* done, even if just after the slice ended */
    if (!(keep && r == TNT_SUCCESS)) tnt_requests_release(&c->requests, handle);
  }
  pthread_mutex_unlock(&c->requests.mu);
  return r;
}

static tnt_result_t allreduce_in(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                 tnt_reduce_op_t op, double prescale, uint64_t layout, double timeout_s,
                                 tnt_handle_t *handle) {
  TNT_CHECK(allreduce_async_in(name, in, out, count, dtype, op, prescale, layout, handle, 1));
  return wait_driven(*handle, timeout_s, 0);
}

static tnt_result_t broadcast_in(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype, int root,
                                 uint64_t layout, double timeout_s, tnt_handle_t *handle) {
  TNT_CHECK(broadcast_async_in(name, in, out, count, dtype, root, layout, handle, 1));
  return wait_driven(*handle, timeout_s, 0);
}

static tnt_result_t allgather_in(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                 void *out, int64_t out_count, uint64_t layout, double timeout_s, tnt_handle_t *handle) {
  TNT_CHECK(allgather_async_in(name, in, count, row_elems, dtype, out, out_count, layout, handle, 1));
  return wait_driven(*handle, timeout_s, 1);
}

static tnt_result_t barrier_in(const char *name, double timeout_s, tnt_handle_t *handle) {
  TNT_CHECK(barrier_async_in(name, handle, 1));
  return wait_driven(*handle, timeout_s, 0);
}

tnt_result_t tnt_allreduce(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                           tnt_reduce_op_t op, double prescale, double timeout_s, tnt_handle_t *handle) {
  WITH_CONTEXT(allreduce_in(name, in, out, count, dtype, op, prescale, 0, timeout_s, handle));
}

tnt_result_t tnt_allreduce_layout(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                  tnt_reduce_op_t op, double prescale, uint64_t layout, double timeout_s,
                                  tnt_handle_t *handle) {
  WITH_CONTEXT(allreduce_in(name, in, out, count, dtype, op, prescale, layout, timeout_s, handle));
}

tnt_result_t tnt_allreduce_layout_async(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                        tnt_reduce_op_t op, double prescale, uint64_t layout, tnt_handle_t *handle) {
  WITH_CONTEXT(allreduce_async_in(name, in, out, count, dtype, op, prescale, layout, handle, 0));
}

tnt_result_t tnt_broadcast(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype, int root,
                           double timeout_s, tnt_handle_t *handle) {
  WITH_CONTEXT(broadcast_in(name, in, out, count, dtype, root, 0, timeout_s, handle));
}

tnt_result_t tnt_broadcast_layout(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                  int root, uint64_t layout, double timeout_s, tnt_handle_t *handle) {
  WITH_CONTEXT(broadcast_in(name, in, out, count, dtype, root, layout, timeout_s, handle));
}

tnt_result_t tnt_allgather_into(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                void *out, int64_t out_count, double timeout_s, tnt_handle_t *handle) {
  WITH_CONTEXT(allgather_in(name, in, count, row_elems, dtype, out, out_count, 0, timeout_s, handle));
}

tnt_result_t tnt_allgather_into_layout(const char *name, const void *in, int64_t count, int64_t row_elems,
                                       tnt_dtype_t dtype, void *out, int64_t out_count, uint64_t layout,
                                       double timeout_s, tnt_handle_t *handle) {
  WITH_CONTEXT(allgather_in(name, in, count, row_elems, dtype, out, out_count, layout, timeout_s, handle));
}

tnt_result_t tnt_barrier(const char *name, double timeout_s, tnt_handle_t *handle) {
  WITH_CONTEXT(barrier_in(name, timeout_s, handle));
}

tnt_result_t tnt_broadcast_async(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype, int root,
                                 tnt_handle_t *handle) {
  WITH_CONTEXT(broadcast_async_in(name, in, out, count, dtype, root, 0, handle, 0));
}

tnt_result_t tnt_broadcast_layout_async(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                        int root, uint64_t layout, tnt_handle_t *handle) {
  WITH_CONTEXT(broadcast_async_in(name, in, out, count, dtype, root, layout, handle, 0));
}

tnt_result_t tnt_allgather_async(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                 tnt_handle_t *handle) {
  WITH_CONTEXT(allgather_async_in(name, in, count, row_elems, dtype, NULL, 0, 0, handle, 0));
}

tnt_result_t tnt_allgather_into_async(const char *name, const void *in, int64_t count, int64_t row_elems,
                                      tnt_dtype_t dtype, void *out, int64_t out_count, tnt_handle_t *handle) {
  WITH_CONTEXT(allgather_async_in(name, in, count, row_elems, dtype, out, out_count, 0, handle, 0));
}

tnt_result_t tnt_allgather_into_layout_async(const char *name, const void *in, int64_t count, int64_t row_elems,
                                             tnt_dtype_t dtype, void *out, int64_t out_count, uint64_t layout,
                                             tnt_handle_t *handle) {
  WITH_CONTEXT(allgather_async_in(name, in, count, row_elems, dtype, out, out_count, layout, handle, 0));
}

tnt_result_t tnt_barrier_async(const char *name, tnt_handle_t *handle) {
  WITH_CONTEXT(barrier_async_in(name, handle, 0));
}

int tnt_name_in_flight(const char *name) {
  if (name == NULL || enter() != TNT_SUCCESS) return 0;
  pthread_mutex_lock(&tnt_ctx.requests.mu);
  int in_flight = tnt_namemap_get(&tnt_ctx.requests.active, name) >= 0;
  pthread_mutex_unlock(&tnt_ctx.requests.mu);
  leave();
  return in_flight;
}

tnt_result_t tnt_test(tnt_handle_t handle) {
  WITH_CONTEXT(test_in(handle));
}

tnt_result_t tnt_result_count(tnt_handle_t handle, int64_t *count) {
  WITH_CONTEXT(result_count_in(handle, count));
}

tnt_result_t tnt_result_rank_counts(tnt_handle_t handle, int64_t *counts) {
  WITH_CONTEXT(result_rank_counts_in(handle, counts));
}

tnt_result_t tnt_result_copy(tnt_handle_t handle, void *dst) {
  WITH_CONTEXT(result_copy_in(handle, dst));
}

tnt_result_t tnt_release(tnt_handle_t handle) {
  if (!tnt_initialized()) return TNT_SUCCESS; /* finalize freed every slot already */
  WITH_CONTEXT(release_in(handle));
}

tnt_result_t tnt_get_stats(tnt_stats_t *stats) {
  if (!stats) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "stats pointer is NULL");
  TNT_CHECK(enter());
  memset(stats, 0, sizeof *stats);
  if (tnt_ctx.transport) tnt_engine_stats(&tnt_ctx.engine, stats);
  leave();
  return TNT_SUCCESS;
}
