/* put_copy.h - how a rank copies a piece into a peer's window on one host:
 * with plain stores while the two cores are near, with streaming stores while
 * they are far apart, decided from what the plain copies cost.
 *
 * A VM may place its vCPUs sharing a cache or far apart, and move them between
 * the two every few seconds to minutes (docs/benchmarks.md, "The slow launches
 * are the VM's two vCPUs placed far apart"). A plain store into a line the
 * peer's core read last must first take the line from that core: cheap near,
 * 5x dearer far. A streaming store writes whole lines without taking them, and
 * the reader then reads them from memory. In a C probe of 64 KiB swaps between
 * two pinned threads: near, 7 us plain against 15 us streaming; far, 34-40 us
 * plain against 14 us streaming. The bytes are the same either way: each rank
 * may choose alone.
 *
 * The signal is the plain copy's own time per byte: near it moved 64 KiB in
 * 1.5-8 us, far in 23-63 us. The slowest samples may be a preempted copy, so a
 * rank takes the cores as far apart only when its last PUT_SAMPLES plain
 * copies were all slow, and as near again at its first fast one; while far,
 * every PUT_PROBE_EVERY-th piece is copied plainly to look. */
#ifndef TNT_PUT_COPY_H
#define TNT_PUT_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

#define PUT_SAMPLES 4
#define PUT_PROBE_EVERY 32
/* Slower than this per byte, a plain copy took its lines from a far core
 * (near: <= 0.12 ns per byte, far: >= 0.35, on the machine above). */
#define PUT_FAR_NS_PER_BYTE 0.2

/* TNT_SHM_PLACEMENT: the verdict timed, or given (where the timing misleads:
 * a host whose plain copies are slow for another reason; and so that a test
 * runs each branch for certain). Every rank of a job may choose alone. */
typedef enum { TNT_PUT_TIMED = 0, TNT_PUT_NEAR = 1, TNT_PUT_FAR = 2 } tnt_put_placement_t;

/* Process-wide, set once at init (context.c) before any copier runs; the
 * count of bytes streamed starts again from 0. */
void tnt_put_init(tnt_put_placement_t placement);
/* Bytes the copiers of this process wrote with streaming stores since tnt_put_init. */
int64_t tnt_put_bytes_streamed(void);

typedef struct {
  double ns_per_byte[PUT_SAMPLES]; /* the last plain copies' costs, a ring */
  uint32_t samples, puts;
  int far;
} tnt_put_copier_t;

/* memcpy(dst, src, len) into a peer's window, as the placement asks. */
void tnt_put_copy(tnt_put_copier_t *c, void *dst, const void *src, size_t len);
/* tnt_scale(dtype, dst, src, factor, n) into a peer's window, as the placement
 * asks: an average's input (1/N) goes out this way, and a scale takes the
 * peer's lines as a copy does. Plain float32 and float64 scales are timed for
 * the verdict like plain copies (against a threshold of their own: put_copy.c);
 * other dtypes' arithmetic may cost more than that anywhere (scalar float16),
 * so they follow the verdict without giving one. */
void tnt_put_scale(tnt_put_copier_t *c, tnt_dtype_t dtype, void *dst, const void *src, double factor, size_t n);
/* 1 while the copier's last timed puts found the cores far apart (or
 * TNT_SHM_PLACEMENT says they are). */
int tnt_put_copier_far(const tnt_put_copier_t *c);
/* tnt_reduce_scaled(dtype, dst, a, b, factor, divisor, n), the same values
 * also into `also` (NULL: none), computed in L1 blocks and written to both
 * with streaming stores: how the ring's fused last step of an average goes
 * into a peer's window and the caller's result at once while the cores are
 * far apart, no line of the peer's taken across (a sum's stays plain:
 * allreduce_ring.c). Not timed. */
void tnt_reduce_scaled_streaming(tnt_dtype_t dtype, void *dst, void *also, const void *a, const void *b, double factor,
                                 int divisor, size_t n);
/* What a plain copy cost: the verdict after it (tnt_put_copy times its plain copies). */
void tnt_put_copier_record(tnt_put_copier_t *c, double ns_per_byte);
/* 1 when its last PUT_SAMPLES plain copies found the cores near (or
 * TNT_SHM_PLACEMENT says they are); 0 while far, and before it has timed that
 * many (no verdict yet). */
int tnt_put_copier_near(const tnt_put_copier_t *c);

#endif
