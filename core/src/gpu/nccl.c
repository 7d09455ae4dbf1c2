/* gpu/nccl.c - NCCL loaded at run time (nccl.h says why and how). */
#define _GNU_SOURCE
#include "nccl.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "cuda_rt.h"
#include "dtype.h"

/* NCCL's ABI, as documented (nccl.h of NCCL 2.14 and later). */
typedef int nccl_result_t;
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7 };
typedef struct {
  char internal[TNT_NCCL_ID_BYTES];
} nccl_id_t;
/* ncclConfig_t as of 2.14: NCCL reads a config by its size and version, so a
 * newer library accepts this prefix; unset fields are INT_MIN / NULL. */
typedef struct {
  size_t size;
  unsigned int magic, version;
  int blocking, cga_cluster_size, min_ctas, max_ctas;
  const char *net_name;
} nccl_config_v21400_t;
#define NCCL_API_MAGIC 0xcafebeef

#define POLL_S 1e-3 /* a communicator being set up is polled this often */

static struct {
  pthread_once_t once;
  tnt_result_t result;
  char why[768];
  char path[512];
  void *lib;
  int version;
  nccl_result_t (*get_version)(int *version);
  nccl_result_t (*get_unique_id)(nccl_id_t *id);
  nccl_result_t (*comm_init_rank_config)(void **comm, int nranks, nccl_id_t id, int rank, void *config);
  nccl_result_t (*comm_get_async_error)(void *comm, nccl_result_t *error);
  nccl_result_t (*comm_abort)(void *comm);
  nccl_result_t (*comm_destroy)(void *comm);
  const char *(*get_error_string)(nccl_result_t result);
  const char *(*get_last_error)(void *comm);
  nccl_result_t (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream);
  nccl_result_t (*broadcast)(const void *send, void *recv, size_t count, int dtype, int root, void *comm,
                             void *stream);
  nccl_result_t (*all_gather)(const void *send, void *recv, size_t count, int dtype, void *comm, void *stream);
} nccl = {.once = PTHREAD_ONCE_INIT};

struct tnt_nccl_comm {
  void *comm; /* NULL once aborted */
  int rank, size;
  char failed[768]; /* the failure that aborted it */
};

#define INSTALL "pip install nvidia-nccl-cu12 (tensorflow[and-cuda] installs it), or set TNT_NCCL_LIBRARY to a libnccl.so.2"

static void load_once(void) {
  const char *env = getenv("TNT_NCCL_LIBRARY");
  snprintf(nccl.path, sizeof nccl.path, "%s", env && *env ? env : "libnccl.so.2");
  /* RTLD_LOCAL: NCCL's symbols stay out of the process's namespace; never
   * unloaded (its threads and exit handlers must stay mapped) */
  nccl.lib = dlopen(nccl.path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!nccl.lib) {
    const char *err = dlerror();
    nccl.result = TNT_ERR_INVALID_USAGE;
    snprintf(nccl.why, sizeof nccl.why, "NCCL cannot be loaded from %s (%s): %s", nccl.path, err ? err : "?",
             INSTALL);
    return;
  }
  struct {
    const char *name;
    void **fn;
  } table[] = {
      {"ncclGetVersion", (void **)&nccl.get_version},
      {"ncclGetUniqueId", (void **)&nccl.get_unique_id},
      {"ncclCommInitRankConfig", (void **)&nccl.comm_init_rank_config},
      {"ncclCommGetAsyncError", (void **)&nccl.comm_get_async_error},
      {"ncclCommAbort", (void **)&nccl.comm_abort},
      {"ncclCommDestroy", (void **)&nccl.comm_destroy},
      {"ncclGetErrorString", (void **)&nccl.get_error_string},
      {"ncclGetLastError", (void **)&nccl.get_last_error},
      {"ncclAllReduce", (void **)&nccl.all_reduce},
      {"ncclBroadcast", (void **)&nccl.broadcast},
      {"ncclAllGather", (void **)&nccl.all_gather},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    *table[i].fn = dlsym(nccl.lib, table[i].name);
    if (!*table[i].fn) {
      nccl.result = TNT_ERR_INVALID_USAGE;
      snprintf(nccl.why, sizeof nccl.why, "%s is not a usable NCCL: it has no %s (NCCL 2.14 or newer is needed): %s",
               nccl.path, table[i].name, INSTALL);
      return;
    }
  }
  int v = 0;
  if (nccl.get_version(&v) != NCCL_SUCCESS || v < TNT_NCCL_MIN_VERSION) {
    nccl.result = TNT_ERR_INVALID_USAGE;
    snprintf(nccl.why, sizeof nccl.why,
             "NCCL %d.%d.%d at %s is too old: Tarantella needs 2.14 or newer (non-blocking communicators, so that "
             "a lost rank cannot hang the others): %s",
             v / 10000, v / 100 % 100, v % 100, nccl.path, INSTALL);
    return;
  }
  nccl.version = v;
  nccl.result = TNT_SUCCESS;
  nccl.why[0] = 0;
  TNT_INFO("NCCL %d.%d.%d loaded from %s", v / 10000, v / 100 % 100, v % 100, nccl.path);
}

