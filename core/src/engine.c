/* engine.c - the background thread: take requests, negotiate, execute.
 *
 * Loop: take what the application queued; if this rank has news (new requests)
 * or another rank asked for a cycle, run one negotiation cycle and execute its
 * responses in order; otherwise sleep on the transport's doorbell. No cycle
 * runs unless some rank has news, so idle ranks and ranks waiting for a slow
 * peer sleep instead of spinning.
 *
 * Execution packs consecutive allreduces of one dtype into the fusion buffer
 * (up to TNT_FUSION_THRESHOLD_KB): each tensor is copied in with its rank's
 * prescale, the buffer is reduced once, and each tensor is copied out (divided
 * by N for "average"). A single allreduce runs straight from input to output;
 * a one-round response (negotiate.c) adds the payloads that came with the
 * negotiation and needs no data round.
 *
 * Errors: a mismatch fails one request on every rank. A transport error (peer
 * lost, timeout) is fatal: every pending and later request fails with it, and
 * a timeout marks this rank aborted so that its peers fail fast too. A request
 * pending longer than TNT_TIMEOUT_S (some rank never submitted it) is fatal as
 * well, with the missing ranks named. The thread never exits the process. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

#include "copy_unaliased.h"
#include "pause.h"
#include "dtype.h"
#include "settings_agree.h"
#include "transport/put_copy.h"

#define LIVENESS_S 0.2 /* how often a thread with pending requests checks its peers */

/* Complete and forget a request; the engine must not touch it afterwards. */
static void finish(tnt_engine_t *c, tnt_request_t *req, tnt_result_t res, const char *msg, int peer, void *buf,
                   int64_t count, const int64_t *rank_counts) {
  tnt_pending_remove(&c->pending, req);
  if (res == TNT_SUCCESS) {
    atomic_fetch_add(&c->executed, 1);
    if (req->meta.coll == COLL_ALLREDUCE)
      atomic_fetch_add(&c->bytes_reduced, req->meta.count * (int64_t)tnt_dtype_size((tnt_dtype_t)req->meta.dtype));
  }
  tnt_requests_complete(c->requests, req, res, msg, peer, buf, count, rank_counts);
}

static void fail_all_pending(tnt_engine_t *c, tnt_result_t res, const char *msg, int peer) {
  while (c->pending.n > 0) finish(c, c->pending.items[c->pending.n - 1], res, msg, peer, NULL, 0, NULL);
}

/* Move the queue into the pending table; 1 if the engine should stop. */
static int take_queue(tnt_engine_t *c) {
  pthread_mutex_lock(&c->queue_mu);
  tnt_request_t *req = c->queue_head;
  c->queue_head = c->queue_tail = NULL;
  int stop = c->stop;
  pthread_mutex_unlock(&c->queue_mu);
  while (req) {
    tnt_request_t *next = req->next;
    req->state = REQ_NEW;
    if (tnt_pending_add(&c->pending, req))
      tnt_requests_complete(c->requests, req, TNT_ERR_SYSTEM, "out of memory", -1, NULL, 0, NULL);
    req = next;
  }
  return stop;
}

/* Wherever the background thread sleeps: on the transport's doorbell, or on
 * `woken` while an application thread drives (engine_main). */
void tnt_engine_wake(tnt_engine_t *c) {
  c->transport->wake_local(c->ts);
  pthread_mutex_lock(&c->queue_mu);
  c->wakes++;
  pthread_cond_signal(&c->woken);
  pthread_mutex_unlock(&c->queue_mu);
}

static uint64_t wakes_now(tnt_engine_t *c) {
  pthread_mutex_lock(&c->queue_mu);
  uint64_t w = c->wakes;
  pthread_mutex_unlock(&c->queue_mu);
  return w;
}

/* The background thread's longest step in a cycle that waits for the peers (engine_main). */
#define STEP_BOUND_S 1.0

/* The background thread's longest sleep while an application thread drives. */
#define BUSY_SLEEP_S 1e-3

/* The background thread's sleep while an application thread drives: until a
 * wake-up after `seen`, or `until` (tnt_now's clock). Shutting down too: the
 * stop's own wake-up ends the sleep once, and the thread does not spin on the
 * lock while a driving thread finishes its step. */
static void sleep_until_woken(tnt_engine_t *c, uint64_t seen, double until) {
  const struct timespec ts = tnt_deadline_timespec(until); /* the condition's clock, CLOCK_MONOTONIC */
  pthread_mutex_lock(&c->queue_mu);
  while (c->wakes == seen && tnt_now() < until)
    if (pthread_cond_timedwait(&c->woken, &c->queue_mu, &ts) == ETIMEDOUT) break;
  pthread_mutex_unlock(&c->queue_mu);
}

static int is_float(tnt_dtype_t dt) { return dt != TNT_INT32 && dt != TNT_INT64; }

/* The factor on this rank's input: its prescale, and 1/N for a floating-point
 * average (scaled before the sum, as NCCL does: float16 averages of large
 * values would overflow if the sum came first). */
static double input_factor(const tnt_engine_t *c, const tnt_request_t *req) {
  double f = req->prescale;
  if (req->meta.op == TNT_AVERAGE && is_float((tnt_dtype_t)req->meta.dtype)) f /= c->pl->size;
  return f;
}

static double op_deadline(const tnt_engine_t *c) { return tnt_now() + c->params->timeout_s; }

/* Two ranks whose link crosses the network: reduce() swaps their whole buffers
 * up to TNT_PAIR_MAX_BYTES (allreduce_pair.c), and setup_hierarchy says so. */
static int pair_across_network(const tnt_engine_t *c) {
  return c->pl->size == 2 && tnt_transport_remote(c->transport, c->ts, c->ring.next);
}

/* Two ranks on one host over shared memory swap whole buffers in a window of
 * sizes (ring.h, TNT_SHM_PAIR_MIN_BYTES): measured there, on shm only. */
static int pair_on_host(const tnt_engine_t *c, size_t bytes) {
  return c->pl->size == 2 && c->transport == &tnt_transport_shm && bytes > TNT_SHM_PAIR_MIN_BYTES &&
         bytes <= TNT_SHM_PAIR_MAX_BYTES;
}

