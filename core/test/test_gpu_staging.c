/* test_gpu_staging.c - the allreduce of GPU tensors through pinned host
 * buffers (src/gpu/staging.c) with N real ranks: every dtype, sizes of one
 * element to several pieces, in place and not, sum and average; each result
 * must have the bits of the core's host allreduce of the same data, and no
 * byte past it may change.
 *
 *   test_gpu_staging N            on a GPU (the ranks share GPU 0), else "skipped: why"
 *   TNT_STAGING_ON_HOST=1 test_gpu_staging N
 *                                 with a stand-in libcudart (TNT_CUDART_LIBRARY)
 *                                 whose "device" memory is host memory: the
 *                                 pipeline's logic on a machine without a GPU
 *   test_gpu_staging N --bench    then rank 0 times a 100 MB float32 bucket
 *   test_gpu_staging N --unequal  only ranks that stage different counts, which must all fail
 *   test_gpu_staging N --failed   a call that fails part-way (a mismatch of its last piece), then
 *                                 calls that must go on as before (with the stand-in runtime `async`)
 *   test_gpu_staging N --threads  two threads per rank stage x and y, rank 0 x first, the others y
 *                                 first: both calls of a rank run at once (they took turns, and waited
 *                                 for each other across ranks until TNT_TIMEOUT_S)
 *
 * Prints "N passed, N failed". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "dtype.h"
#include "gpu/cuda_rt.h"
#include "gpu/staging.h"
#include "half.h"
#include "ranks.h"

#define SKIP 77
#define CHECK(cond)                                                                                         \
  do {                                                                                                      \
    if (!(cond)) {                                                                                          \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s (%s)\n", tnt_rank(), __FILE__, __LINE__, #cond, tnt_last_error()); \
      return 1;                                                                                             \
    }                                                                                                       \
  } while (0)

static const tnt_cuda_t *cuda;

static void fill(uint8_t *host, tnt_dtype_t dt, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) {
    float v = (float)((int)((i * 7 + (size_t)rank) % 61) - 30);
    uint8_t *at = host + i * tnt_dtype_size(dt);
    switch (dt) {
      case TNT_FLOAT32: memcpy(at, &v, 4); break;
      case TNT_FLOAT64: { double d = v; memcpy(at, &d, 8); break; }
      case TNT_INT32: { int32_t x = (int32_t)v; memcpy(at, &x, 4); break; }
      case TNT_INT64: { int64_t x = (int64_t)v; memcpy(at, &x, 8); break; }
      case TNT_FLOAT16: { uint16_t h = tnt_f32_to_f16(v); memcpy(at, &h, 2); break; }
      case TNT_BFLOAT16: { uint16_t h = tnt_f32_to_bf16(v); memcpy(at, &h, 2); break; }
    }
  }
}

/* One staged allreduce against the host allreduce of the same data. */
static int check_one(tnt_dtype_t dt, tnt_reduce_op_t op, size_t count, int in_place, int *serial) {
  const size_t bytes = count * tnt_dtype_size(dt), guard = 64;
  uint8_t *in = malloc(bytes + 1), *want = malloc(bytes + 1), *got = malloc(bytes + guard);
  CHECK(in && want && got);
  fill(in, dt, count, tnt_rank());
  char name[64];
  snprintf(name, sizeof name, "ref%d", (*serial)++);
  tnt_handle_t h;
  /* a sum has the bits of the host's allreduce of the whole; an average those
   * of the host's average of each piece (the core's float average rounds by
   * the size it runs at: with 3 ranks, 12 MB and 4 MB averages differ) */
  const size_t piece = op == TNT_SUM || !bytes ? bytes : TNT_STAGING_PIECE_BYTES;
  for (size_t off = 0, k = 0; off < bytes || (!bytes && !k); off += piece, k++) {
    size_t len = bytes - off < piece ? bytes - off : piece;
    char ref[80];
    snprintf(ref, sizeof ref, "%s.%zu", name, k);
    CHECK(tnt_allreduce(ref, in + off, want + off, (int64_t)(len / tnt_dtype_size(dt)), dt, op, 1.0, 60, &h) ==
          TNT_SUCCESS);
    if (!bytes) break;
  }
  void *dsend = NULL, *drecv = NULL;
  CHECK(cuda->malloc(&dsend, bytes + guard) == 0 && cuda->malloc(&drecv, bytes + guard) == 0);
  memset(got, 0xA5, bytes + guard);
  CHECK(cuda->memcpy(drecv, got, bytes + guard, TNT_CUDA_HOST_TO_DEVICE) == 0);
  CHECK(cuda->memcpy(in_place ? drecv : dsend, in, bytes, TNT_CUDA_HOST_TO_DEVICE) == 0);
  snprintf(name, sizeof name, "staged%d", (*serial)++);
  CHECK(tnt_gpu_allreduce_staged(name, in_place ? drecv : dsend, drecv, (int64_t)count, dt, op, NULL, 60) ==
        TNT_SUCCESS);
  CHECK(cuda->memcpy(got, drecv, bytes + guard, TNT_CUDA_DEVICE_TO_HOST) == 0);
  if (memcmp(got, want, bytes) != 0) {
    fprintf(stderr, "rank %d: staged allreduce of %zu %s (op %d, in place %d) differs from the host's\n", tnt_rank(),
            count, tnt_dtype_name(dt), op, in_place);
    return 1;
  }
  for (size_t i = 0; i < guard; i++) CHECK(got[bytes + i] == 0xA5);
  cuda->free(dsend);
  cuda->free(drecv);
  free(in);
  free(want);
  free(got);
  return 0;
}

