/* stream_store.h - writing results that do not fit in the cache past it.
 *
 * A normal store first reads the line it writes (write-allocate), so writing an
 * S-byte result out of cache costs 2S of memory traffic. A streaming
 * (non-temporal) store writes whole lines without reading them: on this
 * project's machine a 64 MiB copy takes 3.4 ms instead of 5.3. It pays off
 * only for results too large to stay in the cache for their reader anyway,
 * hence the threshold. The bytes are the same either way: only where they go
 * differs. */
#ifndef TNT_STREAM_STORE_H
#define TNT_STREAM_STORE_H

#include <stddef.h>

/* From now on, process-wide, collectives whose buffer has at least `bytes`
 * count as larger than the cache: they write their results with streaming
 * stores, and the ring allreduce fuses its last reduce step with the
 * allgather's first (allreduce_ring.c). tnt_init applies TNT_STREAM_MIN_KB;
 * docs/benchmarks.md, "Past the cache", has the measurements behind its
 * default. */
void tnt_stream_min_set(size_t bytes);
/* Whether a buffer of `bytes` counts as larger than the cache. */
int tnt_stream_wanted(size_t bytes);

/* memcpy(dst, src, len), the aligned middle with streaming stores, followed by
 * a store fence (what comes next, a notification or the return to the caller,
 * is ordered after the data). Plain memcpy where the CPU has no such stores. */
void tnt_copy_streaming(void *dst, const void *src, size_t len);
/* The same without the fence, for a loop of blocks that fences once after its
 * last (tnt_stream_fence). */
void tnt_copy_streaming_unfenced(void *dst, const void *src, size_t len);
void tnt_stream_fence(void);

#endif
