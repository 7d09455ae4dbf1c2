/* test_nccl_gpu.c - the NCCL collectives (src/gpu/nccl.c) with the real NCCL
 * and CUDA runtime, on a GPU: a communicator of one rank runs every
 * collective on every dtype (device memory, a stream of its own, in place and
 * not, bytes past the end untouched, sizes past NCCL's chunks); a collective
 * whose stream does not get to it by the deadline ends in TNT_ERR_TIMEOUT with
 * an aborted communicator; a communicator that a
 * rank never joins ends at its deadline; two ranks on one GPU are refused by
 * NCCL with its words, on both, not a hang. Without a GPU (no CUDA runtime,
 * no NCCL, no device) it prints "skipped: <why>" and succeeds.
 *
 * Each case runs in a child process, and the parent never touches CUDA: a
 * process must not fork after CUDA is initialised. Prints "N passed, N failed". */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "child_case.h"
#include "common.h"
#include "dtype.h"
#include "gpu/cuda_rt.h"
#include "gpu/nccl.h"
#include "half.h"

#define SKIP 77

#define CHECK(cond)                                                                               \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      fflush(stdout);                                                                             \
      fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, tnt_last_error()); \
      _exit(1);                                                                                   \
    }                                                                                             \
  } while (0)
#define CUDA_OK(call) CHECK((call) == TNT_CUDA_SUCCESS)

static const tnt_cuda_t *cuda;

static tnt_nccl_comm_t *one_rank(void) {
  CUDA_OK(cuda->set_device(0));
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm = NULL;
  CHECK(tnt_nccl_comm_init(0, 1, id, tnt_now() + 60, &comm) == TNT_SUCCESS && comm);
  return comm;
}

/* small integers, exact in every dtype (float16 and bfloat16 included) */
static void fill(uint8_t *host, tnt_dtype_t dt, size_t count, int seed) {
  for (size_t i = 0; i < count; i++) {
    double v = (double)((int)((i * 7 + (size_t)seed) % 61) - 30);
    switch (dt) {
      case TNT_FLOAT32: { float f = (float)v; memcpy(host + i * 4, &f, 4); break; }
      case TNT_FLOAT64: memcpy(host + i * 8, &v, 8); break;
      case TNT_INT32: { int32_t x = (int32_t)v; memcpy(host + i * 4, &x, 4); break; }
      case TNT_INT64: { int64_t x = (int64_t)v; memcpy(host + i * 8, &x, 8); break; }
      case TNT_FLOAT16: case TNT_BFLOAT16: {
        uint16_t h = dt == TNT_FLOAT16 ? tnt_f32_to_f16((float)v) : tnt_f32_to_bf16((float)v);
        memcpy(host + i * 2, &h, 2);
        break;
      }
    }
  }
}

/* One collective on the GPU: `count` elements in, the result compared with the
 * input (one rank: every collective is the identity), and the guard bytes past
 * the result untouched. */
static void check_one(tnt_nccl_comm_t *comm, void *stream, const char *kind, tnt_dtype_t dt, tnt_reduce_op_t op,
                      size_t count, int in_place) {
  const size_t bytes = count * tnt_dtype_size(dt), guard = 256;
  uint8_t *in = malloc(bytes + 1), *out = malloc(bytes + guard);
  CHECK(in && out);
  fill(in, dt, count, (int)count);
  void *dsend = NULL, *drecv = NULL;
  CUDA_OK(cuda->malloc(&dsend, bytes + guard));
  CUDA_OK(cuda->malloc(&drecv, bytes + guard));
  memset(out, 0xA5, bytes + guard);
  CUDA_OK(cuda->memcpy(drecv, out, bytes + guard, TNT_CUDA_HOST_TO_DEVICE)); /* the guard pattern */
  CUDA_OK(cuda->memcpy(in_place ? drecv : dsend, in, bytes, TNT_CUDA_HOST_TO_DEVICE));
  const void *src = in_place ? drecv : dsend;
  double deadline = tnt_now() + 60;
  tnt_result_t rc = TNT_ERR_INTERNAL;
  if (!strcmp(kind, "allreduce")) rc = tnt_nccl_allreduce(comm, src, drecv, count, dt, op, stream, deadline);
  if (!strcmp(kind, "broadcast")) rc = tnt_nccl_broadcast(comm, src, drecv, count, dt, 0, stream, deadline);
  if (!strcmp(kind, "allgather")) rc = tnt_nccl_allgather(comm, src, drecv, count, dt, stream, deadline);
  CHECK(rc == TNT_SUCCESS);
  CUDA_OK(cuda->memcpy(out, drecv, bytes + guard, TNT_CUDA_DEVICE_TO_HOST));
  if (memcmp(in, out, bytes) != 0) {
    size_t at = 0, wrong = 0, size = tnt_dtype_size(dt);
    for (size_t i = count; i-- > 0;)
      if (memcmp(in + i * size, out + i * size, size)) at = i, wrong++;
    uint64_t a = 0, b = 0;
    memcpy(&a, in + at * size, size);
    memcpy(&b, out + at * size, size);
    fprintf(stderr, "%s of %zu %s (op %d, in place %d): %zu elements wrong, the first at %zu: %#llx, not %#llx\n",
            kind, count, tnt_dtype_name(dt), op, in_place, wrong, at, (unsigned long long)b, (unsigned long long)a);
    _exit(1);
  }
  for (size_t i = 0; i < guard; i++) CHECK(out[bytes + i] == 0xA5);
  CUDA_OK(cuda->free(dsend));
  CUDA_OK(cuda->free(drecv));
  free(in);
  free(out);
}

