/*
 * tarantella.h - the public C API of the Tarantella communication core.
 *
 * One context per process. tnt_init() reads the placement from the environment
 * (TNT_RANK/TNT_SIZE/..., else Slurm, OpenMPI or PMI variables, else rank 0 of 1)
 * and starts one background thread that negotiates and executes collectives.
 *
 * Every entry point returns a tnt_result_t. Collectives are non-blocking: they
 * enqueue a named request and return a handle; tnt_wait() blocks (never spins
 * for long) until the request completed on this rank, failed, or timed out.
 * tnt_last_error() gives the message of the last failure seen by this thread.
 *
 * The block between TNT_CDEF_BEGIN and TNT_CDEF_END is read verbatim by the cffi
 * builder (tarantella/common/_build_core.py): keep it free of preprocessor
 * directives and macros.
 */
#ifndef TARANTELLA_H
#define TARANTELLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* TNT_CDEF_BEGIN */
typedef enum {
  TNT_SUCCESS = 0,
  TNT_ERR_INVALID_ARGUMENT = 1, /* bad dtype, count, root, name...: fix the call */
  TNT_ERR_INVALID_USAGE = 2,    /* call before init / after finalize, duplicate name */
  TNT_ERR_MISMATCH = 3,         /* ranks submitted the same name with different dtype/count/op */
  TNT_ERR_PEER_LOST = 4,        /* a peer process died or aborted */
  TNT_ERR_TIMEOUT = 5,          /* a wait or a stalled negotiation exceeded its bound */
  TNT_ERR_SYSTEM = 6,           /* an OS call failed (shm_open, mmap, ...) */
  TNT_ERR_INTERNAL = 7,         /* a bug: please report it with TNT_LOG_LEVEL=DEBUG output */
  TNT_IN_PROGRESS = 8           /* tnt_test(): not complete yet */
} tnt_result_t;

typedef enum {
  TNT_FLOAT16 = 0,
  TNT_BFLOAT16 = 1,
  TNT_FLOAT32 = 2,
  TNT_FLOAT64 = 3,
  TNT_INT32 = 4,
  TNT_INT64 = 5
} tnt_dtype_t;

typedef enum {
  TNT_SUM = 0,
  TNT_AVERAGE = 1
} tnt_reduce_op_t;

typedef int64_t tnt_handle_t;

/* Context. tnt_init is idempotent while initialized; after tnt_finalize it may be
 * called again. tnt_abort marks this rank failed so peers fail fast with `reason`. */
tnt_result_t tnt_init(void);
tnt_result_t tnt_finalize(void);
tnt_result_t tnt_abort(const char *reason);
int tnt_initialized(void);
int tnt_rank(void);
int tnt_size(void);
int tnt_local_rank(void);
int tnt_local_size(void);
const char *tnt_transport_name(void);
/* Can transport `name` be used on this machine? "": yes; NULL: a name this core
 * does not know; else why not, in one line that says what to install or set
 * (mpi: usable when its plugin loads, or, not built yet, when an MPI compiler
 * wrapper is found to build it at first use). Needs no tnt_init. */
const char *tnt_transport_status(const char *name);
/* NCCL (the collectives of GPU tensors, loaded at run time): "" when it can be
 * used on this machine, else why not, in one line that says what to install or
 * set. Needs no tnt_init and no GPU (whether a GPU is there is asked apart). */
const char *tnt_nccl_status(void);

/* Collectives. `name` identifies the request across ranks (at most 255 bytes);
 * ranks may submit names in any order. Buffers must stay valid until completion.
 *
 * allreduce: out[i] = sum over ranks of (prescale_r * in_r[i]), divided by the
 * number of ranks for TNT_AVERAGE. in == out is allowed. */
tnt_result_t tnt_allreduce_async(const char *name, const void *in, void *out, int64_t count,
                                 tnt_dtype_t dtype, tnt_reduce_op_t op, double prescale,
                                 tnt_handle_t *handle);
/* Blocking allreduce: tnt_allreduce_async, tnt_wait(timeout_s) and tnt_release
 * in one call, the calling thread driving the collective (no wake-up of the
 * background thread in a steady loop). TNT_SUCCESS: `out` holds the result.
 * TNT_IN_PROGRESS: not complete within timeout_s; *handle is the pending
 * request (tnt_wait on it, then tnt_release). Any error: nothing to release. */
tnt_result_t tnt_allreduce(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                           tnt_reduce_op_t op, double prescale, double timeout_s, tnt_handle_t *handle);
/* broadcast: every rank's out receives root's in (in is read on the root only). */
tnt_result_t tnt_broadcast_async(const char *name, const void *in, void *out, int64_t count,
                                 tnt_dtype_t dtype, int root, tnt_handle_t *handle);
