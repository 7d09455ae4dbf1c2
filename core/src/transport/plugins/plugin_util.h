/* plugin_util.h - what both run-time transport plugins (plugins/mpi.c,
 * plugins/gpi2.c) do alike and cannot take from the core they do not link
 * against: futex, sleeps, the identity of this node, the backoff of a polled
 * wait, the idle thread's doorbell, and how a plugin judges its peers' health
 * and words their failures (one copy, so that a lost rank reads the same under
 * either transport). What differs between them (every call into MPI or GPI-2)
 * stays in the plugin.
 *
 * Header-only (static inline), because each plugin is compiled alone, from its
 * one .c file, at first use; tarantella/common/plugins.py ships it with their
 * sources and includes it in their build digest.
 *
 * A plugin that includes it defines failf (its error report, declared below)
 * and sets `host` in its entry point. */
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

static const tnt_plugin_host_t *host; /* set by the plugin's entry point */

/* The plugin's error report, defined by each plugin: the core's fail() with a
 * formatted message (mpi.c also notes that the job failed). */
static tnt_result_t failf(tnt_result_t code, int peer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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

/* ---- a polled wait ---- */

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

/* ---- peers' health ----
 *
 * Neither engine tells of a peer that died or froze (GPI-2 marks only a broken
 * connection, which gpi2.c checks besides these), so both plugins keep the
 * same record of every peer, each from its own engine's messages (heard from,
 * a goodbye, an abort), and judge it by the same rules: a local peer whose
 * process is gone is lost, and so is a peer silent for SILENT_BEATS
 * heartbeats. */

enum { PEER_ALIVE = 0, PEER_EXITED = 1, PEER_FAILED = 2 };

#define REASON_MAX 512  /* an abort's reason, as it travels */
#define SILENT_BEATS 10 /* heartbeats a peer may miss before it is lost */
#define PID_CHECK_S 0.1 /* how often a waiter checks local peers' pids */

typedef struct {
  int state;      /* PEER_ALIVE, PEER_EXITED (it said goodbye) or PEER_FAILED (it aborted) */
  int root;       /* the rank an aborted peer named as the cause (-1: none) */
  int pid, local; /* local: same kernel and pid namespace (node_ids_match), so its pid can be checked */
  char host[64];
  char reason[REASON_MAX]; /* why it aborted */
  double last_heard, last_sent;
} peer_health_t;

/* What this rank knows of the job's health. Guarded by the plugin's lock (`mu`),
 * which the functions below expect held, but for describe and timed_out,
 * which take it. */
typedef struct {
  int me, n;
  peer_health_t *peer;      /* [n] */
  double beat_s, silence_s; /* the heartbeat's period, and the silence that loses a peer */
  const char *beat_var;     /* the heartbeat's environment variable, named in messages */
  pthread_mutex_t *mu;
  /* a failure seen where none can be returned (an engine's progress): the
   * first is kept, and the next wait reports it */
  tnt_result_t err_code;
  int err_peer;
  char err[768];
} job_health_t;

/* Keep a failure seen where it cannot be returned (the first one only). */
static inline void sticky(job_health_t *h, tnt_result_t code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void sticky(job_health_t *h, tnt_result_t code, int peer, const char *fmt, ...) {
  if (h->err_code != TNT_SUCCESS) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->err, sizeof h->err, fmt, ap);
  va_end(ap);
  h->err_code = code;
  h->err_peer = peer;
}

/* The failure sticky kept, reported as met while this rank was `what`
 * (TNT_SUCCESS: none kept). */
static inline tnt_result_t held_failure(const job_health_t *h, const char *what) {
  if (h->err_code == TNT_SUCCESS) return TNT_SUCCESS;
  return failf(h->err_code, h->err_peer, "%s (while rank %d was %s)", h->err, h->me, what);
}

/* Peer r aborted: the error names the rank it blamed, if another. */
static inline tnt_result_t peer_aborted(const job_health_t *h, int r, const char *what) {
  const peer_health_t *p = &h->peer[r];
  if (p->root >= 0 && p->root != r && p->root != h->me)
    return failf(TNT_ERR_PEER_LOST, p->root, "rank %d aborted because of rank %d (%s) while rank %d was %s", r, p->root,
                 p->reason, h->me, what);
  return failf(TNT_ERR_PEER_LOST, r, "rank %d aborted (%s) while rank %d was %s", r, p->reason, h->me, what);
}

/* What a local peer's process is doing ("" for a remote one: we cannot tell). */
static inline const char *local_doing(const peer_health_t *p) {
  if (!p->local) return "";
  return tnt_process_doing(tnt_process_state(p->pid));
}

/* Peer r in a line, for an error (takes the lock itself). */
static inline void describe(const job_health_t *h, int r, char *out, size_t len) {
  pthread_mutex_lock(h->mu);
  const peer_health_t *p = &h->peer[r];
  const char *doing = local_doing(p);
  snprintf(out, len, "rank %d (pid %d on %s) %s%swas last heard from %.1f s ago", r, p->pid, p->host, doing,
           doing[0] ? "; it " : "", host->now() - p->last_heard);
  pthread_mutex_unlock(h->mu);
}

/* The message of peer `r` silent past the bound. A host cut off silences all
 * its ranks at once, but their last heartbeats came at slightly different
 * times: when `r` crosses the bound, the others of the same loss have been
 * silent for nearly as long. Every peer silent for half the bound is named
 * with it, grouped by host, r's host first: "ranks 2 (pid 71), 3 (pid 72) on
 * hostB sent nothing for 2.0 s while rank 0 was ...: their process or host
 * died, ..." (a healthy peer is silent for about one heartbeat), with what r's
 * process is doing where that can be told. */
static inline void silent_message(const job_health_t *h, int r, double now, const char *what, char *out, size_t len) {
  const int n = h->n, me = h->me;
  const double bound = h->silence_s;
  char who[512] = "";
  size_t at = 0;
  int named = 0, count = 0;
  uint8_t *done = calloc((size_t)n, 1);
  for (int k = -1; done && k < n; k++) { /* k = -1: r's host first */
    int l = k < 0 ? r : k;
    const peer_health_t *lead = &h->peer[l];
    if (l == me || done[l] || lead->state != PEER_ALIVE || now - lead->last_heard <= bound / 2) continue;
    char ranks[384] = "";
    size_t rat = 0;
    int here = 0;
    for (int p = 0; p < n; p++) {
      const peer_health_t *q = &h->peer[p];
      if (p == me || done[p] || q->state != PEER_ALIVE || strcmp(q->host, lead->host) ||
          now - q->last_heard <= bound / 2)
        continue;
      done[p] = 1;
      if (rat < sizeof ranks)
        rat += (size_t)snprintf(ranks + rat, sizeof ranks - rat, "%s%d (pid %d)", here ? ", " : "", p, q->pid);
      here++;
    }
    if (at < sizeof who)
      at += (size_t)snprintf(who + at, sizeof who - at, "%s%s %s on %s", named ? " and " : "",
                             here > 1 ? "ranks" : "rank", ranks, lead->host);
    named++;
    count += here;
  }
  free(done);
  const peer_health_t *lost = &h->peer[r];
  if (!count) { /* out of memory: r alone */
    snprintf(who, sizeof who, "rank %d (pid %d) on %s", r, lost->pid, lost->host);
    count = 1;
  }
  int many = count > 1;
  const char *doing = local_doing(lost);
  snprintf(out, len,
           "%s sent nothing for %.1f s while rank %d was %s: %s process or host died, %s cut off, or %s hang%s%s%s "
           "(every rank sends a heartbeat every %g s, %s; %d missed mean lost)",
           who, now - lost->last_heard, me, what, many ? "their" : "its", many ? "they are" : "it is",
           many ? "they" : "it", many ? "" : "s", doing[0] ? "; it " : "", doing, h->beat_s, h->beat_var,
           SILENT_BEATS);
}

/* Local peer r's process is gone (a system call: only when a pid check is due). */
static inline tnt_result_t peer_died(const job_health_t *h, int r, const char *what) {
  const peer_health_t *p = &h->peer[r];
  if (!p->local) return TNT_SUCCESS;
  char st = tnt_process_state(p->pid);
  if (st == 'X' || st == 'Z')
    return failf(TNT_ERR_PEER_LOST, r, "rank %d (pid %d on %s) died while rank %d was %s", r, p->pid, p->host, h->me,
                 what);
  return TNT_SUCCESS;
}

/* Peer r has been silent past the bound. */
static inline tnt_result_t peer_silent(const job_health_t *h, int r, double now, const char *what) {
  if (now - h->peer[r].last_heard <= h->silence_s) return TNT_SUCCESS;
  char msg[1024];
  silent_message(h, r, now, what, msg, sizeof msg);
  return failf(TNT_ERR_PEER_LOST, r, "%s", msg);
}

/* Peer r aborted or has shut down: gone, while this rank still needs it. */
static inline tnt_result_t peer_gone(const job_health_t *h, int r, const char *what) {
  const peer_health_t *p = &h->peer[r];
  if (p->state == PEER_FAILED) return peer_aborted(h, r, what);
  if (p->state == PEER_EXITED)
    return failf(TNT_ERR_PEER_LOST, r, "rank %d has shut down while rank %d was %s: every rank must make the same "
                 "collective calls before shutdown", r, h->me, what);
  return TNT_SUCCESS;
}

/* The job-wide failures: a held one, an aborted rank. */
static inline tnt_result_t check_job(const job_health_t *h, const char *what) {
  tnt_result_t res = held_failure(h, what);
  if (res != TNT_SUCCESS) return res;
  for (int r = 0; r < h->n; r++)
    if (r != h->me && h->peer[r].state == PEER_FAILED) return peer_aborted(h, r, what);
  return TNT_SUCCESS;
}

/* A wait for rank `from` (-1: no one rank) ran out of time (takes the lock). */
static inline tnt_result_t timed_out(const job_health_t *h, int from, const char *what) {
  if (from < 0) return failf(TNT_ERR_TIMEOUT, -1, "rank %d timed out %s (TNT_TIMEOUT_S bound reached)", h->me, what);
  char doing[320];
  describe(h, from, doing, sizeof doing);
  return failf(TNT_ERR_TIMEOUT, from, "rank %d timed out %s after TNT_TIMEOUT_S: %s", h->me, what, doing);
}

#endif
