/* settings_agree.c - ranks refuse to run with different protocol settings.
 *
 * A rank with another fusion threshold fuses differently, one with another
 * cache capacity caches differently: their exchange rounds drift apart and data
 * of one tensor is read as another's. Horovod and NCCL trust the environment to
 * be uniform; we check it once, at set-up, where it costs one exchange. */
#include "settings_agree.h"

#include <stdlib.h>
#include <string.h>

#include "coll/ring.h"
#include "common.h"

/* The settings, as the values every rank must share; the names are what the
 * user sets, so the error says what to change. */
typedef struct {
  const char *name;
  int64_t value;
} setting_t;

enum { N_SETTINGS = 12 };

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
  };
  for (int i = 0; i < N_SETTINGS; i++) {
    out[i] = table[i].value;
    names[i] = table[i].name;
  }
}

tnt_result_t tnt_settings_agree(const tnt_transport_t *t, void *ts, const tnt_placement_t *pl, const tnt_params_t *params) {
  const int N = pl->size;
  int64_t mine[N_SETTINGS];
  const char *names[N_SETTINGS];
  collect(pl, params, mine, names);
  int64_t *all = calloc((size_t)N, sizeof mine);
  size_t *lens = calloc((size_t)N, sizeof *lens);
  if (!all || !lens) {
    free(all);
    free(lens);
    return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  tnt_result_t res = t->exchange(ts, mine, sizeof mine, all, sizeof mine, lens, tnt_now() + params->timeout_s);
  for (int q = 0; res == TNT_SUCCESS && q < N; q++)
    if (lens[q] != sizeof mine)
      res = tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d sent a set-up record of %zu bytes, not %zu: every rank must run the "
                     "same release of Tarantella", q, lens[q], sizeof mine);
  for (int i = 0; res == TNT_SUCCESS && i < N_SETTINGS; i++) {
    int differs = 0;
    for (int q = 1; q < N; q++) differs |= all[(size_t)q * N_SETTINGS + i] != all[i];
    if (!differs) continue;
    char values[768];
    size_t used = 0;
    for (int q = 0; q < N && used < sizeof values - 40; q++)
      used += (size_t)snprintf(values + used, sizeof values - used, "%srank %d: %lld", q ? ", " : "", q,
                               (long long)all[(size_t)q * N_SETTINGS + i]);
    res = tnt_fail(TNT_ERR_INVALID_USAGE, "the ranks disagree on %s (%s): give every rank the same environment (tntrun "
                   "does), or the same Tarantella release", names[i], values);
  }
  free(all);
  free(lens);
  return res;
}