/* Blocking broadcast, as tnt_allreduce is the blocking allreduce. */
tnt_result_t tnt_broadcast(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                           int root, double timeout_s, tnt_handle_t *handle);
/* allgather: concatenation of every rank's `count` elements in rank order. Counts
 * may differ between ranks but must be multiples of the same `row_elems` (the
 * element count of one first-dimension row, which every rank must agree on).
 * The result is owned by the handle: query with tnt_result_count, copy with
 * tnt_result_copy, then tnt_release. */
tnt_result_t tnt_allgather_async(const char *name, const void *in, int64_t count, int64_t row_elems,
                                 tnt_dtype_t dtype, tnt_handle_t *handle);
/* The same, written straight into `out` when the result has exactly `out_count`
 * elements (the caller's guess, e.g. every rank's count equal to its own): then
 * tnt_result_count gives out_count and the result is already in `out`, and
 * nothing is left to copy. Otherwise the handle owns the result, as with
 * tnt_allgather_async. `out` must not overlap `in` and must stay valid until
 * the request completes. Saves a copy of the whole result. */
tnt_result_t tnt_allgather_into_async(const char *name, const void *in, int64_t count, int64_t row_elems,
                                      tnt_dtype_t dtype, void *out, int64_t out_count, tnt_handle_t *handle);
/* Blocking tnt_allgather_into_async, the calling thread driving it (as
 * tnt_allreduce), except that a successful request is not released:
 * TNT_SUCCESS leaves *handle complete, for tnt_result_count (and
 * tnt_result_copy when the result did not fit `out`), then tnt_release. */
tnt_result_t tnt_allgather_into(const char *name, const void *in, int64_t count, int64_t row_elems, tnt_dtype_t dtype,
                                void *out, int64_t out_count, double timeout_s, tnt_handle_t *handle);
tnt_result_t tnt_barrier_async(const char *name, tnt_handle_t *handle);
/* Blocking barrier, as tnt_allreduce is the blocking allreduce. */
tnt_result_t tnt_barrier(const char *name, double timeout_s, tnt_handle_t *handle);
/* The same collectives for a payload fused from several arrays (a nested
 * structure's leaves): `layout` is the caller's digest of their keys, dtypes
 * and shapes, and every rank must pass the same one, as it must the same
 * count; else TNT_ERR_MISMATCH on every rank (equal counts alone would sum
 * one rank's leaf into another's). 0 is a 1-d array's layout; one array of
 * more dimensions passes tnt_shape_layout of its shape (below). */
tnt_result_t tnt_allreduce_layout_async(const char *name, const void *in, void *out, int64_t count,
                                        tnt_dtype_t dtype, tnt_reduce_op_t op, double prescale, uint64_t layout,
                                        tnt_handle_t *handle);
tnt_result_t tnt_allreduce_layout(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                  tnt_reduce_op_t op, double prescale, uint64_t layout, double timeout_s,
                                  tnt_handle_t *handle);
tnt_result_t tnt_broadcast_layout_async(const char *name, const void *in, void *out, int64_t count,
                                        tnt_dtype_t dtype, int root, uint64_t layout, tnt_handle_t *handle);
tnt_result_t tnt_allgather_into_layout_async(const char *name, const void *in, int64_t count, int64_t row_elems,
                                             tnt_dtype_t dtype, void *out, int64_t out_count, uint64_t layout,
                                             tnt_handle_t *handle);
/* Blocking forms, as tnt_broadcast and tnt_allgather_into are. */
tnt_result_t tnt_broadcast_layout(const char *name, const void *in, void *out, int64_t count, tnt_dtype_t dtype,
                                  int root, uint64_t layout, double timeout_s, tnt_handle_t *handle);
tnt_result_t tnt_allgather_into_layout(const char *name, const void *in, int64_t count, int64_t row_elems,
                                       tnt_dtype_t dtype, void *out, int64_t out_count, uint64_t layout,
                                       double timeout_s, tnt_handle_t *handle);
/* The layout of one array of `ndim` dimensions `dims` (first first), for the
 * calls above: equal counts do not make two shapes alike ((2, 3) summed into
 * (3, 2) element by element). 0 when ndim < 2 (the count says it all: a 0-d
 * array and a 1-element vector match), else never 0: its two lowest bits are
 * binary 10, so a caller's own digests should be odd (the NumPy API's
 * structures' are). Shapes that fit (ndim up to 9, each dimension within
 * 58/ndim bits: (n, m) up to 536870911 each) are held exactly, and a mismatch
 * message shows them ("float32[6] of shape (2, 3)"); others as a hash. The
 * NumPy API and the TensorFlow ops pass it for every array: allreduce and
 * broadcast the array's shape; allgather the shape of its rows (all
 * dimensions but the first, so ndim >= 3; ndim 2 differs in row_elems). */
