/* copy_unaliased.c - see copy_unaliased.h. */
#include "copy_unaliased.h"

#include <stdint.h>
#include <string.h>

/* 1 when a forward copy's stores would trail its loads by less than 256 bytes
 * modulo 4 KiB: the loads of the next few lines alias the stores just made. */
static int stores_trail_loads(const void *dst, const void *src) {
  return (((uintptr_t)dst - (uintptr_t)src) & 4095u) - 1u < 255u;
}

void tnt_copy_unaliased(void *dst, const void *src, size_t len) {
  if (!len) return; /* an empty tensor's buffer may be NULL, which memcpy must not get even for 0 bytes */
  if (!stores_trail_loads(dst, src)) {
    memcpy(dst, src, len);
    return;
  }
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t i = len;
  for (; i >= 64; i -= 64) __builtin_memcpy(d + i - 64, s + i - 64, 64); /* one cache line per step, last first */
  if (i) memcpy(d, s, i);
}