/* A pair of ranks across the network sums in the network transport's direct
 * messages (allreduce_pair_direct.c): two ranks on two hosts, and the link of
 * the hierarchical allreduce between 2 hosts. On the test bed 1.65-2.46x the
 * speed of the ring and the whole-buffer swap from 128 KB to 16 MB on 2 x 1,
 * 1.18-1.74x on 2 x 2 (docs/benchmarks.md). Not past INT_MAX bytes (MPI's
 * count); TNT_MPI_PAIR_SUM=0 keeps the ring. */
static int pair_direct_fits(const tnt_engine_t *c, tnt_dtype_t dt, int64_t count) {
  return c->params->mpi_pair_sum && c->transport->sendrecv && (size_t)count * tnt_dtype_size(dt) <= INT_MAX;
}

/* How a pair across the network sums in MPI's direct messages, for the INFO
 * line of the allreduce's scheme (setup_hierarchy): where TNT_MPI_PAIR_SUM and
 * TNT_MPI_PAIR_PIECE_KB say so, and the transport has them. */
static void describe_pair_sum(const tnt_engine_t *c, char *buf, size_t n) {
  snprintf(buf, n, "in MPI's direct messages (TNT_MPI_PAIR_SUM=1) of at most %lld KiB (TNT_MPI_PAIR_PIECE_KB)",
           (long long)(c->params->mpi_pair_piece_bytes / 1024));
}

/* The allreduce algorithm for a buffer: one exchange for a few kilobytes (one
 * wake-up instead of 2(N-1)); beyond, two ranks on two hosts sum in the
 * network transport's direct messages where it can (pair_direct_fits), else two
 * ranks across the network swap whole buffers up to TNT_PAIR_MAX_BYTES
 * (allreduce_pair.c: one phase of network latency instead of the ring's
 * two); with more than 2 ranks over shared
 * memory, two exchange rounds per chunk read in place (allreduce_direct.c:
 * 1.1-2.5x the ring's speed at 256 KB - 64 MB on 3, 4 and 8 ranks; with 2
 * ranks the ring moves fewer bytes), else the pipelined ring. Each applies
 * the factor inside its own passes, and all add in the order of ring.h's
 * segments. */
static tnt_result_t reduce(tnt_engine_t *c, const void *in, void *out, int64_t count, tnt_dtype_t dt, double factor,
                           const int64_t *bounds) {
  /* nothing to add (every rank agreed on the count): empty tensors may come with NULL
   * buffers, which the exchanges' memcpy must not be given even for 0 bytes */
  if (!count) return TNT_SUCCESS;
  size_t bytes = (size_t)count * tnt_dtype_size(dt);
  if (bytes > TNT_SMALL_ALLREDUCE_BYTES) {
    if (c->hier) {
      const int pair = c->net_ring.size == 2 && pair_direct_fits(c, dt, count);
      if (!pair)
        return tnt_allreduce_hier(&c->host_ring, &c->net_ring, in, out, count, dt, factor, bounds, 0,
                                  op_deadline(c));
      /* the pair's messages are over when its call returns: the phases inside the
       * host wait for nothing across */
      atomic_fetch_add(&c->pair_sums, 1);
      tnt_transport_quiet(c->transport, c->ts, 1);
      tnt_result_t res = tnt_allreduce_hier(&c->host_ring, &c->net_ring, in, out, count, dt, factor, bounds,
                                            (size_t)c->params->mpi_pair_piece_bytes,
                                            op_deadline(c));
      tnt_transport_quiet(c->transport, c->ts, 0);
      return res;
    }
    const int pair = pair_across_network(c);
    if (pair && pair_direct_fits(c, dt, count)) {
      atomic_fetch_add(&c->pair_sums, 1);
      return tnt_allreduce_pair_direct(&c->ring, in, out, count, dt, factor, (size_t)c->params->mpi_pair_piece_bytes,
                                       op_deadline(c));
    }
    if ((pair && bytes <= TNT_PAIR_MAX_BYTES) || pair_on_host(c, bytes)) {
      atomic_fetch_add(&c->pair_swaps, 1);
      return tnt_allreduce_pair(&c->ring, in, out, count, dt, factor, bounds, op_deadline(c));
    }
    if (c->params->shm_direct && c->pl->size > 2 && tnt_allreduce_direct_possible(c->transport))
      return tnt_allreduce_direct(c->transport, c->ts, c->pl->rank, c->pl->size, in, out, count, dt, factor, bounds,
                                  op_deadline(c));
    return tnt_allreduce_ring(&c->ring, in, out, count, dt, factor, 1, bounds, op_deadline(c));
  }
  const void *src = in;
  if (factor != 1.0) { /* small: scale into the output, then reduce in place */
    tnt_scale(dt, out, in, factor, (size_t)count);
    src = out;
  }
  if (c->hier)
    return tnt_allreduce_hier_small(&c->ring, c->topo.members, c->topo.hosts, c->host_ring.size, src, out, count, dt,
                                    bounds, c->small_scratch, op_deadline(c));
  return tnt_allreduce_small(&c->ring, src, out, count, dt, bounds, c->small_scratch, op_deadline(c));
}

/* Integer average: the exact floor of the mean, which never wraps. Each rank
 * splits its (whole-prescaled, wrapping) x = N*q + r (0 <= r < N); one sum of
 * [q | r] gives Q and R, and floor(mean) = Q + floor(R / N). Wrapping sums
 * (unsigned) cancel out. */
#define INT_AVERAGE(T, UT)                                                                          \
  do {                                                                                              \
    const T *x_ = req->in;                                                                          \
    const UT k_ = (UT)(int64_t)req->prescale;                                                       \
    T *q_ = buf, *r_ = q_ + n, *o_ = req->out;                                                       \
    for (int64_t i = 0; i < n; i++) {                                                               \
      const T x = (T)((UT)x_[i] * k_);                                                              \
      T q = (T)(x / N), r = (T)(x % N);                                                             \
      if (r < 0) { q--; r = (T)(r + N); }                                                           \
      q_[i] = q;                                                                                    \
      r_[i] = r;                                                                                    \
    }                                                                                               \
    res = reduce(c, buf, buf, 2 * n, dt, 1.0, NULL);                                                \
    for (int64_t i = 0; res == TNT_SUCCESS && i < n; i++) o_[i] = (T)((UT)q_[i] + (UT)(r_[i] / N)); \
  } while (0)

