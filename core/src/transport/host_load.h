/* host_load.h - how many threads the machine runs now, and which CPUs this
 * process may use, for the host-wide budget of spinning (a waiter may
 * busy-wait only while a core is free).
 *
 * Header-only (static inline), compiled into the core (shm.c) and into the
 * run-time transport plugins (plugins/plugin_util.h), as process_state.h. */
#ifndef TNT_HOST_LOAD_H
#define TNT_HOST_LOAD_H

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

/* This process's affinity mask, *bytes long, to CPU_FREE; NULL where it cannot
 * be read. */
static inline cpu_set_t *tnt_affinity(size_t *bytes) {
  for (int ncpus = 1024; ncpus <= (1 << 16); ncpus *= 2) { /* the kernel's CPU ids may go beyond 1024 */
    cpu_set_t *set = CPU_ALLOC(ncpus);
    if (!set) return NULL;
    *bytes = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(*bytes, set);
    if (sched_getaffinity(0, *bytes, set) == 0) return set;
    CPU_FREE(set);
    if (errno != EINVAL) return NULL;
  }
  return NULL;
}

/* The machine's online CPUs: what /proc/loadavg's count of runnable threads
 * (tnt_running_threads) is measured against, since it counts the machine's. */
static inline long tnt_online_cpus(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? online : 1;
}

/* The kernel's count of runnable threads, /proc/loadavg's "running/total":
 * the whole machine's, whatever namespace we are in (-1: unknown). */
static inline long tnt_running_threads(void) {
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  long running = -1;
  if (n > 0) {
    buf[n] = 0;
    if (sscanf(buf, "%*s %*s %*s %ld/", &running) != 1) running = -1;
  }
  return running;
}

#endif
