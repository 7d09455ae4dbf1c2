/* topology.h - which ranks share a host, found once at set-up.
 *
 * Every rank publishes its host name in one exchange of the job's transport;
 * ranks with the same name are one host. Hosts are numbered in the order of
 * their lowest rank, and the ranks of a host in the order of their ranks, so
 * every rank computes the same map. The host name is what launchers group by
 * too (mpirun's --host, Slurm's nodes); the test bed gives every namespace
 * its own name. */
#ifndef TNT_TOPOLOGY_H
#define TNT_TOPOLOGY_H

#include "params.h"
#include "transport.h"

typedef struct {
  int size;        /* ranks */
  int hosts;       /* H */
  int host;        /* this rank's host */
  int *host_of;    /* [size] host of each rank */
  int *index_of;   /* [size] position of each rank among its host's ranks */
  int *host_start; /* [hosts + 1] where a host's ranks start in `members` */
  int *members;    /* [size] the ranks, host by host */
  int uniform;     /* every host has the same number of ranks */
} tnt_topology_t;

/* Every rank on one host (no exchange). */
tnt_result_t tnt_topology_single(const tnt_placement_t *pl, tnt_topology_t *topo);
/* One exchange of host names over `t` (collective: every rank calls it). */
tnt_result_t tnt_topology_discover(const tnt_transport_t *t, void *ts, const tnt_placement_t *pl, double timeout_s,
                                   tnt_topology_t *topo);
void tnt_topology_free(tnt_topology_t *topo);

static inline int tnt_topology_host_size(const tnt_topology_t *topo, int h) {
  return topo->host_start[h + 1] - topo->host_start[h];
}
/* The rank at position `index` of host `h`. */
static inline int tnt_topology_rank(const tnt_topology_t *topo, int h, int index) {
  return topo->members[topo->host_start[h] + index];
}

#endif
