/* gpu_copy_bandwidth.c - what moving a 100 MB gradient bucket GPU -> host ->
 * GPU costs through pageable memory (what TensorFlow's copies for a CPU
 * kernel use) and through pinned memory, whole and in 4 MiB pieces whose copy
 * back overlaps the next piece's copy out: the bound that host staging of GPU
 * tensors (issue "GPUs", docs/gpus.md) is measured against. Best of 6.
 *
 *   cc -O2 -o /tmp/gpu_copy_bandwidth bench/gpu_copy_bandwidth.c -ldl
 *   TNT_CUDART_LIBRARY=/path/to/libcudart.so.13 /tmp/gpu_copy_bandwidth
 *
 * The CUDA runtime is loaded at run time (nothing of CUDA is needed to build). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  const char *path = getenv("TNT_CUDART_LIBRARY");
  void *rt = dlopen(path && *path ? path : "libcudart.so", RTLD_NOW);
  if (!rt) {
    fprintf(stderr, "no CUDA runtime: %s (set TNT_CUDART_LIBRARY)\n", dlerror());
    return 1;
  }
  int (*mal)(void **, size_t) = dlsym(rt, "cudaMalloc");
  int (*malhost)(void **, size_t) = dlsym(rt, "cudaMallocHost");
  int (*cpy)(void *, const void *, size_t, int) = dlsym(rt, "cudaMemcpy");
  int (*cpya)(void *, const void *, size_t, int, void *) = dlsym(rt, "cudaMemcpyAsync");
  int (*sync)(void *) = dlsym(rt, "cudaStreamSynchronize");
  int (*screate)(void **) = dlsym(rt, "cudaStreamCreate");
  const size_t B = 100u << 20;
  void *d, *d2, *pin, *pin2; char *page = malloc(B), *page2 = malloc(B);
  memset(page, 1, B); memset(page2, 1, B);
  const char *(*err)(int) = dlsym(rt, "cudaGetErrorString");
  int rc = mal(&d, B);
  if (!rc) rc = mal(&d2, B);
  if (!rc) rc = malhost(&pin, B);
  if (!rc) rc = malhost(&pin2, B);
  if (rc) {
    fprintf(stderr, "no GPU memory: %s (CUDA error %d)\n", err(rc), rc);
    return 1;
  }
  void *s1, *s2; screate(&s1); screate(&s2);
  for (int kind = 0; kind < 2; kind++) {
    char *h = kind ? pin : page;
    double best_d2h = 1e9, best_h2d = 1e9, best_rt = 1e9, best_pipe = 1e9;
    for (int r = 0; r < 6; r++) {
      double t0 = now(); cpy(h, d, B, 2); double t1 = now(); cpy(d, h, B, 1); double t2 = now();
      if (t1 - t0 < best_d2h) best_d2h = t1 - t0;
      if (t2 - t1 < best_h2d) best_h2d = t2 - t1;
      if (t2 - t0 < best_rt) best_rt = t2 - t0;
      /* pieces of 4 MiB: piece i's copy back overlaps piece i+1's copy out (two streams) */
      const size_t P = 4u << 20; double t3 = now();
      for (size_t off = 0; off < B; off += P) {
        cpya(h + off, (char *)d + off, P, 2, s1); sync(s1);
        cpya((char *)d2 + off, h + off, P, 1, s2);
      }
      sync(s2); double t4 = now();
      if (t4 - t3 < best_pipe) best_pipe = t4 - t3;
    }
    printf("%s: D2H %.1f GB/s, H2D %.1f GB/s, round trip of 100 MB %.2f ms (%.1f GB/s), in 4 MiB pieces overlapped %.2f ms\n",
           kind ? "pinned" : "pageable", B / best_d2h / 1e9, B / best_h2d / 1e9, best_rt * 1e3, B / best_rt / 1e9, best_pipe * 1e3);
  }
  return 0;
}
