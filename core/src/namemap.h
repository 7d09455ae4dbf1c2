/* namemap.h - a small string -> int hash map (open addressing, linear probing),
 * used for tensor names: pending requests, the negotiation table, the cache. */
#ifndef TNT_NAMEMAP_H
#define TNT_NAMEMAP_H

#include <stddef.h>

typedef struct {
  char **keys;
  int *values;
  size_t cap, used, tombstones;
} tnt_namemap_t;

void tnt_namemap_init(tnt_namemap_t *m);
void tnt_namemap_free(tnt_namemap_t *m);
/* -1 when absent. */
int tnt_namemap_get(const tnt_namemap_t *m, const char *key);
/* 0 on success, -1 when out of memory. Replaces an existing value. */
int tnt_namemap_put(tnt_namemap_t *m, const char *key, int value);
void tnt_namemap_del(tnt_namemap_t *m, const char *key);

#endif
