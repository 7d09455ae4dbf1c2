/* process_state.h - what a local peer's process is doing, from /proc.
 *
 * Header-only (static inline) because it is compiled into the core (shm.c) and
 * into the run-time transport plugins (plugins/mpi.c, plugins/gpi2.c), which
 * cannot link against the core: tarantella/common/plugins.py ships it with
 * their sources and includes it in their build digest. */
#ifndef TNT_PROCESS_STATE_H
#define TNT_PROCESS_STATE_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* The fields of /proc/<pid>/stat after the command name, from the space before the
 * state (field 3), read into `buf`; NULL when they cannot be read (errno ENOENT: the
 * process is gone). */
static inline const char *tnt_proc_stat_fields(pid_t pid, char *buf, size_t len) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  ssize_t n = read(fd, buf, len - 1);
  close(fd);
  if (n <= 0) return NULL;
  buf[n] = 0;
  const char *paren = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  return paren ? paren + 1 : NULL;
}

/* The start of a process in clock ticks since boot (field 22 of /proc/<pid>/stat), from the
 * fields tnt_proc_stat_fields read; 0 when they hold none. With the pid, it names one process:
 * a pid used again later comes with a later start. */
static inline unsigned long long tnt_proc_stat_starttime(const char *fields) {
  const char *p = fields;
  /* from the space before field 3 (state), each one up to that before field 22 (starttime) */
  for (int field = 4; field <= 22 && p; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* CLOCK_BOOTTIME in nanoseconds, the clock of the processes' starts; 0 when it cannot be read. */
static inline int64_t tnt_boottime_ns(void) {
  struct timespec ts;
  return clock_gettime(CLOCK_BOOTTIME, &ts) == 0 ? (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec : 0;
}

/* A process's start (tnt_proc_stat_starttime, clock ticks since boot) on tnt_boottime_ns's
 * clock; 0 when unknown. */
static inline int64_t tnt_start_boottime_ns(unsigned long long ticks) {
  const long hz = sysconf(_SC_CLK_TCK);
  if (!ticks || hz <= 0) return 0;
  const unsigned long long per_s = (unsigned long long)hz;
  return (int64_t)(ticks / per_s) * 1000000000 + (int64_t)(ticks % per_s) * 1000000000 / hz;
}

/* The scheduler state letter of a process ('R', 'S', 'T' stopped, 'Z' zombie...),
 * 'X' when it is gone, '?' when it cannot be read. */
static inline char tnt_process_state(pid_t pid) {
  if (pid <= 0) return '?';
  if (kill(pid, 0) != 0 && errno == ESRCH) return 'X';
  char buf[512];
  errno = 0;
  const char *fields = tnt_proc_stat_fields(pid, buf, sizeof buf);
  if (!fields) return errno == ENOENT ? 'X' : '?';
  return fields[0] == ' ' ? fields[1] : '?';
}

/* What a peer process in `state` (tnt_process_state) is doing, for errors that
 * name a rank that did not answer. */
static inline const char *tnt_process_doing(char state) {
  return state == 'T' || state == 't' ? "is stopped (SIGSTOP or a debugger): resume it with SIGCONT or kill it"
         : state == 'D'               ? "is blocked in the kernel (disk or network I/O)"
         : state == 'X' || state == 'Z' ? "has exited"
                                      : "is alive but did not answer: it may be hung or busy outside Tarantella";
}

#endif
