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
 * Where it rides: 2 hosts x 2 ranks placed host by host, whose recursive
 * doubling pairs the ranks of a host first (rank r with r ^ 1), then each
 * with its place on the other host. The first step reads the partner's
 * payload where it lies, in the host's shared memory (transport.h's
 * ride_shared: MPI's own shared memory took 84-138 us for 64 KiB), and sends
 * only the words; the second sends the host's sum. Two ranks on two hosts
 * gained nothing (docs/benchmarks.md, "Rides"): there nothing rides.
 *
 * The sums are added in the order of the path the tensor takes otherwise,
 * tnt_reduce_in_hier_order's tree, (host k's two) + (host k+1's two) per
 * segment, so that its bits do not depend on the path. */
#ifndef TNT_RIDE_H
#define TNT_RIDE_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "topology.h"
#include "transport.h"

/* The largest allreduce that rides: its message across, with the words, must
 * leave without MPI's rendezvous (under the mpi plugin's 72 KiB eager limit
 * for Open MPI's TCP): riding, 128 KB went 0.73x as fast as the usual path;
 * 4 B - 64 KB go 1.14-1.82x as fast (docs/benchmarks.md, "Rides"). */
#define TNT_RIDE_MAX_BYTES (64 * 1024)

typedef struct {
  size_t most;          /* allreduces of up to this many bytes ride; 0: none in this job */
  int host_of[4], pos_of[4], rank_at[4];
  const tnt_transport_t *t;
  void *ts;
  tnt_dtype_t dtype;    /* of the ride in flight */
  int64_t count;
  int parity;           /* of its cycle: which shared buffer (transport.h's ride_shared) */
  tnt_ride_t ride;      /* what the transport gets: ctx is this */
} tnt_rides_t;

/* Whether this job's allreduces ride. `topo`: the engine's, where its
 * allreduce is hierarchical; NULL otherwise. */
void tnt_rides_setup(tnt_rides_t *r, const tnt_transport_t *t, void *ts, const tnt_params_t *params, int rank,
                     int N, const tnt_topology_t *topo);
/* Ready r->ride for a payload of `count` elements of `dtype` tagged `tag`, in
 * a cycle of `parity`: where this rank writes its payload (NULL: it cannot). */
void *tnt_rides_prepare(tnt_rides_t *r, uint64_t tag, tnt_dtype_t dtype, int64_t count, int parity, int rank);

#endif
