/* common.h - internal helpers shared by every core file: result propagation,
 * error recording and logging. */
#ifndef TNT_COMMON_H
#define TNT_COMMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tarantella.h"

#define TNT_MAX_NAME 256 /* names are at most 255 bytes + NUL */
/* Bumped whenever what ranks exchange changes meaning: ranks of different
 * versions refuse each other at set-up instead of misreading each other. */
#define TNT_PROTOCOL_VERSION 6u

/* Log levels, as TNT_LOG_LEVEL spells them. */
enum { TNT_LOG_DEBUG = 0, TNT_LOG_INFO = 1, TNT_LOG_WARNING = 2, TNT_LOG_ERROR = 3 };

void tnt_log_init(int rank);
void tnt_log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int tnt_log_enabled(int level);
#define TNT_DEBUG(...) do { if (tnt_log_enabled(TNT_LOG_DEBUG)) tnt_log(TNT_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define TNT_INFO(...) do { if (tnt_log_enabled(TNT_LOG_INFO)) tnt_log(TNT_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define TNT_WARN(...) tnt_log(TNT_LOG_WARNING, __FILE__, __LINE__, __VA_ARGS__)
#define TNT_ERROR(...) tnt_log(TNT_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

/* Record `fmt` as this thread's last error and return `code`. */
tnt_result_t tnt_fail(tnt_result_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, naming the peer rank a TNT_ERR_PEER_LOST is about. */
tnt_result_t tnt_fail_peer(int peer, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, for any code: a timeout that names the rank it waited for. */
tnt_result_t tnt_fail_about(tnt_result_t code, int peer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Copy a message recorded elsewhere (e.g. by the background thread) into this thread's slot. */
void tnt_set_last_error(const char *message, int peer);

/* Propagate a failure upward; with TNT_LOG_LEVEL=DEBUG each level logs, so the
 * log reads as a back-trace (NCCL's NCCLCHECK). */
#define TNT_CHECK(call)                                                      \
  do {                                                                       \
    tnt_result_t tnt_check_res_ = (call);                                    \
    if (tnt_check_res_ != TNT_SUCCESS) {                                     \
      TNT_DEBUG("%s -> %d", #call, (int)tnt_check_res_);                     \
      return tnt_check_res_;                                                 \
    }                                                                        \
  } while (0)

/* The monotonic clock, less the time this process was stopped (pause.c). */
extern _Atomic int64_t tnt_pause_offset_ns; /* the time stopped, counted so far */
extern _Atomic int64_t tnt_clock_seen_ns;   /* the latest reading of the clock, by any thread */
#define TNT_CLOCK_GRAIN_NS 10000000LL        /* how often tnt_clock_seen_ns is brought up to date */
double tnt_now_slow(int64_t raw_ns);

/* Monotonic clock in seconds, for deadlines: the time this process was stopped
 * (SIGSTOP, Ctrl+Z) and continued does not count (pause.c). Values of tnt_now
 * stay in this process: another process's deadlines are not on its clock. */
static inline double tnt_now(void) {
  const int64_t off = atomic_load(&tnt_pause_offset_ns);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t raw = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
  if (raw - atomic_load(&tnt_clock_seen_ns) <= TNT_CLOCK_GRAIN_NS && atomic_load(&tnt_pause_offset_ns) == off)
    return (double)(raw - off) * 1e-9;
  return tnt_now_slow(raw);
}

/* A tnt_now() time as an absolute CLOCK_MONOTONIC timespec (a condition variable's
 * timed wait): the pauses counted so far added back. */
static inline struct timespec tnt_deadline_timespec(double t) {
  const double raw = t + (double)atomic_load(&tnt_pause_offset_ns) * 1e-9;
  struct timespec ts = {(time_t)raw, (long)((raw - (double)(time_t)raw) * 1e9)};
  return ts;
}

/* A condition variable whose timed waits count on tnt_now()'s clock: deadlines
 * are tnt_now() values, and the wall clock may jump. */
static inline void tnt_cond_init_monotonic(pthread_cond_t *cond) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cond, &ca);
  pthread_condattr_destroy(&ca);
}

/* A pause for busy-wait loops (lets the sibling hyper-thread run). */
static inline void tnt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* A relative timeout in seconds as a timespec (for futex and friends). */
static inline struct timespec tnt_timespec(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  return ts;
}

/* Microseconds of the monotonic clock, pauses included (timelines, and times that
 * other processes of the host compare with theirs). */
static inline int64_t tnt_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* snprintf(dst, cap, "%s", src) without the formatting machinery, for names on
 * the hot path (every call copies its name twice; snprintf took 1.4% of a
 * 4-rank loop of 4-byte allreduces). cap > 0. */
static inline void tnt_copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* A buffer kept between calls: *buf holds at least `bytes` afterwards, 64-byte
 * aligned, grown (its contents dropped) when *cap is smaller. */
static inline tnt_result_t tnt_grow_buffer(uint8_t **buf, size_t *cap, size_t bytes, const char *what) {
  if (bytes <= *cap) return TNT_SUCCESS;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes)) return tnt_fail(TNT_ERR_SYSTEM, "cannot allocate %zu bytes of %s", bytes, what);
  free(*buf);
  *buf = p;
  *cap = bytes;
  return TNT_SUCCESS;
}

#endif
