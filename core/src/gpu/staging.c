/* gpu/staging.c - see staging.h. Calls of one process run at once, each in a lane of its own
 * (pinned buffers, two streams, events), made at the first call that needs it and kept: pinned
 * memory is slow to allocate. One set for the process made its calls take turns: two threads
 * that staged x then y on one rank and y then x on another each held the set on its rank while
 * waiting for the other rank's piece, which waited behind the set there, until TNT_TIMEOUT_S. */
#define _GNU_SOURCE
#include "staging.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "cuda_rt.h"
#include "dtype.h"

typedef struct {
  int ready;
  char failed[TNT_MAX_NAME]; /* the last call that failed here: its copies may still be queued (drain) */
  uint8_t *pinned[TNT_STAGING_BUFFERS];
  void *out, *back;                          /* the streams copying out to the host and back to the GPU */
  void *landed[TNT_STAGING_BUFFERS];         /* a piece is in its buffer */
  void *returned[TNT_STAGING_BUFFERS];       /* a buffer's piece is back on the GPU: the buffer is free */
  void *inputs_ready;                        /* the caller's stream has run what came before the call */
} lane_t;

static struct {
  pthread_mutex_t lock; /* guards `busy` only: a lane is its call's alone */
  int busy[TNT_STAGING_LANES];
  lane_t lanes[TNT_STAGING_LANES];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static tnt_result_t cuda_call(int rc, const char *what) {
  return rc == TNT_CUDA_SUCCESS ? TNT_SUCCESS
                                : tnt_fail(TNT_ERR_SYSTEM, "host staging: %s failed: %s (CUDA error %d)", what,
                                           tnt_cuda_error(rc), rc);
}

/* *slot made by `create` (cudaEventCreate, cudaStreamCreate) unless it is made already; set only
 * on success, whatever a failed call left in its argument. */
static tnt_result_t make(void **slot, int (*create)(void **), const char *what) {
  if (*slot) return TNT_SUCCESS;
  void *made = NULL;
  TNT_CHECK(cuda_call(create(&made), what));
  *slot = made;
  return TNT_SUCCESS;
}

/* Makes what is not made yet: a set-up that failed part-way (out of pinned memory) is taken up
 * where it stopped by the next call, which made everything again before and leaked the rest. */
static tnt_result_t set_up(const tnt_cuda_t *c, lane_t *st) {
  if (st->ready) return TNT_SUCCESS;
  for (int b = 0; b < TNT_STAGING_BUFFERS; b++) {
    void *pinned = NULL;
    if (!st->pinned[b]) {
      TNT_CHECK(cuda_call(c->malloc_host(&pinned, TNT_STAGING_PIECE_BYTES), "cudaMallocHost"));
      st->pinned[b] = pinned;
    }
    TNT_CHECK(make(&st->landed[b], c->event_create, "cudaEventCreate"));
    TNT_CHECK(make(&st->returned[b], c->event_create, "cudaEventCreate"));
  }
  TNT_CHECK(make(&st->inputs_ready, c->event_create, "cudaEventCreate"));
  TNT_CHECK(make(&st->out, c->stream_create, "cudaStreamCreate"));
  TNT_CHECK(make(&st->back, c->stream_create, "cudaStreamCreate"));
  st->ready = 1;
  return TNT_SUCCESS;
}

/* Wait until the streams out and back have run what they hold, until `deadline`. A call that fails
 * part-way (a piece's allreduce a mismatch, a lost peer) has copies still queued: the copies back of
 * the pieces summed and the copy out of the next. Returning at once, it let them land in the caller's
 * buffer after it had returned (where a retry's input or another tensor may be by then), while the
 * next call's copies out overwrote the pinned buffers they copied from. */
static tnt_result_t drain(const tnt_cuda_t *c, lane_t *st, double deadline) {
  void *streams[] = {st->out, st->back};
  for (int i = 0; i < 2; i++)
    for (tnt_gpu_poll_t poll = tnt_gpu_poll_start();; tnt_gpu_poll_pause(&poll)) {
      int q = c->stream_query(streams[i]);
      if (q == TNT_CUDA_SUCCESS) break;
      if (q != TNT_CUDA_NOT_READY) return cuda_call(q, "waiting for the copies of a failed call");
      if (tnt_now() >= deadline)
        return tnt_fail(TNT_ERR_TIMEOUT, "host staging: the copies of the failed call '%s' did not end (a GPU "
                        "that is stuck, or a stream it waited for?)", st->failed);
    }
  st->failed[0] = 0;
  return TNT_SUCCESS;
}

/* A failed call ends once its copies have: within its deadline, or DRAIN_S after the failure where
 * that came first (queued copies take milliseconds). Copies that do not end by then stay queued,
 * and the next call waits for them first (drain, with its own deadline). The call's own error is
 * kept, with what the wait found. */
#define DRAIN_S 1.0
static tnt_result_t settle_failure(const tnt_cuda_t *c, lane_t *st, tnt_result_t rc, const char *name,
                                   double deadline) {
  char why[1024];
  snprintf(why, sizeof why, "%s", tnt_last_error());
  snprintf(st->failed, sizeof st->failed, "%s", name);
  const double now = tnt_now();
  if (drain(c, st, deadline > now + DRAIN_S ? deadline : now + DRAIN_S) == TNT_SUCCESS)
    return tnt_fail(rc, "%s", why);
  char left[512];
  snprintf(left, sizeof left, "%s", tnt_last_error());
  return tnt_fail(rc, "%s; %s: the next call waits for them first", why, left);
}

#define PIECE_SUFFIX 42 /* "#k/n" of a piece's name: two numbers of up to 20 digits */

/* The bytes of piece k of `total` (it starts at k * TNT_STAGING_PIECE_BYTES). */
static size_t piece_bytes(size_t total, size_t k) {
  const size_t off = k * TNT_STAGING_PIECE_BYTES;
  return total - off < TNT_STAGING_PIECE_BYTES ? total - off : TNT_STAGING_PIECE_BYTES;
}

/* Piece k out to its buffer, on the stream out, once the buffer is free. */
static tnt_result_t copy_out(const tnt_cuda_t *c, lane_t *st, const uint8_t *dsend, size_t total, size_t k, double deadline) {
  const int b = (int)(k % TNT_STAGING_BUFFERS);
  const size_t off = k * TNT_STAGING_PIECE_BYTES, len = piece_bytes(total, k);
  if (k >= TNT_STAGING_BUFFERS)
    TNT_CHECK(tnt_cuda_wait_event(st->returned[b], deadline, "host staging: a piece's copy back to the GPU"));
  TNT_CHECK(cuda_call(c->memcpy_async(st->pinned[b], dsend + off, len, TNT_CUDA_DEVICE_TO_HOST, st->out),
                      "cudaMemcpyAsync to the host"));
  return cuda_call(c->event_record(st->landed[b], st->out), "cudaEventRecord");
}

static tnt_result_t staged(const tnt_cuda_t *c, lane_t *st, const char *name, const uint8_t *dsend, uint8_t *drecv, size_t count,
                           tnt_dtype_t dt, tnt_reduce_op_t op, void *stream, double deadline) {
  const size_t esize = tnt_dtype_size(dt), total = count * esize;
  /* pieces hold whole elements (TNT_STAGING_PIECE_BYTES is a multiple of every size) */
  const size_t pieces = (total + TNT_STAGING_PIECE_BYTES - 1) / TNT_STAGING_PIECE_BYTES;
  TNT_CHECK(set_up(c, st));
  if (st->failed[0]) TNT_CHECK(drain(c, st, deadline)); /* an earlier call failed with copies left queued */
  /* the inputs are ready once the caller's stream has run what it holds */
  TNT_CHECK(cuda_call(c->event_record(st->inputs_ready, stream), "cudaEventRecord"));
  TNT_CHECK(cuda_call(c->stream_wait_event(st->out, st->inputs_ready, 0), "cudaStreamWaitEvent"));
  if (pieces) TNT_CHECK(copy_out(c, st, dsend, total, 0, deadline));
  for (size_t k = 0; k < pieces; k++) {
    const int b = (int)(k % TNT_STAGING_BUFFERS);
    const size_t off = k * TNT_STAGING_PIECE_BYTES, len = piece_bytes(total, k);
    TNT_CHECK(tnt_cuda_wait_event(st->landed[b], deadline, "host staging: a piece's copy to the host"));
    if (k + 1 < pieces) TNT_CHECK(copy_out(c, st, dsend, total, k + 1, deadline)); /* out while this one is summed */
    /* named with the number of pieces too: ranks that stage different counts never meet (each fails
     * at TNT_TIMEOUT_S, naming the pieces). "#k" alone let a rank of one piece meet the others' first
     * piece of the same size and return a success while they waited for their second. */
    char piece[TNT_MAX_NAME];
    snprintf(piece, sizeof piece, "%s#%zu/%zu", name, k, pieces);
    /* the core bounds it by the job's TNT_TIMEOUT_S, as every collective */
    tnt_handle_t h;
    TNT_CHECK(tnt_allreduce(piece, st->pinned[b], st->pinned[b], (int64_t)(len / esize), dt, op, 1.0, 1e9, &h));
    TNT_CHECK(cuda_call(c->memcpy_async(drecv + off, st->pinned[b], len, TNT_CUDA_HOST_TO_DEVICE, st->back),
                        "cudaMemcpyAsync to the GPU"));
    TNT_CHECK(cuda_call(c->event_record(st->returned[b], st->back), "cudaEventRecord"));
  }
  for (size_t k = pieces > TNT_STAGING_BUFFERS ? pieces - TNT_STAGING_BUFFERS : 0; k < pieces; k++)
    TNT_CHECK(tnt_cuda_wait_event(st->returned[k % TNT_STAGING_BUFFERS], deadline,
                                  "host staging: a piece's copy back to the GPU"));
  return TNT_SUCCESS;
}

/* A lane for one call: a free one already made if there is one (no more pinned memory than the
 * calls at once need), else a free one; -1 if none came free by `deadline`. */
static int take_lane(double deadline) {
  for (;;) {
    int chosen = -1;
    pthread_mutex_lock(&pool.lock);
    for (int i = 0; i < TNT_STAGING_LANES; i++)
      if (!pool.busy[i] && (chosen < 0 || (pool.lanes[i].ready && !pool.lanes[chosen].ready))) chosen = i;
    if (chosen >= 0) pool.busy[chosen] = 1;
    pthread_mutex_unlock(&pool.lock);
    if (chosen >= 0) return chosen;
    if (tnt_now() >= deadline) return -1;
    struct timespec pause = {0, 200 * 1000}; /* rare: more calls at once than lanes */
    nanosleep(&pause, NULL);
  }
}

static void give_lane(int lane) {
  pthread_mutex_lock(&pool.lock);
  pool.busy[lane] = 0;
  pthread_mutex_unlock(&pool.lock);
}

tnt_result_t tnt_gpu_allreduce_staged(const char *name, const void *dsend, void *drecv, int64_t count,
                                      tnt_dtype_t dt, tnt_reduce_op_t op, void *stream, double timeout_s) {
  if (!name || strlen(name) > TNT_MAX_NAME - 1 - PIECE_SUFFIX || count < 0 || !tnt_dtype_valid(dt) ||
      (count > 0 && (!dsend || !drecv)))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "host staging of '%.40s': a name of at most %d bytes (its pieces "
                    "add '#k/n'), device buffers and a count >= 0 are needed (count %lld, dtype %d)",
                    name ? name : "(null)", TNT_MAX_NAME - 1 - PIECE_SUFFIX, (long long)count, dt);
  const tnt_cuda_t *c = tnt_cuda();
  if (!c) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tnt_last_error());
    return tnt_fail(TNT_ERR_INVALID_USAGE, "host staging of '%s': %s", name, why);
  }
  const double deadline = tnt_now() + timeout_s;
  const int lane = take_lane(deadline);
  if (lane < 0)
    return tnt_fail(TNT_ERR_TIMEOUT, "host staging of '%s': the process's %d lanes were all busy for %.0f s: more "
                    "than %d staged calls at once in one process", name, TNT_STAGING_LANES, timeout_s,
                    TNT_STAGING_LANES);
  lane_t *st = &pool.lanes[lane];
  tnt_result_t rc = staged(c, st, name, dsend, drecv, (size_t)count, dt, op, stream, deadline);
  if (rc != TNT_SUCCESS && st->ready && !st->failed[0]) rc = settle_failure(c, st, rc, name, deadline);
  give_lane(lane);
  return rc;
}
