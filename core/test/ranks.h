/* ranks.h - what the multi-rank C tests (test_ranks.c, test_edges.c,
 * test_gpu_staging.c) do in each forked child to make it rank `r` of `n` ranks
 * on one host in job `job`, as tntrun would. */
#ifndef TNT_TEST_RANKS_H
#define TNT_TEST_RANKS_H

#include <stdio.h>
#include <stdlib.h>

static void become_rank(int r, int n, const char *job) {
  char v[32];
  snprintf(v, sizeof v, "%d", r);
  setenv("TNT_RANK", v, 1);
  setenv("TNT_LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("TNT_SIZE", v, 1);
  setenv("TNT_LOCAL_SIZE", v, 1);
  setenv("TNT_JOB_ID", job, 1);
}

#endif
