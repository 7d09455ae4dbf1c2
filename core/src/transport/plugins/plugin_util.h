/* plugin_util.h - what every run-time transport plugin needs and cannot take
 * from the core it does not link against: futex, sleeps, the identity of this
 * node, the backoff of a polled wait, and the message naming silent peers.
 *
 * Header-only (static inline), shared by plugins/mpi.c and plugins/gpi2.c;
 * tarantella/common/plugins.py ships it with their sources and includes it in
 * their build digest. */
#ifndef TNT_PLUGIN_UTIL_H
#define TNT_PLUGIN_UTIL_H

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../host_load.h"

#define SLEEP_MIN_S 10e-6  /* first idle sleep of a wait */
#define SLEEP_MAX_S 1e-3   /* longest idle sleep of a wait */
#define SLEEP_FLAT_S 2e-3  /* a wait polls at the shortest sleep this long before it backs off */

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
} doorbell_t;

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

/* Whether the machine has a core to spare: the kernel's count of runnable
 * threads (/proc/loadavg's "running/total", the whole machine's, whatever
 * namespace we are in) is at most the number of cores. Read by one thread of
 * the process at most every 5 ms; the answer in between is the last one. */
static inline int host_has_free_cores(double now) {
  static _Atomic long read_at_us;
  static _Atomic int free_cores = 1;
  static long ncpu;
  long us = (long)(now * 1e6), last = atomic_load_explicit(&read_at_us, memory_order_relaxed);
  if (us - last >= 5000 && atomic_compare_exchange_strong(&read_at_us, &last, us)) {
    if (!ncpu) ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    long running = tnt_running_threads();
    if (running >= 0) atomic_store(&free_cores, running <= ncpu);
  }
  return atomic_load_explicit(&free_cores, memory_order_relaxed);
}

/* One polled wait's idle state (zero it before the wait). */
typedef struct {
  int idle;
  double start, sleep;
} backoff_t;

/* Spin for spin_s (only set with a core to spare), yield for yield_polls polls
 * (a peer in the same collective is usually microseconds away), then sleep
 * SLEEP_MIN_S at a time for SLEEP_FLAT_S, then twice as long each time up to
 * SLEEP_MAX_S. */
static inline void backoff_pause(backoff_t *b, double spin_s, int yield_polls, double now) {
  if (b->idle++ == 0) {
    b->start = now;
    b->sleep = SLEEP_MIN_S;
  }
  if (now < b->start + spin_s) return; /* poll again at once */
  if (b->idle <= yield_polls) {
    sched_yield();
    return;
  }
  sleep_s(b->sleep);
  if (now >= b->start + SLEEP_FLAT_S) b->sleep = b->sleep * 2 > SLEEP_MAX_S ? SLEEP_MAX_S : b->sleep * 2;
}

/* A peer as silent_message sees it (the plugins' peer records differ). */
typedef struct {
  int alive, pid;
  const char *host;
  double last_heard;
} peer_view_t;
typedef void (*peer_view_fn)(void *state, int peer, peer_view_t *out);

/* The message of peer `r` silent past `bound` seconds. A host cut off silences
 * all its ranks at once, but their last heartbeats came at slightly different
 * times: when `r` crosses the bound, the others of the same loss have been
 * silent for nearly as long. Every peer silent for half the bound is named
 * with it, grouped by host, r's host first: "ranks 2 (pid 71), 3 (pid 72) on
 * hostB sent nothing for 2.0 s while rank 0 was ...: their process or host
 * died, ..." (a healthy peer is silent for about one heartbeat). `doing` is
 * what r's process is doing where that can be told ("" else), `beat_var` the
 * heartbeat's variable. */
static inline void silent_message(void *state, peer_view_fn view, int n, int me, int r, double now, double bound,
                                  const char *what, const char *doing, double beat_s, const char *beat_var,
                                  int beats, char *out, size_t len) {
  char who[512] = "";
  size_t at = 0;
  int named = 0, count = 0;
  uint8_t *done = calloc((size_t)n, 1);
  peer_view_t lead, q;
  for (int k = -1; done && k < n; k++) { /* k = -1: r's host first */
    int l = k < 0 ? r : k;
    view(state, l, &lead);
    if (l == me || done[l] || !lead.alive || now - lead.last_heard <= bound / 2) continue;
    char ranks[384] = "";
    size_t rat = 0;
    int here = 0;
    for (int p = 0; p < n; p++) {
      view(state, p, &q);
      if (p == me || done[p] || !q.alive || strcmp(q.host, lead.host) || now - q.last_heard <= bound / 2) continue;
      done[p] = 1;
      if (rat < sizeof ranks)
        rat += (size_t)snprintf(ranks + rat, sizeof ranks - rat, "%s%d (pid %d)", here ? ", " : "", p, q.pid);
      here++;
    }
    if (at < sizeof who)
      at += (size_t)snprintf(who + at, sizeof who - at, "%s%s %s on %s", named ? " and " : "",
                             here > 1 ? "ranks" : "rank", ranks, lead.host);
    named++;
    count += here;
  }
  free(done);
  view(state, r, &lead);
  if (!count) { /* out of memory: r alone */
    snprintf(who, sizeof who, "rank %d (pid %d) on %s", r, lead.pid, lead.host);
    count = 1;
  }
  int many = count > 1;
  snprintf(out, len,
           "%s sent nothing for %.1f s while rank %d was %s: %s process or host died, %s cut off, or %s hang%s%s%s "
           "(every rank sends a heartbeat every %g s, %s; %d missed mean lost)",
           who, now - lead.last_heard, me, what, many ? "their" : "its", many ? "they are" : "it is",
           many ? "they" : "it", many ? "" : "s", doing[0] ? "; it " : "", doing, beat_s, beat_var, beats);
}

#endif
