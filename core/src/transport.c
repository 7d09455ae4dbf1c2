/* transport.c - which transport serves the job (NCCL's ncclTransports[]
 * pattern: probed in order for TNT_TRANSPORT=auto).
 *
 *   auto   every rank on this host: shm. Ranks on several hosts: shm+mpi
 *          (transport/hier.c: shm within each host, mpi between hosts), or
 *          gpi2 for ranks that gaspi_run started (GASPI_RANK set: no MPI runs).
 *   shm    every rank must be on this host.
 *   mpi    the plugin, for every byte (same-host pairs included).
 *   gpi2   the plugin over GPI-2, for every byte (started by gaspi_run or tntrun).
 * The placement's local size says whether the ranks share this host: the
 * launcher's (tntrun, mpirun, srun) count of ranks per node. */
#define _GNU_SOURCE /* transport/host_load.h: the affinity mask */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "transport.h"
#include "transport_plugin.h"
#include "transport/host_load.h"

static const char *const plugins[] = {"mpi", "gpi2"};

static tnt_result_t cannot_serve(const tnt_transport_t *t, const tnt_placement_t *pl) {
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "transport %s cannot serve this job: rank %d of %d sees %d ranks on its host (shm needs every "
                  "rank on one host); use TNT_TRANSPORT=auto (shm within hosts, mpi between them) or "
                  "TNT_TRANSPORT=mpi under mpirun/srun, or start the job on one host. Received: TNT_TRANSPORT=%s, "
                  "%d of %d ranks on this host",
                  t->name, pl->rank, pl->size, pl->local_size, t->name, pl->local_size, pl->size);
}

/* The plugin transport `name` that auto needs for a job on several hosts, or
 * an error that says why auto wanted it (`started`, `role`) and why it cannot
 * be used (the loader's own error). */
static tnt_result_t plugin_for_auto(const char *name, const tnt_placement_t *pl, const char *started,
                                    const char *role, const tnt_transport_t **out) {
  if (tnt_plugin_transport(name, out) == TNT_SUCCESS) return TNT_SUCCESS;
  char why[768];
  snprintf(why, sizeof why, "%s", tnt_last_error());
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                  "the %d ranks of this job are on several hosts (%d on this one)%s: TNT_TRANSPORT=auto needs the %s "
                  "transport%s, and it cannot be used: %s",
                  pl->size, pl->local_size, started, name, role, why);
}

static tnt_result_t select_auto(const tnt_placement_t *pl, const tnt_transport_t **out) {
  if (tnt_transport_shm.can_serve(pl)) {
    TNT_INFO("transport shm selected (TNT_TRANSPORT=auto): all %d ranks are on this host", pl->size);
    *out = &tnt_transport_shm;
    return TNT_SUCCESS;
  }
  const char *gaspi = getenv("GASPI_RANK");
  if (gaspi && *gaspi) {
    const tnt_transport_t *gpi2 = NULL;
    TNT_CHECK(plugin_for_auto("gpi2", pl, " and were started by gaspi_run (GASPI_RANK is set)", "", &gpi2));
    TNT_INFO("transport gpi2 selected (TNT_TRANSPORT=auto): the %d ranks are on several hosts (%d on this one) and "
             "were started by gaspi_run (GASPI_RANK is set, no MPI runs): gpi2 for every byte",
             pl->size, pl->local_size);
    *out = gpi2;
    return TNT_SUCCESS;
  }
  const tnt_transport_t *mpi = NULL;
  TNT_CHECK(plugin_for_auto("mpi", pl, "", " between hosts", &mpi));
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
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "unknown transport %s: use auto, shm, mpi or gpi2", want);
}

int tnt_transport_regions(const tnt_transport_t *t) { return t == &tnt_transport_shm ? 1 : TNT_CHANNELS; }

/* An executable `name` on PATH (or `name` itself when it has a slash). */
static int on_path(const char *name) {
  if (strchr(name, '/')) return access(name, X_OK) == 0;
  const char *path = getenv("PATH");
  char dir[4096];
  for (const char *p = path ? path : ""; *p;) {
    size_t n = strcspn(p, ":");
    snprintf(dir, sizeof dir, "%.*s/%s", (int)n, p, name);
    if (n && access(dir, X_OK) == 0) return 1;
    p += n + (p[n] == ':');
  }
  return 0;
}

const char *tnt_transport_status(const char *name) {
  static __thread char why[1024];
  if (!name) return NULL;
  if (!strcmp(name, "shm")) return "";
  if (strcmp(name, "mpi")) return NULL; /* not known to this core: the caller asks the machine */
  const char *lib = getenv("TNT_MPI_PLUGIN");
  if (lib && *lib) { /* built (by Python, or named by the user): can it be loaded? */
    const tnt_transport_t *t = NULL;
    if (tnt_plugin_transport("mpi", &t) == TNT_SUCCESS) return "";
    snprintf(why, sizeof why, "%s", tnt_last_error());
    return why;
  }
  /* not built yet: it is built at first use with the MPI's compiler wrapper */
  const char *cc = getenv("TNT_MPICC");
  if (!cc || !*cc) cc = getenv("MPICC");
  if (cc && *cc) {
    char first[1024];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(cc, " "), cc);
    if (on_path(first)) return "";
    snprintf(why, sizeof why, "the MPI compiler wrapper %.900s (TNT_MPICC or MPICC) was not found", first);
    return why;
  }
  if (on_path("mpicc")) return "";
  return "no MPI found (no mpicc on PATH, nor TNT_MPICC / MPICC): install Open MPI (Debian/Ubuntu: apt-get install "
         "openmpi-bin libopenmpi-dev) or MPICH, or load your cluster's MPI module";
}

long tnt_transport_cores(const tnt_transport_t *t, void *ts) {
  return t->cores ? t->cores(ts) : tnt_online_cpus();
}