tnt_result_t tnt_nccl_load(void) {
  pthread_once(&nccl.once, load_once);
  return nccl.result == TNT_SUCCESS ? TNT_SUCCESS : tnt_fail(nccl.result, "%s", nccl.why);
}

const char *tnt_nccl_status(void) {
  pthread_once(&nccl.once, load_once);
  return nccl.why;
}

int tnt_nccl_version(void) { return tnt_nccl_load() == TNT_SUCCESS ? nccl.version : 0; }

/* NCCL's own words for a failure: the code's name and its last error line. */
static const char *nccl_error(nccl_result_t rc, void *comm, char *buf, size_t len) {
  const char *last = nccl.get_last_error(comm);
  snprintf(buf, len, "%s%s%s", nccl.get_error_string(rc), last && *last ? ": " : "", last ? last : "");
  return buf;
}

tnt_result_t tnt_nccl_unique_id(void *id) {
  TNT_CHECK(tnt_nccl_load());
  nccl_id_t out;
  nccl_result_t rc = nccl.get_unique_id(&out);
  char e[512];
  if (rc != NCCL_SUCCESS)
    return tnt_fail(TNT_ERR_SYSTEM, "ncclGetUniqueId failed: %s", nccl_error(rc, NULL, e, sizeof e));
  memcpy(id, &out, sizeof out);
  return TNT_SUCCESS;
}

tnt_result_t tnt_nccl_comm_init(int rank, int size, const void *id, double deadline, tnt_nccl_comm_t **out) {
  *out = NULL;
  TNT_CHECK(tnt_nccl_load());
  nccl_config_v21400_t config = {sizeof config, NCCL_API_MAGIC, TNT_NCCL_MIN_VERSION, 0 /* non-blocking */, INT_MIN,
                                 INT_MIN, INT_MIN, NULL};
  nccl_id_t nid;
  memcpy(&nid, id, sizeof nid);
  void *comm = NULL;
  char e[512];
  nccl_result_t rc = nccl.comm_init_rank_config(&comm, size, nid, rank, &config);
  if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) {
    if (comm) nccl.comm_abort(comm);
    return tnt_fail(TNT_ERR_SYSTEM, "rank %d could not join its NCCL communicator of %d ranks: %s", rank, size,
                    nccl_error(rc, comm, e, sizeof e));
  }
  /* set up in the background: poll until done, failed, or the deadline */
  for (;;) {
    nccl_result_t state = NCCL_IN_PROGRESS;
    rc = nccl.comm_get_async_error(comm, &state);
    if (rc == NCCL_SUCCESS && state == NCCL_SUCCESS) break;
    if (rc != NCCL_SUCCESS || state != NCCL_IN_PROGRESS) {
      nccl_error(rc != NCCL_SUCCESS ? rc : state, comm, e, sizeof e);
      nccl.comm_abort(comm);
      return tnt_fail(TNT_ERR_SYSTEM, "rank %d: NCCL failed while setting up its communicator of %d ranks: %s", rank,
                      size, e);
    }
    if (tnt_now() >= deadline) {
      nccl.comm_abort(comm);
      return tnt_fail(TNT_ERR_TIMEOUT,
                      "rank %d: NCCL did not set up its communicator of %d ranks within TNT_TIMEOUT_S (a rank that "
                      "never joined, or a network NCCL cannot use: NCCL_DEBUG=INFO says more); it was aborted",
                      rank, size);
    }
    struct timespec ts = {0, (long)(POLL_S * 1e9)};
    nanosleep(&ts, NULL);
  }
  tnt_nccl_comm_t *c = malloc(sizeof *c);
  if (!c) {
    nccl.comm_abort(comm);
    return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  c->comm = comm;
  c->rank = rank;
  c->size = size;
  c->failed[0] = 0;
  *out = c;
  return TNT_SUCCESS;
}

