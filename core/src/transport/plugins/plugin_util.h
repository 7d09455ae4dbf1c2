/* plugin_util.h - what both run-time transport plugins (plugins/mpi.c,
 * plugins/gpi2.c) do alike and cannot take from the core they do not link
 * against: futex, sleeps, the identity of this node, the backoff of a polled
 * wait and the idle thread's doorbell (how a plugin judges its peers' health
 * is peer_health.h; what both build alike on their own state,
 * shared_entries.h). What differs between them (every call into MPI or GPI-2)
 * stays in the plugin.
 *
 * Header-only (static inline), because each plugin is compiled alone, from its
 * one .c file, at first use; tarantella/common/plugins.py ships it with their
 * sources and includes it in their build digest.
 *
 * A plugin that includes it defines plugin_failed (what it does besides
 * reporting a failure, declared below) and sets `host` in its entry point. */
#ifndef TNT_PLUGIN_UTIL_H
#define TNT_PLUGIN_UTIL_H

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport_plugin.h"
#include "../host_load.h"
#include "../process_state.h"

#define SLEEP_MIN_S 10e-6  /* first idle sleep of a wait */
#define SLEEP_MAX_S 1e-3   /* longest idle sleep of a wait */
#define SLEEP_FLAT_S 2e-3  /* a wait polls at the shortest sleep this long before it backs off */

/* ---- the core's services ---- */

enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARNING = 2, LOG_ERROR = 3 }; /* the core's levels (common.h) */

static const tnt_plugin_host_t *host; /* set by the plugin's entry point */

/* Defined by each plugin: what it does at every failure it reports, before
 * the core records it (mpi.c notes that the job failed; gpi2.c nothing). */
static void plugin_failed(tnt_result_t code);

/* The plugin's error report: the core's fail() with a formatted message. */
static inline tnt_result_t failf(tnt_result_t code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline tnt_result_t failf(tnt_result_t code, int peer, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  plugin_failed(code);
  return host->fail(code, peer, msg);
}

/* A log line as the core writes it, from `file` (the plugin's source). */
static inline void plugin_log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void plugin_log(int level, const char *file, int line, const char *fmt, ...) {
  if (!host->log_enabled(level)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  host->log(level, file, line, msg);
}

/* Whether the core that loads the plugin speaks the plugin's ABI; else `why`
 * says what each side speaks. */
static inline int plugin_abi_matches(const tnt_plugin_host_t *h, char *why, size_t why_len) {
  if (h && h->abi_version == TNT_PLUGIN_ABI_VERSION && h->struct_size >= sizeof(tnt_plugin_host_t)) return 1;
  snprintf(why, why_len, "the core offers plugin ABI %u (%u-byte host table); this plugin was built for ABI %d",
           h ? h->abi_version : 0, h ? h->struct_size : 0, TNT_PLUGIN_ABI_VERSION);
  return 0;
}

/* The number of seconds in environment variable `name` ("meaning" says what
 * it sets, for the error), `dflt` when it is unset. */
static inline tnt_result_t read_seconds(const char *name, double dflt, double lo, double hi, const char *meaning,
                                        double *out) {
  const char *raw = getenv(name);
  *out = dflt;
  if (!raw || !*raw) return TNT_SUCCESS;
  char *end = NULL;
  double v = strtod(raw, &end);
  if (end == raw || *end || !(v >= lo && v <= hi))
    return failf(TNT_ERR_INVALID_ARGUMENT, -1, "environment variable %s must be a number between %g and %g (%s). "
                 "Received: %s=%s", name, lo, hi, meaning, name, raw);
  *out = v;
  return TNT_SUCCESS;
}

/* Whether `value`, a count that only grows, has reached `target`: compared
 * as a difference, so that a count that wrapped past 2^32 still has. */
static inline int reached(uint32_t value, uint32_t target) { return (int32_t)(value - target) >= 0; }

/* ---- sleeping and waking ---- */

static inline long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline struct timespec timespec_of(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  return ts;
}

static inline void sleep_s(double seconds) {
  struct timespec ts = timespec_of(seconds);
  nanosleep(&ts, NULL);
}

/* The idle thread's doorbell: a counter that a local request bumps (waking
 * the thread if it sleeps on it), and the thread's wait between polls of the
 * engine for a peer's round. Both plugins' engines have no wake-up of their
 * own for a peer's first message of a cycle, so the wait polls: every
 * SLEEP_MIN_S at first, twice as long each time up to poll_max_s. */
typedef struct {
  _Atomic uint32_t bell, waiters;
  uint32_t seen; /* the last bell the waiting thread answered */
  /* a cycle asked for by this rank's own engine: the thread that asked runs
   * it, so it does not wake the idle thread (peers' rounds do: the doorbell) */
  _Atomic uint64_t cycle_wanted;
} doorbell_t;

/* The engine wants cycle `cycle` (ring_doorbell): recorded for cycle_wanted,
 * no bell rung. */
static inline void doorbell_want_cycle(doorbell_t *d, uint64_t cycle) {
  uint64_t cur = atomic_load(&d->cycle_wanted);
  while (cur < cycle && !atomic_compare_exchange_weak(&d->cycle_wanted, &cur, cycle)) {
  }
}

static inline void doorbell_ring_local(doorbell_t *d) {
  atomic_fetch_add(&d->bell, 1);
  if (atomic_load(&d->waiters)) futex(&d->bell, FUTEX_WAKE, INT_MAX, NULL);
}

/* Return at a local ring, when peer_started(arg) (which polls the engine) says
 * a peer's round has begun, or at `deadline`. */
static inline void doorbell_wait(doorbell_t *d, double deadline, double poll_max_s, double (*now)(void),
                                 int (*peer_started)(void *), void *arg) {
  double sleep = SLEEP_MIN_S;
  for (;;) {
    uint32_t b = atomic_load(&d->bell);
    if (b != d->seen) { /* a local request, or a handed-over cycle */
      d->seen = b;
      return;
    }
    double t = now();
    if (t >= deadline) return;
    if (peer_started(arg)) return;
    if (atomic_load(&d->bell) != b) continue;
    double wait = deadline - t < sleep ? deadline - t : sleep;
    struct timespec ts = timespec_of(wait);
    atomic_fetch_add(&d->waiters, 1);
    if (atomic_load(&d->bell) == b) futex(&d->bell, FUTEX_WAIT, b, &ts);
    atomic_fetch_sub(&d->waiters, 1);
    sleep = sleep * 2 > poll_max_s ? poll_max_s : sleep * 2;
  }
}

/* ---- this node ---- */

/* The kernel (boot id) and pid namespace of this process: ranks that share
 * them can see each other's pids. */
static inline void node_id(char *out, size_t len) {
  char boot[64] = "?", ns[64] = "?";
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, boot, sizeof boot - 1);
    boot[n > 0 ? n : 0] = 0;
    close(fd);
    char *nl = strchr(boot, '\n');
    if (nl) *nl = 0;
  }
  ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  ns[n > 0 ? n : 0] = 0;
  snprintf(out, len, "%s/%s", boot, ns);
}