static tnt_result_t run_int_average(tnt_engine_t *c, tnt_request_t *req) {
  const tnt_dtype_t dt = (tnt_dtype_t)req->meta.dtype;
  const int64_t n = req->meta.count, N = c->pl->size;
  void *buf = malloc((size_t)(2 * n + 1) * tnt_dtype_size(dt));
  if (!buf) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate %lld elements for the integer average '%s'", (long long)(2 * n), req->name);
  tnt_result_t res = TNT_SUCCESS;
  if (dt == TNT_INT32) INT_AVERAGE(int32_t, uint32_t);
  else INT_AVERAGE(int64_t, uint64_t);
  free(buf);
  return res;
}

/* Allreduce of reqs[0..n) (n > 1: through the fusion buffer). */
static tnt_result_t run_allreduce(tnt_engine_t *c, tnt_request_t **reqs, int n) {
  tnt_dtype_t dt = (tnt_dtype_t)reqs[0]->meta.dtype;
  size_t esz = tnt_dtype_size(dt);
  int64_t t0 = tnt_now_us();
  if (n == 1) {
    tnt_request_t *req = reqs[0];
    if (req->meta.op == TNT_AVERAGE && !is_float(dt)) TNT_CHECK(run_int_average(c, req));
    else TNT_CHECK(reduce(c, req->in, req->out, req->meta.count, dt, input_factor(c, req), NULL));
    tnt_timeline_event(c->timeline, req->name, "ALLREDUCE", t0, tnt_now_us(), NULL);
    return TNT_SUCCESS;
  }
  double factors[n];
  for (int i = 0; i < n; i++) factors[i] = input_factor(c, reqs[i]);
  tnt_fused_t fused;
  TNT_CHECK(tnt_fusion_pack(&c->fusion, reqs, n, factors, &fused));
  const int64_t total = fused.count;
  int64_t t1 = tnt_now_us();
  TNT_CHECK(reduce(c, fused.buf, fused.buf, total, dt, 1.0, fused.bounds)); /* scaled on the way in */
  int64_t t2 = tnt_now_us();
  tnt_fusion_unpack(&c->fusion, reqs, n);
  int64_t t3 = tnt_now_us();
  if (c->timeline) {
    char detail[64];
    snprintf(detail, sizeof detail, "%d tensors, %lld bytes fused", n, (long long)(total * (int64_t)esz));
    for (int i = 0; i < n; i++) {
      tnt_timeline_event(c->timeline, reqs[i]->name, "MEMCPY_IN_FUSION_BUFFER", t0, t1, NULL);
      tnt_timeline_event(c->timeline, reqs[i]->name, "ALLREDUCE", t1, t2, detail);
      tnt_timeline_event(c->timeline, reqs[i]->name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3, NULL);
    }
  }
  return TNT_SUCCESS;
}

/* Where an allgather of `total` elements writes its result: the caller's
 * array when it guessed the size right (no copy out afterwards), else a
 * buffer the handle will own (*owned = 1). NULL: out of memory. */
static void *gather_target(const tnt_request_t *req, int64_t total, size_t esz, int *owned) {
  *owned = !(req->out && req->out_count == total);
  return *owned ? malloc(total ? (size_t)total * esz : 1) : req->out;
}

static tnt_result_t run_one(tnt_engine_t *c, tnt_request_t *req, const tnt_response_t *resp, void **result_buf,
                            int64_t *result_count) {
  int64_t t0 = tnt_now_us();
  size_t esz = tnt_dtype_size((tnt_dtype_t)req->meta.dtype);
  switch (req->meta.coll) {
    case COLL_BROADCAST: /* nothing to send when empty (every rank agreed on the count) */
      if (req->meta.count)
        TNT_CHECK(tnt_broadcast_ring(&c->ring, req->in, req->out, (size_t)req->meta.count * esz, req->meta.root, op_deadline(c)));
      tnt_timeline_event(c->timeline, req->name, "BROADCAST", t0, tnt_now_us(), NULL);
      break;
    case COLL_ALLGATHER: {
      int N = c->pl->size;
      int64_t bytes[N], total = 0;
      for (int q = 0; q < N; q++) {
        bytes[q] = resp->rank_counts[q] * (int64_t)esz;
        total += resp->rank_counts[q];
      }
      int owned;
      void *out = gather_target(req, total, esz, &owned);
      if (!out) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate %lld bytes for allgather '%s'", (long long)(total * (int64_t)esz), req->name);
      tnt_result_t r = tnt_allgather_ring(&c->ring, req->in, out, bytes, op_deadline(c));
      if (r != TNT_SUCCESS) {
        if (owned) free(out);
        return r;
      }
      *result_buf = owned ? out : NULL;
      *result_count = total;
      tnt_timeline_event(c->timeline, req->name, "ALLGATHER", t0, tnt_now_us(), NULL);
      break;
    }
    case COLL_BARRIER: break; /* the negotiation itself synchronized every rank */
    default: return tnt_fail(TNT_ERR_INTERNAL, "unknown collective %d", req->meta.coll);
  }
  return TNT_SUCCESS;
}

/* A one-round allreduce: every rank's scaled payload is in the negotiation's
 * messages; add them as the small path would (the same bits). A one-round
 * broadcast: copy the root's. A one-round allgather: every rank's, one after
 * another, into its result (*result_buf when the handle owns it). */
