/* sequences.c - the counters of unnamed calls (tnt_sequence_counter), shared by every caller in
 * the process: the Python API (tarantella/common/request_names.py, through _fastpath.Counter)
 * and the compiled TensorFlow ops (tarantella/tensorflow/ops/tnt_ops.cc), so that an unnamed call
 * takes the next number of its sequence whichever of them makes it. Kept in Python alone, a
 * traced unnamed call had to come back into Python for its name (one tf.numpy_function, ~15 times
 * the compiled op's cost). Process-wide, outside the context: counters outlive tnt_finalize and
 * are set to 0 by tnt_sequence_restart when the next context starts. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "tarantella.h"

typedef struct counter_s {
  _Atomic int64_t value; /* first: the address handed out is the counter's */
  struct counter_s *next;
  char key[];
} counter_t;

#define BUCKETS 256 /* a few kinds times the threads that make unnamed calls: short chains */
static counter_t *buckets[BUCKETS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket_of(const char *key) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 1099511628211ULL;
  return (size_t)(h % BUCKETS);
}

int64_t *tnt_sequence_counter(const char *key) {
  if (key == NULL) return NULL;
  size_t b = bucket_of(key);
  pthread_mutex_lock(&mu);
  counter_t *c = buckets[b];
  while (c && strcmp(c->key, key) != 0) c = c->next;
  if (c == NULL) {
    size_t len = strlen(key);
    c = malloc(sizeof *c + len + 1);
    if (c) {
      atomic_init(&c->value, 0);
      memcpy(c->key, key, len + 1);
      c->next = buckets[b];
      buckets[b] = c; /* never freed: its address stays valid for whoever holds it */
    }
  }
  pthread_mutex_unlock(&mu);
  return c ? (int64_t *)&c->value : NULL;
}

int64_t tnt_sequence_next(int64_t *counter) {
  return atomic_fetch_add((_Atomic int64_t *)counter, 1);
}

void tnt_sequence_restart(void) {
  pthread_mutex_lock(&mu);
  for (size_t b = 0; b < BUCKETS; b++)
    for (counter_t *c = buckets[b]; c; c = c->next) atomic_store(&c->value, 0);
  pthread_mutex_unlock(&mu);
}