static void every_collective_every_dtype(void) {
  tnt_nccl_comm_t *comm = one_rank();
  void *stream = NULL;
  CUDA_OK(cuda->stream_create(&stream));
  const tnt_dtype_t dts[] = {TNT_FLOAT16, TNT_BFLOAT16, TNT_FLOAT32, TNT_FLOAT64, TNT_INT32, TNT_INT64};
  const size_t counts[] = {1, 1000, 1000003, 1 << 22};
  for (int d = 0; d < 6; d++) {
    for (int n = 0; n < 4; n++) {
      for (int in_place = 0; in_place < 2; in_place++) {
        check_one(comm, stream, "allreduce", dts[d], TNT_SUM, counts[n], in_place);
        check_one(comm, stream, "broadcast", dts[d], TNT_SUM, counts[n], in_place);
        check_one(comm, stream, "allgather", dts[d], TNT_SUM, counts[n], in_place);
      }
    }
  }
  /* no average: NCCL 2.28.9's ncclAvg left the elements past 8 MB (float64) or 16 MB unwritten, with one
   * rank, not in place (docs/gpus.md) */
  CHECK(tnt_nccl_allreduce(comm, NULL, NULL, 4, TNT_FLOAT64, TNT_AVERAGE, stream, tnt_now() + 5) ==
        TNT_ERR_INVALID_ARGUMENT);
  /* the default stream works too */
  check_one(comm, NULL, "allreduce", TNT_FLOAT32, TNT_SUM, 1000, 0);
  CUDA_OK(cuda->stream_destroy(stream));
  tnt_nccl_comm_destroy(comm);
}

static void sleep_on_stream(void *seconds) {
  struct timespec ts = {(time_t) * (int *)seconds, 0};
  nanosleep(&ts, NULL);
}

static void stream_never_gets_there(void) {
  tnt_nccl_comm_t *comm = one_rank();
  void *stream = NULL, *buf = NULL;
  CUDA_OK(cuda->stream_create(&stream));
  CUDA_OK(cuda->malloc(&buf, 4096));
  static int seconds = 4; /* the stream is busy for longer than the deadline */
  CUDA_OK(cuda->memcpy(buf, &seconds, sizeof seconds, TNT_CUDA_HOST_TO_DEVICE)); /* CUDA is up before the clock starts */
  CUDA_OK(cuda->launch_host_func(stream, sleep_on_stream, &seconds));
  double start = tnt_now();
  CHECK(tnt_nccl_allreduce(comm, buf, buf, 1024, TNT_FLOAT32, TNT_SUM, stream, start + 0.5) == TNT_ERR_TIMEOUT);
  double took = tnt_now() - start;
  printf("  stream_never_gets_there: TNT_ERR_TIMEOUT after %.2f s: %s\n", took, tnt_last_error());
  /* A bound, not a timing: it ended. The wait ends at the deadline; NCCL's abort then waits for the work
   * queued before the collective on the stream (2.5 s of the host function's 4 on an H100, NCCL 2.28.9). */
  CHECK(took >= 0.5 && took < seconds + 3.0);
  CHECK(strstr(tnt_last_error(), "did not complete within TNT_TIMEOUT_S"));
  CHECK(tnt_nccl_allreduce(comm, buf, buf, 1024, TNT_FLOAT32, TNT_SUM, stream, tnt_now() + 5) == TNT_ERR_PEER_LOST);
  tnt_nccl_comm_destroy(comm);
}