static tnt_result_t run_one_round(tnt_engine_t *c, tnt_request_t *req, const tnt_response_t *resp, void **result_buf,
                                  int64_t *result_count) {
  const int N = c->pl->size;
  const void *contrib[N];
  int64_t t0 = tnt_now_us();
  if (req->meta.coll == COLL_ALLGATHER) {
    const size_t esz = tnt_dtype_size((tnt_dtype_t)req->meta.dtype);
    int64_t total = 0;
    for (int q = 0; q < N; q++) total += resp->rank_counts[q];
    int owned;
    uint8_t *dst = gather_target(req, total, esz, &owned);
    if (!dst) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate %lld bytes for allgather '%s'", (long long)(total * (int64_t)esz), req->name);
    size_t at = 0; /* bytes of the result written */
    for (int q = 0; q < N; q++) {
      const size_t bytes = (size_t)resp->rank_counts[q] * esz;
      if (bytes) tnt_copy_unaliased(dst + at, tnt_negotiate_payload(&c->neg, resp->cache_slot, q), bytes);
      at += bytes;
    }
    *result_buf = owned ? dst : NULL;
    *result_count = total;
    tnt_timeline_event(c->timeline, req->name, "ALLGATHER", t0, tnt_now_us(), "one round");
    return TNT_SUCCESS;
  }
  if (req->meta.coll == COLL_BROADCAST) {
    const void *root_in = tnt_negotiate_payload(&c->neg, resp->cache_slot, req->meta.root);
    if (!(req->meta.root == c->pl->rank && req->out == req->in))
      tnt_copy_unaliased(req->out, root_in, (size_t)req->meta.count * tnt_dtype_size((tnt_dtype_t)req->meta.dtype));
    tnt_timeline_event(c->timeline, req->name, "BROADCAST", t0, tnt_now_us(), "one round");
    return TNT_SUCCESS;
  }
  if (resp->one_round == 2) { /* summed along the bit round's steps (ride.h) */
    tnt_copy_unaliased(req->out, tnt_negotiate_ride_sum(&c->neg),
                       (size_t)req->meta.count * tnt_dtype_size((tnt_dtype_t)req->meta.dtype));
    tnt_timeline_event(c->timeline, req->name, "ALLREDUCE", t0, tnt_now_us(), "ride");
    return TNT_SUCCESS;
  }
  for (int q = 0; q < N; q++) contrib[q] = tnt_negotiate_payload(&c->neg, resp->cache_slot, q);
  /* the order of the data path this tensor would otherwise take: the same bits either way */
  if (c->hier)
    TNT_CHECK(tnt_reduce_in_hier_order((tnt_dtype_t)req->meta.dtype, req->out, contrib, req->meta.count,
                                       c->topo.members, c->topo.hosts, c->host_ring.size, NULL));
  else
    tnt_reduce_in_ring_order((tnt_dtype_t)req->meta.dtype, req->out, contrib, req->meta.count, N, NULL);
  tnt_timeline_event(c->timeline, req->name, "ALLREDUCE", t0, tnt_now_us(), "one round");
  return TNT_SUCCESS;
}

/* The one-round allreduces of a cycle, first: their payloads may lie in the
 * transport's exchange buffers (exchange_view), which the next exchange of
 * this rank (a small allreduce's) lets the peers overwrite. */
static tnt_result_t execute_one_rounds(tnt_engine_t *c, tnt_response_t *resp, int n, int64_t now) {
  for (int i = 0; i < n; i++) {
    if (resp[i].error != TNT_SUCCESS || !resp[i].one_round) continue;
    tnt_request_t *req = tnt_pending_find(&c->pending, resp[i].name);
    if (!req) return tnt_fail(TNT_ERR_INTERNAL, "response for '%s' has no request on rank %d", resp[i].name, c->pl->rank);
    tnt_timeline_event(c->timeline, req->name, "NEGOTIATE", req->submit_us, now, tnt_coll_name(req->meta.coll));
    void *buf = NULL;
    int64_t count = 0;
    TNT_CHECK(run_one_round(c, req, &resp[i], &buf, &count));
    finish(c, req, TNT_SUCCESS, NULL, -1, buf, count, resp[i].rank_counts);
  }
  return TNT_SUCCESS;
}

static tnt_result_t execute(tnt_engine_t *c, tnt_response_t *resp, int n) {
  int64_t now = tnt_now_us();
  tnt_request_t *group[256];
  TNT_CHECK(execute_one_rounds(c, resp, n, now));
  for (int i = 0; i < n;) {
    if (resp[i].error == TNT_SUCCESS && resp[i].one_round) { /* done above */
      i++;
      continue;
    }
    tnt_request_t *req = tnt_pending_find(&c->pending, resp[i].name);
    if (!req) return tnt_fail(TNT_ERR_INTERNAL, "response for '%s' has no request on rank %d", resp[i].name, c->pl->rank);
    tnt_timeline_event(c->timeline, req->name, "NEGOTIATE", req->submit_us, now, tnt_coll_name(req->meta.coll));
    if (resp[i].error != TNT_SUCCESS) {
      finish(c, req, resp[i].error, resp[i].error_msg ? resp[i].error_msg : "mismatch", -1, NULL, 0, NULL);
      i++;
      continue;
    }
    if (req->meta.coll != COLL_ALLREDUCE) {
      void *buf = NULL;
      int64_t count = 0;
      TNT_CHECK(run_one(c, req, &resp[i], &buf, &count));
      finish(c, req, TNT_SUCCESS, NULL, -1, buf, count, resp[i].rank_counts);
      i++;
      continue;
    }
    /* fuse the run of allreduces of the same dtype that fits the threshold */
    size_t esz = tnt_dtype_size((tnt_dtype_t)req->meta.dtype);
    int64_t bytes = req->meta.count * (int64_t)esz;
    int ng = 1, j = i + 1;
    group[0] = req;
    const int alone = req->meta.op == TNT_AVERAGE && !is_float((tnt_dtype_t)req->meta.dtype);
    while (!alone && j < n && ng < 256 && resp[j].error == TNT_SUCCESS && !resp[j].one_round &&
           resp[j].meta.coll == COLL_ALLREDUCE &&
           resp[j].meta.dtype == req->meta.dtype &&
           !(resp[j].meta.op == TNT_AVERAGE && !is_float((tnt_dtype_t)resp[j].meta.dtype)) &&
           bytes + resp[j].meta.count * (int64_t)esz <= c->params->fusion_threshold_bytes) {
      tnt_request_t *next = tnt_pending_find(&c->pending, resp[j].name);
      if (!next) return tnt_fail(TNT_ERR_INTERNAL, "response for '%s' has no request", resp[j].name);
      tnt_timeline_event(c->timeline, resp[j].name, "NEGOTIATE", next->submit_us, now, "allreduce");
      group[ng++] = next;
      bytes += resp[j].meta.count * (int64_t)esz;
      j++;
    }
    TNT_CHECK(run_allreduce(c, group, ng));
    for (int k = 0; k < ng; k++) finish(c, group[k], TNT_SUCCESS, NULL, -1, NULL, 0, NULL);
    i = j;
  }
  return TNT_SUCCESS;
}