static int bench(void) {
  const size_t count = 25u << 20; /* 100 MB of float32 */
  void *d = NULL;
  CHECK(cuda->malloc(&d, count * 4) == 0);
  double best = 1e9;
  for (int i = 0; i < 6; i++) { /* the first negotiates the pieces' names */
    double t0 = tnt_now();
    CHECK(tnt_gpu_allreduce_staged("bench", d, d, (int64_t)count, TNT_FLOAT32, TNT_SUM, NULL, 60) == TNT_SUCCESS);
    double t = tnt_now() - t0;
    if (i > 0 && t < best) best = t;
  }
  float *host = calloc(count, 4); /* the host allreduce alone, of the same bytes in host memory */
  CHECK(host);
  double host_best = 1e9;
  for (int i = 0; i < 6; i++) {
    tnt_handle_t h;
    double t0 = tnt_now();
    CHECK(tnt_allreduce("bench.host", host, host, (int64_t)count, TNT_FLOAT32, TNT_SUM, 1.0, 60, &h) == TNT_SUCCESS);
    double t = tnt_now() - t0;
    if (i > 0 && t < host_best) host_best = t;
  }
  if (tnt_rank() == 0)
    printf("staged allreduce of 100 MB float32 on %d rank(s): %.2f ms; the host allreduce alone: %.2f ms (best of "
           "5)\n", tnt_size(), best * 1e3, host_best * 1e3);
  free(host);
  cuda->free(d);
  return 0;
}

/* A variable of the stand-in runtime the core has loaded (NULL on a real one). */
static int *standin_int(const char *name) {
  const char *path = getenv("TNT_CUDART_LIBRARY");
  void *lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  return lib ? dlsym(lib, name) : NULL;
}

/* One staged call of --threads, on a thread of its own once `delay_ms` have passed. */
typedef struct {
  const char *name;
  tnt_dtype_t dt;
  size_t count;
  int delay_ms;
  const uint8_t *want; /* the host allreduce of the same data */
  int failed;
} thread_call_t;

static int thread_call(thread_call_t *t) {
  struct timespec pause = {t->delay_ms / 1000, (t->delay_ms % 1000) * 1000000L};
  nanosleep(&pause, NULL);
  const size_t bytes = t->count * tnt_dtype_size(t->dt);
  uint8_t *host = malloc(bytes);
  void *d = NULL;
  CHECK(host && cuda->malloc(&d, bytes) == 0);
  fill(host, t->dt, t->count, tnt_rank());
  CHECK(cuda->memcpy(d, host, bytes, TNT_CUDA_HOST_TO_DEVICE) == 0);
  CHECK(tnt_gpu_allreduce_staged(t->name, d, d, (int64_t)t->count, t->dt, TNT_SUM, NULL, 60) == TNT_SUCCESS);
  CHECK(cuda->memcpy(host, d, bytes, TNT_CUDA_DEVICE_TO_HOST) == 0);
  CHECK(memcmp(host, t->want, bytes) == 0);
  cuda->free(d);
  free(host);
  return 0;
}

static void *run_thread_call(void *arg) {
  thread_call_t *t = arg;
  t->failed = thread_call(t);
  return NULL;
}

/* Two calls at once on every rank, begun in another order on rank 0 than on the others: each
 * call must go on while the other waits for its pieces. One set of pinned buffers per process
 * made them take turns, and each rank's first call held it while waiting for the other ranks'
 * first, which waited behind theirs: both failed at TNT_TIMEOUT_S. */