void tnt_nccl_comm_abort(tnt_nccl_comm_t *comm) {
  if (!comm) return;
  if (comm->comm) nccl.comm_abort(comm->comm);
  free(comm);
}

void tnt_nccl_comm_destroy(tnt_nccl_comm_t *comm) {
  if (!comm) return;
  if (comm->comm) nccl.comm_destroy(comm->comm);
  free(comm);
}

/* ---- collectives ---- */

/* NCCL's ncclDataType_t and ncclRedOp_t, as documented. */
static int nccl_dtype(tnt_dtype_t dt) {
  switch (dt) {
    case TNT_FLOAT16: return 6;
    case TNT_BFLOAT16: return 9;
    case TNT_FLOAT32: return 7;
    case TNT_FLOAT64: return 8;
    case TNT_INT32: return 2;
    case TNT_INT64: return 4;
  }
  return -1;
}
enum { NCCL_SUM = 0 };

/* Abort the communicator after `code`: every later call fails naming it. */
static tnt_result_t fail_comm(tnt_nccl_comm_t *c, tnt_result_t code, const char *msg) {
  const double start = tnt_now();
  if (c->comm) nccl.comm_abort(c->comm);
  TNT_DEBUG("rank %d: NCCL communicator aborted in %.3f s", c->rank, tnt_now() - start);
  c->comm = NULL;
  snprintf(c->failed, sizeof c->failed, "%s", msg);
  return tnt_fail(code, "%s", msg);
}

static tnt_result_t usable(tnt_nccl_comm_t *c, const char *what) {
  if (!c) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "NCCL %s on no communicator", what);
  if (!c->comm)
    return tnt_fail(TNT_ERR_PEER_LOST, "rank %d: NCCL %s on a communicator aborted after an earlier failure (%s)",
                    c->rank, what, c->failed);
  if (!tnt_cuda()) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tnt_last_error()); /* tnt_fail writes where tnt_last_error reads */
    return tnt_fail(TNT_ERR_INVALID_USAGE, "NCCL %s: %s", what, why);
  }
  return TNT_SUCCESS;
}

/* Wait until NCCL has taken the call (a non-blocking communicator may still be
 * enqueuing it: ncclInProgress), then until `stream` has run it, polling both
 * for errors (tnt_gpu_poll_pause between polls); at `deadline` abort. */
