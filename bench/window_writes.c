/* window_writes.c - what it costs two cores to swap a buffer through shared
 * memory, by where and how the writer puts it: the probe behind ring.c's
 * slot_offset and transport/put_copy.c.
 *
 * Two threads pinned to CPUs 0 and 1 do what a 2-rank allreduce on one host
 * does: each copies its input into the other's window slot, raises a flag,
 * waits for the other's flag, adds the slot it received to its input, and
 * says it has read the slot. The cases differ in the slots (1 = always the
 * same lines; N = rotating through N separate buffers, N x the size) and in
 * the copy (memcpy, or streaming stores), or in a scale by 0.5 in its place
 * (an average's input on its way out: plain, or in 8 KiB blocks streamed from
 * L1, as transport/put_copy.c's tnt_put_scale). Each case runs 7 times,
 * rotated with the others; the figure is the best and the mean time per swap,
 * and the writer's cost per byte (CPU 0's mean: what put_copy.c's verdict reads).
 *
 * On the project's 2-vCPU VM (docs/benchmarks.md, 2026-11-29), 64 KiB:
 * vCPUs near (a shared cache): memcpy 13 us on 1 slot, 13 on 8, 9 on 16,
 * 7 on 32; streaming 15. Far apart: memcpy 38-42 us whatever the slots,
 * streaming 13-15. Run bench/cross_core.c before and after to know which.
 * 2026-12-01, 8 slots: near, memcpy 0.09-0.10 ns a byte, the scale 0.14-0.16,
 * streamed 0.07 and 0.10; far, memcpy 0.47-0.55, the scale 0.50-0.58 (43-50
 * us a swap), streamed 0.04 and 0.11-0.16 (20-21 us).
 *
 *   cc -O2 -march=native -pthread -o window_writes window_writes.c && ./window_writes [KiB]
 */
#define _GNU_SOURCE
#include <emmintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAXSLOTS = 64, ITERS = 3000, REPEATS = 7 };
static size_t bytes = 64 << 10;
static float *win[2][MAXSLOTS], *in[2], *out[2];
static _Alignas(64) atomic_long posted[2];
static _Alignas(64) atomic_long consumed[2];
enum { MEMCPY, STREAM, SCALE, SCALE_STREAM, HOWS };
static const char *const how_name[HOWS] = {"memcpy", "streaming", "scale", "scale-stream"};
static int how, slots;
static long base; /* swaps of the earlier runs: the flags keep counting */
static double write_s[HOWS]; /* CPU 0's time in its writes, by how */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void stream_copy(void *dst, const void *src, size_t len) {
  char *d = dst;
  const char *s = src;
  for (; len >= 64; d += 64, s += 64, len -= 64)
    for (int k = 0; k < 64; k += 16) _mm_stream_si128((__m128i *)(d + k), _mm_loadu_si128((const __m128i *)(s + k)));
  _mm_sfence();
}

/* dst = src * 0.5, through an L1 block written out with streaming stores */
static void scale_stream(float *dst, const float *src, size_t len) {
  static __thread float block[2048];
  for (size_t at = 0; at < len / 4; at += 2048) {
    for (int k = 0; k < 2048; k++) block[k] = src[at + (size_t)k] * 0.5f;
    char *d = (char *)(dst + at);
    for (int k = 0; k < (int)sizeof block; k += 16)
      _mm_stream_si128((__m128i *)(d + k), _mm_loadu_si128((const __m128i *)((char *)block + k)));
  }
  _mm_sfence();
}

static void put(float *restrict dst, const float *restrict src) {
  switch (how) {
    case MEMCPY: memcpy(dst, src, bytes); break;
    case STREAM: stream_copy(dst, src, bytes); break;
    case SCALE: for (size_t k = 0; k < bytes / 4; k++) dst[k] = src[k] * 0.5f; break;
    case SCALE_STREAM: scale_stream(dst, src, bytes); break;
  }
}

static void *swap(void *arg) {
  const int me = (int)(long)arg, peer = 1 - me;
  pin(me);
  for (long it = 1; it <= ITERS; it++) {
    const long i = base + it;
    const int slot = (int)(i % slots);
    while (atomic_load_explicit(&consumed[peer], memory_order_acquire) < i - 1) _mm_pause(); /* slot free */
    const double w0 = now();
    put(win[peer][slot], in[me]);
    if (me == 0) write_s[how] += now() - w0;
    atomic_store_explicit(&posted[me], i, memory_order_release);
    while (atomic_load_explicit(&posted[peer], memory_order_acquire) < i) _mm_pause();
    const float *got = win[me][slot];
    for (size_t k = 0; k < bytes / 4; k++) out[me][k] = in[me][k] + got[k];
    atomic_store_explicit(&consumed[me], i, memory_order_release);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) bytes = (size_t)atol(argv[1]) << 10;
  if (bytes < 8192 || bytes % 8192) {
    fprintf(stderr, "window_writes: the size must be a multiple of 8 KiB (the scale's block). Received: %zu bytes\n", bytes);
    return 2;
  }
  for (int r = 0; r < 2; r++) {
    in[r] = aligned_alloc(4096, bytes);
    out[r] = aligned_alloc(4096, bytes);
    for (size_t k = 0; k < bytes / 4; k++) in[r][k] = (float)k;
    for (int s = 0; s < MAXSLOTS; s++) {
      win[r][s] = aligned_alloc(4096, bytes + 4096);
      memset(win[r][s], 0, bytes);
    }
  }
  const struct { int how, slots; } cases[] = {{MEMCPY, 1}, {MEMCPY, 8},   {MEMCPY, 16},      {MEMCPY, 32},
                                              {STREAM, 1}, {STREAM, 8},   {SCALE, 8},        {SCALE_STREAM, 8}};
  int runs[HOWS] = {0};
  enum { NC = sizeof cases / sizeof cases[0] };
  double best[NC], sum[NC] = {0};
  for (int c = 0; c < NC; c++) best[c] = 1e9;
  for (int rep = 0; rep < REPEATS; rep++)
    for (int c = 0; c < NC; c++) {
      how = cases[c].how, slots = cases[c].slots;
      runs[how]++;
      pthread_t t[2];
      const double t0 = now();
      for (long r = 0; r < 2; r++) pthread_create(&t[r], NULL, swap, (void *)r);
      for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
      const double us = (now() - t0) / ITERS * 1e6;
      base += ITERS;
      if (us < best[c]) best[c] = us;
      sum[c] += us;
    }
  printf("%zu KiB swaps\n", bytes >> 10);
  for (int c = 0; c < NC; c++)
    printf("%-12s %2d slot(s): best %6.2f us, mean %6.2f us\n", how_name[cases[c].how], cases[c].slots, best[c],
           sum[c] / REPEATS);
  for (int h = 0; h < HOWS; h++)
    printf("%-12s writes: %.3f ns a byte (CPU 0, mean of every slot count)\n", how_name[h],
           write_s[h] / ((double)runs[h] * ITERS * (double)bytes) * 1e9);
  return 0;
}
