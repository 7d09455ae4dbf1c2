/* gpu/nccl.h - NCCL, loaded at run time: the collectives of GPU tensors when
 * every rank has a GPU of its own (docs/gpus.md: the Python frontend does not
 * call them yet).
 *
 * Nothing of NCCL or CUDA is needed to build or install the core: the library
 * is dlopen()ed on first use ($TNT_NCCL_LIBRARY, set by the Python package to
 * the libnccl.so.2 of the nvidia-nccl-cu12 wheel that tensorflow[and-cuda]
 * installs, else libnccl.so.2 on the library path), its functions found by
 * name, and the few declarations we need are written here from NCCL's API
 * documentation. NCCL's licence forbids shipping it: it is loaded, never
 * copied.
 *
 * Every wait has a deadline: communicators are created non-blocking
 * (ncclConfig_t.blocking = 0, NCCL 2.14 and newer) and polled with
 * ncclCommGetAsyncError; at the deadline or on an error the communicator is
 * aborted (ncclCommAbort), so a rank that never joins cannot hang the others;
 * a collective is waited for on its stream through the CUDA runtime, loaded
 * the same way (gpu/cuda_rt.h), with the same deadline. */
#ifndef TNT_GPU_NCCL_H
#define TNT_GPU_NCCL_H

#include <stddef.h>

#include "tarantella.h"

#define TNT_NCCL_ID_BYTES 128     /* ncclUniqueId */
#define TNT_NCCL_MIN_VERSION 21400 /* 2.14.0: non-blocking communicators (ncclConfig_t.blocking) */

typedef struct tnt_nccl_comm tnt_nccl_comm_t;

/* Load NCCL once per process: TNT_SUCCESS, or an error that says why it cannot
 * be used and what to install or set (the reason stays: tnt_nccl_status). */
tnt_result_t tnt_nccl_load(void);
/* NCCL's version code (major * 10000 + minor * 100 + patch), 0 when not loaded. */
int tnt_nccl_version(void);
/* The id of a new communicator (rank 0 makes it; every rank passes it to init). */
tnt_result_t tnt_nccl_unique_id(void *id);
/* This rank's member of the communicator `id` of `size` ranks, ready by
 * `deadline` (tnt_now() clock), else aborted and TNT_ERR_TIMEOUT. The CUDA
 * device the rank uses must be current. */
tnt_result_t tnt_nccl_comm_init(int rank, int size, const void *id, double deadline, tnt_nccl_comm_t **out);
/* The collectives, on device memory and a CUDA stream (a cudaStream_t; NULL
 * is the default stream). Each returns when the stream has run it, at most
 * at `deadline`: then, or when NCCL or CUDA report an error, the communicator
 * is aborted (a peer that never makes the call cannot hang this rank), and
 * every later call on it fails at once, naming the first failure. `send` may
 * be `recv` (in place). AVERAGE is refused (TNT_ERR_INVALID_ARGUMENT): NCCL's
 * ncclAvg lost elements in a measured case (nccl.c), and an integer one would
 * round otherwise than the host path; sum, then scale. */
tnt_result_t tnt_nccl_allreduce(tnt_nccl_comm_t *comm, const void *send, void *recv, size_t count, tnt_dtype_t dt,
                                tnt_reduce_op_t op, void *stream, double deadline);
tnt_result_t tnt_nccl_broadcast(tnt_nccl_comm_t *comm, const void *send, void *recv, size_t count, tnt_dtype_t dt,
                                int root, void *stream, double deadline);
/* `count` elements from every rank, in rank order: recv holds count * size. */
tnt_result_t tnt_nccl_allgather(tnt_nccl_comm_t *comm, const void *send, void *recv, size_t count, tnt_dtype_t dt,
                                void *stream, double deadline);
/* Abort (a failure: in-flight work is dropped) or destroy (after clean work). */
void tnt_nccl_comm_abort(tnt_nccl_comm_t *comm);
void tnt_nccl_comm_destroy(tnt_nccl_comm_t *comm);

#endif