static tnt_result_t finish(tnt_nccl_comm_t *c, nccl_result_t rc, void *stream, double deadline, const char *what) {
  char e[512], msg[768];
  const tnt_cuda_t *cuda = tnt_cuda();
  tnt_gpu_poll_t poll = tnt_gpu_poll_start();
  for (int enqueued = rc == NCCL_SUCCESS;; tnt_gpu_poll_pause(&poll)) {
    nccl_result_t state = NCCL_SUCCESS;
    if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) state = rc;
    else if (nccl.comm_get_async_error(c->comm, &state) != NCCL_SUCCESS) state = 2; /* unhandled system error */
    if (state != NCCL_SUCCESS && state != NCCL_IN_PROGRESS) {
      snprintf(msg, sizeof msg, "rank %d: NCCL %s failed: %s; its communicator was aborted", c->rank, what,
               nccl_error(state, c->comm, e, sizeof e));
      return fail_comm(c, TNT_ERR_SYSTEM, msg);
    }
    rc = NCCL_SUCCESS;
    if (!enqueued) enqueued = state == NCCL_SUCCESS;
    if (enqueued) {
      int q = cuda->stream_query(stream);
      if (q == TNT_CUDA_SUCCESS) return TNT_SUCCESS;
      if (q != TNT_CUDA_NOT_READY) {
        snprintf(msg, sizeof msg, "rank %d: the CUDA stream of NCCL %s failed: %s (CUDA error %d); its communicator "
                 "was aborted", c->rank, what, tnt_cuda_error(q), q);
        return fail_comm(c, TNT_ERR_SYSTEM, msg);
      }
    }
    if (tnt_now() >= deadline) {
      snprintf(msg, sizeof msg, "rank %d: NCCL %s did not complete within TNT_TIMEOUT_S (a rank of the %d that did "
               "not make the same call, or a GPU that is stuck); its communicator was aborted", c->rank, what, c->size);
      return fail_comm(c, TNT_ERR_TIMEOUT, msg);
    }
  }
}

tnt_result_t tnt_nccl_allreduce(tnt_nccl_comm_t *c, const void *send, void *recv, size_t count, tnt_dtype_t dt,
                                tnt_reduce_op_t op, void *stream, double deadline) {
  char what[128];
  snprintf(what, sizeof what, "allreduce of %zu %s", count, tnt_dtype_name(dt));
  TNT_CHECK(usable(c, what));
  if (nccl_dtype(dt) < 0 || (op != TNT_SUM && op != TNT_AVERAGE))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "NCCL %s: dtype %d or op %d is not one of Tarantella's", what, dt, op);
  /* NCCL 2.28.9's own average (ncclAvg), measured on an H100 with one rank
   * and not in place, left every element past the first 8 or 16 MB unwritten
   * (docs/gpus.md): a silent wrong result. So no average here: sum, then scale. */
  if (op == TNT_AVERAGE)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "NCCL %s: an average is not done on NCCL (its ncclAvg lost "
                    "elements in a measured case, and an integer one would round otherwise than the host path); "
                    "sum, then scale", what);
  return finish(c, nccl.all_reduce(send, recv, count, nccl_dtype(dt), NCCL_SUM, c->comm, stream), stream, deadline,
                what);
}

tnt_result_t tnt_nccl_broadcast(tnt_nccl_comm_t *c, const void *send, void *recv, size_t count, tnt_dtype_t dt,
                                int root, void *stream, double deadline) {
  char what[128];
  snprintf(what, sizeof what, "broadcast of %zu %s from rank %d", count, tnt_dtype_name(dt), root);
  TNT_CHECK(usable(c, what));
  if (nccl_dtype(dt) < 0 || root < 0 || root >= c->size)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "NCCL %s: dtype %d or root %d out of range (%d ranks)", what, dt, root,
                    c->size);
  return finish(c, nccl.broadcast(send, recv, count, nccl_dtype(dt), root, c->comm, stream), stream, deadline, what);
}

tnt_result_t tnt_nccl_allgather(tnt_nccl_comm_t *c, const void *send, void *recv, size_t count, tnt_dtype_t dt,
                                void *stream, double deadline) {
  char what[128];
  snprintf(what, sizeof what, "allgather of %zu %s per rank", count, tnt_dtype_name(dt));
  TNT_CHECK(usable(c, what));
  if (nccl_dtype(dt) < 0) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "NCCL %s: dtype %d is not one of Tarantella's", what, dt);
  return finish(c, nccl.all_gather(send, recv, count, nccl_dtype(dt), c->comm, stream), stream, deadline, what);
}
