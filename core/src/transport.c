/* transport.c - the table of transports, probed in order for TNT_TRANSPORT=auto
 * (NCCL's ncclTransports[] pattern). MPI and GPI-2 come next, behind the same
 * struct; until then a multi-host placement gets a clear error. */
#include <string.h>

#include "common.h"
#include "transport.h"

static const tnt_transport_t *const transports[] = {&tnt_transport_shm};
static const char *const planned[] = {"mpi", "gpi2"};

tnt_result_t tnt_transport_select(const tnt_placement_t *pl, const tnt_params_t *params, const tnt_transport_t **out) {
  const char *want = params->transport;
  for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++) {
    const tnt_transport_t *t = transports[i];
    if (strcmp(want, "auto") && strcmp(want, t->name)) continue;
    if (!t->can_serve(pl)) {
      if (strcmp(want, "auto")) {
        return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                        "transport %s cannot serve this job: rank %d of %d sees %d ranks on its host (shm needs every "
                        "rank on one host); use TNT_TRANSPORT=auto or start the job on one host",
                        t->name, pl->rank, pl->size, pl->local_size);
      }
      continue;
    }
    TNT_INFO("transport %s selected (TNT_TRANSPORT=%s)", t->name, want);
    *out = t;
    return TNT_SUCCESS;
  }
  for (size_t i = 0; i < sizeof planned / sizeof planned[0]; i++)
    if (!strcmp(want, planned[i]))
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                      "transport %s is not available in this build of Tarantella yet; use TNT_TRANSPORT=shm (one host)",
                      want);
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "no transport can serve this job: %d ranks across several hosts (%d on this one) need the mpi or "
                  "gpi2 transport, which this build does not have yet",
                  pl->size, pl->local_size);
}
