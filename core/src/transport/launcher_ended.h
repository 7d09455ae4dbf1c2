/* launcher_ended.h - ranks that the launcher saw end before they joined the job.
 *
 * A rank whose program returns or calls sys.exit before its first collective never joins
 * the job's segment, and the ranks that do join waited for it in their set-up until
 * TNT_TIMEOUT_S (300 s), told only that it "did not start". tntrun knows better: it started
 * that process and saw it end. It gives each rank TNT_LAUNCHER_DIR (the job's private folder)
 * and writes ended-rank<R> there, holding how rank R's process ended ("exit code 0"), as soon
 * as it ends. A waiting rank reads it for the ranks that have not joined, and fails within a
 * slice of its wait, naming the rank and how it ended. A rank that ended after joining is
 * told by the segment itself, not by this. */
#ifndef TNT_LAUNCHER_ENDED_H
#define TNT_LAUNCHER_ENDED_H

#include <stddef.h>

/* 1 when the launcher says global rank `rank` has ended, with how in `how` ("exit code 0");
 * 0 when it does not (no TNT_LAUNCHER_DIR: a launcher other than tntrun, or none). */
int tnt_launcher_rank_ended(int rank, char *how, size_t len);

#endif
