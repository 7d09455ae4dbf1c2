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
 * works: its segment keeps its name until they have all attached.
 *
 * The other way round: a worker started before its rank's tnt_init that uses
 * Tarantella first claims the rank itself, in a job the other ranks then
 * complete with it (its ancestor is no rank yet: nothing refuses it). The
 * rank, calling in later, made a second job under the same id and waited for
 * ranks busy in the first, whose failure it then reported as theirs. Its
 * descendants tell: one that holds the job's segment open and whose pid is
 * in this rank's block took the rank (shm.c's worker_holding_my_rank). */
#define _GNU_SOURCE
#include "ancestry.h"
#include "process_state.h"

#include <dirent.h>
#include <fcntl.h>
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

int tnt_is_descendant(pid_t target) {
  const pid_t me = getpid();
  pid_t pid = target;
  for (int depth = 0; pid > 1 && depth < MAX_DEPTH; depth++) {
    pid = parent_of(pid);
    if (pid == me) return 1;
  }
  return 0;
}

/* Every process /proc lists, with its parent: how many (at most `cap`). */
static int all_processes(pid_t *pids, pid_t *parents, int cap) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while (n < cap && (e = readdir(d)) != NULL) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 1) continue;
    pid_t parent = parent_of((pid_t)pid);
    if (parent <= 0) continue; /* gone meanwhile */
    pids[n] = (pid_t)pid;
    parents[n++] = parent;
  }
  closedir(d);
  return n;
}

int tnt_descendants(pid_t *out, int cap) {
  enum { MAX_PROCESSES = 1 << 16 };
  pid_t *pids = malloc(2 * MAX_PROCESSES * sizeof *pids);
  if (!pids) return 0;
  pid_t *parents = pids + MAX_PROCESSES;
  int n = all_processes(pids, parents, MAX_PROCESSES), found = 0;
  /* breadth first from this process: each pass adds the children of the last pass's finds */
  const pid_t me = getpid();
  int from = 0, grew = 1;
  for (int depth = 0; grew && depth < MAX_DEPTH; depth++) {
    grew = 0;
    const int level_end = found;
    for (int i = 0; i < n && found < cap; i++) {
      int child = parents[i] == me && depth == 0;
      for (int j = from; !child && j < level_end; j++) child = parents[i] == out[j];
      if (child) {
        out[found++] = pids[i];
        grew = 1;
      }
    }
    from = level_end;
  }
  free(pids);
  return found;
}

int tnt_open_object_of(pid_t pid, const char *name) {
  char dir[64], want[256], deleted[280];
  snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
  snprintf(want, sizeof want, "/dev/shm%s", name);
  snprintf(deleted, sizeof deleted, "%s (deleted)", want);
  DIR *d = opendir(dir);
  if (!d) return -1;
  int fd = -1;
  struct dirent *e;
  while (fd < 0 && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char path[320], link[300];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    ssize_t len = readlink(path, link, sizeof link - 1);
    if (len <= 0) continue;
    link[len] = 0;
    if (!strcmp(link, want) || !strcmp(link, deleted)) fd = open(path, O_RDWR | O_CLOEXEC);
  }
  closedir(d);
  return fd;
}
