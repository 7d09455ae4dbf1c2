/* job_void.c - the mark of a job of one host that cannot start (job_void.h). */
#define _GNU_SOURCE
#include "job_void.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "process_state.h"

#define VOID_MAGIC 0x544e5457u /* "TNTW" */
typedef struct {
  uint32_t magic;
  int32_t rank; /* the rank that failed to start, else -1 (a voided segment) */
  int64_t at_us; /* the wall clock (CLOCK_REALTIME): the mark outlives every process of the job */
  int32_t pid; /* the process that left it: its own mark never stops its own retry */
  int32_t counts_s; /* how long it counts (its job's TNT_TIMEOUT_S, rounded up): a stale one is swept */
  char why[512];
} void_mark_t;

static int64_t wall_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void void_mark_name(const char *segment, char *out, size_t len) { snprintf(out, len, "%s-void", segment); }

/* When this process was started, on the wall clock (from its start in /proc/self/stat, in
 * ticks since boot, and CLOCK_BOOTTIME); 0 when it cannot be told. */
static int64_t process_started_wall_us(void) {
  char buf[1024];
  const char *fields = tnt_proc_stat_fields(getpid(), buf, sizeof buf);
  const int64_t started = tnt_start_boottime_ns(fields ? tnt_proc_stat_starttime(fields) : 0);
  const int64_t now = tnt_boottime_ns();
  if (!started || !now) return 0;
  return wall_us() - (now - started) / 1000;
}

/* Leave the mark of the job whose segment is `segment` (best effort: without it, a latecomer
 * waits as before). `rank`: the rank that failed to start, or -1 for a voided segment. */
void tnt_job_void_leave(const char *segment, int rank, double timeout_s, const char *why) {
  char name[200];
  void_mark_name(segment, name, sizeof name);
  int fd = shm_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077)) {
    void_mark_t m;
    memset(&m, 0, sizeof m);
    m.magic = VOID_MAGIC;
    m.rank = rank;
    m.at_us = wall_us();
    m.pid = (int32_t)getpid();
    m.counts_s = timeout_s < 1 ? 1 : timeout_s > INT32_MAX ? INT32_MAX : (int32_t)timeout_s + (timeout_s > (int32_t)timeout_s);
    snprintf(m.why, sizeof m.why, "%s", why);
    if (pwrite(fd, &m, sizeof m, 0) != (ssize_t)sizeof m) { /* a mark cut short is read as none */
    }
  }
  close(fd);
}

static int read_mark(const char *name, void_mark_t *m) {
  int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct stat st;
  memset(m, 0, sizeof *m);
  const int ours = fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077);
  const int whole = ours && pread(fd, m, sizeof *m, 0) == (ssize_t)sizeof *m && m->magic == VOID_MAGIC;
  close(fd);
  m->why[sizeof m->why - 1] = 0;
  return whole;
}

void tnt_job_void_note_failed_rank(const char *segment, int rank, double timeout_s, const char *why) {
  char text[512], name[200];
  void_mark_name(segment, name, sizeof name);
  void_mark_t m;
  /* the first reason stands (a rank that failed because of the mark must not replace it) */
  if (read_mark(name, &m) && (double)(wall_us() - m.at_us) / 1e6 < timeout_s) return;
  snprintf(text, sizeof text, "rank %d (pid %d) failed to start: %s", rank, (int)getpid(), why);
  tnt_job_void_leave(segment, rank, timeout_s, text);
}

void tnt_job_void_note_failed_start(const tnt_placement_t *pl, double timeout_s, const char *why) {
  if (pl->size < 2 || !pl->job_id[0]) return;
  char segment[160];
  snprintf(segment, sizeof segment, "/tnt-%s", pl->job_id);
  tnt_job_void_note_failed_rank(segment, pl->rank, timeout_s, why);
}

/* Remove the marks of other jobs of this user that no longer count (older than their job's
 * TNT_TIMEOUT_S): a hand-made job whose rank failed to start leaves one, and nothing else ends
 * it unless the id is used again (a random id never is), so they gathered in /dev/shm. A rank 0
 * about to start a job sweeps them, as it removes a stale mark of its own id. */
void tnt_job_void_sweep_stale(void) {
  DIR *dir = opendir("/dev/shm");
  if (!dir) return;
  const size_t suffix = strlen("-void");
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    const size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, "tnt-", 4) != 0 || n <= 4 + suffix || strcmp(e->d_name + n - suffix, "-void") != 0)
      continue;
    char name[NAME_MAX + 2];
    snprintf(name, sizeof name, "/%s", e->d_name);
    void_mark_t m;
    if (!read_mark(name, &m)) continue; /* another user's, or not a mark */
    const double age = (double)(wall_us() - m.at_us) / 1e6;
    if (age > (m.counts_s > 0 ? m.counts_s : 300)) shm_unlink(name);
  }
  closedir(dir);
}

/* 1 (and *res) when a job of this id was voided less than `timeout_s` ago, after this process
 * started; a mark that does not count is removed by a rank 0 (`remove_stale`), which is about to
 * start the id anew. */
int tnt_job_void_lately(const char *segment, int me, const char *job_id, double timeout_s, int remove_stale,
                        tnt_result_t *res) {
  char name[200];
  void_mark_name(segment, name, sizeof name);
  void_mark_t m;
  if (!read_mark(name, &m)) return 0;
  const double age = (double)(wall_us() - m.at_us) / 1e6;
  const int64_t started = process_started_wall_us();
  /* another launch's: long over, or before this process began (a job started again after the
   * failure, with the same id; 1 s of slack for the start's resolution) */
  const int stale = age > timeout_s || age < -60 || (started && started > m.at_us + 1000000);
  /* or this process's own failure: it may try again (its setting fixed) */
  if (stale || m.pid == (int32_t)getpid()) {
    /* the failed rank trying again (a process started again, or the same one's next try) stands
     * in for the failed one, and the mark goes (a new failure leaves it again): else it failed
     * the retries of the ranks still up (a loop around tnt.init) for TNT_TIMEOUT_S while this
     * one waited for them */
    if ((stale && remove_stale) || (m.rank >= 0 && m.rank == me)) shm_unlink(name);
    return 0;
  }
  if (m.rank >= 0) /* a rank that failed before it joined: the others fail at once, naming it */
    *res = tnt_fail_peer(m.rank, "rank %d: the job cannot start: %s (%.1f s ago). Fix it and start every rank "
                         "again", me, m.why, age > 0 ? age : 0);
  else
    *res = tnt_fail(TNT_ERR_INVALID_USAGE,
                    "rank %d: job %s was voided %.1f s ago, before this rank joined it (%s). Start the job again "
                    "with a fresh TNT_JOB_ID (tntrun makes one per job); the id can be reused once /dev/shm%s is "
                    "removed, or TNT_TIMEOUT_S after it was left",
                    me, job_id, age > 0 ? age : 0, m.why, name);
  return 1;
}