/* Whether a peer's node_id is ours, and known: its pid can be checked here. */
static inline int node_ids_match(const char *theirs, const char *ours) {
  return !strcmp(theirs, ours) && strcmp(ours, "?/?");
}

/* Whether the machine has a core to spare: the kernel's count of runnable
 * threads (/proc/loadavg's "running/total", the whole machine's, whatever
 * namespace we are in) is at most its online CPUs. Read by one thread of
 * the process at most every 5 ms; the answer in between is the last one. */
static inline int host_has_free_cores(double now) {
  static _Atomic long read_at_us;
  static _Atomic int free_cores = 1;
  static long online;
  long us = (long)(now * 1e6), last = atomic_load_explicit(&read_at_us, memory_order_relaxed);
  if (us - last >= 5000 && atomic_compare_exchange_strong(&read_at_us, &last, us)) {
    if (!online) online = tnt_online_cpus();
    long running = tnt_running_threads();
    if (running >= 0) atomic_store(&free_cores, running <= online);
  }
  return atomic_load_explicit(&free_cores, memory_order_relaxed);
}

/* ---- the machine's cores ---- */

/* The ranks that share this rank's machine (its kernel: node_id) and the
 * CPUs they may run on, the union of the sets (tnt_cpus_t) they sent in their
 * set-up records: what the waits' budget counts. Not the machine's online
 * CPUs, which take ranks confined to a few of them (taskset, a container's
 * cpuset) for ranks with cores to spare: two hosts of the test bed confined
 * to one CPU spun in every wait on the core the awaited rank was queued on.
 * Not the ranks of this host name alone: hosts that share a kernel (the test
 * bed's namespaces) share its cores. And not this rank's own mask, which
 * cannot tell a rank pinned to a core of its own (Slurm's binding) from ranks
 * that share that core. `node_of(all, r)` and `cpus_of(all, r)` read rank r's
 * record; rank `me`'s always counts. */
typedef struct {
  int ranks;
  long cores;
} machine_share_t;

