/* job_void.h - the mark of a job of one host that cannot start: /dev/shm/tnt-<job id>-void.
 *
 * What it is: a few hundred bytes (job_void.c's void_mark_t) saying why the job of that id is
 * over, when (the wall clock: it outlives every process of the job), which rank failed (or -1),
 * which process left it, and how long it counts (its job's TNT_TIMEOUT_S).
 *
 * Who writes it:
 *   - the shared-memory transport (shm.c), when it voids a segment during the set-up (two
 *     processes claimed one rank, a rank disagreed on the set-up): the segment's name is
 *     removed so that nothing large leaks, and the mark stays instead (tnt_job_void_leave);
 *   - a rank whose tnt_init failed before it joined the others (a bad setting of its own, such
 *     as TNT_FUSION_THRESHOLD_KB=abc on one rank): context.c, through
 *     tnt_job_void_note_failed_start, naming that rank;
 *   - a rank whose shm set-up failed (Ctrl-C, TNT_TIMEOUT_S, a peer that died) before every rank
 *     had attached: shm.c, through tnt_job_void_note_failed_rank. The segment's name goes with
 *     that failure, so a rank still to come could not see it there.
 *
 * Who reads it: the shm transport's set-up (tnt_job_void_lately), in a rank 0 before it makes
 * the segment and in every rank while it waits for rank 0's segment or for the others to
 * attach. Why: without it a rank that came later (the rest of a voided job, a TensorFlow import
 * late) found no segment and waited for a rank 0 until TNT_TIMEOUT_S, or, a rank 0, made a new
 * one and waited for ranks that had failed already; with it, it fails at once, saying why.
 *
 * When it counts: for a process started before it was left (a rank of that launch, late to call
 * in: TensorFlow's import alone takes seconds), for TNT_TIMEOUT_S (such a rank would have timed
 * out by then anyway). A job started again afterwards with the same id is a new one.
 *
 * Who removes it: a rank 0 starting the id anew when it no longer counts (older than its
 * timeout, or left before that rank 0's process started: a new launch), the failed rank itself
 * trying again, a rank 0 sweeping every stale mark of its user (tnt_job_void_sweep_stale), and
 * tntrun with its job (tnt-<job id>*). */
#ifndef TNT_JOB_VOID_H
#define TNT_JOB_VOID_H

#include "common.h"
#include "params.h"

/* Leave the mark of the job whose shared segment is `segment` ("/tnt-<job id>"), best effort:
 * `rank` is the job-wide rank that failed to start, or -1 for a voided segment; the mark counts
 * for `timeout_s` (the job's TNT_TIMEOUT_S). */
void tnt_job_void_leave(const char *segment, int rank, double timeout_s, const char *why);

/* This rank's tnt_init failed before the job was up (`why`): leave the job's mark, naming this
 * rank, so that the ranks waiting for it on this host fail at once, not at TNT_TIMEOUT_S. The
 * first reason stands: a mark that still counts is kept. No mark for a job of one rank. */
void tnt_job_void_note_failed_start(const tnt_placement_t *pl, double timeout_s, const char *why);
/* The same for the job of the shared segment `segment`, whose (job-wide) rank `rank` failed in
 * its set-up before every rank had attached (shm.c). */
void tnt_job_void_note_failed_rank(const char *segment, int rank, double timeout_s, const char *why);

/* Remove this user's marks of any job that no longer count (older than their job's
 * TNT_TIMEOUT_S): nothing else ends the mark of a random id, which is never used again. */
void tnt_job_void_sweep_stale(void);

/* 1 (and *res, the failure that rank `me` of job `job_id` reports) when the job of `segment`
 * was voided less than `timeout_s` ago and after this process started; else 0. A mark that does
 * not count is removed where `remove_stale` (a rank 0 about to start the id anew), and so is the
 * mark of rank `me`'s own failed start (it is trying again). */
int tnt_job_void_lately(const char *segment, int me, const char *job_id, double timeout_s, int remove_stale,
                        tnt_result_t *res);

#endif
