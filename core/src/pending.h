/* pending.h - the engine's requests taken from the queue and not yet executed,
 * indexed by name. Owned by the engine; the negotiator reads and classifies
 * them (under the engine's progress lock). */
#ifndef TNT_PENDING_H
#define TNT_PENDING_H

#include "namemap.h"
#include "request.h"

typedef struct {
  tnt_request_t **items;
  int n, cap;
  tnt_namemap_t by_name;
} tnt_pending_t;

void tnt_pending_init(tnt_pending_t *p);
void tnt_pending_free(tnt_pending_t *p);
/* 0, or -1 when out of memory (the request is then not added). */
int tnt_pending_add(tnt_pending_t *p, tnt_request_t *req);
void tnt_pending_remove(tnt_pending_t *p, const tnt_request_t *req);
/* The pending request of that name, or NULL. */
tnt_request_t *tnt_pending_find(const tnt_pending_t *p, const char *name);

#endif