static inline machine_share_t machine_share(int n, int me, const char *(*node_of)(const void *, int),
                                            const tnt_cpus_t *(*cpus_of)(const void *, int), const void *all) {
  tnt_cpus_t here;
  memset(&here, 0, sizeof here);
  machine_share_t m = {0, 0};
  for (int r = 0; r < n; r++)
    if (r == me || node_ids_match(node_of(all, r), node_of(all, me))) {
      tnt_cpus_add(&here, cpus_of(all, r));
      m.ranks++;
    }
  m.cores = tnt_cpus_count(&here);
  return m;
}

/* ---- a polled wait ---- */

/* How a wait polls before it sleeps (backoff_pause), from the ranks that
 * share this machine and their cores (machine_share). It spins (polls at
 * once) only where every such rank has a core, as a wait on shared memory
 * does (the caller drives the collective: its background thread is idle):
 * for TNT_NET_SPIN_US (or TNT_SPIN_US, whichever is longer), and only while
 * the machine has a core free. Then it polls yield_polls times with sched_yield between polls,
 * also where the ranks outnumber the cores (the rank it waits for is then
 * usually queued on its core). A wait across the network lasts a round trip
 * at least, tens of microseconds over TCP, longer than a wait on shared
 * memory, and a transfer over MPI's TCP transport moves only while its
 * receiver polls: one that slept after TNT_SPIN_US's 50 us took 0.62 ms for
 * 512 KB and 1.06 ms for 1 MB on 2 hosts x 1 rank against 0.38 and 0.75 ms
 * with 1 ms of polling (docs/benchmarks.md, "Polling through a round trip"). */
typedef struct {
  double spin_s;   /* how long a wait spins while the machine has a core free; 0 where it may not */
  int yield_polls; /* then polls with sched_yield before the wait sleeps */
} wait_policy_t;

static inline wait_policy_t wait_policy(const tnt_params_t *params, machine_share_t m, int yield_polls) {
  wait_policy_t w = {0.0, yield_polls};
  if (m.ranks <= m.cores) w.spin_s = params->net_spin_s > params->spin_s ? params->net_spin_s : params->spin_s;
  return w;
}

/* How this rank's waits that paused ended (the transport's wait_stats): how
 * the last pause of each went. */
typedef struct {
  _Atomic int64_t spun, yielded, slept;
} wait_counts_t;

/* One polled wait's idle state (zero it before the wait). */
typedef struct {
  int idle;
  int stage; /* how the last pause went: 0 none yet, 1 spun, 2 yielded, 3 slept */
  double start, sleep;
} backoff_t;

/* After a poll that found nothing: spin, then yield (a peer in the same
 * collective is usually microseconds away), as `w` says (above), then sleep
 * SLEEP_MIN_S at a time for SLEEP_FLAT_S, then twice as long each time up to
 * SLEEP_MAX_S. host_has_free_cores caches its answer. */
static inline void backoff_pause(backoff_t *b, const wait_policy_t *w, double now) {
  if (b->idle++ == 0) {
    b->start = now;
    b->sleep = SLEEP_MIN_S;
  }
  /* spinning at all only while the machine has a core free, as on shared memory: a core per rank
   * of the machine (wait_policy) says nothing of the other threads that want the cores */
  const double spin_s = w->spin_s > 0 && host_has_free_cores(now) ? w->spin_s : 0.0;
  if (now < b->start + spin_s) {
    b->stage = 1;
    return; /* poll again at once */
  }
  if (b->idle <= w->yield_polls) {
    b->stage = 2;
    sched_yield();
    return;
  }
  b->stage = 3;
  sleep_s(b->sleep);
  if (now >= b->start + SLEEP_FLAT_S) b->sleep = b->sleep * 2 > SLEEP_MAX_S ? SLEEP_MAX_S : b->sleep * 2;
}

/* The wait is over: count how it ended, if it paused at all. */
static inline void backoff_end(const backoff_t *b, wait_counts_t *counts) {
  if (b->stage == 1) atomic_fetch_add_explicit(&counts->spun, 1, memory_order_relaxed);
  else if (b->stage == 2) atomic_fetch_add_explicit(&counts->yielded, 1, memory_order_relaxed);
  else if (b->stage == 3) atomic_fetch_add_explicit(&counts->slept, 1, memory_order_relaxed);
}

static inline void wait_counts_read(const wait_counts_t *counts, int64_t *spun, int64_t *yielded, int64_t *slept) {
  *spun = atomic_load_explicit(&counts->spun, memory_order_relaxed);
  *yielded = atomic_load_explicit(&counts->yielded, memory_order_relaxed);
  *slept = atomic_load_explicit(&counts->slept, memory_order_relaxed);
}

#endif
