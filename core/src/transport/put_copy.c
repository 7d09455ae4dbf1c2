/* put_copy.c - plain or streaming copies into a peer's window (put_copy.h). */
#include "put_copy.h"

#include <string.h>

#include "common.h"
#include "stream_store.h"

/* Pieces smaller than this are copied plainly and not timed: a clock read
 * costs more than the choice could save. */
#define PUT_TIMED_MIN (16 << 10)
/* Slower than this per byte, a plain copy took its lines from a far core
 * (near: <= 0.12 ns per byte, far: >= 0.35, on the machine of put_copy.h). */

static int all_slow(const tnt_put_copier_t *c) {
  if (c->samples < PUT_SAMPLES) return 0;
  for (int i = 0; i < PUT_SAMPLES; i++)
    if (c->ns_per_byte[i] <= PUT_FAR_NS_PER_BYTE) return 0;
  return 1;
}

void tnt_put_copy(tnt_put_copier_t *c, void *dst, const void *src, size_t len) {
  if (len < PUT_TIMED_MIN) {
    memcpy(dst, src, len);
    return;
  }
  if (c->far && ++c->puts % PUT_PROBE_EVERY) {
    tnt_copy_streaming(dst, src, len);
    return;
  }
  const double t0 = tnt_now();
  memcpy(dst, src, len);
  tnt_put_copier_record(c, (tnt_now() - t0) * 1e9 / (double)len);
}

void tnt_put_copier_record(tnt_put_copier_t *c, double ns_per_byte) {
  c->ns_per_byte[c->samples++ % PUT_SAMPLES] = ns_per_byte;
  c->far = ns_per_byte > PUT_FAR_NS_PER_BYTE && all_slow(c);
}

int tnt_put_copier_near(const tnt_put_copier_t *c) { return c->samples >= PUT_SAMPLES && !c->far; }
