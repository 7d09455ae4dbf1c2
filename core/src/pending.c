/* pending.c - the pending table (pending.h): an array for iteration in
 * submission order, a name map for lookups by the negotiation's responses. */
#include "pending.h"

#include <stdlib.h>

void tnt_pending_init(tnt_pending_t *p) {
  p->items = NULL;
  p->n = p->cap = 0;
  tnt_namemap_init(&p->by_name);
}

void tnt_pending_free(tnt_pending_t *p) {
  free(p->items);
  p->items = NULL;
  p->n = p->cap = 0;
  tnt_namemap_free(&p->by_name);
}

int tnt_pending_add(tnt_pending_t *p, tnt_request_t *req) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 64;
    tnt_request_t **items = realloc(p->items, (size_t)cap * sizeof *items);
    if (!items) return -1;
    p->items = items;
    p->cap = cap;
  }
  if (tnt_namemap_put(&p->by_name, req->name, p->n)) return -1;
  p->items[p->n++] = req;
  return 0;
}

void tnt_pending_remove(tnt_pending_t *p, const tnt_request_t *req) {
  int i = tnt_namemap_get(&p->by_name, req->name);
  if (i < 0) return;
  tnt_namemap_del(&p->by_name, req->name);
  int last = --p->n;
  if (i != last) {
    p->items[i] = p->items[last];
    tnt_namemap_put(&p->by_name, p->items[i]->name, i);
  }
}

tnt_request_t *tnt_pending_find(const tnt_pending_t *p, const char *name) {
  int i = tnt_namemap_get(&p->by_name, name);
  return i >= 0 ? p->items[i] : NULL;
}
