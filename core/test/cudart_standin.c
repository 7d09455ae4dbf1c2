/* cudart_standin.c - a stand-in for libcudart.so that test_nccl.c builds in
 * variants: what cudaStreamQuery answers (QUERY: 0 done, 600 still running
 * forever, 700 an illegal memory access). Memory is host memory, and no
 * device is reported. No GPU, no CUDA. */
#include <stdlib.h>
#include <string.h>

#ifndef QUERY
#define QUERY 0
#endif

int cudaGetDeviceCount(int *count) { *count = 0; return 0; }
int cudaSetDevice(int device) { return 0; }
int cudaMalloc(void **ptr, size_t bytes) { *ptr = malloc(bytes ? bytes : 1); return *ptr ? 0 : 2; }
int cudaFree(void *ptr) { free(ptr); return 0; }
int cudaMemcpy(void *dst, const void *src, size_t bytes, int kind) { memmove(dst, src, bytes); return 0; }
static int stream_object;
int cudaStreamCreate(void **stream) { *stream = &stream_object; return 0; }
int cudaStreamDestroy(void *stream) { return 0; }
int standin_queries;
int cudaStreamQuery(void *stream) { standin_queries++; return QUERY; }
int cudaLaunchHostFunc(void *stream, void (*fn)(void *), void *arg) { fn(arg); return 0; }
const char *cudaGetErrorString(int error) {
  return error == 700 ? "an illegal memory access was encountered" : error == 600 ? "device not ready" : "no error";
}
/* host staging: pinned memory is host memory, copies are done at once, events have always happened */
/* pinned buffers made so far, and which one fails once (1, 2, ...; 0: none), set by test_gpu_staging.c */
int standin_host_allocs, standin_fail_host_alloc_at;
int cudaMallocHost(void **ptr, size_t bytes) {
  if (standin_fail_host_alloc_at == standin_host_allocs + 1) {
    standin_fail_host_alloc_at = 0;
    return 2; /* cudaErrorMemoryAllocation */
  }
  standin_host_allocs++;
  return cudaMalloc(ptr, bytes);
}
int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *stream) {
  memmove(dst, src, bytes);
  return 0;
}
static int event_object;
int cudaEventCreate(void **event) { *event = &event_object; return 0; }
int cudaEventRecord(void *event, void *stream) { return 0; }
int cudaEventQuery(void *event) { return QUERY; }
int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags) { return 0; }
