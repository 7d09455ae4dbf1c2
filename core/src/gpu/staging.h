/* gpu/staging.h - the allreduce of a GPU tensor through host memory, done
 * well: for ranks that share a GPU (NCCL refuses them) or where NCCL is not
 * found. The tensor comes out to pinned host buffers in pieces on a stream of
 * its own; each piece is summed by the host transports (the core's allreduce)
 * as soon as it has landed, while the next piece comes out, and goes back
 * while later ones are summed. On an H100, a 100 MB bucket made the round trip
 * in 21.3 ms through pageable memory (how TensorFlow stages a tensor for a CPU
 * kernel) and 2.41 ms through pinned memory in overlapped pieces
 * (docs/gpus.md). The CUDA runtime is loaded at run time (gpu/cuda_rt.h). */
#ifndef TNT_GPU_STAGING_H
#define TNT_GPU_STAGING_H

#include <stdint.h>

#include "tarantella.h"

#define TNT_STAGING_PIECE_BYTES (4u << 20) /* the pieces of the pipeline */
#define TNT_STAGING_BUFFERS 3              /* a piece coming out, one being summed, one going back */
/* Calls of one process at once (threads; TensorFlow's executor staging several buckets): each has
 * pinned buffers and streams of its own, made when first needed; a call beyond waits for one to end */
#define TNT_STAGING_LANES 8

/* Allreduce `count` elements of `dt` at the device address `dsend` into
 * `drecv` (may be the same) across the job's ranks (tnt_init first), after
 * the work queued on `stream` (a cudaStream_t; NULL: the default stream).
 * Returns when the result is in `drecv`; a copy that has not happened after
 * timeout_s is TNT_ERR_TIMEOUT, and each piece's allreduce is bounded by the
 * job's TNT_TIMEOUT_S as every collective (on an error `drecv` holds a part of
 * the result; the call returns once the copies it queued have ended, up to its
 * deadline or 1 s after the failure, so that none lands in `drecv` later: what
 * is still queued then is waited for by the next call, with its deadline). `name` (at most 213 bytes) names it across ranks; its pieces
 * are the core's allreduces "<name>#<k>/<pieces>", so every rank must stage
 * the same count: ranks that stage different numbers of pieces never meet
 * and fail at TNT_TIMEOUT_S, a piece of different sizes is a mismatch. A sum has the bits of tnt_allreduce of the same host data, an
 * average those of tnt_allreduce of each piece (every rank's the same). */
tnt_result_t tnt_gpu_allreduce_staged(const char *name, const void *dsend, void *drecv, int64_t count,
                                      tnt_dtype_t dt, tnt_reduce_op_t op, void *stream, double timeout_s);

#endif
