/* hier.c - the transport of a job spread over several hosts: shm between the
 * ranks of one host, mpi between hosts (TNT_TRANSPORT=auto picks it when the
 * placement says the ranks are not all on this host).
 *
 * It is the transport of every rank of the job, numbered by job-wide rank, and
 * routes each call by its peer: a peer on this host goes to the host's shm
 * segment (its own id there is its position on the host), any other to the
 * mpi transport (the plugin, over every rank of the job). Whatever is job-wide
 * goes through mpi: the exchange (negotiation, set-up), the doorbell, liveness
 * of every rank (mpi checks ranks of the same kernel by pid, the others by
 * heartbeats). An abort is published on both, so that a rank waiting on shm
 * for a host neighbour fails as fast as one waiting on the network.
 *
 * The segment of host h is /dev/shm/tnt-<job id>-h<h>: hosts of a test bed
 * share one /dev/shm, real hosts do not, and either way the names differ. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common.h"
#include "../topology.h"
#include "../transport.h"
#include "../transport_plugin.h"

typedef struct {
  const tnt_transport_t *net;
  void *nts;
  void *lts; /* shm over this host's ranks; NULL when the rank is alone on its host */
  tnt_topology_t topo;
  int me;
  uint8_t *none_awaited; /* [size] zeros: no rank's clean shutdown is a failure here */
  double next_check;     /* wait_local's next full check of the remote peers */
  int quiet;             /* tnt_transport_quiet: no network transfer waits on this rank's MPI progress */
} hier_t;

static const tnt_transport_t *const shm = &tnt_transport_shm;

/* 1 if `peer` is reached through this host's segment. */
static int local(const hier_t *h, int peer) { return h->lts && h->topo.host_of[peer] == h->topo.host; }
static int lid(const hier_t *h, int peer) { return h->topo.index_of[peer]; }

static int hier_can_serve(const tnt_placement_t *pl) { return pl->local_size < pl->size; }

static void hier_free(hier_t *h) {
  tnt_topology_free(&h->topo);
  free(h->none_awaited);
  free(h);
}

static tnt_result_t hier_init(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes,
                              void **state) {
  hier_t *h = calloc(1, sizeof *h);
  if (!h) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  h->me = pl->rank;
  tnt_result_t res = tnt_plugin_transport("mpi", &h->net);
  if (res == TNT_SUCCESS) res = h->net->init(pl, params, window_bytes, &h->nts);
  if (res != TNT_SUCCESS) {
    hier_free(h);
    return res;
  }
  h->none_awaited = calloc((size_t)pl->size, 1);
  res = h->none_awaited ? tnt_topology_discover(h->net, h->nts, pl, params->timeout_s, &h->topo)
                        : tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  const int host = h->topo.host, n_local = res == TNT_SUCCESS ? tnt_topology_host_size(&h->topo, host) : 0;
  if (res == TNT_SUCCESS && n_local > 1) {
    tnt_placement_t sub = *pl;
    sub.rank = sub.local_rank = h->topo.index_of[pl->rank];
    sub.size = sub.local_size = n_local;
    snprintf(sub.job_id, sizeof sub.job_id, "%.100s-h%d", pl->job_id, host);
    res = tnt_shm_init_group(&sub, params, window_bytes, &h->topo.members[h->topo.host_start[host]], &h->lts);
  }
  if (res != TNT_SUCCESS) { /* the other hosts' ranks fail at once, not at their timeout */
    h->net->abort(h->nts, tnt_last_error(), -1);
    h->net->finalize(h->nts);
    hier_free(h);
    return res;
  }
  TNT_INFO("transport shm+mpi: host %d of %d, %d ranks here (%s), %d ranks in all", host, h->topo.hosts, n_local,
           n_local > 1 ? "shm between them" : "alone: every peer over mpi", pl->size);
  *state = h;
  return TNT_SUCCESS;
}

static tnt_result_t hier_put(void *st, int peer, size_t offset, const void *src, size_t len) {
  hier_t *h = st;
  return local(h, peer) ? shm->put(h->lts, lid(h, peer), offset, src, len) : h->net->put(h->nts, peer, offset, src, len);
}

static tnt_result_t hier_fence(void *st, int peer, double deadline) {
  hier_t *h = st;
  return local(h, peer) ? shm->fence(h->lts, lid(h, peer), deadline) : h->net->fence(h->nts, peer, deadline);
}

static void *hier_send_buffer(void *st, int peer, size_t offset, size_t len) {
  hier_t *h = st;
  return local(h, peer) ? shm->send_buffer(h->lts, lid(h, peer), offset, len)
                        : h->net->send_buffer(h->nts, peer, offset, len);
}

static void *hier_window(void *st) {
  hier_t *h = st;
  return h->net->window(h->nts);
}

void *tnt_transport_window_for(const tnt_transport_t *t, void *ts, int peer) {
  if (t != &tnt_transport_hier) return t->window(ts);
  hier_t *h = ts;
  return local(h, peer) ? shm->window(h->lts) : h->net->window(h->nts);
}

