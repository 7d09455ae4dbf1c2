/* gpu/cuda_rt.h - the CUDA runtime, loaded at run time: what the core needs
 * of it to wait for GPU work with a deadline (gpu/nccl.c), and what a test
 * needs to put data on a GPU.
 *
 * Nothing of CUDA is needed to build or install the core. The library is
 * dlopen()ed on first use: $TNT_CUDART_LIBRARY, else the first of
 * libcudart.so.13, libcudart.so.12 and libcudart.so on the library path (the
 * runtime TensorFlow brings, nvidia-cuda-runtime-cu12, is on it once
 * TensorFlow has loaded it). The few declarations used are written here from
 * the CUDA runtime API's documentation; streams and events are opaque
 * pointers, error codes ints (cudaSuccess 0, cudaErrorNotReady 600). */
#ifndef TNT_GPU_CUDA_RT_H
#define TNT_GPU_CUDA_RT_H

#include <stddef.h>

#include "tarantella.h"

#define TNT_CUDA_SUCCESS 0
#define TNT_CUDA_NOT_READY 600 /* cudaErrorNotReady: the stream still has work */
#define TNT_CUDA_HOST_TO_DEVICE 1 /* cudaMemcpyKind */
#define TNT_CUDA_DEVICE_TO_HOST 2

typedef struct {
  int (*get_device_count)(int *count);
  int (*set_device)(int device);
  int (*malloc)(void **ptr, size_t bytes);
  int (*free)(void *ptr);
  int (*memcpy)(void *dst, const void *src, size_t bytes, int kind);
  int (*stream_create)(void **stream);
  int (*stream_destroy)(void *stream);
  int (*stream_query)(void *stream);
  int (*launch_host_func)(void *stream, void (*fn)(void *), void *arg);
  const char *(*get_error_string)(int error);
  /* for host staging (gpu/staging.c) */
  int (*malloc_host)(void **ptr, size_t bytes);
  int (*memcpy_async)(void *dst, const void *src, size_t bytes, int kind, void *stream);
  int (*event_create)(void **event);
  int (*event_record)(void *event, void *stream);
  int (*event_query)(void *event);
  int (*stream_wait_event)(void *stream, void *event, unsigned int flags);
} tnt_cuda_t;

/* The CUDA runtime, loaded once per process: its functions, or NULL with an
 * error that says why it cannot be used and what to install or set. */
const tnt_cuda_t *tnt_cuda(void);
/* CUDA's own words for an error code ("an illegal memory access was ..."). */
const char *tnt_cuda_error(int error);
/* The pause between two polls of GPU work (an event, a stream): the first
 * 200 us yield the core, then sleeps of 10 us back off to 1 ms. A 4 MiB piece
 * crosses PCIe gen 5 in about 80 us: sleeping 10-40 us at a time from the
 * start made a 100 MB staging 1.6x the copies' own time on an H100. */
typedef struct {
  double yield_until;
  long nap_ns;
} tnt_gpu_poll_t;
tnt_gpu_poll_t tnt_gpu_poll_start(void);
void tnt_gpu_poll_pause(tnt_gpu_poll_t *poll);
/* Wait until `event` has happened, pausing between polls as above, until
 * `deadline`: TNT_SUCCESS, TNT_ERR_TIMEOUT, or TNT_ERR_SYSTEM with CUDA's
 * words; `what` says what it waited for. */
tnt_result_t tnt_cuda_wait_event(void *event, double deadline, const char *what);

#endif