/* Fatal if a request waited longer than TNT_TIMEOUT_S; warn once at half of it,
 * or after STALL_WARN_S where that comes first (Horovod's stall check warns
 * after 60 s: with the default 300 s timeout a user saw nothing for 150 s).
 * The error names the first missing rank and what its process is doing.
 * Ranks that are missing because they are busy in a section of their own
 * (tnt_set_busy: the master writing a save) are alive and will come: while
 * the full rounds, asked for again every half warning period, say so,
 * TNT_TIMEOUT_S counts from the last one that did, and TNT_BUSY_TIMEOUT_S
 * bounds the whole wait. A busy rank that died or stopped stops answering
 * the full rounds, which then fail it as before. */
#define STALL_WARN_S 60.0

/* What keeps a rank busy on its own, as every message about one words it (tnt_set_busy's callers). */
#define BUSY_WORK \
  "a save, a callback that runs on the master only, tnt.rank_only(), or Keras replacing a tf.data iterator"

static double stall_warn_at(const tnt_engine_t *c) {
  return c->params->timeout_s / 2 < STALL_WARN_S ? c->params->timeout_s / 2 : STALL_WARN_S;
}

static tnt_result_t check_stalls(tnt_engine_t *c) {
  const double now = tnt_now();
  const double timeout = c->params->timeout_s;
  const double warn_at = stall_warn_at(c);
  for (int i = 0; i < c->pending.n; i++) {
    tnt_request_t *req = c->pending.items[i];
    const double age = now - req->submit_time;
    if (age < warn_at) continue;
    const tnt_negotiator_t *neg = &c->neg;
    const double round_at = tnt_negotiate_full_round_at(neg);
    if (req->stall_warned && !tnt_negotiate_refreshing(neg) && round_at > req->busy_checked) {
      req->busy_checked = round_at;
      if (tnt_negotiate_missing_busy(neg, req)) req->busy_seen = round_at;
    }
    const int busy = req->busy_seen > 0;
    const double since = busy && req->busy_seen > req->submit_time ? req->busy_seen : req->submit_time;
    const double bound = busy && c->params->busy_timeout_s > timeout ? c->params->busy_timeout_s : timeout;
    char missing[512];
    tnt_negotiate_missing(&c->neg, req, missing, sizeof missing);
    int first = -1;
    if (sscanf(missing, "%d", &first) != 1 || first < 0 || first >= c->pl->size) first = -1;
    if (busy && age >= bound)
      return tnt_fail_about(TNT_ERR_TIMEOUT, first,
                            "%s '%s' was submitted on rank %d %.0f s ago and waits for ranks [%s], busy on their own "
                            "(" BUSY_WORK ") for longer than TNT_BUSY_TIMEOUT_S=%g s: raise it if their work "
                            "takes that long, else see what they do",
                            tnt_coll_name(req->meta.coll), req->name, c->pl->rank, age, missing, bound);
    if (now - since >= timeout) {
      char doing[384] = "", was_busy[96] = "";
      tnt_coll_t theirs_coll;
      const char *theirs = first >= 0 ? tnt_negotiate_peer_waits_for(neg, first, &theirs_coll) : NULL;
      if (theirs) /* crossed calls (rank 0 in evaluate, rank 1 in a barrier): say what it waits in */
        snprintf(doing, sizeof doing, "rank %d waits instead in %s '%.120s', which this rank never submitted",
                 first, tnt_coll_name(theirs_coll), theirs);
      else if (first >= 0 && c->transport->describe_peer)
        c->transport->describe_peer(c->ts, first, doing, sizeof doing);
      if (busy) snprintf(was_busy, sizeof was_busy, " (busy on their own until %.0f s ago)", now - req->busy_seen);
      return tnt_fail_about(TNT_ERR_TIMEOUT, first,
                            "%s '%s' was submitted on rank %d %.0f s ago but ranks [%s] never submitted it%s "
                            "(TNT_TIMEOUT_S=%g)%s%s: every rank must make the same collective calls",
                            tnt_coll_name(req->meta.coll), req->name, c->pl->rank, age, missing, was_busy, timeout,
                            doing[0] ? "; " : "", doing);
    }
    if (!req->stall_warned) { /* first a full round, so that the warning knows who is missing */
      req->stall_warned = 1;
      tnt_negotiate_refresh(&c->neg);
    } else if (req->stall_warned == 1 && !tnt_negotiate_refreshing(&c->neg)) {
      req->stall_warned = 2;
      /* the full round told every rank who waits for what: threads named otherwise on another rank will
       * never meet, so fail now, on every rank alike, rather than at TNT_TIMEOUT_S */
      const char *theirs = first >= 0 ? tnt_negotiate_thread_twin(&c->neg, req->name, first) : NULL;
      if (theirs)
        return tnt_fail(TNT_ERR_MISMATCH,
                        "%s '%.120s' has waited %.0f s on rank %d for rank %d, which waits instead for '%.120s': one "
                        "call made in threads of other names. A call without name= in a thread pairs with the thread "
                        "of the same name on every rank, and Python numbers unnamed threads (Thread-N) in the order a "
                        "process starts threads. Name the thread alike on every rank (threading.Thread(target=..., "
                        "name=\"train\")) or pass name= to the call",
                        tnt_coll_name(req->meta.coll), req->name, age, c->pl->rank, first, theirs);
      if (busy)
        TNT_WARN("%s '%s' has waited %.0f s for ranks [%s], busy on their own (" BUSY_WORK "); it waits while "
                 "they are, up to TNT_BUSY_TIMEOUT_S=%g s",
                 tnt_coll_name(req->meta.coll), req->name, age, missing, bound);
      else {
        tnt_coll_t instead_coll;
        const char *waits = first >= 0 ? tnt_negotiate_peer_waits_for(neg, first, &instead_coll) : NULL;
        char instead[256] = "";
        if (waits)
          snprintf(instead, sizeof instead, " (rank %d waits instead in %s '%.120s')", first,
                   tnt_coll_name(instead_coll), waits);
        TNT_WARN("%s '%s' has waited %.0f s for ranks [%s]%s; it fails at TNT_TIMEOUT_S=%g s",
                 tnt_coll_name(req->meta.coll), req->name, age, missing, instead, timeout);
      }
    } else if (!tnt_negotiate_refreshing(&c->neg) && now - tnt_negotiate_full_round_at(neg) >= warn_at / 2) {
      tnt_negotiate_refresh(&c->neg); /* busy (still, or since)? the next full round says */
    }
  }
  return TNT_SUCCESS;
}

