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
 * by N for "average"). A single allreduce runs straight from input to output.
 *
 * Errors: a mismatch fails one request on every rank. A transport error (peer
 * lost, timeout) is fatal: every pending and later request fails with it, and
 * a timeout marks this rank aborted so that its peers fail fast too. A request
 * pending longer than TNT_TIMEOUT_S (some rank never submitted it) is fatal as
 * well, with the missing ranks named. The thread never exits the process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "dtype.h"
#include "negotiate.h"
#include "settings_agree.h"

#define LIVENESS_S 0.2 /* how often a thread with pending requests checks its peers */

tnt_result_t tnt_engine_setup(tnt_ctx_t *c) {
  c->small_scratch = malloc((size_t)c->pl.size * TNT_SMALL_ALLREDUCE_BYTES);
  if (!c->small_scratch) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  TNT_CHECK(tnt_negotiate_setup(c));
  return tnt_settings_agree(c->transport, c->ts, &c->pl, &c->params);
}

void tnt_engine_teardown(tnt_ctx_t *c) {
  tnt_negotiate_teardown(c);
  free(c->pending);
  c->pending = NULL;
  c->npending = c->cappending = 0;
  free(c->fusion_buf);
  c->fusion_buf = NULL;
  free(c->small_scratch);
  c->small_scratch = NULL;
  c->fusion_cap = 0;
}

static void pending_remove(tnt_ctx_t *c, tnt_request_t *req) {
  int i = tnt_namemap_get(&c->pending_by_name, req->name);
  if (i < 0) return;
  tnt_namemap_del(&c->pending_by_name, req->name);
  int last = --c->npending;
  if (i != last) {
    c->pending[i] = c->pending[last];
    tnt_namemap_put(&c->pending_by_name, c->pending[i]->name, i);
  }
}

/* Complete and forget a request; the engine must not touch it afterwards. */
static void finish(tnt_ctx_t *c, tnt_request_t *req, tnt_result_t res, const char *msg, int peer, void *buf,
                   int64_t count, const int64_t *rank_counts) {
  pending_remove(c, req);
  tnt_complete(c, req, res, msg, peer, buf, count, rank_counts);
}

static void fail_all_pending(tnt_ctx_t *c, tnt_result_t res, const char *msg, int peer) {
  while (c->npending > 0) finish(c, c->pending[c->npending - 1], res, msg, peer, NULL, 0, NULL);
}

/* Move the queue into the pending table; 1 if the engine should stop. */
static int take_queue(tnt_ctx_t *c) {
  pthread_mutex_lock(&c->mu);
  tnt_request_t *req = c->queue_head;
  c->queue_head = c->queue_tail = NULL;
  int stop = c->stop;
  pthread_mutex_unlock(&c->mu);
  while (req) {
    tnt_request_t *next = req->next;
    if (c->npending == c->cappending) {
      int cap = c->cappending ? 2 * c->cappending : 64;
      tnt_request_t **p = realloc(c->pending, (size_t)cap * sizeof *p);
      if (!p) {
        tnt_complete(c, req, TNT_ERR_SYSTEM, "out of memory", -1, NULL, 0, NULL);
        req = next;
        continue;
      }
      c->pending = p;
      c->cappending = cap;
    }
    req->state = REQ_NEW;
    c->pending[c->npending] = req;
    tnt_namemap_put(&c->pending_by_name, req->name, c->npending);
    c->npending++;
    req = next;
  }
  return stop;
}

static tnt_result_t grow_fusion(tnt_ctx_t *c, size_t bytes) {
  if (bytes <= c->fusion_cap) return TNT_SUCCESS;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes)) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate a %zu-byte fusion buffer", bytes);
  free(c->fusion_buf);
  c->fusion_buf = p;
  c->fusion_cap = bytes;
  return TNT_SUCCESS;
}

static int is_float(tnt_dtype_t dt) { return dt != TNT_INT32 && dt != TNT_INT64; }

/* The factor on this rank's input: its prescale, and 1/N for a floating-point
 * average (scaled before the sum, as NCCL does: float16 averages of large
 * values would overflow if the sum came first). */
