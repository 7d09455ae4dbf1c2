/* ride.c - see ride.h. */
#include "ride.h"

#include <stdatomic.h>

#include "coll/ring.h"
#include "common.h"

/* out = x + y over [b, e) elements, x first. */
static void add_range(const tnt_rides_t *r, uint8_t *out, const uint8_t *x, const uint8_t *y, int64_t b, int64_t e) {
  if (e <= b) return;
  const size_t esz = tnt_dtype_size(r->dtype), at = (size_t)b * esz;
  tnt_reduce_sum(r->dtype, out + at, x + at, y + at, (size_t)(e - b));
}

/* The one rank in a single-rank set, else -1. */
static int only_rank(uint64_t ranks) { return ranks && !(ranks & (ranks - 1)) ? __builtin_ctzll(ranks) : -1; }

/* Both ranks of host h, as a set. */
static uint64_t host_set(const tnt_rides_t *r, int h) { return 1ull << r->rank_at[2 * h] | 1ull << r->rank_at[2 * h + 1]; }

/* tnt_ride_t's combine for 2 hosts x 2 ranks, in tnt_reduce_in_hier_order's
 * tree: segment s*H + k of slice s is (host k: position s + position s+1) +
 * (host k+1: the same). Symmetric in a and b, so that both partners of a
 * step decide alike; b NULL: rank b's own payload, in its shared buffer. */
static int combine(void *ctx, void *out, const void *a, uint64_t a_ranks, const void *b, uint64_t b_ranks) {
  const tnt_rides_t *r = ctx;
  const int H = 2, L = 2, N = 4;
  const int64_t n = r->count;
  const int ra = only_rank(a_ranks), rb = only_rank(b_ranks);
  if (!b) { /* a rank of this host: its payload where it lies */
    size_t cap = 0;
    if (rb < 0 || !r->t->ride_shared || !(b = r->t->ride_shared(r->ts, rb, r->parity, &cap)) || cap < r->ride.bytes)
      return 0;
    /* its writes came before its message (negotiate.c's release): read after it */
    atomic_thread_fence(memory_order_acquire);
  }
  const uint8_t *A = a, *B = b;
  if (ra >= 0 && rb >= 0) { /* the step inside a host */
    if (ra == rb || r->host_of[ra] != r->host_of[rb]) return 0;
    for (int s = 0; s < L; s++)
      for (int k = 0; k < H; k++) {
        const int64_t lo = tnt_segment_begin(NULL, n, N, s * H + k), hi = tnt_segment_begin(NULL, n, N, s * H + k + 1);
        const int a_first = r->pos_of[ra] == s;
        add_range(r, out, a_first ? A : B, a_first ? B : A, lo, hi);
      }
    return 1;
  }
  /* the step across: the two hosts' sums, host k = g % H first */
  const uint64_t h0 = host_set(r, 0), h1 = host_set(r, 1);
  if (!((a_ranks == h0 && b_ranks == h1) || (a_ranks == h1 && b_ranks == h0))) return 0;
  for (int g = 0; g < N; g++) {
    const int64_t lo = tnt_segment_begin(NULL, n, N, g), hi = tnt_segment_begin(NULL, n, N, g + 1);
    const int a_first = (g % H == 0) == (a_ranks == h0);
    add_range(r, out, a_first ? A : B, a_first ? B : A, lo, hi);
  }
  return 1;
}

void tnt_rides_setup(tnt_rides_t *r, const tnt_transport_t *t, void *ts, const tnt_params_t *params, int rank,
                     int N, const tnt_topology_t *topo) {
  *r = (tnt_rides_t){0};
  r->t = t;
  r->ts = ts;
  r->ride.combine = combine;
  r->ride.ctx = r;
  if (!params->rides || !t->and_post_ride || !t->ride_result || !t->ride_shared) return;
  /* 2 x 2 placed host by host: recursive doubling's first step stays in the host */
  if (!topo || N != 4 || topo->hosts != 2 || !topo->uniform) return;
  for (int h = 0; h < 2; h++) {
    const int x = tnt_topology_rank(topo, h, 0), y = tnt_topology_rank(topo, h, 1);
    if ((x ^ 1) != y) return;
    for (int i = 0; i < 2; i++) {
      const int q = tnt_topology_rank(topo, h, i);
      r->rank_at[2 * h + i] = q;
      r->host_of[q] = h;
      r->pos_of[q] = i;
    }
  }
  r->ride.shared = host_set(r, r->host_of[rank]);
  r->most = TNT_RIDE_MAX_BYTES;
}

void *tnt_rides_prepare(tnt_rides_t *r, uint64_t tag, tnt_dtype_t dtype, int64_t count, int parity, int rank) {
  r->ride.tag = tag;
  r->ride.bytes = (size_t)count * tnt_dtype_size(dtype);
  r->dtype = dtype;
  r->count = count;
  r->parity = parity;
  size_t cap = 0;
  void *mine = r->t->ride_shared(r->ts, rank, parity, &cap);
  return mine && cap >= r->ride.bytes ? mine : NULL;
}
