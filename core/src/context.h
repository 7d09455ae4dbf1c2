/* context.h - the per-process context: placement, settings, the transport, the
 * requests table and the engine. context.c holds only the public API and the
 * lifecycle; each part owns its own state (requests.h, engine.h, ...). */
#ifndef TNT_CONTEXT_H
#define TNT_CONTEXT_H

#include <stdatomic.h>

#include "engine.h"
#include "params.h"
#include "requests.h"
#include "timeline.h"
#include "transport.h"

typedef struct {
  _Atomic int initialized;
  tnt_placement_t pl;
  tnt_params_t params;
  const tnt_transport_t *transport; /* NULL on one rank */
  void *ts;
  tnt_timeline_t *timeline;
  tnt_requests_t requests;
  tnt_engine_t engine;              /* started when there is more than one rank */
  double spin_s;                    /* how long a waiter may spin before it sleeps */
} tnt_ctx_t;

extern tnt_ctx_t tnt_ctx;

#endif
