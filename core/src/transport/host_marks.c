/* host_marks.c - which transport each rank of this host took (host_marks.h). */
#define _GNU_SOURCE
#include "host_marks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "process_state.h"

typedef struct {
  _Atomic int32_t pid; /* written last: the slot is whole once it is set */
  int32_t rank;
  char setting[16];
  char transport[24];
  uint64_t started; /* the writer's start (tnt_proc_stat_starttime; 0: unknown): with pid, that process */
  int64_t at_ns;    /* when the slot was written, on CLOCK_BOOTTIME (the clock of the processes' starts) */
} mark_t;

/* the marks of the set-up in progress (tnt_init holds its lock throughout) */
static struct {
  mark_t *slots;
  int count, me;
  size_t bytes;
  int64_t started_ns; /* when this process started, on CLOCK_BOOTTIME (0: unknown) */
  char name[192]; /* "/tnt-" + a job id of up to 100 characters + "-marks-" + a host name of up to 64 */
} cur;

/* Whether the slot of `pid` counts. While its writer lives (that pid, started when the slot says:
 * a pid used again is another process), it does; once it is gone, only if it was written after
 * this process started: a rank of this launch that failed and exited (its mark is why it
 * failed). A slot written before by a process gone since is a leftover: a job of this id killed
 * during its set-up (SIGKILL; an MPI rank that ended itself in MPI_Init) never removed the name,
 * and a hand-made relaunch of the id with another transport failed on it, naming a dead pid. A
 * start rounded down to the clock's tick errs toward counting. */
static int slot_counts(const mark_t *m, int32_t pid) {
  if (!cur.started_ns || !m->started || m->at_ns >= cur.started_ns) return 1;
  char buf[512];
  errno = 0;
  const char *fields = tnt_proc_stat_fields(pid, buf, sizeof buf);
  if (!fields) return errno != ENOENT; /* gone, or (unreadable) as before */
  if (fields[0] == ' ' && (fields[1] == 'Z' || fields[1] == 'X')) return 0; /* exited, not yet reaped */
  return tnt_proc_stat_starttime(fields) == m->started;
}

static tnt_result_t check(void) {
  const mark_t *mine = &cur.slots[cur.me];
  for (int i = 0; i < cur.count; i++) {
    const mark_t *m = &cur.slots[i];
    int32_t pid = atomic_load(&m->pid);
    if (i == cur.me || !pid || !slot_counts(m, pid)) continue;
    if (strncmp(m->transport, mine->transport, sizeof m->transport))
      return tnt_fail(TNT_ERR_INVALID_USAGE,
                      "the ranks of this host took different transports: rank %d (pid %d) %s (TNT_TRANSPORT=%s), "
                      "rank %d (pid %d) %s (TNT_TRANSPORT=%s); give every rank the same environment (tntrun does; "
                      "a launcher such as mpirun passes a variable set for one rank to that rank only)",
                      mine->rank, (int)getpid(), mine->transport, mine->setting, m->rank, (int)pid, m->transport,
                      m->setting);
  }
  return TNT_SUCCESS;
}

tnt_result_t tnt_host_marks_begin(const tnt_placement_t *pl, const char *setting, const char *transport) {
  tnt_host_marks_end();
  if (pl->local_size < 2 || pl->local_rank < 0 || pl->local_rank >= pl->local_size || !pl->job_id[0])
    return TNT_SUCCESS; /* alone on this host, or no job to name the segment after */
  /* the host's name in the segment's: hosts of the multi-host test bed share /dev/shm */
  char host[64] = "";
  if (gethostname(host, sizeof host - 1) != 0 || strchr(host, '/')) snprintf(host, sizeof host, "host");
  snprintf(cur.name, sizeof cur.name, "/tnt-%s-marks-%s", pl->job_id, host);
  cur.bytes = (size_t)pl->local_size * sizeof(mark_t);
  int fd = shm_open(cur.name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  struct stat st;
  /* best effort: no marks (another user's segment, no /dev/shm) only loses the early error */
  if (fd < 0) return TNT_SUCCESS;
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) ||
      (st.st_size < (off_t)cur.bytes && ftruncate(fd, (off_t)cur.bytes) != 0)) {
    close(fd);
    return TNT_SUCCESS;
  }
  void *base = mmap(NULL, cur.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return TNT_SUCCESS;
  cur.slots = base;
  cur.count = pl->local_size;
  cur.me = pl->local_rank;
  char buf[512];
  const char *fields = tnt_proc_stat_fields(getpid(), buf, sizeof buf);
  const unsigned long long started = fields ? tnt_proc_stat_starttime(fields) : 0;
  cur.started_ns = tnt_start_boottime_ns(started);
  mark_t *mine = &cur.slots[cur.me];
  atomic_store(&mine->pid, 0); /* a leftover's slot of this local rank: not whole while it is rewritten */
  mine->rank = pl->rank;
  snprintf(mine->setting, sizeof mine->setting, "%s", setting);
  snprintf(mine->transport, sizeof mine->transport, "%s", transport);
  mine->started = started;
  mine->at_ns = tnt_boottime_ns();
  atomic_store(&mine->pid, (int32_t)getpid());
  return check();
}

tnt_result_t tnt_host_marks_poll(void) { return cur.slots ? check() : TNT_SUCCESS; }

void tnt_host_marks_end(void) {
  if (!cur.slots) return;
  /* every rank of the host marked before its set-up, which it shares with the others: once
   * one ends, the name is no longer needed (a rank that still waits keeps its mapping) */
  munmap(cur.slots, cur.bytes);
  shm_unlink(cur.name);
  memset(&cur, 0, sizeof cur);
}