/* The ranks that wait warn (check_stalls), but only the master's warnings are shown (tntrun shows the
 * master's output, and logs are the master's unless TNT_LOG_ON_ALL_DEVICES): with the master busy on its
 * own (a save, a callback that runs on the master only, tnt.rank_only()), the ranks waiting for it warned
 * where nobody saw it, and the job stood still without a word for up to TNT_BUSY_TIMEOUT_S. So a rank
 * busy for the stall warning's time, that a full round since its section began shows waited for, says
 * so itself, once a section. After a cycle, by the thread that ran it. */
static void warn_if_waited_for_while_busy(tnt_engine_t *c) {
  tnt_negotiator_t *neg = &c->neg;
  if (!atomic_load(&neg->busy)) return;
  const double since = atomic_load(&neg->busy_since), now = tnt_now();
  if (neg->busy_warned == since || now - since < stall_warn_at(c) || tnt_negotiate_full_round_at(neg) <= since)
    return;
  char waiting[512] = "";
  const char *name = NULL;
  tnt_coll_t coll = COLL_ALLREDUCE;
  size_t used = 0;
  for (int q = 0; q < c->pl->size && used < sizeof waiting - 16; q++) {
    tnt_coll_t theirs;
    const char *waits = q == c->pl->rank ? NULL : tnt_negotiate_peer_waits_for(neg, q, &theirs);
    if (!waits) continue;
    if (!name) name = waits, coll = theirs;
    used += (size_t)snprintf(waiting + used, sizeof waiting - used, "%s%d", used ? ", " : "", q);
  }
  if (!name) return;
  neg->busy_warned = since;
  TNT_WARN("this rank has been busy on its own for %.0f s (" BUSY_WORK ") while ranks [%s] wait for it in "
           "%s '%.120s'; they wait while it is, up to TNT_BUSY_TIMEOUT_S=%g s, and fail at TNT_TIMEOUT_S=%g s "
           "after it if it never makes that call",
           now - since, waiting, tnt_coll_name(coll), name,
           c->params->busy_timeout_s > c->params->timeout_s ? c->params->busy_timeout_s : c->params->timeout_s,
           c->params->timeout_s);
}

void tnt_engine_abort(tnt_engine_t *c, const char *reason, int root_peer, int log) {
  /* publish it first: peers waiting on this rank fail at once, naming the root
   * cause (the lost or stuck rank when there is one, else this rank) */
  c->transport->abort(c->ts, reason, root_peer);
  if (tnt_requests_set_fatal(c->requests, TNT_ERR_PEER_LOST, reason, root_peer) && log) TNT_ERROR("%s", reason);
  tnt_engine_wake(c);
}

static void go_fatal(tnt_engine_t *c, tnt_result_t res) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", tnt_last_error());
  int peer = tnt_last_error_rank();
  c->transport->abort(c->ts, msg, peer);
  if (tnt_requests_set_fatal(c->requests, res, msg, peer)) TNT_ERROR("%s", msg);
  fail_all_pending(c, res, msg, peer);
}

/* One step of the engine, by whichever thread holds c->progress: the
 * background thread, or an application thread waiting for its own request
 * (which saves the two thread hand-offs of a blocking collective). */
static int engine_step(tnt_engine_t *c, double until) {
  int stop = take_queue(c);
  char msg[1024];
  int peer = -1;
  tnt_result_t fatal = tnt_requests_fatal(c->requests, msg, sizeof msg, &peer);
  if (fatal != TNT_SUCCESS) {
    fail_all_pending(c, fatal, msg, peer);
    return stop ? TNT_STEP_STOP : TNT_STEP_IDLE;
  }
  if (stop) {
    char why[160];
    snprintf(why, sizeof why, "Tarantella was shut down on rank %d before this request completed", c->pl->rank);
    fail_all_pending(c, TNT_ERR_INVALID_USAGE, why, -1);
    return TNT_STEP_STOP;
  }
  tnt_result_t res = check_stalls(c);
  if (!tnt_negotiate_in_cycle(&c->neg)) {
    if (res == TNT_SUCCESS && c->pending.n && tnt_now() >= c->next_liveness) {
      /* a sleeping peer costs nothing; a dead one must not leave us waiting for
       * TNT_TIMEOUT_S; a peer that shut down matters only if we still wait for it */
      uint8_t awaited[c->pl->size];
      tnt_negotiate_awaited(&c->neg, awaited);
      c->next_liveness = tnt_now() + LIVENESS_S;
      res = c->transport->check_peers(c->ts, awaited);
    }
    if (res != TNT_SUCCESS) {
      go_fatal(c, res);
      return TNT_STEP_WORKED;
    }
    if (tnt_negotiate_has_news(&c->neg)) c->transport->ring_doorbell(c->ts, tnt_negotiate_cycles(&c->neg) + 1);
    else if (!c->transport->cycle_wanted(c->ts, tnt_negotiate_cycles(&c->neg))) return TNT_STEP_IDLE;
  } else if (res != TNT_SUCCESS) {
    go_fatal(c, res);
    return TNT_STEP_WORKED;
  }
  tnt_response_t *resp = NULL;
  int nresp = 0;
  res = tnt_negotiate_cycle(&c->neg, &resp, &nresp, until);
  if (res == TNT_IN_PROGRESS) return TNT_STEP_BLOCKED;
  if (res == TNT_SUCCESS) res = execute(c, resp, nresp);
  tnt_responses_free(resp, nresp);
  if (res != TNT_SUCCESS) go_fatal(c, res);
  else warn_if_waited_for_while_busy(c);
  return TNT_STEP_WORKED;
}