static double input_factor(const tnt_ctx_t *c, const tnt_request_t *req) {
  double f = req->prescale;
  if (req->meta.op == TNT_AVERAGE && is_float((tnt_dtype_t)req->meta.dtype)) f /= c->pl.size;
  return f;
}

static double op_deadline(const tnt_ctx_t *c) { return tnt_now() + c->params.timeout_s; }

/* The allreduce algorithm for a buffer: one exchange for a few kilobytes (one
 * wake-up instead of 2(N-1)), the pipelined ring beyond, which applies the
 * factor inside its own passes. Both add in the order of ring.h's segments. */
static tnt_result_t reduce(tnt_ctx_t *c, const void *in, void *out, int64_t count, tnt_dtype_t dt, double factor,
                           const int64_t *bounds) {
  size_t bytes = (size_t)count * tnt_dtype_size(dt);
  if (bytes > TNT_SMALL_ALLREDUCE_BYTES)
    return tnt_allreduce_ring(&c->ring, in, out, count, dt, factor, 1, bounds, op_deadline(c));
  const void *src = in;
  if (factor != 1.0) { /* small: scale into the output, then reduce in place */
    tnt_scale(dt, out, in, factor, (size_t)count);
    src = out;
  }
  return tnt_allreduce_small(&c->ring, src, out, count, dt, bounds, c->small_scratch, op_deadline(c));
}

/* Integer average: the exact floor of the mean, which never wraps. Each rank
 * splits x = N*q + r (0 <= r < N); one sum of [q | r] gives Q and R, and
 * floor(mean) = Q + floor(R / N). Wrapping sums (unsigned) cancel out. */
#define INT_AVERAGE(T, UT)                                                                          \
  do {                                                                                              \
    const T *x_ = req->in;                                                                          \
    T *q_ = buf, *r_ = q_ + n, *o_ = req->out;                                                       \
    for (int64_t i = 0; i < n; i++) {                                                               \
      T q = (T)(x_[i] / N), r = (T)(x_[i] % N);                                                     \
      if (r < 0) { q--; r = (T)(r + N); }                                                           \
      q_[i] = q;                                                                                    \
      r_[i] = r;                                                                                    \
    }                                                                                               \
    res = reduce(c, buf, buf, 2 * n, dt, 1.0, NULL);                                                \
    for (int64_t i = 0; res == TNT_SUCCESS && i < n; i++) o_[i] = (T)((UT)q_[i] + (UT)(r_[i] / N)); \
  } while (0)

static tnt_result_t run_int_average(tnt_ctx_t *c, tnt_request_t *req) {
  const tnt_dtype_t dt = (tnt_dtype_t)req->meta.dtype;
  const int64_t n = req->meta.count, N = c->pl.size;
  void *buf = malloc((size_t)(2 * n + 1) * tnt_dtype_size(dt));
  if (!buf) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate %lld elements for the integer average '%s'", (long long)(2 * n), req->name);
  tnt_result_t res = TNT_SUCCESS;
  if (dt == TNT_INT32) INT_AVERAGE(int32_t, uint32_t);
  else INT_AVERAGE(int64_t, uint64_t);
  free(buf);
  return res;
}

/* Segment j of tensor i in a fused buffer sits after segment j of tensors
 * 0..i-1 (ring.h), so each tensor is summed in its own order, alone or fused. */
typedef struct {
  int n, N;
  int64_t *seg_off;  /* [N + 1]: where fused segment j begins */
  int64_t *pos;      /* [N]: running position inside fused segment j */
} fused_layout_t;

static void layout_reset(fused_layout_t *L) {
  for (int j = 0; j < L->N; j++) L->pos[j] = L->seg_off[j];
}

static void layout_build(fused_layout_t *L, tnt_request_t **reqs, int n) {
  const int N = L->N;
  for (int j = 0; j <= N; j++) L->seg_off[j] = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < N; j++) {
      int64_t cnt = reqs[i]->meta.count;
      L->seg_off[j + 1] += cnt * (j + 1) / N - cnt * j / N;
    }
  for (int j = 0; j < N; j++) L->seg_off[j + 1] += L->seg_off[j];
  layout_reset(L);
}

