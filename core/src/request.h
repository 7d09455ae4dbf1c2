/* request.h - what one collective call is, as every part of the core sees it:
 * the request (what the application asked) and its meta (what every rank must
 * agree on). Owned by the requests table from submission to release. */
#ifndef TNT_REQUEST_H
#define TNT_REQUEST_H

#include <stdint.h>

#include "common.h"

typedef enum { COLL_ALLREDUCE = 0, COLL_BROADCAST = 1, COLL_ALLGATHER = 2, COLL_BARRIER = 3 } tnt_coll_t;

/* What every rank must agree on for one name. For allgather `count` is this
 * rank's own count (it may differ between ranks) and row_elems must agree.
 * `layout` is the caller's digest of how the payload is laid out (a nested
 * structure's keys, leaf dtypes and shapes, fused into one request), 0 for a
 * plain array: equal counts do not make two structures alike. */
typedef struct {
  uint8_t coll, dtype, op, pad;
  int32_t root;
  int64_t count;
  int64_t row_elems;
  uint64_t layout;
} tnt_meta_t;

/* NEW: just taken; TO_ANNOUNCE: name+meta go out next cycle; ANNOUNCED: sent, waiting
 * for the other ranks; CACHED: matches a cache slot, bit goes out next cycle;
 * CACHED_SENT: bit sent, waiting for the other ranks. */
enum { REQ_NEW = 0, REQ_TO_ANNOUNCE, REQ_ANNOUNCED, REQ_CACHED, REQ_CACHED_SENT };

typedef struct tnt_request {
  tnt_handle_t handle;
  char name[TNT_MAX_NAME];
  tnt_meta_t meta;
  double prescale;
  const void *in;
  void *out;         /* allgather: where the caller would like the result (may be NULL) */
  int64_t out_count; /* allgather: the elements out holds; the result goes there when it has exactly as many */
  int state;       /* REQ_*: the negotiator's, under the engine's progress lock */
  int cache_slot;  /* when REQ_CACHED */
  double submit_time;
  int64_t submit_us;
  int stall_warned; /* 1: a full round asked for (engine.c check_stalls), 2: warned */
  double busy_checked; /* the last full round (full_round_at) check_stalls read about the missing ranks */
  double busy_seen;    /* the last full round in which every missing rank was busy on its own; 0: none */
  struct tnt_request *next; /* the engine's submission queue */
} tnt_request_t;

#endif
