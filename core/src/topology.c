/* topology.c - the host map (topology.h). */
#include "topology.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define HOST_NAME_BYTES 256

static tnt_result_t alloc(tnt_topology_t *topo, int size) {
  memset(topo, 0, sizeof *topo);
  topo->size = size;
  topo->host_of = calloc((size_t)size, sizeof(int));
  topo->index_of = calloc((size_t)size, sizeof(int));
  topo->host_start = calloc((size_t)size + 1, sizeof(int));
  topo->members = calloc((size_t)size, sizeof(int));
  if (topo->host_of && topo->index_of && topo->host_start && topo->members) return TNT_SUCCESS;
  tnt_topology_free(topo);
  return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
}

/* host_start and members from host_of (hosts numbered by their lowest rank). */
static void group(tnt_topology_t *topo, int me) {
  int count[topo->hosts];
  memset(count, 0, sizeof count);
  for (int r = 0; r < topo->size; r++) topo->index_of[r] = count[topo->host_of[r]]++;
  topo->host_start[0] = 0;
  for (int h = 0; h < topo->hosts; h++) topo->host_start[h + 1] = topo->host_start[h] + count[h];
  for (int r = 0; r < topo->size; r++)
    topo->members[topo->host_start[topo->host_of[r]] + topo->index_of[r]] = r;
  topo->host = topo->host_of[me];
  topo->uniform = 1;
  for (int h = 1; h < topo->hosts; h++) topo->uniform &= count[h] == count[0];
}

tnt_result_t tnt_topology_single(const tnt_placement_t *pl, tnt_topology_t *topo) {
  TNT_CHECK(alloc(topo, pl->size));
  topo->hosts = 1;
  group(topo, pl->rank);
  return TNT_SUCCESS;
}

tnt_result_t tnt_topology_discover(const tnt_transport_t *t, void *ts, const tnt_placement_t *pl, double timeout_s,
                                   tnt_topology_t *topo) {
  char mine[HOST_NAME_BYTES] = "";
  if (gethostname(mine, sizeof mine - 1) != 0) snprintf(mine, sizeof mine, "(unnamed)");
  char *all = malloc((size_t)pl->size * HOST_NAME_BYTES);
  size_t *lens = malloc((size_t)pl->size * sizeof *lens);
  tnt_result_t res = all && lens ? TNT_SUCCESS : tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  if (res == TNT_SUCCESS)
    res = t->exchange(ts, mine, strlen(mine) + 1, all, HOST_NAME_BYTES, lens, tnt_now() + timeout_s);
  if (res == TNT_SUCCESS) res = alloc(topo, pl->size);
  if (res == TNT_SUCCESS) {
    for (int r = 0; r < pl->size; r++) {
      const char *name = all + (size_t)r * HOST_NAME_BYTES;
      all[(size_t)r * HOST_NAME_BYTES + HOST_NAME_BYTES - 1] = '\0';
      int h = 0;
      while (h < r && strcmp(name, all + (size_t)h * HOST_NAME_BYTES)) h++;
      topo->host_of[r] = h < r ? topo->host_of[h] : topo->hosts++;
    }
    group(topo, pl->rank);
    TNT_INFO("%d ranks on %d hosts (%s): this host, %s, is host %d with %d ranks", pl->size, topo->hosts,
             topo->uniform ? "as many on each" : "uneven", mine, topo->host,
             tnt_topology_host_size(topo, topo->host));
  }
  free(all);
  free(lens);
  return res;
}

void tnt_topology_free(tnt_topology_t *topo) {
  free(topo->host_of);
  free(topo->index_of);
  free(topo->host_start);
  free(topo->members);
  memset(topo, 0, sizeof *topo);
}