int tnt_engine_drive(tnt_engine_t *c, double until) {
  if (pthread_mutex_trylock(&c->progress) != 0) return TNT_STEP_BUSY;
  int step = engine_step(c, until);
  const int pending = c->pending.n;
  pthread_mutex_unlock(&c->progress);
  pthread_mutex_lock(&c->queue_mu);
  c->left_behind = pending || c->queue_head; /* other threads' requests (tnt_engine_leave) */
  pthread_mutex_unlock(&c->queue_mu);
  if (step == TNT_STEP_BLOCKED) tnt_engine_wake(c); /* hand the cycle over */
  return step;
}

void tnt_engine_leave(tnt_engine_t *c, int own_done) {
  pthread_mutex_lock(&c->queue_mu);
  const int left = c->left_behind;
  pthread_mutex_unlock(&c->queue_mu);
  if (!own_done || left) tnt_engine_wake(c);
}

static void *engine_main(void *arg) {
  tnt_engine_t *c = arg;
  for (;;) {
    const uint64_t wakes = wakes_now(c);
    if (pthread_mutex_trylock(&c->progress) != 0) {
      /* an application thread drives the engine for its own request: it wakes
       * this thread if it stops before the request is done. Queueing on the
       * lock instead would cost that thread a futex wake-up per step, and this
       * one a wake-up for nothing. */
      sleep_until_woken(c, wakes, tnt_now() + BUSY_SLEEP_S);
      continue;
    }
    /* a bounded step: a negotiation waiting for a peer that does not answer (stopped, a
     * debugger) resumes at the next step, which sees a stop (tnt.shutdown(), the exit handler's)
     * first. Waited out with INFINITY, the stop came only at TNT_TIMEOUT_S (300 s by default),
     * and shutdown waited for the peer, which it must not; a peer that answers completes a cycle
     * far sooner than STEP_BOUND_S, so a stop never cuts off a cycle it would have finished */
    int step = engine_step(c, tnt_now() + STEP_BOUND_S);
    uint64_t done = tnt_negotiate_cycles(&c->neg);
    int pending = c->pending.n;
    pthread_mutex_unlock(&c->progress);
    if (step == TNT_STEP_STOP) break;
    /* nobody has news: sleep until a local request or a peer's cycle; with
     * requests pending, wake every LIVENESS_S to check the peers */
    if (step == TNT_STEP_IDLE) c->transport->wait_doorbell(c->ts, done, tnt_now() + (pending ? LIVENESS_S : 5.0));
  }
  return NULL;
}

void tnt_engine_free(tnt_engine_t *c) {
  tnt_negotiate_teardown(&c->neg);
  tnt_pending_free(&c->pending);
  tnt_fusion_free(&c->fusion);
  tnt_ring_teardown(&c->ring);
  tnt_ring_teardown(&c->host_ring);
  tnt_ring_teardown(&c->net_ring);
  tnt_topology_free(&c->topo);
  free(c->small_scratch);
  pthread_mutex_destroy(&c->queue_mu);
  pthread_cond_destroy(&c->woken);
  pthread_mutex_destroy(&c->progress);
  memset(c, 0, sizeof *c);
}

/* The host map, and the two rings of the hierarchical allreduce when every
 * host holds the same number L > 1 of ranks on more than one host and the
 * transport has a window region for them. Otherwise (one rank per host, or
 * uneven hosts such as 3 + 1) every allreduce takes the flat ring, whose links
 * are shm or network hop by hop: correct, in the flat ring's order. */
static tnt_result_t setup_hierarchy(tnt_engine_t *c) {
  const tnt_placement_t *pl = c->pl;
  if (tnt_transport_regions(c->transport) < TNT_CHANNELS) return tnt_topology_single(pl, &c->topo);
  TNT_CHECK(tnt_topology_discover(c->transport, c->ts, pl, c->params->timeout_s, &c->topo));
  const tnt_topology_t *t = &c->topo;
  const int H = t->hosts, L = tnt_topology_host_size(t, t->host), h = t->host, i = t->index_of[pl->rank];
  if (H == 1 || L == 1 || !t->uniform || !c->params->hierarchical) {
    char pair[160] = "", how[112];
    if (pair_across_network(c) && pair_direct_fits(c, TNT_FLOAT32, 0)) {
      describe_pair_sum(c, how, sizeof how);
      snprintf(pair, sizeof pair, "; above %d KiB the two sum %s", TNT_SMALL_ALLREDUCE_BYTES / 1024, how);
    } else if (pair_across_network(c))
      snprintf(pair, sizeof pair, "; up to %d KiB the two swap whole buffers (allreduce_pair.c)",
               TNT_PAIR_MAX_BYTES / 1024);
    TNT_INFO("allreduce: flat ring over all %d ranks (%s)%s", pl->size,
             H == 1                    ? "one host"
             : !t->uniform             ? "hosts hold different numbers of ranks"
             : L == 1                  ? "one rank per host"
                                       : "TNT_HIERARCHICAL=0",
             pair);
    return TNT_SUCCESS;
  }
  const size_t slot = (size_t)c->params->shm_slot_bytes;
  const int slots = c->params->shm_slots;
  TNT_CHECK(tnt_ring_setup_on(&c->host_ring, c->transport, c->ts, i, L, tnt_topology_rank(t, h, (i + 1) % L),
                              tnt_topology_rank(t, h, (i + L - 1) % L), TNT_CHANNEL_HOST, slot, slots,
                              c->params->timeout_s));
  TNT_CHECK(tnt_ring_setup_on(&c->net_ring, c->transport, c->ts, h, H, tnt_topology_rank(t, (h + 1) % H, i),
                              tnt_topology_rank(t, (h + H - 1) % H, i), TNT_CHANNEL_NET, slot, slots,
                              c->params->timeout_s));
  c->hier = 1;
  char pair[120] = "", how[112];
  if (H == 2 && pair_direct_fits(c, TNT_FLOAT32, 0)) {
    describe_pair_sum(c, how, sizeof how);
    snprintf(pair, sizeof pair, " %s", how);
  }
  TNT_INFO("allreduce: hierarchical, %d hosts x %d ranks (inside the host, then position %d of every host%s, then "
           "inside the host again)", H, L, i, pair);
  return TNT_SUCCESS;
}

