/* shape_layout.c - tnt_shape_layout: the `layout` of one array's shape, and its
 * words in a mismatch message.
 *
 * The 64 bits, lowest first:
 *   bits 0-1  binary 10: a shape (a structure's digest is odd, a plain array's 0)
 *   bit  2    1: the shape itself, exactly; 0: a hash of it
 * exact (every dimension fits its share of 58 bits):
 *   bits 3-5  ndim - 2 (ndim 2 to 9)
 *   bits 6-   the dimensions, first first, 58 / ndim bits each (ndim 2: 29 bits,
 *             up to 536870911; 3: 19 bits; 4: 14 bits, up to 16383; ...)
 * hashed (any other shape):
 *   bits 3-10 ndim (255 for more)
 *   bits 11-  53 bits of a hash of ndim and the dimensions
 * Two exact layouts are equal only for equal shapes; an exact and a hashed one
 * never are; two hashed ones of different shapes are equal with odds of 2^-53.
 * The exact form lets a mismatch message show each rank's shape. */
#include <stdio.h>
#include <string.h>

#include "shape_layout.h"

#define TAG_SHAPE 2u
#define TAG_EXACT 4u
#define EXACT_BITS 58
#define EXACT_MAX_NDIM 9

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A hash of ndim and the dimensions, from `seed` (one per kind of layout). */
static uint64_t hash_dims(uint64_t seed, int ndim, const int64_t *dims) {
  uint64_t h = mix(seed ^ (uint64_t)ndim);
  for (int i = 0; i < ndim && dims; i++) h = mix(h ^ (uint64_t)dims[i]) + 0x9e3779b97f4a7c15ull;
  return h;
}

uint64_t tnt_shape_layout(int ndim, const int64_t *dims) {
  if (ndim < 2 || !dims) return 0;
  if (ndim <= EXACT_MAX_NDIM) {
    const int width = EXACT_BITS / ndim;
    uint64_t packed = 0;
    int fits = 1;
    for (int i = 0; i < ndim && fits; i++) {
      fits = dims[i] >= 0 && (uint64_t)dims[i] < (1ull << width);
      packed |= fits ? (uint64_t)dims[i] << (i * width) : 0;
    }
    if (fits) return packed << 6 | (uint64_t)(ndim - 2) << 3 | TAG_EXACT | TAG_SHAPE;
  }
  const uint64_t h = hash_dims(0x74616e7368617065ull, ndim, dims); /* "tanshape" */
  const uint64_t shown_ndim = ndim > 255 ? 255 : (uint64_t)ndim;
  return (h << 11) | shown_ndim << 3 | TAG_SHAPE;
}

uint64_t tnt_empty_rows_layout(int ndim, const int64_t *dims) {
  /* "emptyrow"; odd: never 0 nor a shape's (binary 10), as a structure's digest */
  return hash_dims(0x656d707479726f77ull, ndim, dims) | 1u;
}

int tnt_shape_layout_is_shape(uint64_t layout) { return (layout & 3u) == TAG_SHAPE; }

int tnt_shape_layout_text(uint64_t layout, char *out, size_t len) {
  if (!len) return 0;
  out[0] = 0;
  if (!tnt_shape_layout_is_shape(layout)) return 0;
  if (!(layout & TAG_EXACT)) {
    snprintf(out, len, "a %d-dimensional shape (digest %016llx)", (int)(layout >> 3 & 255),
             (unsigned long long)layout);
    return 1;
  }
  const int ndim = (int)(layout >> 3 & 7) + 2, width = EXACT_BITS / ndim;
  const uint64_t packed = layout >> 6;
  size_t used = (size_t)snprintf(out, len, "shape (");
  for (int i = 0; i < ndim && used < len; i++)
    used += (size_t)snprintf(out + used, len - used, "%s%llu", i ? ", " : "",
                             (unsigned long long)(packed >> (i * width) & ((1ull << width) - 1)));
  if (used < len) snprintf(out + used, len - used, ")");
  return 1;
}
