/* ancestry.c - a process started by a rank is not a rank of its job.
 *
 * A worker that a rank starts (os.fork, a multiprocessing pool, a data
 * loader's workers, a subprocess) inherits the rank's environment: TNT_RANK
 * and TNT_JOB_ID. Started after tnt_init, it is refused (fork: context.c; a
 * spawned Python: TNT_RANK_PID in tarantella/common/core.py). Started before,
 * nothing marked it, and its tnt_init (Python: a worker's tnt.get_rank())
 * found the job's segment name gone (removed once every rank has attached)
 * and made a second job under the same id: it waited TNT_TIMEOUT_S for ranks
 * that never came, or paired with the other ranks' workers without a word.
 * Its ancestors tell: one that maps the job's segment after its name was
 * removed belongs to a job that is complete. A rank that starts the other
 * ranks itself before its own tnt_init (a launcher of one's own) still
 * works: its segment keeps its name until they have all attached. */
#define _GNU_SOURCE
#include "ancestry.h"
#include "process_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_DEPTH = 64 }; /* a chain of processes longer than this is not worth reading */

/* The parent of `pid`, from /proc/<pid>/stat; 0 when it cannot be read. */
static pid_t parent_of(pid_t pid) {
  char buf[512];
  const char *fields = tnt_proc_stat_fields(pid, buf, sizeof buf);
  int ppid = 0;
  if (!fields || sscanf(fields, " %*c %d", &ppid) != 1) return 0;
  return (pid_t)ppid;
}

/* Whether `pid` maps a file whose maps line ends with `path` (the line's path
 * is its last field). */
static int maps_path(pid_t pid, const char *path) {
  char file[64];
  snprintf(file, sizeof file, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(file, "re");
  if (!f) return 0;
  char *line = NULL;
  size_t cap = 0, want = strlen(path);
  ssize_t len;
  int found = 0;
  while (!found && (len = getline(&line, &cap, f)) > 0) {
    if (line[len - 1] == '\n') line[--len] = 0;
    found = (size_t)len > want && line[len - want - 1] == ' ' && !strcmp(line + len - want, path);
  }
  free(line);
  fclose(f);
  return found;
}

pid_t tnt_ancestor_in_job(const char *name) {
  char path[256];
  snprintf(path, sizeof path, "/dev/shm%s (deleted)", name);
  pid_t pid = getppid();
  for (int depth = 0; pid > 1 && depth < MAX_DEPTH; depth++) {
    if (maps_path(pid, path)) return pid;
    pid = parent_of(pid);
  }
  return 0;
}

int tnt_is_ancestor(pid_t target) {
  pid_t pid = getppid();
  for (int depth = 0; target > 1 && pid > 1 && depth < MAX_DEPTH; depth++) {
    if (pid == target) return 1;
    pid = parent_of(pid);
  }
  return 0;
}