void tnt_transport_quiet(const tnt_transport_t *t, void *ts, int on) {
  if (t == &tnt_transport_hier) ((hier_t *)ts)->quiet = on;
}

int tnt_transport_remote(const tnt_transport_t *t, void *ts, int peer) {
  if (t == &tnt_transport_shm) return 0;
  return t != &tnt_transport_hier || !local((hier_t *)ts, peer);
}

static tnt_result_t hier_notify(void *st, int peer, int kind) {
  hier_t *h = st;
  return local(h, peer) ? shm->notify(h->lts, lid(h, peer), kind) : h->net->notify(h->nts, peer, kind);
}

/* A wait for a host neighbour, in slices between which MPI makes progress:
 * MPI moves a message only while its sender calls into it, so a rank waiting
 * here with a put to another host still in flight would otherwise hold that
 * host's ranks (and, around a ring, itself) until its next MPI call. The
 * slices start short, for the put's next piece, and grow to SLICE_MAX_S.
 * Quiet (nothing in flight across), one slice of QUIET_SLICE_S: each slice's
 * end is a wake-up, and on 2 hosts x 2 ranks sleeping through was 1.04-1.62x
 * faster at 16 KB - 16 MB (docs/benchmarks.md). Still a slice, for the
 * heartbeats that MPI's progress sends, well within their silence bound. */
#define SLICE_MIN_S 50e-6
#define SLICE_MAX_S 2e-3
#define QUIET_SLICE_S 50e-3
static tnt_result_t wait_local(hier_t *h, int kind, int from, uint32_t target, double deadline) {
  const double min = h->quiet ? QUIET_SLICE_S : SLICE_MIN_S, max = h->quiet ? QUIET_SLICE_S : SLICE_MAX_S;
  for (double slice = min;; slice = slice * 2 < max ? slice * 2 : max) {
    double until = tnt_now() + slice;
    if (until >= deadline) return shm->wait(h->lts, kind, lid(h, from), target, deadline);
    tnt_result_t res = shm->wait(h->lts, kind, lid(h, from), target, until);
    if (res != TNT_ERR_TIMEOUT) return res;
    /* one round of MPI progress: a wait for a count already reached (our own
     * counter from ourselves never moves from 0) polls once and returns. The
     * neighbour we wait for fails its own wait if a remote rank is lost, and
     * its abort ends ours; full checks of every peer every 0.1 s. */
    TNT_CHECK(h->net->wait(h->nts, TNT_NOTIFY_DATA, h->me, 0, deadline));
    if (tnt_now() >= h->next_check) {
      h->next_check = tnt_now() + 0.1;
      TNT_CHECK(h->net->check_peers(h->nts, h->none_awaited));
    }
  }
}

static tnt_result_t hier_wait(void *st, int kind, int from, uint32_t target, double deadline) {
  hier_t *h = st;
  return local(h, from) ? wait_local(h, kind, from, target, deadline)
                        : h->net->wait(h->nts, kind, from, target, deadline);
}

static tnt_result_t hier_exchange(void *st, const void *mine, size_t len, void *all, size_t stride, size_t *lens,
                                  double deadline) {
  hier_t *h = st;
  return h->net->exchange(h->nts, mine, len, all, stride, lens, deadline);
}

static tnt_result_t hier_exchange_post(void *st, const void *mine, size_t len, double deadline) {
  hier_t *h = st;
  return h->net->exchange_post(h->nts, mine, len, deadline);
}

static tnt_result_t hier_exchange_collect(void *st, void *all, size_t stride, size_t *lens, double until) {
  hier_t *h = st;
  return h->net->exchange_collect(h->nts, all, stride, lens, until);
}

static void hier_ring_doorbell(void *st, uint64_t cycle) {
  hier_t *h = st;
  h->net->ring_doorbell(h->nts, cycle);
}

static int hier_cycle_wanted(void *st, uint64_t done) {
  hier_t *h = st;
  return h->net->cycle_wanted(h->nts, done);
}

static void hier_wait_doorbell(void *st, uint64_t done, double deadline) {
  hier_t *h = st;
  h->net->wait_doorbell(h->nts, done, deadline);
}

static tnt_result_t hier_check_peers(void *st, const uint8_t *awaited) {
  hier_t *h = st;
  TNT_CHECK(h->net->check_peers(h->nts, h->none_awaited));
  if (!h->lts) return TNT_SUCCESS;
  const int host = h->topo.host, n = tnt_topology_host_size(&h->topo, host);
  uint8_t mine[n];
  for (int i = 0; i < n; i++) mine[i] = !awaited || awaited[tnt_topology_rank(&h->topo, host, i)];
  return shm->check_peers(h->lts, mine);
}

static void hier_describe_peer(void *st, int peer, char *out, size_t len) {
  hier_t *h = st;
  if (local(h, peer)) shm->describe_peer(h->lts, lid(h, peer), out, len);
  else h->net->describe_peer(h->nts, peer, out, len);
}

