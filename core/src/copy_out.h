/* copy_out.h - copying a received piece into the caller's memory.
 *
 * A forward copy whose stores land just above its loads modulo 4 KiB (the
 * destination 1-255 bytes past the source in the page) makes every load wait
 * on the store before it: the CPU matches addresses on their low 12 bits first
 * (4K aliasing). Pieces arrive page-aligned in the window or the exchange
 * buffers, and NumPy places an array of 128 KiB or more 16 bytes into a fresh
 * page, so `out=np.empty_like(x)` hit it on every piece: a 256 KB allreduce on
 * 2 ranks took 77-124 us into such an array against 30-40 us into one 1 KiB
 * further (docs/benchmarks.md). Copied backwards, the loads run ahead of the
 * stores that alias them, and the penalty is gone. */
#ifndef TNT_COPY_OUT_H
#define TNT_COPY_OUT_H

#include <stddef.h>

/* memcpy(dst, src, len) for buffers that do not overlap, in the direction
 * that avoids 4K aliasing. */
void tnt_copy_out(void *dst, const void *src, size_t len);

#endif
