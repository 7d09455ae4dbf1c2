/* transport.c - the table of transports, probed in order for TNT_TRANSPORT=auto
 * (NCCL's ncclTransports[] pattern). shm is built in; mpi and gpi2 are plugins
 * loaded at run time (plugin.c), only when asked for by name: `auto` keeps shm on one
 * host (choosing mpi across hosts comes with the hierarchical transport). */
#include <string.h>

#include "common.h"
#include "transport.h"
#include "transport_plugin.h"

static const tnt_transport_t *const transports[] = {&tnt_transport_shm};
static const char *const plugins[] = {"mpi", "gpi2"};

static tnt_result_t cannot_serve(const tnt_transport_t *t, const tnt_placement_t *pl) {
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "transport %s cannot serve this job: rank %d of %d sees %d ranks on its host (shm needs every "
                  "rank on one host); use TNT_TRANSPORT=mpi under mpirun/srun, or start the job on one host",
                  t->name, pl->rank, pl->size, pl->local_size);
}

tnt_result_t tnt_transport_select(const tnt_placement_t *pl, const tnt_params_t *params, const tnt_transport_t **out) {
  const char *want = params->transport;
  for (size_t i = 0; i < sizeof plugins / sizeof plugins[0]; i++) {
    if (strcmp(want, plugins[i])) continue;
    const tnt_transport_t *t = NULL;
    TNT_CHECK(tnt_plugin_transport(plugins[i], &t));
    if (!t->can_serve(pl)) return cannot_serve(t, pl);
    TNT_INFO("transport %s selected (TNT_TRANSPORT=%s)", t->name, want);
    *out = t;
    return TNT_SUCCESS;
  }
  for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++) {
    const tnt_transport_t *t = transports[i];
    if (strcmp(want, "auto") && strcmp(want, t->name)) continue;
    if (!t->can_serve(pl)) {
      if (strcmp(want, "auto")) return cannot_serve(t, pl);
      continue;
    }
    TNT_INFO("transport %s selected (TNT_TRANSPORT=%s)", t->name, want);
    *out = t;
    return TNT_SUCCESS;
  }
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "no transport can serve this job: %d ranks across several hosts (%d on this one); TNT_TRANSPORT=auto "
                  "does not pick mpi across hosts yet: start the job with mpirun/srun and TNT_TRANSPORT=mpi",
                  pl->size, pl->local_size);
}