/* Copy (scaled) tensor `req` into the fused buffer, or back out of it. */
static void layout_move(fused_layout_t *L, tnt_request_t *req, uint8_t *fused, double factor, int out) {
  const tnt_dtype_t dt = (tnt_dtype_t)req->meta.dtype;
  const size_t esz = tnt_dtype_size(dt);
  const int64_t cnt = req->meta.count;
  for (int j = 0; j < L->N; j++) {
    int64_t b = cnt * j / L->N, len = cnt * (j + 1) / L->N - b;
    uint8_t *slot = fused + L->pos[j] * (int64_t)esz;
    if (out) memcpy((uint8_t *)req->out + b * (int64_t)esz, slot, (size_t)len * esz);
    else if (factor != 1.0) tnt_scale(dt, slot, (const uint8_t *)req->in + b * (int64_t)esz, factor, (size_t)len);
    else memcpy(slot, (const uint8_t *)req->in + b * (int64_t)esz, (size_t)len * esz);
    L->pos[j] += len;
  }
}

/* Allreduce of reqs[0..n) (n > 1: through the fusion buffer). */
static tnt_result_t run_allreduce(tnt_ctx_t *c, tnt_request_t **reqs, int n) {
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
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += reqs[i]->meta.count;
  TNT_CHECK(grow_fusion(c, (size_t)total * esz));
  const int N = c->pl.size;
  int64_t seg_off[N + 1], pos[N];
  fused_layout_t L = {n, N, seg_off, pos};
  layout_build(&L, reqs, n);
  for (int i = 0; i < n; i++) layout_move(&L, reqs[i], c->fusion_buf, input_factor(c, reqs[i]), 0);
  int64_t t1 = tnt_now_us();
  TNT_CHECK(reduce(c, c->fusion_buf, c->fusion_buf, total, dt, 1.0, seg_off)); /* scaled on the way in */
  int64_t t2 = tnt_now_us();
  layout_reset(&L);
  for (int i = 0; i < n; i++) layout_move(&L, reqs[i], c->fusion_buf, 1.0, 1);
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

static tnt_result_t run_one(tnt_ctx_t *c, tnt_request_t *req, const tnt_response_t *resp, void **result_buf,
                            int64_t *result_count) {
  int64_t t0 = tnt_now_us();
  size_t esz = tnt_dtype_size((tnt_dtype_t)req->meta.dtype);
  switch (req->meta.coll) {
    case COLL_BROADCAST:
      TNT_CHECK(tnt_broadcast_ring(&c->ring, req->in, req->out, (size_t)req->meta.count * esz, req->meta.root, op_deadline(c)));
      tnt_timeline_event(c->timeline, req->name, "BROADCAST", t0, tnt_now_us(), NULL);
      break;
    case COLL_ALLGATHER: {
      int N = c->pl.size;
      int64_t bytes[N], total = 0;
      for (int q = 0; q < N; q++) {
        bytes[q] = resp->rank_counts[q] * (int64_t)esz;
        total += resp->rank_counts[q];
      }
      void *out = malloc(total ? (size_t)total * esz : 1);
      if (!out) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate %lld bytes for allgather '%s'", (long long)(total * (int64_t)esz), req->name);
      tnt_result_t r = tnt_allgather_ring(&c->ring, req->in, out, bytes, op_deadline(c));
      if (r != TNT_SUCCESS) {
        free(out);
        return r;
      }
      *result_buf = out;
      *result_count = total;
      tnt_timeline_event(c->timeline, req->name, "ALLGATHER", t0, tnt_now_us(), NULL);
      break;
    }
    case COLL_BARRIER: break; /* the negotiation itself synchronized every rank */
    default: return tnt_fail(TNT_ERR_INTERNAL, "unknown collective %d", req->meta.coll);
  }
  return TNT_SUCCESS;
}

static tnt_result_t execute(tnt_ctx_t *c, tnt_response_t *resp, int n) {
  int64_t now = tnt_now_us();
  tnt_request_t *group[256];
  for (int i = 0; i < n;) {
    tnt_request_t *req = tnt_pending_find(c, resp[i].name);
    if (!req) return tnt_fail(TNT_ERR_INTERNAL, "response for '%s' has no request on rank %d", resp[i].name, c->pl.rank);
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
    while (!alone && j < n && ng < 256 && resp[j].error == TNT_SUCCESS && resp[j].meta.coll == COLL_ALLREDUCE &&
           resp[j].meta.dtype == req->meta.dtype &&
           !(resp[j].meta.op == TNT_AVERAGE && !is_float((tnt_dtype_t)resp[j].meta.dtype)) &&
           bytes + resp[j].meta.count * (int64_t)esz <= c->params.fusion_threshold_bytes) {
      tnt_request_t *next = tnt_pending_find(c, resp[j].name);
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

/* Fatal if a request waited longer than TNT_TIMEOUT_S; warn once at half of it.
 * The error names the first missing rank and what its process is doing. */
static tnt_result_t check_stalls(tnt_ctx_t *c) {
  double now = tnt_now();
  for (int i = 0; i < c->npending; i++) {
    tnt_request_t *req = c->pending[i];
    double age = now - req->submit_time;
    if (age < c->params.timeout_s / 2) continue;
    char missing[512];
    tnt_negotiate_missing(c, req, missing, sizeof missing);
    if (age >= c->params.timeout_s) {
      int first = -1;
      char doing[256] = "";
      if (sscanf(missing, "%d", &first) == 1 && first >= 0 && first < c->pl.size && c->transport->describe_peer)
        c->transport->describe_peer(c->ts, first, doing, sizeof doing);
      return tnt_fail_about(TNT_ERR_TIMEOUT, first,
                            "%s '%s' was submitted on rank %d %.0f s ago but ranks [%s] never submitted it "
                            "(TNT_TIMEOUT_S=%g)%s%s: every rank must make the same collective calls",
                            tnt_coll_name(req->meta.coll), req->name, c->pl.rank, age, missing, c->params.timeout_s,
                            doing[0] ? "; " : "", doing);
    }
    if (!req->stall_warned) {
      req->stall_warned = 1;
      TNT_WARN("%s '%s' has waited %.0f s for ranks [%s]; it fails at TNT_TIMEOUT_S=%g s", tnt_coll_name(req->meta.coll),
               req->name, age, missing, c->params.timeout_s);
    }
  }
  return TNT_SUCCESS;
}

static void go_fatal(tnt_ctx_t *c, tnt_result_t res) {
  const char *msg = tnt_last_error();
  int peer = tnt_last_error_rank();
  /* publish it: peers waiting on this rank fail at once, naming the root cause
   * (the lost or stuck rank when there is one, else this rank) */
  c->transport->abort(c->ts, msg, peer);
  tnt_set_fatal(c, res, msg, peer);
  fail_all_pending(c, res, msg, peer);
}

/* One step of the engine, by whichever thread holds c->progress: the
 * background thread, or an application thread waiting for its own request
 * (which saves the two thread hand-offs of a blocking collective). */
int tnt_engine_step(tnt_ctx_t *c, double until) {
  int stop = take_queue(c);
  pthread_mutex_lock(&c->mu);
  tnt_result_t fatal = c->fatal;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", c->fatal_msg);
  int peer = c->fatal_peer;
  pthread_mutex_unlock(&c->mu);
  if (fatal != TNT_SUCCESS) {
    fail_all_pending(c, fatal, msg, peer);
    return stop ? TNT_STEP_STOP : TNT_STEP_IDLE;
  }
  if (stop) {
    char why[160];
    snprintf(why, sizeof why, "Tarantella was shut down on rank %d before this request completed", c->pl.rank);
    fail_all_pending(c, TNT_ERR_INVALID_USAGE, why, -1);
    return TNT_STEP_STOP;
  }
  tnt_result_t res = check_stalls(c);
  if (!tnt_negotiate_in_cycle(c)) {
    if (res == TNT_SUCCESS && c->npending && tnt_now() >= c->next_liveness) {
      /* a sleeping peer costs nothing; a dead one must not leave us waiting for
       * TNT_TIMEOUT_S; a peer that shut down matters only if we still wait for it */
      uint8_t awaited[c->pl.size];
      tnt_negotiate_awaited(c, awaited);
      c->next_liveness = tnt_now() + LIVENESS_S;
      res = c->transport->check_peers(c->ts, awaited);
    }
    if (res != TNT_SUCCESS) {
      go_fatal(c, res);
      return TNT_STEP_WORKED;
    }
    if (tnt_negotiate_has_news(c)) c->transport->ring_doorbell(c->ts, c->cycles + 1);
    else if (!c->transport->cycle_wanted(c->ts, c->cycles)) return TNT_STEP_IDLE;
  } else if (res != TNT_SUCCESS) {
    go_fatal(c, res);
    return TNT_STEP_WORKED;
  }
  tnt_response_t *resp = NULL;
  int nresp = 0;
  res = tnt_negotiate_cycle(c, &resp, &nresp, until);
  if (res == TNT_IN_PROGRESS) return TNT_STEP_BLOCKED;
  if (res == TNT_SUCCESS) res = execute(c, resp, nresp);
  tnt_responses_free(resp, nresp);
  if (res != TNT_SUCCESS) go_fatal(c, res);
  return TNT_STEP_WORKED;
}

void *tnt_engine_main(void *arg) {
  tnt_ctx_t *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->progress);
    int step = tnt_engine_step(c, INFINITY);
    uint64_t done = c->cycles;
    int pending = c->npending;
    pthread_mutex_unlock(&c->progress);
    if (step == TNT_STEP_STOP) break;
    /* nobody has news: sleep until a local request or a peer's cycle; with
     * requests pending, wake every LIVENESS_S to check the peers */
    if (step == TNT_STEP_IDLE) c->transport->wait_doorbell(c->ts, done, tnt_now() + (pending ? LIVENESS_S : 5.0));
  }
  return NULL;
}

/* Size-1 jobs: every collective is a local copy (no thread, no transport). */
tnt_result_t tnt_execute_local(tnt_ctx_t *c, tnt_request_t *req) {
  size_t esz = tnt_dtype_size((tnt_dtype_t)req->meta.dtype);
  void *buf = NULL;
  int64_t count = 0, t0 = tnt_now_us();
  switch (req->meta.coll) {
    case COLL_ALLREDUCE: /* the prescaled value; an average over one rank is the value itself */
      if (req->prescale != 1.0) tnt_scale((tnt_dtype_t)req->meta.dtype, req->out, req->in, req->prescale, (size_t)req->meta.count);
      else if (req->out != req->in) memcpy(req->out, req->in, (size_t)req->meta.count * esz);
      break;
    case COLL_BROADCAST:
      if (req->out != req->in) memcpy(req->out, req->in, (size_t)req->meta.count * esz);
      break;
    case COLL_ALLGATHER:
      buf = malloc(req->meta.count ? (size_t)req->meta.count * esz : 1);
      if (!buf) {
        tnt_complete(c, req, TNT_ERR_SYSTEM, "out of memory", -1, NULL, 0, NULL);
        return TNT_SUCCESS;
      }
      if (req->meta.count) memcpy(buf, req->in, (size_t)req->meta.count * esz);
      count = req->meta.count;
      break;
    default: break;
  }
  if (c->timeline) {
    pthread_mutex_lock(&c->mu); /* several application threads may submit */
    tnt_timeline_event(c->timeline, req->name, tnt_coll_name(req->meta.coll), t0, tnt_now_us(), "local");
    pthread_mutex_unlock(&c->mu);
  }
  tnt_complete(c, req, TNT_SUCCESS, NULL, -1, buf, count, req->meta.coll == COLL_ALLGATHER ? &count : NULL);
  return TNT_SUCCESS;
}
