/* cudart_standin.c - a stand-in for libcudart.so that test_nccl.c builds in
 * variants: what cudaStreamQuery answers (QUERY: 0 done, 600 still running
 * forever, 700 an illegal memory access). Memory is host memory, and no
 * device is reported. No GPU, no CUDA.
 *
 * ASYNC (the variant `async`, for host staging): streams run their work later,
 * in order, each on a thread of its own, as a GPU's do: a copy after a pause
 * ($STANDIN_COPY_DELAY_US, default 200 us), an event happens when its stream
 * reaches it, cudaStreamWaitEvent holds a stream until then. Without it, a copy
 * is done when it is queued and every event has happened, so that no order of
 * host staging's streams is ever tested. The NULL stream runs work at once. */
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
int standin_queries;
#ifndef ASYNC
static int stream_object;
int cudaStreamCreate(void **stream) { *stream = &stream_object; return 0; }
int cudaStreamQuery(void *stream) { standin_queries++; return QUERY; }
#endif
int cudaStreamDestroy(void *stream) { return 0; }
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
  __atomic_fetch_add(&standin_host_allocs, 1, __ATOMIC_RELAXED); /* lanes are made by threads at once */
  return cudaMalloc(ptr, bytes);
}
#ifndef ASYNC
int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *stream) {
  memmove(dst, src, bytes);
  return 0;
}
static int event_object;
int cudaEventCreate(void **event) { *event = &event_object; return 0; }
int cudaEventRecord(void *event, void *stream) { return 0; }
int cudaEventQuery(void *event) { return QUERY; }
int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags) { return 0; }
#else
#include <pthread.h>
#include <time.h>

/* One lock for every stream and event: a stand-in, not a fast one. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
typedef struct {
  unsigned long recorded, reached; /* records queued, and reached by their stream */
} event_t;
enum { COPY, RECORD, WAIT };
typedef struct op {
  int kind;
  void *dst;
  const void *src;
  size_t bytes;
  event_t *event;
  unsigned long mark; /* RECORD: the record it is; WAIT: the record it waits for */
  struct op *next;
} op_t;
typedef struct {
  op_t *head, *tail; /* the head is running, and leaves the queue once done */
} queue_t;

static long copy_delay_us(void) {
  const char *v = getenv("STANDIN_COPY_DELAY_US");
  return v ? atol(v) : 200;
}

static void *run_stream(void *arg) {
  queue_t *q = arg;
  for (;;) {
    pthread_mutex_lock(&mu);
    while (!q->head) pthread_cond_wait(&changed, &mu);
    op_t *op = q->head;
    if (op->kind == WAIT)
      while (op->event->reached < op->mark) pthread_cond_wait(&changed, &mu);
    pthread_mutex_unlock(&mu);
    if (op->kind == COPY) {
      struct timespec pause = {0, copy_delay_us() * 1000};
      nanosleep(&pause, NULL);
      memmove(op->dst, op->src, op->bytes);
    }
    pthread_mutex_lock(&mu);
    if (op->kind == RECORD && op->event->reached < op->mark) op->event->reached = op->mark;
    q->head = op->next;
    if (!q->head) q->tail = NULL;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&mu);
    free(op);
  }
  return NULL;
}

/* Queues `op` on `stream`; the NULL stream runs it now. Under mu. */
static int queue(void *stream, op_t op) {
  if (!stream) {
    if (op.kind == COPY) memmove(op.dst, op.src, op.bytes);
    if (op.kind == RECORD) op.event->reached = op.mark;
    while (op.kind == WAIT && op.event->reached < op.mark) pthread_cond_wait(&changed, &mu);
    pthread_cond_broadcast(&changed);
    return 0;
  }
  op_t *o = malloc(sizeof *o);
  if (!o) return 2;
  *o = op;
  o->next = NULL;
  queue_t *q = stream;
  if (q->tail) q->tail->next = o;
  else q->head = o;
  q->tail = o;
  pthread_cond_broadcast(&changed);
  return 0;
}

int cudaStreamCreate(void **stream) {
  queue_t *q = calloc(1, sizeof *q);
  pthread_t t;
  if (!q || pthread_create(&t, NULL, run_stream, q) != 0) return 2;
  pthread_detach(t);
  *stream = q;
  return 0;
}
int cudaStreamQuery(void *stream) {
  pthread_mutex_lock(&mu);
  const int busy = stream && ((queue_t *)stream)->head;
  pthread_mutex_unlock(&mu);
  standin_queries++;
  return busy ? 600 : 0;
}
int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *stream) {
  pthread_mutex_lock(&mu);
  int rc = queue(stream, (op_t){.kind = COPY, .dst = dst, .src = src, .bytes = bytes});
  pthread_mutex_unlock(&mu);
  return rc;
}
int cudaEventCreate(void **event) {
  *event = calloc(1, sizeof(event_t));
  return *event ? 0 : 2;
}
int cudaEventRecord(void *event, void *stream) {
  event_t *e = event;
  pthread_mutex_lock(&mu);
  int rc = queue(stream, (op_t){.kind = RECORD, .event = e, .mark = ++e->recorded});
  pthread_mutex_unlock(&mu);
  return rc;
}
int cudaEventQuery(void *event) {
  event_t *e = event;
  pthread_mutex_lock(&mu);
  const int done = e->reached >= e->recorded;
  pthread_mutex_unlock(&mu);
  return done ? 0 : 600;
}
int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags) {
  event_t *e = event;
  pthread_mutex_lock(&mu);
  int rc = queue(stream, (op_t){.kind = WAIT, .event = e, .mark = e->recorded});
  pthread_mutex_unlock(&mu);
  return rc;
}
#endif