static void hier_wake_local(void *st) {
  hier_t *h = st;
  h->net->wake_local(h->nts);
}

static void hier_abort(void *st, const char *reason, int root_peer) {
  hier_t *h = st;
  if (h->lts) shm->abort(h->lts, reason, root_peer);
  h->net->abort(h->nts, reason, root_peer);
}

static void hier_finalize(void *st) {
  hier_t *h = st;
  if (h->lts) shm->finalize(h->lts);
  h->net->finalize(h->nts);
  hier_free(h);
}

/* The bit round: the network transport's AND over every rank (recursive
 * doubling in mpi), the same job-wide path as the exchange. */
static tnt_result_t hier_and_post(void *st, const uint64_t *mine, int nwords, double deadline) {
  hier_t *h = st;
  if (!h->net->and_post) return tnt_fail(TNT_ERR_INTERNAL, "transport %s has no AND-allreduce", h->net->name);
  return h->net->and_post(h->nts, mine, nwords, deadline);
}

static tnt_result_t hier_and_collect(void *st, uint64_t *out, double until) {
  hier_t *h = st;
  return h->net->and_collect(h->nts, out, until);
}

/* A bit round with a ride: the network transport's (the job-wide AND's
 * steps carry it), where it has one. */
static tnt_result_t hier_and_post_ride(void *st, const uint64_t *mine, int nwords, const tnt_ride_t *ride,
                                       const void *payload, double deadline) {
  hier_t *h = st;
  if (!h->net->and_post_ride) return tnt_fail(TNT_ERR_INTERNAL, "transport %s carries no rides", h->net->name);
  return h->net->and_post_ride(h->nts, mine, nwords, ride, payload, deadline);
}

static const void *hier_ride_result(void *st, uint64_t *ranks) {
  hier_t *h = st;
  return h->net->ride_result ? h->net->ride_result(h->nts, ranks) : NULL;
}

/* A ride's payload of a rank of this host: in that rank's exchange area of the
 * host's segment, which nothing else uses here (every exchange of this
 * transport goes over the network), so that the step between the ranks of a
 * host reads it in place instead of MPI carrying it through its own shared
 * memory (docs/benchmarks.md, "Rides"). */
static void *hier_ride_shared(void *st, int rank, int parity, size_t *capacity) {
  hier_t *h = st;
  *capacity = 0;
  return local(h, rank) ? tnt_shm_exchange_area(h->lts, lid(h, rank), parity, capacity) : NULL;
}

/* The host's waits and the network's, added up. */
static void hier_wait_stats(void *st, int64_t *spun, int64_t *yielded, int64_t *slept) {
  hier_t *h = st;
  int64_t local[3] = {0, 0, 0}, net[3] = {0, 0, 0};
  if (h->lts) shm->wait_stats(h->lts, &local[0], &local[1], &local[2]); /* else alone on its host: no shm waits */
  if (h->net->wait_stats) h->net->wait_stats(h->nts, &net[0], &net[1], &net[2]);
  *spun = local[0] + net[0];
  *yielded = local[1] + net[1];
  *slept = local[2] + net[2];
}

/* The host's segment counts its ranks' CPUs; alone on its host, the plugin
 * counts those of the ranks on this machine. */
static long hier_cores(void *st) {
  hier_t *h = st;
  return h->lts ? shm->cores(h->lts) : tnt_transport_cores(h->net, h->nts);
}

/* A pair of ranks on two hosts: the network transport's direct messages. */
static tnt_result_t hier_sendrecv(void *st, int peer, const void *send, size_t send_bytes, void *recv,
                                  size_t recv_bytes, double deadline) {
  hier_t *h = st;
  if (local(h, peer) || !h->net->sendrecv)
    return tnt_fail(TNT_ERR_INTERNAL, "direct messages asked of rank %d, on this host", peer);
  return h->net->sendrecv(h->nts, peer, send, send_bytes, recv, recv_bytes, deadline);
}

const tnt_transport_t tnt_transport_hier = {
    .name = "shm+mpi",
    .can_serve = hier_can_serve,
    .init = hier_init,
    .put = hier_put,
    .fence = hier_fence,
    .send_buffer = hier_send_buffer,
    .window = hier_window,
    .notify = hier_notify,
    .wait = hier_wait,
    .exchange = hier_exchange,
    .exchange_post = hier_exchange_post,
    .exchange_collect = hier_exchange_collect,
    .ring_doorbell = hier_ring_doorbell,
    .cycle_wanted = hier_cycle_wanted,
    .wait_doorbell = hier_wait_doorbell,
    .check_peers = hier_check_peers,
    .describe_peer = hier_describe_peer,
    .wake_local = hier_wake_local,
    .abort = hier_abort,
    .finalize = hier_finalize,
    .and_post = hier_and_post,
    .and_collect = hier_and_collect,
    .wait_stats = hier_wait_stats,
    .sendrecv = hier_sendrecv,
    .cores = hier_cores,
    .and_post_ride = hier_and_post_ride,
    .ride_result = hier_ride_result,
    .ride_shared = hier_ride_shared,
};
