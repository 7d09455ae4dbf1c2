/* test_nccl.c - the NCCL loader (src/gpu/nccl.c) against stand-ins of
 * libnccl.so.2 built from test/nccl_standin.c: a missing library, one too old,
 * one without a function, a set-up that fails, one that never ends (aborted at
 * the deadline), and one that works; and the collectives against it, waited
 * for on stand-ins of libcudart.so (test/cudart_standin.c) whose stream is
 * done, never done, or failed, and which runtime is taken where one is loaded
 * already. No GPU, no CUDA. Each case runs in a child
 * process: NCCL is loaded once per process. argv[1]: the folder of the
 * stand-ins. Prints "N passed, N failed". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "child_case.h"
#include "gpu/cuda_rt.h"
#include "gpu/nccl.h"

static const char *dir;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "FAILED %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              tnt_last_error());                                                     \
      _exit(1);                                                                      \
    }                                                                                \
  } while (0)

static void use(const char *standin) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, standin);
  setenv("TNT_NCCL_LIBRARY", path, 1);
}

static int counter(const char *standin, const char *name) { /* the stand-in NCCL loaded: the same instance */
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, standin);
  void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  int *v = lib ? dlsym(lib, name) : NULL;
  return v ? *v : -1000;
}

static void missing_library(void) {
  setenv("TNT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  CHECK(tnt_nccl_load() == TNT_ERR_INVALID_USAGE);
  CHECK(strstr(tnt_last_error(), "NCCL cannot be loaded from /nonexistent/libnccl.so.2"));
  CHECK(strstr(tnt_last_error(), "pip install nvidia-nccl-cu12"));
  CHECK(strstr(tnt_nccl_status(), "cannot be loaded")); /* the reason stays */
  CHECK(tnt_nccl_version() == 0);
}

static void too_old(void) {
  use("nccl-old.so");
  CHECK(tnt_nccl_load() == TNT_ERR_INVALID_USAGE);
  CHECK(strstr(tnt_last_error(), "NCCL 2.12.3 at "));
  CHECK(strstr(tnt_last_error(), "needs 2.14 or newer"));
}

static void function_missing(void) {
  use("nccl-partial.so");
  CHECK(tnt_nccl_load() == TNT_ERR_INVALID_USAGE);
  CHECK(strstr(tnt_last_error(), "has no ncclCommGetAsyncError"));
}

static void init_fails(void) {
  use("nccl-dup.so");
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm = (void *)1;
  CHECK(tnt_nccl_comm_init(1, 2, id, tnt_now() + 5, &comm) == TNT_ERR_SYSTEM);
  CHECK(comm == NULL);
  /* NCCL's own words: the code and its last error line */
  CHECK(strstr(tnt_last_error(), "rank 1 could not join its NCCL communicator of 2 ranks: invalid usage"));
  CHECK(strstr(tnt_last_error(), "Duplicate GPU detected"));
  CHECK(counter("nccl-dup.so", "standin_aborts") == 1);
}

static void setup_fails_later(void) {
  use("nccl-async-error.so");
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm;
  CHECK(tnt_nccl_comm_init(0, 2, id, tnt_now() + 5, &comm) == TNT_ERR_SYSTEM);
  CHECK(strstr(tnt_last_error(), "NCCL failed while setting up its communicator of 2 ranks: unhandled system error"));
  CHECK(counter("nccl-async-error.so", "standin_aborts") == 1);
}

static void setup_never_ends(void) {
  use("nccl-hang.so");
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm;
  double start = tnt_now();
  CHECK(tnt_nccl_comm_init(0, 4, id, start + 0.3, &comm) == TNT_ERR_TIMEOUT);
  double took = tnt_now() - start;
  CHECK(took >= 0.3 && took < 3.0); /* a bound, not a timing: it must end */
  CHECK(strstr(tnt_last_error(), "did not set up its communicator of 4 ranks within TNT_TIMEOUT_S"));
  CHECK(counter("nccl-hang.so", "standin_aborts") == 1);
}

static void works(void) {
  use("nccl-ok.so");
  CHECK(tnt_nccl_load() == TNT_SUCCESS);
  CHECK(tnt_nccl_status()[0] == 0);
  CHECK(tnt_nccl_version() == 22703);
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm = NULL;
  CHECK(tnt_nccl_comm_init(2, 3, id, tnt_now() + 5, &comm) == TNT_SUCCESS && comm);
  CHECK(counter("nccl-ok.so", "standin_blocking") == 0); /* non-blocking: every wait has our deadline */
  CHECK(counter("nccl-ok.so", "standin_nranks") == 3 && counter("nccl-ok.so", "standin_rank") == 2);
  CHECK(counter("nccl-ok.so", "standin_id_ok") == 1);
  tnt_nccl_comm_destroy(comm);
  CHECK(counter("nccl-ok.so", "standin_destroys") == 1 && counter("nccl-ok.so", "standin_aborts") == 0);
}

static void use_cudart(const char *standin) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, standin);
  setenv("TNT_CUDART_LIBRARY", path, 1);
}

