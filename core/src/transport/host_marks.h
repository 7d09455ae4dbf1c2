/* host_marks.h - which transport each rank of this host took, for ranks that must agree.
 *
 * Ranks started by hand (a bare mpirun or srun, no tntrun) can read different TNT_TRANSPORT
 * values: `TNT_TRANSPORT=shm` set for one rank, `mpi` for another of the same host. Each then
 * waits for the other in its own set-up (shm for the rank to attach, MPI_Init for the rank
 * to join MPI) until TNT_TIMEOUT_S, and the shm rank's error said only that a rank did not
 * start. Before its transport's set-up every rank of a host with several (local size > 1)
 * writes its choice into a small segment of this host, /dev/shm/tnt-<job id>-marks-<host>, and
 * fails at once when another rank's differs, naming both; the shm transport checks it again
 * while it waits for its peers (tnt_host_marks_poll), so whichever rank comes first, the one
 * that waits fails too. The segment is removed when the set-up ends, well or not. A rank killed
 * in its set-up leaves it: a slot whose writer is gone counts only if it was written after the
 * reader started (a rank of its launch that failed and exited), so that a relaunch of the id
 * with another transport is not failed by a leftover's dead pid, and the relaunch removes it. */
#ifndef TNT_HOST_MARKS_H
#define TNT_HOST_MARKS_H

#include "common.h"
#include "params.h"

/* Mark this rank's `transport` (what it selected; `setting`: its TNT_TRANSPORT) and check
 * the marks there are; the marks stay current until tnt_host_marks_end. */
tnt_result_t tnt_host_marks_begin(const tnt_placement_t *pl, const char *setting, const char *transport);
/* Check the current marks again (TNT_SUCCESS when there are none). */
tnt_result_t tnt_host_marks_poll(void);
/* The set-up ended: unmap and remove the marks. */
void tnt_host_marks_end(void);

#endif