uint64_t tnt_shape_layout(int ndim, const int64_t *dims);
/* The layout of an allgather of rows of no elements, each of `ndim` dimensions `dims` (a (5, 0)
 * array's rows: (0,)): such rows' data is no bytes, which cannot say how many rows each rank has,
 * so each rank sends its row count instead (an int64, as one row of 8 bytes in the array's dtype)
 * under this layout, odd and one per row shape, which pairs with no array's. The NumPy API and the
 * TensorFlow ops send alike. */
uint64_t tnt_empty_rows_layout(int ndim, const int64_t *dims);

/* Completion. tnt_wait's timeout_s bounds this wait (TNT_ERR_TIMEOUT, the request
 * stays pending); a negative, NaN or infinite timeout_s (or one beyond 1e9 s)
 * waits until the request completes or the core fails it (it always does,
 * within TNT_TIMEOUT_S of a stall). Several threads may wait on one handle; one
 * that waits on a handle another thread releases gets TNT_ERR_INVALID_USAGE.
 * The handle stays valid after completion until tnt_release. */
tnt_result_t tnt_wait(tnt_handle_t handle, double timeout_s);
tnt_result_t tnt_test(tnt_handle_t handle);
tnt_result_t tnt_result_count(tnt_handle_t handle, int64_t *count);
tnt_result_t tnt_result_rank_counts(tnt_handle_t handle, int64_t *counts);
tnt_result_t tnt_result_copy(tnt_handle_t handle, void *dst);
tnt_result_t tnt_release(tnt_handle_t handle);

/* A section of this rank's own: while `busy` is 1 this rank is alive and busy
 * with work the other ranks do not share (the master writing a save, a
 * callback that runs on the master only). A peer that waits meanwhile for a
 * request this rank has not submitted yet is not failed at TNT_TIMEOUT_S:
 * that counts from when the section ended, and TNT_BUSY_TIMEOUT_S bounds the
 * whole wait. A rank whose process died or stopped is still lost as before:
 * its busy state reaches the others through its core's background thread,
 * which then no longer answers. A no-op before tnt_init. */
void tnt_set_busy(int busy);

/* The core's clock, in seconds: monotonic, less the time this process was stopped (SIGSTOP,
 * Ctrl+Z) and continued, once a tnt_init of several ranks has armed the count of pauses (before:
 * the plain monotonic clock). Every bound of the core counts on it (TNT_TIMEOUT_S); a caller's
 * own bound on a wait for the other ranks (the frontend's Handle.wait(timeout=...)) must too, or
 * ranks stopped together for longer than it fail it once continued. Its values mean nothing
 * outside this process. */
double tnt_clock(void);

/* Errors. tnt_strerror: a fixed text that says what to do. tnt_last_error: the
 * message of the last failure returned to this thread (or of the handle's
 * failure after tnt_wait/tnt_test returned it). */
const char *tnt_strerror(tnt_result_t result);
const char *tnt_last_error(void);
/* Rank named by the last TNT_ERR_PEER_LOST or TNT_ERR_TIMEOUT returned to this
 * thread (the lost, or the unresponsive, rank), else -1. */
int tnt_last_error_rank(void);
/* The job's failure (a lost peer, a timeout, a stall the ranks cannot leave), once a call of this
 * rank got it (a tnt_wait or tnt_test that returned a request's failure, a request refused with
 * it), else TNT_SUCCESS (also without a context); tnt_last_error() and
 * tnt_last_error_rank() then say what and whom. Every later request fails with it, so a program
 * that caught the error and went on (or that never converted it: a TensorFlow op's failure)
 * still ended with a broken job: the frontend asks at exit. */
tnt_result_t tnt_job_error(void);
/* The pid of the rank that started this process, directly or not, once a tnt_init of this
 * process failed because of it (a worker made before its rank's tnt_init inherited the rank's
 * TNT_RANK and TNT_JOB_ID, and called in), else 0: this process is not a rank, and its own
 * failures are not the rank's (the frontend's error file stays the rank's). */
int tnt_worker_of(void);
/* Whether tnt_init's waits for the other ranks end at a SIGINT (Ctrl-C), 1 by default: a handler
 * of the core's is chained in front of the program's own while they last. 0 leaves SIGINT to the
 * program's handler alone: one that does not end the program (a Python handler that only notes
 * the signal) then lets the set-up go on, as without the core's handler. The frontend passes 0
 * for a Python handler other than the default (which raises KeyboardInterrupt). */
