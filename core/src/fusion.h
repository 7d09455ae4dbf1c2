/* fusion.h - the fusion buffer and its layout: several allreduces of one dtype
 * packed into one buffer so that they cost one collective.
 *
 * Layout (ring.h's order of additions): segment j of the fused buffer is the
 * concatenation of segment j of each tensor (its own even split into N), so a
 * tensor's elements are summed in the same order alone or fused, and results
 * never depend on what a tensor was fused with. */
#ifndef TNT_FUSION_H
#define TNT_FUSION_H

#include <stddef.h>
#include <stdint.h>

#include "request.h"

typedef struct {
  uint8_t *buf;
  size_t cap;
  int N;            /* ranks = segments */
  int64_t *seg_off; /* [N + 1]: where fused segment j begins (the ring's bounds) */
  int64_t *pos;     /* [N]: the running position inside fused segment j */
  int64_t total;    /* elements packed */
} tnt_fusion_t;

tnt_result_t tnt_fusion_init(tnt_fusion_t *f, int ranks);
void tnt_fusion_free(tnt_fusion_t *f);
/* What a pack laid out, for the one allreduce over it: the buffer, its elements, and where each of the
 * ring's N segments begins (bounds[0..N]). Valid until the next pack. */
typedef struct {
  void *buf;
  int64_t count;
  const int64_t *bounds;
} tnt_fused_t;

/* Lay out reqs[0..n) (one dtype) and copy each in, scaled by factors[i]; *packed says where. */
tnt_result_t tnt_fusion_pack(tnt_fusion_t *f, tnt_request_t **reqs, int n, const double *factors, tnt_fused_t *packed);
/* Copy each tensor's result out of the buffer, in the layout of the last pack. */
void tnt_fusion_unpack(tnt_fusion_t *f, tnt_request_t **reqs, int n);

#endif
