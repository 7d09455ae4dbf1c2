/* stream_store.c - streaming (non-temporal) stores for results larger than the
 * cache (stream_store.h says why). x86-64 only, where SSE2 is always there;
 * elsewhere plain memcpy. */
#include "stream_store.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#define HAVE_STREAM 1
#else
#define HAVE_STREAM 0
#endif

static _Atomic size_t stream_min = (size_t)4 << 20;

void tnt_stream_min_set(size_t bytes) { atomic_store_explicit(&stream_min, bytes, memory_order_relaxed); }

/* The same answer on every CPU (the ranks agree on the threshold at set-up):
 * it also decides the ring's message sequence, so a rank without streaming
 * stores still runs the fused step, with memcpy. */
int tnt_stream_wanted(size_t bytes) { return bytes >= atomic_load_explicit(&stream_min, memory_order_relaxed); }

#if HAVE_STREAM
void tnt_copy_streaming_unfenced(void *dst, const void *src, size_t len) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  /* up to the first 16-byte boundary of dst (a streaming store writes 16 aligned bytes) */
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > len) head = len;
  memcpy(d, s, head);
  d += head, s += head, len -= head;
  for (; len >= 64; d += 64, s += 64, len -= 64) { /* a whole cache line per iteration */
    __m128i x0 = _mm_loadu_si128((const __m128i *)s), x1 = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, x0);
    _mm_stream_si128((__m128i *)(d + 16), x1);
    _mm_stream_si128((__m128i *)(d + 32), x2);
    _mm_stream_si128((__m128i *)(d + 48), x3);
  }
  memcpy(d, s, len);
}

void tnt_stream_fence(void) { _mm_sfence(); }
#else
void tnt_copy_streaming_unfenced(void *dst, const void *src, size_t len) { memcpy(dst, src, len); }
void tnt_stream_fence(void) {}
#endif

void tnt_copy_streaming(void *dst, const void *src, size_t len) {
  tnt_copy_streaming_unfenced(dst, src, len);
  tnt_stream_fence();
}
