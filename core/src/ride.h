/* ride.h - a cached allreduce that rides in its bit round (transport.h's
 * and_post_ride; docs/design.md, "Rides").
 *
 * Across hosts the steady state pays two rounds per call: the bit round that
 * finds every rank ready, then the allreduce. A ride sends the allreduce's
 * scaled input with the bit round's words, and every step of the round's
 * recursive doubling adds its partner's running sum to its own. When the
 * round's AND shows every rank ready for that slot and every rank's input
 * reached every rank, the sum is the result: one round. Otherwise the sums
 * are thrown away and the slot runs the usual way; a rank that is late or
 * called something else sent no sum (or one of another tag), which ends
 * every sum downstream of it, so every rank decides alike.
 *
 * The sums are added in the order of the path the tensor takes otherwise,
 * so that its bits do not depend on the path: two ranks on two hosts,
 * position 0's operand first (allreduce_pair_direct.c); 2 hosts x 2 ranks,
 * tnt_reduce_in_hier_order's tree, (host k's two) + (host k+1's two) per
 * segment, which recursive doubling builds when its first step pairs the
 * ranks of a host (rank r with r ^ 1: ranks placed host by host). Where the
 * job has another shape, nothing rides. */
#ifndef TNT_RIDE_H
#define TNT_RIDE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "topology.h"
#include "transport.h"

/* The largest allreduce that rides: above it the ride's whole buffer per
 * step costs more than the round it saves (the hierarchical allreduce sends
 * each rank's 1/L across; a pair swaps halves from TNT_PAIR_SWAP_BYTES). */
#define TNT_RIDE_MAX_BYTES (256 * 1024)

typedef struct {
  size_t above, most;   /* allreduces of (above, most] bytes ride; most 0: none in this job */
  int N, hier;          /* 2 ranks; or (hier) 2 hosts x 2 ranks */
  int host_of[4], pos_of[4], rank_at[4];
  tnt_dtype_t dtype;    /* of the ride in flight */
  int64_t count;
  tnt_ride_t ride;      /* what the transport gets: ctx is this */
} tnt_rides_t;

/* Whether this job's allreduces ride, and from which size on (`above`: the
 * largest that rides in a full round already, tnt_one_round_bytes). `topo`:
 * the engine's, where it is hierarchical; NULL otherwise. */
void tnt_rides_setup(tnt_rides_t *r, const tnt_transport_t *t, const tnt_params_t *params, int N,
                     const tnt_topology_t *topo, size_t above);
/* Ready r->ride for a payload of `count` elements of `dtype` tagged `tag`. */
void tnt_rides_prepare(tnt_rides_t *r, uint64_t tag, tnt_dtype_t dtype, int64_t count);

#endif