void tnt_setup_sigint(int on);
/* 1 when the last tnt_init of this process failed because a SIGINT (Ctrl-C) interrupted its waits
 * for the other ranks, else 0: the frontend raises KeyboardInterrupt for it in a thread other than
 * the main one too, where Python's own handler raises it in the main thread alone. */
int tnt_setup_was_interrupted(void);
/* 1: the set-up of a tnt_init in progress in another thread (waiting for the other ranks) gives
 * up at its next check, as for a SIGINT, with TNT_ERR_INVALID_USAGE; so does a set-up begun while
 * it stays 1. 0 clears it. The frontend's shutdown() sets it where another thread is in init()
 * (it waited for that init until TNT_TIMEOUT_S), and its init() clears it before it starts. */
void tnt_setup_cancel(int on);

/* The core's numeric settings (TNT_FUSION_THRESHOLD_KB, TNT_TIMEOUT_S, ...), one
 * table for the core, tntrun's validation, --help and the docs. tnt_param_check
 * parses `value` by the core's own rule: TNT_ERR_INVALID_ARGUMENT and
 * tnt_last_error() say what is wrong. Usable before tnt_init. */
int tnt_param_count(void);
tnt_result_t tnt_param_describe(int index, const char **name, double *default_value, double *min, double *max,
                                int *integer, const char **doc);
tnt_result_t tnt_param_check(const char *name, const char *value);

/* What this rank's engine has done so far: negotiation cycles run, requests
 * served from the response cache (one bit each), requests announced in full
 * (name and meta), collectives executed, small allreduces done in one round,
 * bytes allreduced (what gradient compression halves).
 * For tests and tuning; zeros on one rank. */
typedef struct {
  int64_t cycles;
  int64_t cache_hits;
  int64_t announcements;
  int64_t executed;
  int64_t one_round; /* allreduces, broadcasts and allgathers whose payload rode with the negotiation: one exchange, no data round */
  int64_t bit_rounds;  /* cycles that were one AND-allreduce of readiness bits (every name cached) */
  int64_t full_rounds; /* cycles that exchanged every rank's full message */
  int64_t bytes_reduced; /* payload of the allreduces completed: count x element size, this rank's input */
  /* waits on one host (shm) that found their peers not there yet, by how they
   * ended: within the spin (the host's ranks fit on its cores), polling while
   * yielding the core (they outnumber the cores), or asleep on a futex */
  int64_t waits_spun;
  int64_t waits_yielded;
  int64_t waits_slept;
  /* allreduces whose sum between two hosts went in direct MPI messages
   * (two ranks on two hosts, or the 2-host link of the hierarchical
   * allreduce: TNT_MPI_PAIR_SUM) */
  int64_t pair_sums;
  /* allreduces of two ranks that swapped whole buffers (allreduce_pair.c):
   * on one host at 48-128 KiB, across the network up to 256 KiB where the
   * direct MPI messages are not used */
  int64_t pair_swaps;
  /* bytes written into peers' shared memory with streaming stores because the
   * cores were found (or TNT_SHM_PLACEMENT set them) far apart, the results
   * that the ring's last reduce step writes with them included (put_copy.h) */
  int64_t bytes_streamed_far;
} tnt_stats_t;
tnt_result_t tnt_get_stats(tnt_stats_t *stats);

/* Sequences of unnamed calls: one counter per key (the request names' kind and sequence,
 * "allreduce" or "allreduce@worker", as tarantella/common/request_names.py makes them), shared by
 * every caller of the process (the Python API and the compiled TensorFlow ops), so that an unnamed
 * call takes the next number of its sequence whichever of them makes it. tnt_sequence_counter:
 * the key's counter, made at 0 on its first use and never freed (its address stays valid), NULL
 * when out of memory; tnt_sequence_next takes its next number (an atomic fetch-and-add, which a
 * caller may also do itself on the address); tnt_sequence_restart sets every counter to 0 (a new
 * context). Usable without a context, from any thread. tnt_name_in_flight: 1 while a request of
 * that name is in flight on this rank (submitted and not complete), else 0 (also without a
 * context): a caller that reuses unnamed names waits for it before submitting the name again. */
int64_t *tnt_sequence_counter(const char *key);
int64_t tnt_sequence_next(int64_t *counter);
void tnt_sequence_restart(void);
int tnt_name_in_flight(const char *name);

/* Sizes and versions, for the bindings. */
size_t tnt_dtype_size(tnt_dtype_t dtype);
const char *tnt_version(void);
/* TNT_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* TARANTELLA_H */
