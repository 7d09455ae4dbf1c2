/* fusion.c - packing allreduces into the fusion buffer (fusion.h). */
#include "fusion.h"

#include <stdlib.h>
#include <string.h>

#include "copy_unaliased.h"
#include "dtype.h"

tnt_result_t tnt_fusion_init(tnt_fusion_t *f, int ranks) {
  memset(f, 0, sizeof *f);
  f->N = ranks;
  f->seg_off = calloc((size_t)ranks + 1, sizeof *f->seg_off);
  f->pos = calloc((size_t)ranks, sizeof *f->pos);
  return f->seg_off && f->pos ? TNT_SUCCESS : tnt_fail(TNT_ERR_SYSTEM, "out of memory");
}

void tnt_fusion_free(tnt_fusion_t *f) {
  free(f->buf);
  free(f->seg_off);
  free(f->pos);
  memset(f, 0, sizeof *f);
}

static void rewind_positions(tnt_fusion_t *f) {
  for (int j = 0; j < f->N; j++) f->pos[j] = f->seg_off[j];
}

/* Copy tensor `req` in (scaled by factor) or out, one segment at a time. */
static void move(tnt_fusion_t *f, tnt_request_t *req, double factor, int out) {
  const tnt_dtype_t dt = (tnt_dtype_t)req->meta.dtype;
  const size_t esz = tnt_dtype_size(dt);
  const int64_t cnt = req->meta.count;
  for (int j = 0; j < f->N; j++) {
    int64_t b = cnt * j / f->N, len = cnt * (j + 1) / f->N - b;
    /* nothing to move; and an empty tensor may have NULL buffers, as may the buffer of an
     * empty fusion, which memcpy must not be given even for 0 bytes */
    if (!len) continue;
    uint8_t *at = f->buf + f->pos[j] * (int64_t)esz;
    if (out) tnt_copy_unaliased((uint8_t *)req->out + b * (int64_t)esz, at, (size_t)len * esz);
    else if (factor != 1.0) tnt_scale(dt, at, (const uint8_t *)req->in + b * (int64_t)esz, factor, (size_t)len);
    else tnt_copy_unaliased(at, (const uint8_t *)req->in + b * (int64_t)esz, (size_t)len * esz);
    f->pos[j] += len;
  }
}

tnt_result_t tnt_fusion_pack(tnt_fusion_t *f, tnt_request_t **reqs, int n, const double *factors, tnt_fused_t *packed) {
  const int N = f->N;
  f->total = 0;
  for (int i = 0; i < n; i++) f->total += reqs[i]->meta.count;
  TNT_CHECK(tnt_grow_buffer(&f->buf, &f->cap, (size_t)f->total * tnt_dtype_size((tnt_dtype_t)reqs[0]->meta.dtype),
                            "fusion buffer"));
  for (int j = 0; j <= N; j++) f->seg_off[j] = 0;
  for (int i = 0; i < n; i++) {
    int64_t cnt = reqs[i]->meta.count;
    for (int j = 0; j < N; j++) f->seg_off[j + 1] += cnt * (j + 1) / N - cnt * j / N;
  }
  for (int j = 0; j < N; j++) f->seg_off[j + 1] += f->seg_off[j];
  rewind_positions(f);
  for (int i = 0; i < n; i++) move(f, reqs[i], factors[i], 0);
  *packed = (tnt_fused_t){f->buf, f->total, f->seg_off};
  return TNT_SUCCESS;
}

void tnt_fusion_unpack(tnt_fusion_t *f, tnt_request_t **reqs, int n) {
  rewind_positions(f);
  for (int i = 0; i < n; i++) move(f, reqs[i], 1.0, 1);
}
