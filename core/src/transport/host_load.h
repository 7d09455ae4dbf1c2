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
#include <stdint.h>
#include <stdio.h>
#include <string.h>
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

/* A set of CPUs that ranks may run on, in a form that travels (the shm
 * segment's header, the plugins' set-up records): CPU i is bit i % 64 of word
 * i / 64, and `unlisted` is the most CPUs of one rank whose mask did not fit
 * (ids from TNT_CPU_WORDS * 64 on) or could not be read. The cores of the
 * waits' budget are the union of a host's ranks' sets: ranks confined by
 * taskset, a container's cpuset or Slurm's binding to fewer cores than the
 * machine has count as many ranks per core as they really are. */
#define TNT_CPU_WORDS 16
typedef struct {
  uint64_t words[TNT_CPU_WORDS];
  uint32_t unlisted;
  uint32_t reserved;
} tnt_cpus_t;

/* This process's CPUs into *out; returns how many it has (the online CPUs
 * where its mask cannot be read). */
static inline long tnt_cpus_mine(tnt_cpus_t *out) {
  memset(out, 0, sizeof *out);
  size_t bytes;
  cpu_set_t *set = tnt_affinity(&bytes);
  const long mine = set ? CPU_COUNT_S(bytes, set) : tnt_online_cpus();
  int unlisted = !set;
  for (size_t cpu = 0; set && cpu < bytes * 8; cpu++) {
    if (!CPU_ISSET_S(cpu, bytes, set)) continue;
    if (cpu >= TNT_CPU_WORDS * 64) unlisted = 1;
    else out->words[cpu / 64] |= (uint64_t)1 << (cpu % 64);
  }
  if (set) CPU_FREE(set);
  if (unlisted) out->unlisted = (uint32_t)mine;
  return mine > 0 ? mine : 1;
}

/* *into |= *from. */
static inline void tnt_cpus_add(tnt_cpus_t *into, const tnt_cpus_t *from) {
  for (int w = 0; w < TNT_CPU_WORDS; w++) into->words[w] |= from->words[w];
  if (from->unlisted > into->unlisted) into->unlisted = from->unlisted;
}

/* How many CPUs a union holds (at least those of a rank whose mask did not fit). */
static inline long tnt_cpus_count(const tnt_cpus_t *cpus) {
  long n = 0;
  for (int w = 0; w < TNT_CPU_WORDS; w++) n += __builtin_popcountll(cpus->words[w]);
  n = n > (long)cpus->unlisted ? n : (long)cpus->unlisted;
  return n > 0 ? n : 1;
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
