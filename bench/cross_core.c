/* cross_core.c - how far apart two CPUs are, now: the median round trip of a
 * cache line between two threads pinned to CPUs A and B (default 0 and 1).
 *
 * Why: on a VM the hypervisor may place the two vCPUs next to each other (a
 * shared cache: ~55 ns here) or far apart (~320 ns), and move them between
 * runs. Every byte a collective hands from one core to another then costs up
 * to 2.7x, so a benchmark's rounds in the two placements do not compare.
 * bench/allreduce.py runs this before each launch and prints the figures.
 *
 *   cc -O2 -pthread -o cross_core cross_core.c && ./cross_core [A B]   -> "57" (ns)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { TRIPS = 5000, REPS = 7 };
static _Alignas(64) atomic_long ball;
static atomic_int ready; /* the other thread: 1 pinned, -1 it could not be */

static int pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *bounce_back(void *cpu) {
  if (pin(*(int *)cpu)) {
    atomic_store(&ready, -1);
    return NULL;
  }
  atomic_store(&ready, 1);
  for (long i = 0; i < (long)TRIPS * REPS; i++) {
    while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(&ball, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;
  if (pin(a)) {
    fprintf(stderr, "cross_core: cannot run on CPU %d\n", a);
    return 1;
  }
  pthread_t other;
  pthread_create(&other, NULL, bounce_back, &b);
  while (!atomic_load(&ready)) {
  }
  if (atomic_load(&ready) < 0) {
    fprintf(stderr, "cross_core: cannot run on CPU %d\n", b);
    return 1;
  }
  double ns[REPS];
  long i = 0;
  for (int r = 0; r < REPS; r++) {
    const double t0 = now();
    for (long k = 0; k < TRIPS; k++, i++) {
      atomic_store_explicit(&ball, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns[r] = (now() - t0) / TRIPS * 1e9;
  }
  pthread_join(other, NULL);
  qsort(ns, REPS, sizeof ns[0], by_value);
  printf("%.0f\n", ns[REPS / 2]);
  return 0;
}