static int concurrent_calls(void) {
  const size_t piece = TNT_STAGING_PIECE_BYTES / 4;
  thread_call_t calls[2] = {{"x", TNT_FLOAT32, 2 * piece + 17, 0, NULL, 1}, {"y", TNT_INT32, piece + 5, 0, NULL, 1}};
  uint8_t *wants[2];
  for (int i = 0; i < 2; i++) { /* the references first, in one order on every rank */
    const size_t bytes = calls[i].count * 4;
    uint8_t *in = malloc(bytes);
    wants[i] = malloc(bytes);
    CHECK(in && wants[i]);
    fill(in, calls[i].dt, calls[i].count, tnt_rank());
    char ref[16];
    snprintf(ref, sizeof ref, "ref.%s", calls[i].name);
    tnt_handle_t h;
    CHECK(tnt_allreduce(ref, in, wants[i], (int64_t)calls[i].count, calls[i].dt, TNT_SUM, 1.0, 60, &h) ==
          TNT_SUCCESS);
    calls[i].want = wants[i];
    free(in);
  }
  calls[tnt_rank() == 0 ? 1 : 0].delay_ms = 300; /* rank 0: x, then y; the others: y, then x */
  pthread_t threads[2];
  for (int i = 0; i < 2; i++) CHECK(pthread_create(&threads[i], NULL, run_thread_call, &calls[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  CHECK(!calls[0].failed && !calls[1].failed);
  int *allocs = standin_int("standin_host_allocs");
  /* a lane for each call at once, no more (one, where a rank's first call ended before its second began) */
  if (allocs) CHECK(*allocs == TNT_STAGING_BUFFERS || *allocs == 2 * TNT_STAGING_BUFFERS);
  free(wants[0]);
  free(wants[1]);
  return tnt_finalize() == TNT_SUCCESS ? 0 : 1;
}

/* Ranks that stage different counts (a bug of the caller's) must all fail, as the host allreduce's do.
 * Rank 0's one piece met the others' first piece of the same size, and it returned a success while
 * they waited for their second piece until TNT_TIMEOUT_S. */
static int unequal(void) {
  const size_t piece = TNT_STAGING_PIECE_BYTES / 4, count = tnt_rank() == 0 ? piece : piece + 1;
  void *d = NULL;
  CHECK(cuda->malloc(&d, count * 4) == 0);
  tnt_result_t rc = tnt_gpu_allreduce_staged("unequal", d, d, (int64_t)count, TNT_FLOAT32, TNT_SUM, NULL, 60);
  cuda->free(d); /* a failed call has waited for its copies: LeakSanitizer named it on Ubuntu's GCC */
  if (rc == TNT_SUCCESS) {
    fprintf(stderr, "rank %d: the staged allreduce of %zu elements succeeded\n", tnt_rank(), count);
    return 1;
  }
  printf("rank %d: %s\n", tnt_rank(), tnt_last_error());
  return 0;
}

/* A call that fails part-way must not leave copies behind: before, it returned while the copies
 * back of its earlier pieces were still queued (and the copy out of the next one), and they landed
 * in its buffer after it had returned, where the caller may have put new data (a retry's input)
 * or freed it; the next call's copies out could meanwhile overwrite the pinned buffers those were
 * copying from. Ranks stage the same number of pieces, the last of other sizes: a mismatch on
 * every rank, which leaves the job usable. */
static int failed_call(int *serial) {
  const size_t piece = TNT_STAGING_PIECE_BYTES / 4, count = 2 * piece + (tnt_rank() == 0 ? 100 : 200);
  const size_t bytes = count * 4;
  uint8_t *host = malloc(bytes), *after = malloc(bytes);
  void *d = NULL;
  CHECK(host && after && cuda->malloc(&d, bytes) == 0);
  fill(host, TNT_FLOAT32, count, tnt_rank());
  CHECK(cuda->memcpy(d, host, bytes, TNT_CUDA_HOST_TO_DEVICE) == 0);
  CHECK(tnt_gpu_allreduce_staged("fails", d, d, (int64_t)count, TNT_FLOAT32, TNT_SUM, NULL, 60) == TNT_ERR_MISMATCH);
  CHECK(strstr(tnt_last_error(), "fails#2/3"));
  CHECK(cuda->memcpy(host, d, bytes, TNT_CUDA_DEVICE_TO_HOST) == 0); /* what the failed call left */
  struct timespec pause = {0, 300 * 1000 * 1000};                    /* ... and nothing lands later */
  nanosleep(&pause, NULL);
  CHECK(cuda->memcpy(after, d, bytes, TNT_CUDA_DEVICE_TO_HOST) == 0);
  if (memcmp(host, after, bytes) != 0) {
    fprintf(stderr, "rank %d: the failed call's copies landed in its buffer after it had returned\n", tnt_rank());
    return 1;
  }
  cuda->free(d);
  free(host);
  free(after);
  /* the calls after it have the bits of the host allreduce */
  for (int in_place = 0; in_place < 2; in_place++)
    if (check_one(TNT_FLOAT32, TNT_SUM, 2 * piece + 100, in_place, serial)) return 1;
  return 0;
}

static int run_rank(int want_bench) {
  cuda = tnt_cuda();
  int devices = 0;
  int on_host = getenv("TNT_STAGING_ON_HOST") != NULL;
  if (!cuda || (cuda->get_device_count(&devices) != 0 && !on_host) || (devices < 1 && !on_host)) {
    printf("skipped: %s\n", cuda ? "no GPU (cudaGetDeviceCount found none)" : tnt_last_error());
    fflush(stdout);
    return SKIP;
  }
  if (devices > 0) CHECK(cuda->set_device(0) == 0);
  CHECK(tnt_init() == TNT_SUCCESS);
  if (want_bench == 2) return unequal();
  int serial = 0;
  if (want_bench == 3) return failed_call(&serial);
  if (want_bench == 4) return concurrent_calls();
  const tnt_dtype_t dts[] = {TNT_FLOAT16, TNT_BFLOAT16, TNT_FLOAT32, TNT_FLOAT64, TNT_INT32, TNT_INT64};
  /* 0, 1, under a piece, 4 pieces of float32 and a bit (3 x 4 MiB + 20 bytes) */
  const size_t counts[] = {0, 1, 1000003, 3 * (TNT_STAGING_PIECE_BYTES / 4) + 5};
  /* a set-up that fails part-way (at the second pinned buffer) fails the call, on every rank alike; the
   * next call makes what is missing, and nothing twice (each retry leaked what the failed one had made) */
  int *allocs = standin_int("standin_host_allocs"), *fail_at = standin_int("standin_fail_host_alloc_at");
  if (allocs && fail_at) {
    *fail_at = 2;
    CHECK(tnt_gpu_allreduce_staged("set-up fails", NULL, NULL, 0, TNT_FLOAT32, TNT_SUM, NULL, 30) == TNT_ERR_SYSTEM);
    CHECK(strstr(tnt_last_error(), "cudaMallocHost") && *allocs == 1);
  }
  for (int d = 0; d < 6; d++)
    for (int n = 0; n < 4; n++)
      for (int in_place = 0; in_place < 2; in_place++) {
        if (check_one(dts[d], TNT_SUM, counts[n], in_place, &serial)) return 1;
        if (dts[d] == TNT_FLOAT32 && check_one(dts[d], TNT_AVERAGE, counts[n], in_place, &serial)) return 1;
      }
  CHECK(tnt_gpu_allreduce_staged(NULL, NULL, NULL, 1, TNT_FLOAT32, TNT_SUM, NULL, 5) == TNT_ERR_INVALID_ARGUMENT);
  if (allocs) CHECK(*allocs == TNT_STAGING_BUFFERS);
  if (want_bench && bench()) return 1;
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  /* --unequal: only the case of unequal counts, with a short TNT_TIMEOUT_S; --failed: a call that fails */
  int want_bench = argc > 2 && !strcmp(argv[2], "--bench")     ? 1
                   : argc > 2 && !strcmp(argv[2], "--unequal") ? 2
                   : argc > 2 && !strcmp(argv[2], "--failed")  ? 3
                   : argc > 2 && !strcmp(argv[2], "--threads") ? 4
                                                               : 0;
  char job[64];
  snprintf(job, sizeof job, "stage%d%ld", (int)getpid(), (long)time(NULL));
  for (int r = 0; r < n; r++) {
    if (fork() == 0) { /* CUDA starts in each rank, never before the fork */
      become_rank(r, n, job);
      setenv("TNT_TIMEOUT_S", want_bench == 2 ? "3" : want_bench == 4 ? "10" : "60", 1);
      fflush(stdout);
      exit(run_rank(want_bench));
    }
  }
  int failed = 0, skipped = 0;
  for (int r = 0; r < n; r++) {
    int status;
    wait(&status);
    if (WIFEXITED(status) && WEXITSTATUS(status) == SKIP) skipped++;
    else failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (skipped == n) return 0; /* each rank said why */
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed || skipped ? 1 : 0;
}
