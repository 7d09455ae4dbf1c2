/* settings_agree.c - ranks refuse to run with different protocol settings.
 *
 * A rank with another fusion threshold fuses differently, one with another
 * cache capacity caches differently: their exchange rounds drift apart and data
 * of one tensor is read as another's. Horovod and NCCL trust the environment to
 * be uniform; we check it once, at set-up, where it costs one exchange. */
#include "settings_agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/ring.h"
#include "common.h"

/* The settings, as the values every rank must share; the names are what the
 * user sets, so the error says what to change. */
typedef struct {
  const char *name;
  int64_t value;
} setting_t;

enum { N_SETTINGS = 14 };

static void collect(const tnt_placement_t *pl, const tnt_params_t *p, int64_t out[N_SETTINGS], const char *names[N_SETTINGS]) {
  const setting_t table[N_SETTINGS] = {
      {"protocol version (the Tarantella release)", TNT_PROTOCOL_VERSION},
      {"TNT_SIZE (number of ranks)", pl->size},
      {"TNT_FUSION_THRESHOLD_KB (bytes)", p->fusion_threshold_bytes},
      {"TNT_CACHE_CAPACITY", p->cache_capacity},
      {"TNT_SHM_SLOT_KB (bytes)", p->shm_slot_bytes},
      {"TNT_SHM_SLOTS", p->shm_slots},
      {"small-allreduce threshold (bytes, the Tarantella release)", TNT_SMALL_ALLREDUCE_BYTES},
      {"TNT_HIERARCHICAL (its order of additions)", p->hierarchical},
      {"TNT_BIT_ROUNDS (which kind each negotiation cycle is)", p->bit_rounds},
      {"TNT_STREAM_MIN_KB (bytes; from it on the ring's last two steps are one)", p->stream_min_bytes},
      {"TNT_SHM_DIRECT (the ring, or two exchange rounds per chunk)", p->shm_direct},
      {"TNT_MPI_PAIR_SUM (direct MPI messages between two hosts, or the ring)", p->mpi_pair_sum},
      {"TNT_MPI_PAIR_PIECE_KB (bytes; how many messages a pair of ranks sends)", p->mpi_pair_piece_bytes},
      {"TNT_RIDES (a cached allreduce summed along its bit round, or not)", p->rides},
  };
  for (int i = 0; i < N_SETTINGS; i++) {
    out[i] = table[i].value;
    names[i] = table[i].name;
  }
}

/* What a rank says of its place on its host, sent with the settings: a placement given by hand
 * (TNT_LOCAL_RANK, TNT_LOCAL_SIZE) that does not fit the ranks there is no protocol difference,
 * but a rank choosing its GPU by local rank collides with another silently. */
typedef struct {
  int64_t settings[N_SETTINGS];
  int32_t local_rank, local_size, from_launcher, pad;
  char host[256]; /* as topology.c compares them */
} record_t;

/* The host of rank q: the index of the lowest rank with its host name (all ranks one host on
 * the shm transport, which shares one segment, whatever the names). */
static int host_index(const record_t *all, int q, int one_host) {
  if (one_host) return 0;
  int h = 0;
  while (h < q && strncmp(all[h].host, all[q].host, sizeof all[q].host)) h++;
  return h;
}

/* A placement from TNT_* (by hand, or tntrun's) must give the ranks of each host the local ranks
 * 0 .. n-1, once each, and the local size n. Every rank checks every rank's record, so every rank
 * fails alike. (An engine's own variables, OMPI_COMM_WORLD_LOCAL_RANK..., are the engine's count.) */
static tnt_result_t placement_fits(const record_t *all, int N, int one_host) {
  for (int q = 0; q < N; q++) {
    if (!all[q].from_launcher) continue;
    const int h = host_index(all, q, one_host);
    int count = 0;
    char ranks[256];
    size_t used = 0;
    ranks[0] = 0;
    for (int p = 0; p < N; p++) {
      if (host_index(all, p, one_host) != h) continue;
      count++;
      if (used < sizeof ranks - 24) used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? ", " : "", p);
      else if (used < sizeof ranks - 4) used += (size_t)snprintf(ranks + used, sizeof ranks - used, "...");
      if (p < q && all[p].from_launcher && all[p].local_rank == all[q].local_rank)
        return tnt_fail(TNT_ERR_INVALID_USAGE,
                        "ranks %d and %d of host %.64s both have local rank %d (TNT_LOCAL_RANK): each rank of a host "
                        "needs its own, 0 to TNT_LOCAL_SIZE-1 (it picks the rank's GPU); give each its own "
                        "TNT_LOCAL_RANK, or start the job with tntrun, which does. Received: TNT_LOCAL_RANK=%d on "
                        "ranks %d and %d",
                        p, q, all[q].host, all[q].local_rank, all[q].local_rank, p, q);
    }
    if (all[q].local_size != count)
      return tnt_fail(TNT_ERR_INVALID_USAGE,
                      "rank %d says its host %.64s has %d ranks (TNT_LOCAL_SIZE=%d), but %d ranks of the job are "
                      "there (ranks %s): give every rank of a host TNT_LOCAL_SIZE=%d (and its own TNT_LOCAL_RANK, 0 to "
                      "%d), or start the job with tntrun, which does. Received: TNT_LOCAL_SIZE=%d on rank %d",
                      q, all[q].host, all[q].local_size, all[q].local_size, count, ranks, count, count - 1,
                      all[q].local_size, q);
  }
  return TNT_SUCCESS;
}

tnt_result_t tnt_settings_agree(const tnt_transport_t *t, void *ts, const tnt_placement_t *pl, const tnt_params_t *params) {
  const int N = pl->size;
  record_t mine;
  memset(&mine, 0, sizeof mine);
  const char *names[N_SETTINGS];
  collect(pl, params, mine.settings, names);
  mine.local_rank = pl->local_rank;
  mine.local_size = pl->local_size;
  mine.from_launcher = pl->from_launcher;
  if (gethostname(mine.host, sizeof mine.host - 1) != 0) snprintf(mine.host, sizeof mine.host, "(unnamed)");
  record_t *all = calloc((size_t)N, sizeof mine);
  size_t *lens = calloc((size_t)N, sizeof *lens);
  if (!all || !lens) {
    free(all);
    free(lens);
    return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  tnt_result_t res = t->exchange(ts, &mine, sizeof mine, all, sizeof mine, lens, tnt_now() + params->timeout_s);
  for (int q = 0; res == TNT_SUCCESS && q < N; q++)
    if (lens[q] != sizeof mine)
      res = tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d sent a set-up record of %zu bytes, not %zu: every rank must run the "
                     "same release of Tarantella", q, lens[q], sizeof mine);
  for (int i = 0; res == TNT_SUCCESS && i < N_SETTINGS; i++) {
    int differs = 0;
    for (int q = 1; q < N; q++) differs |= all[q].settings[i] != all[0].settings[i];
    if (!differs) continue;
    char values[768];
    size_t used = 0;
    for (int q = 0; q < N && used < sizeof values - 40; q++)
      used += (size_t)snprintf(values + used, sizeof values - used, "%srank %d: %lld", q ? ", " : "", q,
                               (long long)all[q].settings[i]);
    res = tnt_fail(TNT_ERR_INVALID_USAGE, "the ranks disagree on %s (%s): give every rank the same environment (tntrun "
                   "does), or the same Tarantella release", names[i], values);
  }
  /* after the settings: a job of two builds fails on the release, not on what follows from it */
  if (res == TNT_SUCCESS) res = placement_fits(all, N, t == &tnt_transport_shm);
  free(all);
  free(lens);
  return res;
}
