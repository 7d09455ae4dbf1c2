/* params.h - the TNT_* environment variables the core reads, one table row each. */
#ifndef TNT_PARAMS_H
#define TNT_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "tarantella.h"

typedef struct {
  int rank, size, local_rank, local_size;
  char job_id[128];     /* names the job's shared-memory objects */
  int from_launcher;    /* placement came from TNT_* (not an engine's variables) */
} tnt_placement_t;

typedef struct {
  int64_t fusion_threshold_bytes; /* TNT_FUSION_THRESHOLD_KB */
  double timeout_s;               /* TNT_TIMEOUT_S */
  double busy_timeout_s;          /* TNT_BUSY_TIMEOUT_S: a wait for a peer busy on its own (tnt_busy) */
  char transport[16];             /* TNT_TRANSPORT: auto, shm, mpi, gpi2 */
  char timeline[1024];            /* TNT_TIMELINE: trace file path, "" = off */
  int64_t shm_slot_bytes;         /* TNT_SHM_SLOT_KB: pipeline piece size */
  int shm_slots;                  /* TNT_SHM_SLOTS: pieces in flight per link */
  int cache_capacity;             /* TNT_CACHE_CAPACITY: negotiated names remembered */
  double spin_s;                  /* TNT_SPIN_US: busy-wait before sleeping (only with a core per rank) */
  int hierarchical;               /* TNT_HIERARCHICAL: allreduce by host, then between hosts (where it applies) */
  int bit_rounds;                 /* TNT_BIT_ROUNDS: steady-state cycles are an AND of bits (0: always full rounds) */
  int simd;                       /* TNT_SIMD: the highest float16/bfloat16 kernel level (tnt_half_level_t) */
  int64_t stream_min_bytes;       /* TNT_STREAM_MIN_KB: results this large are written past the cache */
  int shm_direct;                 /* TNT_SHM_DIRECT: more than 2 ranks over shm allreduce in place (0: the ring) */
  int mpi_pair_sum;               /* TNT_MPI_PAIR_SUM: a pair of ranks on two hosts sums in direct MPI messages */
  int64_t mpi_pair_piece_bytes;   /* TNT_MPI_PAIR_PIECE_KB: the largest of those messages */
  int rides;                      /* TNT_RIDES: a cached allreduce across hosts rides in its bit round (ride.h) */
  double net_spin_s;              /* TNT_NET_SPIN_US: how long a network transport's wait polls while the host has a core free */
  int shm_placement;              /* TNT_SHM_PLACEMENT: puts' stores timed (0), plain (1) or streaming (2): tnt_put_placement_t */
} tnt_params_t;

tnt_result_t tnt_params_read(tnt_params_t *p);
/* TNT_TIMEOUT_S read on its own, for a rank whose other settings (or placement) failed before
 * tnt_params_read got to it: its default where it is unset or itself bad. Sets no error. */
double tnt_params_timeout_s(void);
tnt_result_t tnt_placement_read(tnt_placement_t *pl);
/* How long a waiter may spin before it sleeps: params->spin_s when every local
 * rank has two cores of its own (its application thread and the background
 * thread), else 0 (2 or 8 ranks on 2 cores must never spin). */
double tnt_spin_seconds(const tnt_params_t *params, const tnt_placement_t *pl, long cores);

#endif
