/* nccl_standin.c - a stand-in for libnccl.so.2 that the NCCL loader's tests
 * build in variants (test_nccl.c): the version it reports (VERSION), what
 * ncclCommInitRankConfig returns (INIT_RC, with NCCL's last error LAST_ERROR),
 * what the communicator's set-up comes to (ASYNC: 0 done, 7 in progress
 * forever, else that error), and a symbol left out (NO_ASYNC_ERROR). It counts
 * aborts, so a test can see that a failed set-up was aborted. Its collectives
 * are those of one rank on host memory (a copy), and record the datatype, op
 * and root NCCL was given. No GPU, no CUDA. */
#include <stddef.h>
#include <string.h>

#ifndef VERSION
#define VERSION 22703
#endif
#ifndef INIT_RC
#define INIT_RC 7 /* ncclInProgress: a non-blocking communicator */
#endif
#ifndef ASYNC
#define ASYNC 0
#endif
#ifndef LAST_ERROR
#define LAST_ERROR ""
#endif

typedef struct {
  char internal[128];
} nccl_id_t;

int standin_aborts, standin_destroys, standin_blocking = -1, standin_nranks, standin_rank;
static int comm_object;

int ncclGetVersion(int *v) { *v = VERSION; return 0; }
int ncclGetUniqueId(nccl_id_t *id) { id->internal[0] = 42; id->internal[127] = 7; return 0; }
int standin_id_ok;
int ncclCommInitRankConfig(void **comm, int nranks, nccl_id_t id, int rank, void *config) {
  standin_id_ok = id.internal[0] == 42 && id.internal[127] == 7; /* passed by value, whole */
  struct { size_t size; unsigned magic, version; int blocking; } *c = config;
  standin_blocking = c->blocking;
  standin_nranks = nranks;
  standin_rank = rank;
  *comm = &comm_object;
  return INIT_RC;
}
#ifndef NO_ASYNC_ERROR
int ncclCommGetAsyncError(void *comm, int *state) { *state = ASYNC; return 0; }
#endif
int ncclCommAbort(void *comm) { standin_aborts++; return 0; }
int ncclCommDestroy(void *comm) { standin_destroys++; return 0; }
const char *ncclGetErrorString(int rc) {
  return rc == 5 ? "invalid usage (run with NCCL_DEBUG=WARN for details)" : rc == 2 ? "unhandled system error" : "error";
}
const char *ncclGetLastError(void *comm) { return LAST_ERROR; }

/* one rank's collectives: the result is the input */
int standin_dtype = -1, standin_op = -1, standin_root = -1, standin_collectives;
static size_t element_bytes(int dtype) { return dtype == 6 || dtype == 9 ? 2 : dtype == 7 || dtype == 2 ? 4 : 8; }
int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream) {
  standin_dtype = dtype, standin_op = op, standin_collectives++;
  memmove(recv, send, count * element_bytes(dtype));
  return 0;
}
int ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, void *comm, void *stream) {
  standin_dtype = dtype, standin_root = root, standin_collectives++;
  memmove(recv, send, count * element_bytes(dtype));
  return 0;
}
int ncclAllGather(const void *send, void *recv, size_t count, int dtype, void *comm, void *stream) {
  standin_dtype = dtype, standin_collectives++;
  memmove(recv, send, count * element_bytes(dtype));
  return 0;
}
