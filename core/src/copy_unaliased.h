/* copy_unaliased.h - copying between the caller's memory and the core's.
 *
 * A forward copy whose stores land just above its loads modulo 4 KiB (the
 * destination 1-255 bytes past the source in the page) makes every load wait
 * on the store before it: the CPU matches addresses on their low 12 bits first
 * (4K aliasing). Pieces arrive page-aligned in the window or the exchange
 * buffers, and NumPy places an array of 128 KiB or more 16 bytes into a fresh
 * page, so `out=np.empty_like(x)` hit it on every piece: a 256 KB allreduce on
 * 2 ranks took 77-124 us into such an array against 30-40 us into one 1 KiB
 * further (docs/benchmarks.md); a job of one rank copies the input into such an
 * array in 28 us for 64 KB instead of 4. Copied backwards, the loads run ahead
 * of the stores that alias them, and the penalty is gone. Every copy of a
 * caller's buffer goes through here: pieces, fusion buffers, one-round
 * payloads, one rank's copies, allgather results. */
#ifndef TNT_COPY_UNALIASED_H
#define TNT_COPY_UNALIASED_H

#include <stddef.h>

/* memcpy(dst, src, len) for buffers that do not overlap, in the direction
 * that avoids 4K aliasing. len 0 touches nothing (either pointer may be NULL). */
void tnt_copy_unaliased(void *dst, const void *src, size_t len);

#endif