static void rank_never_joins(void) {
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm = (void *)1;
  double start = tnt_now();
  CHECK(tnt_nccl_comm_init(0, 2, id, start + 2.0, &comm) == TNT_ERR_TIMEOUT && comm == NULL);
  double took = tnt_now() - start;
  printf("  rank_never_joins: TNT_ERR_TIMEOUT after %.2f s: %s\n", took, tnt_last_error());
  CHECK(took >= 2.0 && took < 15.0);
}

/* Two processes, one GPU, one communicator: NCCL refuses it; each rank must end. */
static void two_ranks_one_gpu(void) {
  int fds[2];
  CHECK(pipe(fds) == 0);
  pid_t kids[2];
  for (int rank = 0; rank < 2; rank++) {
    kids[rank] = fork();
    if (kids[rank] == 0) {
      CUDA_OK(cuda->set_device(0)); /* CUDA starts here: the process that forked these never did */
      char id[TNT_NCCL_ID_BYTES];
      if (rank == 0) {
        CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
        for (int k = 0; k < 2; k++) CHECK(write(fds[1], id, sizeof id) == (ssize_t)sizeof id);
      }
      CHECK(read(fds[0], id, sizeof id) == (ssize_t)sizeof id);
      tnt_nccl_comm_t *comm = NULL;
      double start = tnt_now();
      tnt_result_t rc = tnt_nccl_comm_init(rank, 2, id, start + 20, &comm);
      printf("  two_ranks_one_gpu: rank %d: %s after %.2f s: %s\n", rank, rc == TNT_SUCCESS ? "joined" : "refused",
             tnt_now() - start, rc == TNT_SUCCESS ? "" : tnt_last_error());
      fflush(stdout);
      _exit(rc == TNT_SUCCESS ? 3 : rc == TNT_ERR_TIMEOUT ? 4 : 0);
    }
  }
  for (int rank = 0; rank < 2; rank++) {
    int status = 0;
    waitpid(kids[rank], &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0); /* refused with NCCL's words, not joined, not hung */
  }
}

/* The libraries, loaded without starting CUDA (a case that forks must start it
 * in its children only); NULL, or the reason to skip in `why`. */
static int libraries_loaded(char *why, size_t len) {
  cuda = tnt_cuda();
  if (!cuda) return snprintf(why, len, "%s", tnt_last_error()), 0;
  if (tnt_nccl_load() != TNT_SUCCESS) return snprintf(why, len, "%s", tnt_last_error()), 0;
  return 1;
}

/* In a child of its own (CUDA starts there): whether there is a GPU to test on. */
static void probe(void) {
  char why[1024];
  int n = 0, rc = -1;
  if (libraries_loaded(why, sizeof why) && ((rc = cuda->get_device_count(&n)) != TNT_CUDA_SUCCESS || n < 1))
    snprintf(why, sizeof why, "no GPU: cudaGetDeviceCount said %d device(s) (%s)", n, tnt_cuda_error(rc));
  else if (cuda && n >= 1)
    _exit(0);
  printf("skipped: %s\n", why);
  fflush(stdout);
  _exit(SKIP);
}

static void (*current)(void); /* the case with_libraries runs */

static void with_libraries(void) {
  char why[1024];
  CHECK(libraries_loaded(why, sizeof why));
  current();
}

static void run(const char *name, void (*fn)(void)) {
  current = fn;
  int status = in_child(fn == probe ? probe : with_libraries, 120);
  if (WIFEXITED(status) && WEXITSTATUS(status) == SKIP) exit(0);
  if (fn != probe) report_case(name, status);
}

int main(void) {
  run("probe", probe);
  run("every_collective_every_dtype", every_collective_every_dtype);
  run("stream_never_gets_there", stream_never_gets_there);
  run("rank_never_joins", rank_never_joins);
  run("two_ranks_one_gpu", two_ranks_one_gpu);
  return finish_cases();
}
