/* test_ranks.c - the core with real ranks and no Python: forks N processes
 * that each run every collective through the C API and check the results.
 * Usage: test_ranks N (run under valgrind by the suite to catch leaks and
 * invalid accesses in the engine, the negotiation and the shm transport). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ranks.h"
#include "tarantella.h"

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s (%s)\n", tnt_rank(), __FILE__, __LINE__, #cond, \
              tnt_last_error());                                                                 \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

static int run_rank(void) {
  CHECK(tnt_init() == TNT_SUCCESS);
  int r = tnt_rank(), n = tnt_size();
  enum { COUNT = 300001 }; /* odd, not divisible by n, larger than one pipeline slot */
  float *in = malloc(COUNT * sizeof *in), *out = malloc(COUNT * sizeof *out);
  for (int i = 0; i < COUNT; i++) in[i] = (float)((i + r) % 7);
  for (int iter = 0; iter < 3; iter++) { /* the first negotiates, the others hit the cache */
    tnt_handle_t h[3];
    float small_in[5] = {1, 2, 3, 4, (float)r}, small_out[5];
    CHECK(tnt_allreduce_async("big", in, out, COUNT, TNT_FLOAT32, TNT_SUM, 1.0, &h[0]) == TNT_SUCCESS);
    CHECK(tnt_allreduce_async("small", small_in, small_out, 5, TNT_FLOAT32, TNT_AVERAGE, 1.0, &h[1]) == TNT_SUCCESS);
    /* empty allreduces (a NULL buffer is allowed there), queued while "big" runs: announced
     * together (new names each time, so never the one-round path), they are fused, and the
     * fusion buffer of 0 bytes was a NULL destination of memcpy (UBSan, in the asan build) */
    tnt_handle_t e[2];
    char empty_a[32], empty_b[32];
    snprintf(empty_a, sizeof empty_a, "empty-a-%d", iter);
    snprintf(empty_b, sizeof empty_b, "empty-b-%d", iter);
    CHECK(tnt_allreduce_async(empty_a, NULL, NULL, 0, TNT_FLOAT64, TNT_SUM, 1.0, &e[0]) == TNT_SUCCESS);
    CHECK(tnt_allreduce_async(empty_b, small_in, small_out, 0, TNT_FLOAT64, TNT_SUM, 1.0, &e[1]) == TNT_SUCCESS);
    CHECK(tnt_barrier_async("sync", &h[2]) == TNT_SUCCESS);
    for (int k = 2; k >= 0; k--) CHECK(tnt_wait(h[k], 30) == TNT_SUCCESS && tnt_release(h[k]) == TNT_SUCCESS);
    for (int k = 0; k < 2; k++) CHECK(tnt_wait(e[k], 30) == TNT_SUCCESS && tnt_release(e[k]) == TNT_SUCCESS);
    for (int i = 0; i < COUNT; i += 997) {
      float want = 0;
      for (int q = 0; q < n; q++) want += (float)((i + q) % 7);
      CHECK(out[i] == want);
    }
    CHECK(small_out[0] == 1.0f && small_out[4] == (float)(n - 1) / 2.0f);
  }
  tnt_handle_t alone; /* an empty allreduce on its own: its NULL buffer went to the exchange's memcpy */
  CHECK(tnt_allreduce("empty-alone", NULL, NULL, 0, TNT_FLOAT32, TNT_SUM, 1.0, 30, &alone) == TNT_SUCCESS);
  CHECK(tnt_broadcast("empty-bcast", NULL, NULL, 0, TNT_INT32, n - 1, 30, &alone) == TNT_SUCCESS); /* the ring's too */
  int64_t mine[8] = {r, r, r, r, r, r, r, r}, count = 0, root_data[2] = {0, 0}; /* r + 1 of them: n <= 8 */
  tnt_handle_t g, b;
  CHECK(tnt_allgather_async("gather", mine, r + 1, 1, TNT_INT64, &g) == TNT_SUCCESS);
  if (r == n - 1) root_data[0] = root_data[1] = 42;
  CHECK(tnt_broadcast_async("bcast", root_data, root_data, 2, TNT_INT64, n - 1, &b) == TNT_SUCCESS);
  CHECK(tnt_wait(g, 30) == TNT_SUCCESS && tnt_result_count(g, &count) == TNT_SUCCESS);
  CHECK(count == (int64_t)n * (n + 1) / 2);
  int64_t *all = malloc((size_t)count * sizeof *all);
  CHECK(tnt_result_copy(g, all) == TNT_SUCCESS && all[0] == 0 && all[count - 1] == n - 1);
  CHECK(tnt_release(g) == TNT_SUCCESS);
  CHECK(tnt_wait(b, 30) == TNT_SUCCESS && root_data[1] == 42 && tnt_release(b) == TNT_SUCCESS);
  /* counts that each fit a buffer but together do not: refused on every rank (nothing is read) */
  tnt_handle_t huge;
  CHECK(tnt_allgather_async("huge", mine, PTRDIFF_MAX / 4 + 1, 1, TNT_FLOAT16, &huge) == TNT_SUCCESS);
  CHECK(tnt_wait(huge, 30) == TNT_ERR_INVALID_ARGUMENT && tnt_release(huge) == TNT_SUCCESS);
  free(all);
  free(in);
  free(out);
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  char job[64];
  snprintf(job, sizeof job, "ctest%d%ld", (int)getpid(), (long)time(NULL));
  for (int r = 0; r < n; r++) {
    if (fork() == 0) {
      become_rank(r, n, job);
      setenv("TNT_TIMEOUT_S", "60", 1);
      /* the 1.2 MB allreduce takes the path of buffers past the cache (the ring's
       * last two steps as one, streaming stores), under the sanitizers too */
      setenv("TNT_STREAM_MIN_KB", "1024", 1);
      /* 3 ranks add the 1.2 MB in place over shm (allreduce_direct.c, two
       * chunks), 4 run the ring, which is what 2 ranks always run */
      setenv("TNT_SHM_DIRECT", n >= 4 ? "0" : "1", 1);
      exit(run_rank());
    }
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int status;
    wait(&status);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  printf("%d passed, %d failed\n", n - failed, failed);
  return failed ? 1 : 0;
}