/* A communicator of one rank on the working stand-in, its collectives on host memory. */
static tnt_nccl_comm_t *one_rank(const char *cudart) {
  use("nccl-ok.so");
  use_cudart(cudart);
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm = NULL;
  CHECK(tnt_nccl_comm_init(0, 1, id, tnt_now() + 5, &comm) == TNT_SUCCESS && comm);
  return comm;
}

static void collectives(void) {
  tnt_nccl_comm_t *comm = one_rank("cudart-ok.so");
  float in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0}; /* room for 3 float64 */
  double deadline = tnt_now() + 5;
  CHECK(tnt_nccl_allreduce(comm, in, out, 5, TNT_FLOAT32, TNT_SUM, NULL, deadline) == TNT_SUCCESS);
  CHECK(memcmp(in, out, 5 * sizeof *in) == 0);
  CHECK(counter("nccl-ok.so", "standin_dtype") == 7 && counter("nccl-ok.so", "standin_op") == 0); /* ncclFloat32, ncclSum */
  /* NCCL's codes for every dtype */
  const struct { tnt_dtype_t dt; int nccl; } types[] = {{TNT_FLOAT16, 6}, {TNT_BFLOAT16, 9}, {TNT_FLOAT32, 7},
                                                        {TNT_FLOAT64, 8}, {TNT_INT32, 2}, {TNT_INT64, 4}};
  for (int i = 0; i < 6; i++) {
    CHECK(tnt_nccl_allreduce(comm, in, out, 2, types[i].dt, TNT_SUM, NULL, deadline) == TNT_SUCCESS);
    CHECK(counter("nccl-ok.so", "standin_dtype") == types[i].nccl);
  }
  /* no average on NCCL (its ncclAvg lost elements on a GPU): refused, nothing sent */
  int calls = counter("nccl-ok.so", "standin_collectives");
  CHECK(tnt_nccl_allreduce(comm, in, out, 2, TNT_FLOAT32, TNT_AVERAGE, NULL, deadline) == TNT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tnt_last_error(), "NCCL allreduce of 2 float32: an average is not done on NCCL"));
  CHECK(tnt_nccl_allreduce(comm, in, out, 2, TNT_INT64, TNT_AVERAGE, NULL, deadline) == TNT_ERR_INVALID_ARGUMENT);
  CHECK(counter("nccl-ok.so", "standin_collectives") == calls);
  CHECK(tnt_nccl_broadcast(comm, in, out, 3, TNT_FLOAT64, 0, NULL, deadline) == TNT_SUCCESS);
  CHECK(counter("nccl-ok.so", "standin_root") == 0 && counter("nccl-ok.so", "standin_dtype") == 8);
  CHECK(tnt_nccl_broadcast(comm, in, out, 3, TNT_FLOAT64, 1, NULL, deadline) == TNT_ERR_INVALID_ARGUMENT);
  CHECK(strstr(tnt_last_error(), "root 1 out of range (1 ranks)"));
  CHECK(tnt_nccl_allgather(comm, in, out, 4, TNT_INT32, NULL, deadline) == TNT_SUCCESS);
  CHECK(counter("nccl-ok.so", "standin_dtype") == 2);
  tnt_nccl_comm_destroy(comm);
  CHECK(counter("nccl-ok.so", "standin_aborts") == 0);
}

static void collective_never_completes(void) {
  tnt_nccl_comm_t *comm = one_rank("cudart-busy.so");
  float x[4] = {0};
  double start = tnt_now();
  CHECK(tnt_nccl_allreduce(comm, x, x, 4, TNT_FLOAT32, TNT_SUM, NULL, start + 0.3) == TNT_ERR_TIMEOUT);
  double took = tnt_now() - start;
  CHECK(took >= 0.3 && took < 3.0); /* a bound, not a timing: it must end */
  CHECK(strstr(tnt_last_error(), "rank 0: NCCL allreduce of 4 float32 did not complete within TNT_TIMEOUT_S"));
  CHECK(strstr(tnt_last_error(), "its communicator was aborted"));
  CHECK(counter("nccl-ok.so", "standin_aborts") == 1);
  CHECK(counter("cudart-busy.so", "standin_queries") > 1); /* polled, not waited on blindly */
  /* every later call fails at once, naming the first failure; nothing more is sent */
  int calls = counter("nccl-ok.so", "standin_collectives");
  CHECK(tnt_nccl_broadcast(comm, x, x, 4, TNT_FLOAT32, 0, NULL, tnt_now() + 5) == TNT_ERR_PEER_LOST);
  CHECK(strstr(tnt_last_error(), "aborted after an earlier failure (rank 0: NCCL allreduce of 4 float32 did not"));
  CHECK(counter("nccl-ok.so", "standin_collectives") == calls);
  tnt_nccl_comm_destroy(comm);
  CHECK(counter("nccl-ok.so", "standin_destroys") == 0 && counter("nccl-ok.so", "standin_aborts") == 1);
}

