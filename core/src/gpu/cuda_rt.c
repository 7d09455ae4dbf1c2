/* gpu/cuda_rt.c - the CUDA runtime loaded at run time (cuda_rt.h says why and how). */
#define _GNU_SOURCE
#include "cuda_rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common.h"

static struct {
  pthread_once_t once;
  const tnt_cuda_t *loaded;
  tnt_cuda_t fns;
  char why[768];
} cuda = {.once = PTHREAD_ONCE_INIT};

#define INSTALL "pip install nvidia-cuda-runtime-cu12 (tensorflow[and-cuda] installs it), or set TNT_CUDART_LIBRARY to a libcudart.so"

static void load_once(void) {
  const char *env = getenv("TNT_CUDART_LIBRARY");
  const char *names[] = {env && *env ? env : "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  const int n = env && *env ? 1 : 3; /* a library named by the user is the only one tried */
  void *lib = NULL;
  char errs[512] = "";
  /* a runtime the process has loaded already (TensorFlow's .so.12) before any other: one pass per
   * name loaded a findable .so.13 (a CUDA 13 toolkit on the path) beside it, two runtimes in one
   * process */
  for (int i = 0; i < n && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  for (int i = 0; i < n && !lib; i++) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!lib && i == 0) snprintf(errs, sizeof errs, "%s", dlerror());
  }
  if (!lib) {
    snprintf(cuda.why, sizeof cuda.why, "the CUDA runtime cannot be loaded from %s (%s): %s",
             n == 1 ? names[0] : "libcudart.so.13, .so.12 or .so", errs, INSTALL);
    return;
  }
  struct {
    const char *name;
    void **fn;
  } table[] = {
      {"cudaGetDeviceCount", (void **)&cuda.fns.get_device_count},
      {"cudaSetDevice", (void **)&cuda.fns.set_device},
      {"cudaMalloc", (void **)&cuda.fns.malloc},
      {"cudaFree", (void **)&cuda.fns.free},
      {"cudaMemcpy", (void **)&cuda.fns.memcpy},
      {"cudaStreamCreate", (void **)&cuda.fns.stream_create},
      {"cudaStreamDestroy", (void **)&cuda.fns.stream_destroy},
      {"cudaStreamQuery", (void **)&cuda.fns.stream_query},
      {"cudaLaunchHostFunc", (void **)&cuda.fns.launch_host_func},
      {"cudaGetErrorString", (void **)&cuda.fns.get_error_string},
      {"cudaMallocHost", (void **)&cuda.fns.malloc_host},
      {"cudaMemcpyAsync", (void **)&cuda.fns.memcpy_async},
      {"cudaEventCreate", (void **)&cuda.fns.event_create},
      {"cudaEventRecord", (void **)&cuda.fns.event_record},
      {"cudaEventQuery", (void **)&cuda.fns.event_query},
      {"cudaStreamWaitEvent", (void **)&cuda.fns.stream_wait_event},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    *table[i].fn = dlsym(lib, table[i].name);
    if (!*table[i].fn) {
      snprintf(cuda.why, sizeof cuda.why, "the CUDA runtime found has no %s (CUDA 10 or newer is needed): %s",
               table[i].name, INSTALL);
      return;
    }
  }
  cuda.loaded = &cuda.fns;
}

const tnt_cuda_t *tnt_cuda(void) {
  pthread_once(&cuda.once, load_once);
  if (!cuda.loaded) tnt_fail(TNT_ERR_INVALID_USAGE, "%s", cuda.why);
  return cuda.loaded;
}

const char *tnt_cuda_error(int error) {
  const tnt_cuda_t *c = tnt_cuda();
  const char *s = c ? c->get_error_string(error) : NULL;
  return s ? s : "unknown CUDA error";
}

tnt_gpu_poll_t tnt_gpu_poll_start(void) { return (tnt_gpu_poll_t){tnt_now() + 200e-6, 10000}; }

void tnt_gpu_poll_pause(tnt_gpu_poll_t *poll) {
  if (tnt_now() < poll->yield_until) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, poll->nap_ns};
  nanosleep(&ts, NULL);
  if (poll->nap_ns < 1000000) poll->nap_ns *= 2;
}

tnt_result_t tnt_cuda_wait_event(void *event, double deadline, const char *what) {
  const tnt_cuda_t *c = tnt_cuda();
  if (!c) return TNT_ERR_INVALID_USAGE;
  for (tnt_gpu_poll_t poll = tnt_gpu_poll_start();; tnt_gpu_poll_pause(&poll)) {
    int q = c->event_query(event);
    if (q == TNT_CUDA_SUCCESS) return TNT_SUCCESS;
    if (q != TNT_CUDA_NOT_READY)
      return tnt_fail(TNT_ERR_SYSTEM, "waiting for %s: %s (CUDA error %d)", what, tnt_cuda_error(q), q);
    if (tnt_now() >= deadline)
      return tnt_fail(TNT_ERR_TIMEOUT, "%s did not happen within TNT_TIMEOUT_S (a GPU that is stuck?)", what);
  }
}