tnt_result_t tnt_engine_start(tnt_engine_t *c, const tnt_placement_t *pl, const tnt_params_t *params,
                              const tnt_transport_t *transport, void *ts, tnt_requests_t *requests,
                              tnt_timeline_t *timeline) {
  memset(c, 0, sizeof *c);
  c->pl = pl;
  c->params = params;
  c->transport = transport;
  c->ts = ts;
  c->requests = requests;
  c->timeline = timeline;
  pthread_mutex_init(&c->queue_mu, NULL);
  tnt_cond_init_monotonic(&c->woken);
  pthread_mutex_init(&c->progress, NULL);
  tnt_pending_init(&c->pending);
  tnt_result_t res = tnt_ring_setup(&c->ring, transport, ts, pl->rank, pl->size, (size_t)params->shm_slot_bytes,
                                    params->shm_slots, params->timeout_s);
  if (res == TNT_SUCCESS) res = setup_hierarchy(c);
  if (res == TNT_SUCCESS) res = tnt_fusion_init(&c->fusion, pl->size);
  if (res == TNT_SUCCESS) res = tnt_negotiate_setup(&c->neg, pl, params, transport, ts, &c->pending, c->hier ? &c->topo : NULL);
  if (res == TNT_SUCCESS) {
    c->small_scratch = malloc((size_t)pl->size * TNT_SMALL_ALLREDUCE_BYTES);
    if (!c->small_scratch) res = tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  if (res == TNT_SUCCESS) res = tnt_settings_agree(transport, ts, pl, params);
  if (res == TNT_SUCCESS) {
    int err = pthread_create(&c->thread, NULL, engine_main, c);  /* returns the error; errno is not set */
    if (err != 0) res = tnt_fail(TNT_ERR_SYSTEM, "cannot start the background thread: %s", strerror(err));
  }
  if (res != TNT_SUCCESS) {
    tnt_engine_free(c);
    return res;
  }
  c->thread_started = 1;
  tnt_pause_watch(1); /* its naps read the clock every second: a longer gap is time not run */
  return TNT_SUCCESS;
}

void tnt_engine_stop(tnt_engine_t *c) {
  pthread_mutex_lock(&c->queue_mu);
  c->stop = 1; /* new submissions fail from here on; the thread's last step fails the rest */
  pthread_mutex_unlock(&c->queue_mu);
  if (c->thread_started) {
    tnt_engine_wake(c);
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
    tnt_pause_watch(0);
  }
}

static tnt_result_t enqueue(tnt_engine_t *c, tnt_request_t *req) {
  pthread_mutex_lock(&c->queue_mu);
  if (c->stop) {
    pthread_mutex_unlock(&c->queue_mu);
    return tnt_fail(TNT_ERR_INVALID_USAGE, "Tarantella is shutting down on rank %d: no new collectives", c->pl->rank);
  }
  req->next = NULL;
  if (c->queue_tail) c->queue_tail->next = req;
  else c->queue_head = req;
  c->queue_tail = req;
  pthread_mutex_unlock(&c->queue_mu);
  return TNT_SUCCESS;
}

tnt_result_t tnt_engine_submit(tnt_engine_t *c, tnt_request_t *req) {
  TNT_CHECK(enqueue(c, req));
  tnt_engine_wake(c);
  return TNT_SUCCESS;
}

tnt_result_t tnt_engine_submit_driven(tnt_engine_t *c, tnt_request_t *req) { return enqueue(c, req); }

void tnt_engine_stats(tnt_engine_t *c, tnt_stats_t *stats) {
  tnt_negotiate_stats(&c->neg, stats);
  stats->executed = atomic_load(&c->executed);
  stats->bytes_reduced = atomic_load(&c->bytes_reduced);
  stats->pair_sums = atomic_load(&c->pair_sums);
  stats->pair_swaps = atomic_load(&c->pair_swaps);
  stats->bytes_streamed_far = tnt_put_bytes_streamed();
  if (c->transport->wait_stats)
    c->transport->wait_stats(c->ts, &stats->waits_spun, &stats->waits_yielded, &stats->waits_slept);
}

/* Size-1 jobs: every collective is a local copy (no thread, no transport). */
void tnt_execute_local(tnt_requests_t *requests, tnt_timeline_t *timeline, tnt_request_t *req) {
  size_t esz = tnt_dtype_size((tnt_dtype_t)req->meta.dtype);
  void *buf = NULL;
  int64_t count = 0, t0 = tnt_now_us();
  switch (req->meta.coll) {
    case COLL_ALLREDUCE: /* the prescaled value; an average over one rank is the value itself */
      if (req->prescale != 1.0) tnt_scale((tnt_dtype_t)req->meta.dtype, req->out, req->in, req->prescale, (size_t)req->meta.count);
      else if (req->out != req->in) tnt_copy_unaliased(req->out, req->in, (size_t)req->meta.count * esz);
      break;
    case COLL_BROADCAST:
      if (req->out != req->in) tnt_copy_unaliased(req->out, req->in, (size_t)req->meta.count * esz);
      break;
    case COLL_ALLGATHER: {
      int owned;
      void *dst = gather_target(req, req->meta.count, esz, &owned);
      if (!dst) {
        tnt_requests_complete(requests, req, TNT_ERR_SYSTEM, "out of memory", -1, NULL, 0, NULL);
        return;
      }
      if (req->meta.count && dst != req->in) tnt_copy_unaliased(dst, req->in, (size_t)req->meta.count * esz);
      buf = owned ? dst : NULL;
      count = req->meta.count;
      break;
    }
    default: break;
  }
  tnt_timeline_event(timeline, req->name, tnt_coll_name(req->meta.coll), t0, tnt_now_us(), "local");
  tnt_requests_complete(requests, req, TNT_SUCCESS, NULL, -1, buf, count, req->meta.coll == COLL_ALLGATHER ? &count : NULL);
}