static void stream_fails(void) {
  tnt_nccl_comm_t *comm = one_rank("cudart-broken.so");
  float x[4] = {0};
  CHECK(tnt_nccl_allgather(comm, x, x, 4, TNT_FLOAT32, NULL, tnt_now() + 5) == TNT_ERR_SYSTEM);
  CHECK(strstr(tnt_last_error(), "the CUDA stream of NCCL allgather of 4 float32 per rank failed: an illegal memory "
                                 "access was encountered (CUDA error 700)"));
  CHECK(counter("nccl-ok.so", "standin_aborts") == 1);
  tnt_nccl_comm_abort(comm);
}

static void cudart_missing(void) {
  use("nccl-ok.so");
  setenv("TNT_CUDART_LIBRARY", "/nonexistent/libcudart.so.12", 1);
  char id[TNT_NCCL_ID_BYTES];
  CHECK(tnt_nccl_unique_id(id) == TNT_SUCCESS);
  tnt_nccl_comm_t *comm = NULL;
  CHECK(tnt_nccl_comm_init(0, 1, id, tnt_now() + 5, &comm) == TNT_SUCCESS);
  float x[1] = {0};
  CHECK(tnt_nccl_allreduce(comm, x, x, 1, TNT_FLOAT32, TNT_SUM, NULL, tnt_now() + 5) == TNT_ERR_INVALID_USAGE);
  CHECK(strstr(tnt_last_error(), "the CUDA runtime cannot be loaded from /nonexistent/libcudart.so.12"));
  CHECK(strstr(tnt_last_error(), "pip install nvidia-cuda-runtime-cu12"));
  CHECK(counter("nccl-ok.so", "standin_collectives") == 0);
  tnt_nccl_comm_destroy(comm);
}

/* TensorFlow has loaded libcudart.so.12 (the stand-in whose soname it is), and a libcudart.so.13 is on
 * the library path too (a CUDA 13 toolkit): the core takes the runtime the process has loaded, as
 * docs/gpus.md says. It loaded the .so.13 first, a second CUDA runtime in the process. */
static void cudart_loaded_first(void) {
  unsetenv("TNT_CUDART_LIBRARY");
  char path[1024];
  snprintf(path, sizeof path, "%s/cudart-so12.so", dir);
  void *tf_runtime = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  CHECK(tf_runtime && dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD) == NULL);
  CHECK(tnt_cuda() && tnt_cuda()->stream_query == dlsym(tf_runtime, "cudaStreamQuery"));
  CHECK(dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD) == NULL); /* not loaded beside it */
}

static void run(const char *name, void (*fn)(void)) { report_case(name, in_child(fn, 30)); }

/* The folder of a libcudart.so.13 (the busy stand-in) that cudart_loaded_first needs on the library
 * path, which is read once, when a program starts: made, then the program runs again with it. */
static void with_cudart13_on_the_library_path(char **argv) {
  if (getenv("TNT_TEST_CUDART13_DIR")) return;
  /* realpath writes up to PATH_MAX bytes: a smaller buffer aborts under _FORTIFY_SOURCE (Ubuntu's
   * default; it stopped this program on the GPU machine before its first case) */
  char folder[1024], link[1100], target[PATH_MAX + 32];
  snprintf(folder, sizeof folder, "%s/cudart13", dir);
  snprintf(link, sizeof link, "%s/libcudart.so.13", folder);
  if (!realpath(dir, target)) return;
  strncat(target, "/cudart-busy.so", sizeof target - strlen(target) - 1);
  mkdir(folder, 0700);
  unlink(link);
  if (symlink(target, link) != 0) return;
  const char *old = getenv("LD_LIBRARY_PATH");
  char paths[4096];
  snprintf(paths, sizeof paths, "%s%s%s", folder, old && *old ? ":" : "", old ? old : "");
  setenv("LD_LIBRARY_PATH", paths, 1);
  setenv("TNT_TEST_CUDART13_DIR", folder, 1);
  execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
  dir = argc > 1 ? argv[1] : "build";
  with_cudart13_on_the_library_path(argv);
  run("missing_library", missing_library);
  run("too_old", too_old);
  run("function_missing", function_missing);
  run("init_fails", init_fails);
  run("setup_fails_later", setup_fails_later);
  run("setup_never_ends", setup_never_ends);
  run("works", works);
  run("collectives", collectives);
  run("collective_never_completes", collective_never_completes);
  run("stream_fails", stream_fails);
  run("cudart_missing", cudart_missing);
  run("cudart_loaded_first", cudart_loaded_first);
  return finish_cases();
}
