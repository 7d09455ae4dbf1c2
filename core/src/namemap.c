/* namemap.c - see namemap.h. Deleted slots become tombstones; the table is
 * rebuilt when live + dead entries pass half its capacity. */
#include "namemap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char tombstone_key;
#define TOMB (&tombstone_key)

static uint64_t hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

void tnt_namemap_init(tnt_namemap_t *m) { memset(m, 0, sizeof *m); }

void tnt_namemap_free(tnt_namemap_t *m) {
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i] && m->keys[i] != TOMB) free(m->keys[i]);
  free(m->keys);
  free(m->values);
  memset(m, 0, sizeof *m);
}

static size_t find(const tnt_namemap_t *m, const char *key, int *found) {
  size_t i = hash(key) & (m->cap - 1), first_tomb = (size_t)-1;
  for (;;) {
    char *k = m->keys[i];
    if (!k) {
      *found = 0;
      return first_tomb != (size_t)-1 ? first_tomb : i;
    }
    if (k == TOMB) {
      if (first_tomb == (size_t)-1) first_tomb = i;
    } else if (!strcmp(k, key)) {
      *found = 1;
      return i;
    }
    i = (i + 1) & (m->cap - 1);
  }
}

int tnt_namemap_get(const tnt_namemap_t *m, const char *key) {
  if (!m->cap) return -1;
  int found;
  size_t i = find(m, key, &found);
  return found ? m->values[i] : -1;
}

/* Rebuild without tombstones, at a capacity set by the live entries alone (at most a
 * quarter full, so that the next rebuild is a quarter of it away): a map through which
 * many names pass (each step's collective named apart) keeps the size of what it holds. */
static int grow(tnt_namemap_t *m) {
  size_t cap = 64;
  while ((m->used + 1) * 4 > cap) cap *= 2;
  tnt_namemap_t n = {calloc(cap, sizeof(char *)), calloc(cap, sizeof(int)), cap, 0, 0};
  if (!n.keys || !n.values) {
    free(n.keys);
    free(n.values);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i] || m->keys[i] == TOMB) continue;
    int found;
    size_t j = find(&n, m->keys[i], &found);
    n.keys[j] = m->keys[i];
    n.values[j] = m->values[i];
    n.used++;
  }
  free(m->keys);
  free(m->values);
  *m = n;
  return 0;
}

int tnt_namemap_put(tnt_namemap_t *m, const char *key, int value) {
  if ((m->used + m->tombstones + 1) * 2 > m->cap && grow(m)) return -1;
  int found;
  size_t i = find(m, key, &found);
  if (found) {
    m->values[i] = value;
    return 0;
  }
  char *k = strdup(key);
  if (!k) return -1;
  if (m->keys[i] == TOMB) m->tombstones--;
  m->keys[i] = k;
  m->values[i] = value;
  m->used++;
  return 0;
}

void tnt_namemap_del(tnt_namemap_t *m, const char *key) {
  if (!m->cap) return;
  int found;
  size_t i = find(m, key, &found);
  if (!found) return;
  free(m->keys[i]);
  m->keys[i] = TOMB;
  m->values[i] = 0;
  m->used--;
  m->tombstones++;
}
