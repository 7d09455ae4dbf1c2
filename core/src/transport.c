/* transport.c - which transport serves the job (NCCL's ncclTransports[]
 * pattern: probed in order for TNT_TRANSPORT=auto).
 *
 *   auto   every rank on this host: shm. Ranks on several hosts: shm+mpi
 *          (transport/hier.c: shm within each host, mpi between hosts).
 *   shm    every rank must be on this host.
 *   mpi    the plugin, for every byte (same-host pairs included).
 * The placement's local size says whether the ranks share this host: the
 * launcher's (tntrun, mpirun, srun) count of ranks per node. */
#include <string.h>

#include "common.h"
#include "transport.h"
#include "transport_plugin.h"

static const char *const plugins[] = {"mpi"};
static const char *const planned[] = {"gpi2"};

static tnt_result_t cannot_serve(const tnt_transport_t *t, const tnt_placement_t *pl) {
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "transport %s cannot serve this job: rank %d of %d sees %d ranks on its host (shm needs every "
                  "rank on one host); use TNT_TRANSPORT=auto (shm within hosts, mpi between them) or "
                  "TNT_TRANSPORT=mpi under mpirun/srun, or start the job on one host",
                  t->name, pl->rank, pl->size, pl->local_size);
}

static tnt_result_t select_auto(const tnt_placement_t *pl, const tnt_transport_t **out) {
  if (tnt_transport_shm.can_serve(pl)) {
    TNT_INFO("transport shm selected (TNT_TRANSPORT=auto): all %d ranks are on this host", pl->size);
    *out = &tnt_transport_shm;
    return TNT_SUCCESS;
  }
  const tnt_transport_t *mpi = NULL;
  if (tnt_plugin_transport("mpi", &mpi) != TNT_SUCCESS) {
    char why[768];
    snprintf(why, sizeof why, "%s", tnt_last_error());
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                    "the %d ranks of this job are on several hosts (%d on this one): TNT_TRANSPORT=auto needs the "
                    "mpi transport between hosts, and it cannot be used: %s",
                    pl->size, pl->local_size, why);
  }
  TNT_INFO("transport shm+mpi selected (TNT_TRANSPORT=auto): the %d ranks are on several hosts (%d on this one): "
           "shm within each host, mpi between hosts",
           pl->size, pl->local_size);
  *out = &tnt_transport_hier;
  return TNT_SUCCESS;
}

tnt_result_t tnt_transport_select(const tnt_placement_t *pl, const tnt_params_t *params, const tnt_transport_t **out) {
  const char *want = params->transport;
  if (!strcmp(want, "auto")) return select_auto(pl, out);
  if (!strcmp(want, "shm")) {
    if (!tnt_transport_shm.can_serve(pl)) return cannot_serve(&tnt_transport_shm, pl);
    TNT_INFO("transport shm selected (TNT_TRANSPORT=shm)");
    *out = &tnt_transport_shm;
    return TNT_SUCCESS;
  }
  for (size_t i = 0; i < sizeof plugins / sizeof plugins[0]; i++) {
    if (strcmp(want, plugins[i])) continue;
    const tnt_transport_t *t = NULL;
    TNT_CHECK(tnt_plugin_transport(plugins[i], &t));
    if (!t->can_serve(pl)) return cannot_serve(t, pl);
    TNT_INFO("transport %s selected (TNT_TRANSPORT=%s): every byte goes through it, same-host pairs included",
             t->name, want);
    *out = t;
    return TNT_SUCCESS;
  }
  for (size_t i = 0; i < sizeof planned / sizeof planned[0]; i++)
    if (!strcmp(want, planned[i]))
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                      "transport %s is not available in this build of Tarantella yet; use TNT_TRANSPORT=auto (shm "
                      "on one host, shm+mpi across hosts) or TNT_TRANSPORT=mpi (under mpirun/srun)",
                      want);
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "unknown transport %s: use auto, shm or mpi", want);
}

int tnt_transport_regions(const tnt_transport_t *t) { return t == &tnt_transport_shm ? 1 : TNT_CHANNELS; }
