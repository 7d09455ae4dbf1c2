/* negotiate.c - the decentralized negotiation of one cycle.
 *
 * Every rank sends the same kind of message and receives everyone's (one
 * transport exchange: a full round), then runs the same deterministic merge, so
 * every rank computes the same response list with no coordinator:
 *
 *   message = header | cache bit vector | announcements (name + meta)
 *             | payloads (slot, bytes, data: cached small allreduces)
 *
 * A name seen for the first time is *announced* with its meta (collective,
 * dtype, count, op, root). The table of announced names is identical on every
 * rank; when all ranks have announced a name, the metas are compared: equal ->
 * a response (and a cache slot), different -> an error response naming the
 * tensor and what each rank submitted. Either way no rank waits forever and no
 * sum mixes different tensors.
 *
 * Steady state (training: the same names every step) costs one bit per request:
 * a request that matches its cache slot sets that bit, and readiness is sticky
 * (a rank reports a slot once; the merge remembers which ranks are ready), so a
 * rank that is waiting for a slow peer sends nothing and sleeps instead of
 * cycling. A changed meta under a cached name is announced, which evicts the
 * slot everywhere and renegotiates it.
 *
 * One round: a cached allreduce of at most tnt_one_round_bytes also sends its
 * payload (scaled by its factor) with the bit, every cycle until it runs. When
 * every rank's payload is in the cycle that makes the slot ready, the response
 * is marked one_round and every rank adds the payloads from the messages it
 * already holds, in the small path's order: no data round. A small broadcast
 * does the same with its root's payload alone, which every rank copies, and
 * an allgather with every rank's, which every rank concatenates. Whether it is
 * one_round depends only on the messages, which every rank sees alike, so
 * every rank decides the same; otherwise the data goes the usual way.
 *
 * Bit rounds: the cycle above is a *full round*. Once every name is cached, a
 * cycle needs only the AND of the cache bit vectors, so it is a *bit round*:
 * one AND-allreduce (and_allreduce.h) of ~flags | digest | ~digest | bits.
 * Which kind the next cycle is follows from this cycle's outcome, identical
 * everywhere: full when some rank set WANT_FULL (a name to announce, a
 * payload to carry, a stall to diagnose), else bits. docs/design.md, "Bit
 * rounds".
 *
 * Nothing read from a peer is trusted: every length, count and field is
 * checked against the message's bounds, and every message carries a digest of
 * the responses its sender computed in the previous cycle. Ranks that stopped
 * computing the same responses (different settings, a bug, memory corruption)
 * fail on the next cycle with an error instead of mixing tensors. */
#include "negotiate.h"

#include <stdlib.h>
#include <string.h>

#include "copy_unaliased.h"
#include "dtype.h"
#include "shape_layout.h"

typedef struct {
  uint32_t proto;       /* TNT_PROTOCOL_VERSION */
  uint32_t n_ann;
  uint32_t nwords;
  uint32_t n_payloads;
  uint64_t prev_digest; /* digest of the sender's responses of the previous cycle */
  uint32_t flags;       /* WANT_FULL */
  uint32_t busy;        /* 1: the sender is in a section of its own (tnt_set_busy), its requests may come late */
} msg_hdr_t;

/* A rank's word of flags; in a bit round it is sent inverted, so that the AND
 * of every rank's word has a flag clear when some rank set it (an OR). */
enum { WANT_FULL = 1u << 0 }; /* this rank has something only a full round carries: the next cycle is full */
/* A bit round's words: ~flags, the digest and its complement (the AND equals
 * both of this rank's only if every rank sent the same digest), cache bits. */
enum { BIT_FLAGS = 0, BIT_DIGEST = 1, BIT_DIGEST_NOT = 2, BIT_HEAD = 3 };

typedef struct {
  tnt_meta_t meta;
  uint16_t name_len;
} __attribute__((packed)) ann_hdr_t;

typedef struct {
  uint32_t slot;
  uint32_t bytes;
} payload_hdr_t; /* at an 8-byte boundary, followed by the payload */

static size_t align8(size_t v) { return (v + 7) & ~(size_t)7; }

const char *tnt_coll_name(int coll) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "barrier"};
  return coll >= 0 && coll <= COLL_BARRIER ? names[coll] : "?";
}

static int cache_words(const tnt_negotiator_t *c) { return (c->cache_cap + 63) / 64; }

tnt_result_t tnt_negotiate_setup(tnt_negotiator_t *c, const tnt_placement_t *pl, const tnt_params_t *params,
                                 const tnt_transport_t *transport, void *ts, tnt_pending_t *pending,
                                 const tnt_topology_t *hier_topo) {
  const int hierarchical = hier_topo != NULL;
  memset(c, 0, sizeof *c);
  c->pl = pl;
  c->params = params;
  c->transport = transport;
  c->ts = ts;
  c->pending = pending;
  c->cache_cap = c->params->cache_capacity;
  c->cache = calloc((size_t)(c->cache_cap ? c->cache_cap : 1), sizeof *c->cache);
  if (!c->cache) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  for (int i = 0; i < c->cache_cap; i++) {
    c->cache[i].ready = calloc((size_t)c->pl->size, 1);
    c->cache[i].rank_counts = calloc((size_t)c->pl->size, sizeof(int64_t));
    if (!c->cache[i].ready || !c->cache[i].rank_counts) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  tnt_namemap_init(&c->cache_by_name);
  tnt_namemap_init(&c->gtable_by_name);
  c->peer_busy = calloc((size_t)c->pl->size, 1);
  if (!c->peer_busy) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  c->payload_at = calloc((size_t)(c->cache_cap ? c->cache_cap : 1) * (size_t)c->pl->size, sizeof *c->payload_at);
  c->payload_cycle = calloc((size_t)(c->cache_cap ? c->cache_cap : 1) * (size_t)c->pl->size, sizeof *c->payload_cycle);
  if (!c->payload_at || !c->payload_cycle) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  c->one_round_bytes = tnt_one_round_bytes(transport, pl->size, hierarchical, 0);
  c->one_round_allreduce_bytes = tnt_one_round_bytes(transport, pl->size, hierarchical, 1);
  c->msg_max = c->one_round_bytes + TNT_MESSAGE_ROOM;
  c->msg_out = malloc(c->msg_max);
  c->msg_all = malloc((size_t)c->msg_max * (size_t)c->pl->size);
  c->msg_lens = calloc((size_t)c->pl->size, sizeof(size_t));
  c->msg_at = calloc((size_t)c->pl->size, sizeof *c->msg_at);
  c->msg_mine = c->msg_out;
  if (!c->msg_out || !c->msg_all || !c->msg_lens || !c->msg_at) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  c->bits_out = calloc((size_t)(BIT_HEAD + cache_words(c)), sizeof *c->bits_out);
  c->bits_and = calloc((size_t)(BIT_HEAD + cache_words(c)), sizeof *c->bits_and);
  if (!c->bits_out || !c->bits_and) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  c->and_scratch = (tnt_and_scratch_t){c->msg_all, c->msg_max, c->msg_lens, c->pl->size, 0};
  c->next_full = 1; /* the first cycle checks protocol and cache size in full */
  c->ride_slot = -1;
  tnt_rides_setup(&c->rides, transport, ts, params, pl->rank, pl->size, hier_topo);
  return TNT_SUCCESS;
}

void tnt_negotiate_teardown(tnt_negotiator_t *c) {
  for (int i = 0; i < c->cache_cap && c->cache; i++) {
    free(c->cache[i].ready);
    free(c->cache[i].rank_counts);
  }
  free(c->cache);
  c->cache = NULL;
  for (int i = 0; i < c->ngtable; i++) {
    free(c->gtable[i].metas);
    free(c->gtable[i].announced);
  }
  free(c->gtable);
  c->gtable = NULL;
  c->ngtable = c->capgtable = 0;
  tnt_namemap_free(&c->cache_by_name);
  tnt_namemap_free(&c->gtable_by_name);
  free(c->peer_busy);
  c->peer_busy = NULL;
  free(c->payload_at);
  free(c->payload_cycle);
  c->payload_at = NULL;
  c->payload_cycle = NULL;
  free(c->msg_out);
  free(c->msg_all);
  free(c->msg_lens);
  free((void *)c->msg_at);
  c->msg_at = NULL;
  free(c->bits_out);
  free(c->bits_and);
  c->bits_out = c->bits_and = NULL;
  c->msg_out = c->msg_all = c->msg_mine = NULL;
  c->msg_lens = NULL;
}

int tnt_negotiate_has_news(tnt_negotiator_t *c) {
  if (c->refresh) return 1;
  for (int i = 0; i < c->pending->n; i++) {
    int s = c->pending->items[i]->state;
    if (s == REQ_NEW || s == REQ_TO_ANNOUNCE || s == REQ_CACHED) return 1;
  }
  return 0;
}

static int meta_agree(const tnt_meta_t *a, const tnt_meta_t *b) {
  if (a->coll != b->coll || a->dtype != b->dtype || a->layout != b->layout) return 0;
  switch (a->coll) {
    case COLL_ALLREDUCE: return a->count == b->count && a->op == b->op;
    case COLL_BROADCAST: return a->count == b->count && a->root == b->root;
    case COLL_ALLGATHER: return a->row_elems == b->row_elems;
    default: return 1;
  }
}

/* "allreduce(sum) float32[6] of shape (2, 3)": an array's shape in words when
 * its layout holds it (tnt_shape_layout), else a structure's digest. */
static void describe(const tnt_meta_t *m, char *out, size_t len) {
  const char *dt = tnt_dtype_name((tnt_dtype_t)m->dtype);
  switch (m->coll) {
    case COLL_ALLREDUCE:
      snprintf(out, len, "allreduce(%s) %s[%lld]", m->op == TNT_AVERAGE ? "average" : "sum", dt, (long long)m->count);
      break;
    case COLL_BROADCAST: snprintf(out, len, "broadcast(root %d) %s[%lld]", m->root, dt, (long long)m->count); break;
    case COLL_ALLGATHER:
      snprintf(out, len, "allgather %s rows of %lld elements", dt, (long long)m->row_elems);
      break;
    default: snprintf(out, len, "%s", tnt_coll_name(m->coll)); break;
  }
  const size_t used = strlen(out);
  char shape[128];
  if (used >= len || !m->layout) return;
  if (tnt_shape_layout_text(m->layout, shape, sizeof shape))
    snprintf(out + used, len - used, m->coll == COLL_ALLGATHER ? ", each of %s" : " of %s", shape);
  else
    snprintf(out + used, len - used, " of structure %016llx", (unsigned long long)m->layout);
}

/* "tensor 'x': ranks submitted different collectives: ranks 0, 2: allreduce(sum) float32[10]; rank 1: ..." */
/* NULL, or why an allgather's result cannot exist: each rank's count is below PTRDIFF_MAX
 * bytes (tnt_submit checks it), but their sum can pass it, and even pass INT64_MAX, which
 * every rank would then allocate and fill with a wrapped-around size. */
static char *gather_too_big(const tnt_gentry_t *g, int N) {
  const int64_t limit = PTRDIFF_MAX / (int64_t)tnt_dtype_size((tnt_dtype_t)g->metas[0].dtype);
  int64_t total = 0;
  for (int k = 0; k < N; k++) {
    if (g->metas[k].count > limit - total) {
      char *msg = malloc(512);
      if (msg)
        snprintf(msg, 512, "allgather '%s': the ranks' counts together pass the largest possible buffer "
                 "(%lld elements of %s; rank %d alone brings %lld): gather less at once", g->name, (long long)limit,
                 tnt_dtype_name((tnt_dtype_t)g->metas[0].dtype), k, (long long)g->metas[k].count);
      return msg ? msg : strdup("allgather too big");
    }
    total += g->metas[k].count;
  }
  return NULL;
}

static char *mismatch_message(const tnt_negotiator_t *c, const tnt_gentry_t *g) {
  size_t cap = 4096, used = 0;
  char *msg = malloc(cap);
  if (!msg) return NULL;
  used += (size_t)snprintf(msg, cap, "collective '%s' was submitted differently by the ranks:", g->name);
  uint8_t *done = calloc((size_t)c->pl->size, 1);
  for (int r = 0; r < c->pl->size && done && used < cap - 200; r++) {
    if (done[r]) continue;
    char desc[256], ranks[512];
    size_t rl = 0;
    int n = 0;
    describe(&g->metas[r], desc, sizeof desc);
    for (int q = r; q < c->pl->size; q++) {
      if (done[q] || !meta_agree(&g->metas[q], &g->metas[r]) || g->metas[q].coll != g->metas[r].coll) continue;
      done[q] = 1;
      if (rl < sizeof ranks - 16) rl += (size_t)snprintf(ranks + rl, sizeof ranks - rl, "%s%d", n ? ", " : "", q);
      n++;
    }
    used += (size_t)snprintf(msg + used, cap - used, " %s %s: %s;", n > 1 ? "ranks" : "rank", ranks, desc);
  }
  free(done);
  if (used < cap - 2)
    snprintf(msg + used, cap - used, " every rank must submit it with the same dtype, shape and op (allgather: the same "
             "dimensions but the first; a nested structure: the same keys, leaf dtypes and shapes)");
  return msg;
}

static void cache_invalidate(tnt_negotiator_t *c, int slot) {
  tnt_cache_entry_t *e = &c->cache[slot];
  if (!e->valid) return;
  tnt_request_t *req = tnt_pending_find(c->pending, e->name);
  if (req && (req->state == REQ_CACHED || req->state == REQ_CACHED_SENT) && req->cache_slot == slot) {
    req->state = REQ_TO_ANNOUNCE; /* renegotiate it in full next cycle */
    req->cache_slot = -1;
  }
  tnt_namemap_del(&c->cache_by_name, e->name);
  e->valid = 0;
  memset(e->ready, 0, (size_t)c->pl->size);
  e->nready = 0;
}

/* A slot for a newly agreed name: a free one, else the least recently used one
 * not used in this cycle. Every rank computes the same choice. */
static int cache_insert(tnt_negotiator_t *c, const tnt_response_t *resp) {
  int victim = -1;
  for (int i = 0; i < c->cache_cap; i++) {
    if (!c->cache[i].valid) {
      victim = i;
      break;
    }
    if (c->cache[i].last_used < c->cycles && (victim < 0 || c->cache[i].last_used < c->cache[victim].last_used)) victim = i;
  }
  if (victim < 0) return -1;
  cache_invalidate(c, victim);
  tnt_cache_entry_t *e = &c->cache[victim];
  if (tnt_namemap_put(&c->cache_by_name, resp->name, victim)) return -1;
  e->valid = 1;
  tnt_copy_str(e->name, sizeof e->name, resp->name);
  tnt_request_t *mine = tnt_pending_find(c->pending, resp->name);
  e->meta = mine ? mine->meta : resp->meta;
  if (resp->rank_counts) memcpy(e->rank_counts, resp->rank_counts, sizeof(int64_t) * (size_t)c->pl->size);
  e->last_used = c->cycles;
  return victim;
}

/* Classify requests taken from the queue since the last cycle. */
static void classify_new(tnt_negotiator_t *c) {
  for (int i = 0; i < c->pending->n; i++) {
    tnt_request_t *req = c->pending->items[i];
    if (req->state != REQ_NEW) continue;
    int slot = tnt_namemap_get(&c->cache_by_name, req->name);
    tnt_cache_entry_t *e = slot >= 0 ? &c->cache[slot] : NULL;
    if (e && !memcmp(&e->meta, &req->meta, sizeof req->meta)) {
      req->state = REQ_CACHED;
      req->cache_slot = slot;
      atomic_fetch_add(&c->cache_hits, 1);
    } else {
      req->state = REQ_TO_ANNOUNCE;
      atomic_fetch_add(&c->announcements, 1);
    }
  }
}

size_t tnt_one_round_bytes(const tnt_transport_t *t, int size, int hierarchical, int allreduce) {
  /* On one host every rank reads the others' messages in place (exchange_view)
   * and builds its own where it is published (exchange_buffer). Two ranks:
   * the ring's three hand-offs cost about what one round's extra reads do
   * (0.9-1.2x at 32-64 KB), so only small payloads ride. More ranks: the ring
   * hands off 2(N-1) times, and each costs a wake-up once ranks outnumber
   * cores; one round took 0.4-0.7x its time at 32-64 KB with 4 and 8 ranks on
   * 2 cores, and a broadcast or allgather in one round 0.58-0.89x the time of
   * its own path at 32-64 KB. An allreduce rides only up to 24 KiB: in one
   * round every rank adds all N payloads, where the direct allreduce
   * (allreduce_direct.c) has each add 1/N of them in two exchanges; the one
   * round is 0.86-0.92x the direct path's time at 20-24 KB on 4 and 8 ranks,
   * level at 32 KB, and the direct path 0.64-0.90x the one round's from 48 KB
   * (docs/benchmarks.md). Across hosts a 64 KiB
   * allreduce on 2 ranks took 0.13 ms on the ring and 0.07 ms in one round
   * (bench/multihost.py); but where hosts hold several ranks (the
   * hierarchical allreduce), a round sends every local rank's payload over
   * the network to every remote rank, and the hierarchical path (the host's
   * ranks over shm, one slice each across) took 0.30-0.35 ms at 32-64 KB on
   * 2 hosts x 2 ranks against 0.42-0.58 in one round. */
  if (t == &tnt_transport_shm)
    return size <= 2 ? TNT_ONE_ROUND_BYTES : allreduce ? TNT_ONE_ROUND_SHM_ALLREDUCE_BYTES : TNT_ONE_ROUND_SHM_BYTES;
  return size > 4 || hierarchical ? TNT_ONE_ROUND_BYTES : TNT_ONE_ROUND_NET_BYTES;
}

/* An integer average: it runs its own two-part sum (engine.c), never in one round. */
static int int_average(const tnt_meta_t *m) {
  return m->op == TNT_AVERAGE && (m->dtype == TNT_INT32 || m->dtype == TNT_INT64);
}

/* A request's payload as every rank's one-round path adds it, written at dst:
 * an allreduce's input times its factor (prescale, and 1/N for a
 * floating-point average), what the small path would send; a broadcast
 * root's or an allgather's input as it is. */
static void write_payload(const tnt_negotiator_t *c, const tnt_request_t *req, void *dst) {
  const tnt_dtype_t dt = (tnt_dtype_t)req->meta.dtype;
  const size_t bytes = (size_t)req->meta.count * tnt_dtype_size(dt);
  double factor = req->meta.coll == COLL_ALLREDUCE ? req->prescale : 1.0;
  if (req->meta.coll == COLL_ALLREDUCE && req->meta.op == TNT_AVERAGE) factor /= c->pl->size;
  if (factor != 1.0) tnt_scale(dt, dst, req->in, factor, (size_t)req->meta.count);
  else if (bytes) tnt_copy_unaliased(dst, req->in, bytes);
}

/* A cached allreduce that rides in the bit round (ride.h) rather than in a
 * full round: where the job's allreduces ride, the only request this rank
 * has pending (several at once take a full round, each payload in it), not
 * an integer average (which runs its own two-part sum), small enough. */
static int would_ride(const tnt_negotiator_t *c, const tnt_request_t *req) {
  const tnt_meta_t *m = &req->meta;
  const tnt_dtype_t dt = (tnt_dtype_t)m->dtype;
  return c->rides.most && c->pending->n == 1 && (req->state == REQ_CACHED || req->state == REQ_CACHED_SENT) &&
         m->coll == COLL_ALLREDUCE && !int_average(m) && (size_t)m->count * tnt_dtype_size(dt) <= c->rides.most;
}

/* A cached request whose payload may ride with its bit, when small: an
 * allreduce but an integer average (that one runs its own two-part sum), an
 * allgather, or a broadcast on its root (the only payload a broadcast needs). */
static int rides_with_bit(const tnt_negotiator_t *c, const tnt_request_t *req) {
  const tnt_meta_t *m = &req->meta;
  if (req->state != REQ_CACHED_SENT && req->state != REQ_CACHED) return 0;
  if (m->coll == COLL_BROADCAST) {
    if (m->root != c->pl->rank) return 0;
  } else if (m->coll == COLL_ALLREDUCE) {
    if (int_average(m)) return 0;
    if (would_ride(c, req)) return 0; /* in the bit round instead (ride.h) */
  } else if (m->coll != COLL_ALLGATHER) {
    return 0;
  }
  const size_t limit = m->coll == COLL_ALLREDUCE ? c->one_round_allreduce_bytes : c->one_round_bytes;
  return (size_t)m->count * tnt_dtype_size((tnt_dtype_t)m->dtype) <= limit;
}

/* Append the payloads of the cached small requests (after the bits, which
 * build_message set; write_payload). A payload that does not fit goes
 * without: its slot then runs the usual way. */
static size_t add_payloads(tnt_negotiator_t *c, uint8_t *msg, size_t used) {
  msg_hdr_t *hdr = (msg_hdr_t *)msg;
  size_t at = align8(used);
  for (int i = 0; i < c->pending->n; i++) {
    tnt_request_t *req = c->pending->items[i];
    if (!rides_with_bit(c, req)) continue;
    const tnt_dtype_t dt = (tnt_dtype_t)req->meta.dtype;
    const size_t bytes = (size_t)req->meta.count * tnt_dtype_size(dt);
    if (at + sizeof(payload_hdr_t) + align8(bytes) > c->msg_max) continue;
    payload_hdr_t ph = {(uint32_t)req->cache_slot, (uint32_t)bytes};
    memcpy(msg + at, &ph, sizeof ph);
    write_payload(c, req, msg + at + sizeof ph);
    at += sizeof ph + align8(bytes);
    hdr->n_payloads++;
  }
  return hdr->n_payloads ? at : used;
}

static size_t build_message(tnt_negotiator_t *c) {
  uint8_t *msg = c->msg_mine;
  msg_hdr_t *hdr = (msg_hdr_t *)msg;
  int nwords = cache_words(c);
  uint64_t *bits = (uint64_t *)(msg + sizeof *hdr);
  memset(msg, 0, sizeof *hdr + sizeof(uint64_t) * (size_t)nwords);
  hdr->proto = TNT_PROTOCOL_VERSION;
  hdr->nwords = (uint32_t)nwords;
  hdr->prev_digest = c->responses_digest;
  hdr->busy = atomic_load(&c->busy) ? 1 : 0;
  size_t used = sizeof *hdr + sizeof(uint64_t) * (size_t)nwords;
  for (int i = 0; i < c->pending->n; i++) {
    tnt_request_t *req = c->pending->items[i];
    if (req->state == REQ_CACHED || req->state == REQ_CACHED_SENT) {
      bits[req->cache_slot / 64] |= 1ull << (req->cache_slot % 64);
      req->state = REQ_CACHED_SENT;
    } else if (req->state == REQ_TO_ANNOUNCE) {
      size_t nlen = strlen(req->name);
      if (used + sizeof(ann_hdr_t) + nlen > c->msg_max) continue; /* the rest goes next cycle */
      ann_hdr_t ah = {req->meta, (uint16_t)nlen};
      memcpy(msg + used, &ah, sizeof ah);
      memcpy(msg + used + sizeof ah, req->name, nlen);
      used += sizeof ah + nlen;
      hdr->n_ann++;
      req->state = REQ_ANNOUNCED;
    }
  }
  used = add_payloads(c, msg, used);
  for (int i = 0; i < c->pending->n; i++)
    if (c->pending->items[i]->state == REQ_TO_ANNOUNCE) hdr->flags |= WANT_FULL; /* did not fit */
  if (hdr->n_payloads) hdr->flags |= WANT_FULL; /* a payload rides until it runs: keep carrying it */
  return used;
}

/* A bit round's words: every cached request's bit (sticky: sent every round
 * until it runs), except a small allreduce's, whose payload only a full round
 * carries: it, and a name to announce, ask for the next cycle to be full. */
static void build_bits(tnt_negotiator_t *c) {
  const int nwords = cache_words(c);
  uint64_t *v = c->bits_out;
  uint32_t flags = 0;
  memset(v, 0, sizeof *v * (size_t)(BIT_HEAD + nwords));
  for (int i = 0; i < c->pending->n; i++) {
    tnt_request_t *req = c->pending->items[i];
    if (req->state == REQ_TO_ANNOUNCE || rides_with_bit(c, req)) {
      flags |= WANT_FULL;
      if (req->state == REQ_CACHED_SENT) req->state = REQ_CACHED; /* news: this rank rings for the full cycle */
    } else if (req->state == REQ_CACHED || req->state == REQ_CACHED_SENT) {
      v[BIT_HEAD + req->cache_slot / 64] |= 1ull << (req->cache_slot % 64);
      req->state = REQ_CACHED_SENT;
    }
  }
  if (c->refresh) flags |= WANT_FULL;
  v[BIT_FLAGS] = ~(uint64_t)flags;
  v[BIT_DIGEST] = c->responses_digest;
  v[BIT_DIGEST_NOT] = ~c->responses_digest;
}

static tnt_gentry_t *gtable_get(tnt_negotiator_t *c, const char *name) {
  int i = tnt_namemap_get(&c->gtable_by_name, name);
  if (i >= 0) return &c->gtable[i];
  for (i = 0; i < c->ngtable; i++)
    if (!c->gtable[i].live) break;
  if (i == c->ngtable) {
    if (c->ngtable == c->capgtable) {
      int cap = c->capgtable ? 2 * c->capgtable : 64;
      tnt_gentry_t *t = realloc(c->gtable, (size_t)cap * sizeof *t);
      if (!t) return NULL;
      c->gtable = t;
      c->capgtable = cap;
    }
    tnt_gentry_t *g = &c->gtable[c->ngtable++];
    memset(g, 0, sizeof *g);
    g->metas = calloc((size_t)c->pl->size, sizeof *g->metas);
    g->announced = calloc((size_t)c->pl->size, 1);
    if (!g->metas || !g->announced) return NULL;
  }
  tnt_gentry_t *g = &c->gtable[i];
  tnt_copy_str(g->name, sizeof g->name, name);
  memset(g->announced, 0, (size_t)c->pl->size);
  g->n_announced = 0;
  g->live = 1;
  g->first_us = tnt_now_us();
  if (tnt_namemap_put(&c->gtable_by_name, name, i)) return NULL;
  return g;
}

static int push_response(tnt_response_t **list, int *n, int *cap, const tnt_response_t *r) {
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 16;
    tnt_response_t *l = realloc(*list, (size_t)nc * sizeof *l);
    if (!l) return -1;
    *list = l;
    *cap = nc;
  }
  (*list)[(*n)++] = *r;
  return 0;
}

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
  for (size_t j = 0; j < len; j++) h = (h ^ ((const uint8_t *)data)[j]) * 1099511628211ull;
  return h;
}

/* FNV-1a over the response list, in order: names, errors, paths, and the fields of
 * each meta that every rank shares (an allgather's count is per rank). */
static uint64_t responses_digest(const tnt_response_t *list, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    const tnt_meta_t *m = &list[i].meta;
    int64_t shared[7] = {m->coll, m->dtype, m->op, m->root, m->coll == COLL_ALLGATHER ? 0 : m->count, m->row_elems,
                         (int64_t)m->layout};
    int32_t error_and_path[2] = {list[i].error, list[i].one_round};
    h = fnv(h, list[i].name, strlen(list[i].name) + 1);
    h = fnv(h, shared, sizeof shared);
    h = fnv(h, error_and_path, sizeof error_and_path);
  }
  return h;
}

static int meta_valid(const tnt_meta_t *m) {
  return m->coll <= COLL_BARRIER && tnt_dtype_valid(m->dtype) && m->op <= TNT_AVERAGE && m->count >= 0 &&
         m->row_elems >= 0;
}

/* Every message is well formed and from the same protocol, and every rank
 * computed the same responses last cycle; else the ranks have diverged. */
static tnt_result_t check_messages(tnt_negotiator_t *c) {
  const int N = c->pl->size;
  const msg_hdr_t *mine = (const msg_hdr_t *)c->msg_mine;
  for (int q = 0; q < N; q++) {
    const uint8_t *msg = c->msg_at[q];
    size_t len = c->msg_lens[q];
    msg_hdr_t hdr;
    if (len < sizeof hdr) return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent a truncated negotiation message (%zu bytes)", q, len);
    memcpy(&hdr, msg, sizeof hdr);
    if (hdr.proto != TNT_PROTOCOL_VERSION)
      return tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d speaks negotiation protocol %u, rank %d speaks %u: every rank must run "
                      "the same version of Tarantella", q, hdr.proto, c->pl->rank, (unsigned)TNT_PROTOCOL_VERSION);
    if (hdr.nwords != mine->nwords)
      return tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d caches %u x 64 names, rank %d %u x 64: every rank must have the same "
                      "TNT_CACHE_CAPACITY", q, hdr.nwords, c->pl->rank, mine->nwords);
    if (hdr.prev_digest != mine->prev_digest)
      return tnt_fail(TNT_ERR_INTERNAL, "rank %d and rank %d computed different collectives in negotiation cycle %llu: the "
                      "ranks have diverged (different TNT_* settings or library versions?); stopping before any data mixes",
                      q, c->pl->rank, (unsigned long long)c->cycles);
    size_t off = sizeof hdr + sizeof(uint64_t) * hdr.nwords;
    if (off > len) return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent a negotiation message shorter than its cache bits", q);
    for (uint32_t a = 0; a < hdr.n_ann; a++) {
      ann_hdr_t ah;
      if (off + sizeof ah > len) return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent a truncated announcement", q);
      memcpy(&ah, msg + off, sizeof ah);
      tnt_meta_t meta = ah.meta;
      if (ah.name_len == 0 || ah.name_len >= TNT_MAX_NAME || off + sizeof ah + ah.name_len > len || !meta_valid(&meta))
        return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent a malformed announcement (name length %u, collective %u, dtype %u)",
                        q, ah.name_len, ah.meta.coll, ah.meta.dtype);
      if (memchr(msg + off + sizeof ah, 0, ah.name_len))
        return tnt_fail(TNT_ERR_INTERNAL, "rank %d announced a name containing a NUL byte", q);
      off += sizeof ah + ah.name_len;
    }
    if (hdr.n_payloads) off = align8(off);
    for (uint32_t a = 0; a < hdr.n_payloads; a++) {
      payload_hdr_t ph;
      if (off + sizeof ph > len) return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent a truncated payload header", q);
      memcpy(&ph, msg + off, sizeof ph);
      if (ph.slot >= (uint32_t)c->cache_cap || ph.bytes > c->one_round_bytes || off + sizeof ph + align8(ph.bytes) > len)
        return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent a malformed payload (slot %u, %u bytes)", q, ph.slot, ph.bytes);
      off += sizeof ph + align8(ph.bytes);
    }
    if (off != len) return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent %zu bytes after its announcements", q, len - off);
  }
  return TNT_SUCCESS;
}

/* The request that rides in this bit round (would_ride), if any.
 * *payload: write_payload's, where the ranks of this host read it (ride.h). */
static tnt_result_t pick_ride(tnt_negotiator_t *c, const void **payload) {
  c->ride_slot = -1;
  if (c->pending->n != 1 || !would_ride(c, c->pending->items[0])) return TNT_SUCCESS;
  const tnt_request_t *req = c->pending->items[0];
  const tnt_meta_t *m = &req->meta;
  const tnt_dtype_t dt = (tnt_dtype_t)m->dtype;
  const size_t bytes = (size_t)m->count * tnt_dtype_size(dt);
  /* the cycle's parity is every rank's: a peer reads this buffer in this round */
  void *mine = tnt_rides_prepare(&c->rides, (uint64_t)req->cache_slot << 32 | bytes, dt, m->count,
                                 (int)(c->cycles & 1), c->pl->rank);
  if (!mine) return TNT_SUCCESS;
  write_payload(c, req, mine);
  /* before the message that tells the host's other rank to read it (ride.c's acquire) */
  atomic_thread_fence(memory_order_release);
  *payload = mine;
  c->ride_slot = req->cache_slot;
  return TNT_SUCCESS;
}

/* Publish this rank's part of the cycle: a full message, or a bit round's words. */
static tnt_result_t post_cycle(tnt_negotiator_t *c) {
  const double deadline = tnt_now() + c->params->timeout_s;
  classify_new(c);
  c->cycle_bits = !c->next_full;
  if (c->cycle_bits) {
    build_bits(c);
    const void *payload = NULL;
    TNT_CHECK(pick_ride(c, &payload));
    return tnt_and_post(c->transport, c->ts, &c->and_scratch, c->bits_out, BIT_HEAD + cache_words(c),
                        c->ride_slot >= 0 ? &c->rides.ride : NULL, payload, deadline);
  }
  /* built where the transport publishes it, when it can say where (no copy of the payloads) */
  size_t capacity = 0;
  void *in_place = c->transport->exchange_buffer ? c->transport->exchange_buffer(c->ts, &capacity) : NULL;
  if (capacity < c->msg_max) in_place = NULL;
  c->msg_mine = in_place ? in_place : c->msg_out;
  c->msg_out_len = build_message(c);
  return c->transport->exchange_post(c->ts, c->msg_mine, c->msg_out_len, deadline);
}

/* Push a response for every valid slot whose bit is set in `ready` and that
 * every rank is ready for (nready == N), in slot order. `payloads`: check
 * whether every rank's payload came in this cycle (one_round). */
static tnt_result_t ready_slots(tnt_negotiator_t *c, const uint64_t *ready, int payloads, tnt_response_t **list, int *n,
                                int *cap) {
  const int N = c->pl->size;
  const uint64_t stamp = c->cycles + 1;
  for (int w = 0; w < cache_words(c); w++) {
    for (uint64_t b = ready[w]; b; b &= b - 1) {
      const int slot = w * 64 + __builtin_ctzll(b);
      if (slot >= c->cache_cap) break;
      tnt_cache_entry_t *e = &c->cache[slot];
      if (!e->valid || e->nready < N) continue;
      tnt_response_t r = {0};
      tnt_copy_str(r.name, sizeof r.name, e->name);
      r.meta = e->meta;
      r.cache_slot = slot;
      if (e->meta.coll == COLL_ALLGATHER) {
        r.rank_counts = malloc(sizeof(int64_t) * (size_t)N);
        if (!r.rank_counts) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
        memcpy(r.rank_counts, e->rank_counts, sizeof(int64_t) * (size_t)N);
      }
      /* one round: every payload the collective needs came in this cycle
       * (every rank's for an allreduce or an allgather, the root's for a broadcast) */
      const uint64_t *came = &c->payload_cycle[(size_t)slot * N];
      if (payloads && (e->meta.coll == COLL_ALLREDUCE || e->meta.coll == COLL_ALLGATHER)) {
        r.one_round = 1;
        for (int q = 0; q < N && r.one_round; q++) r.one_round = came[q] == stamp;
      } else if (payloads && e->meta.coll == COLL_BROADCAST) {
        r.one_round = came[e->meta.root] == stamp;
      }
      if (r.one_round) atomic_fetch_add(&c->one_round, 1);
      memset(e->ready, 0, (size_t)N);
      e->nready = 0;
      e->last_used = c->cycles;
      if (push_response(list, n, cap, &r)) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
    }
  }
  return TNT_SUCCESS;
}

/* A bit round's outcome: the slots whose bit every rank set, after the check
 * that every rank computed the same responses last cycle. */
static tnt_result_t merge_bits(tnt_negotiator_t *c, tnt_response_t **list, int *n, int *next_full) {
  const uint64_t *v = c->bits_and;
  if (v[BIT_DIGEST] != c->bits_out[BIT_DIGEST] || v[BIT_DIGEST_NOT] != c->bits_out[BIT_DIGEST_NOT])
    return tnt_fail(TNT_ERR_INTERNAL, "rank %d and another rank computed different collectives in negotiation cycle "
                    "%llu (a bit round): the ranks have diverged (different TNT_* settings or library versions?); "
                    "stopping before any data mixes", c->pl->rank, (unsigned long long)c->cycles);
  *next_full = !(v[BIT_FLAGS] & WANT_FULL);
  /* every rank's bit: the sticky per-rank readiness of the full rounds is all set */
  for (int w = 0; w < cache_words(c); w++) {
    for (uint64_t b = v[BIT_HEAD + w]; b; b &= b - 1) {
      const int slot = w * 64 + __builtin_ctzll(b);
      if (slot >= c->cache_cap || !c->cache[slot].valid) continue;
      memset(c->cache[slot].ready, 1, (size_t)c->pl->size);
      c->cache[slot].nready = c->pl->size;
    }
  }
  int cap = 0;
  TNT_CHECK(ready_slots(c, v + BIT_HEAD, 0, list, n, &cap));
  /* a ride that reached every rank is the slot's result (ride.h): every rank
   * holds the same ranks, so every rank decides alike */
  c->ride_sum = NULL;
  if (c->ride_slot < 0) return TNT_SUCCESS;
  uint64_t ranks = 0;
  const void *sum = c->transport->ride_result(c->ts, &ranks);
  const uint64_t every = c->pl->size >= 64 ? ~0ull : (1ull << c->pl->size) - 1;
  if (!sum || ranks != every) return TNT_SUCCESS;
  for (int i = 0; i < *n; i++)
    if ((*list)[i].cache_slot == c->ride_slot && (*list)[i].error == TNT_SUCCESS) {
      (*list)[i].one_round = 2;
      c->ride_sum = sum;
      atomic_fetch_add(&c->one_round, 1);
    }
  return TNT_SUCCESS;
}

static tnt_result_t merge_full(tnt_negotiator_t *c, tnt_response_t **responses, int *nresponses, int *next_full);

/* A full round's messages: read in place where the transport can lend them
 * (no copy of N payloads before they are added), else copied into msg_all. */
static tnt_result_t collect_messages(tnt_negotiator_t *c, double until) {
  if (c->transport->exchange_view)
    return c->transport->exchange_view(c->ts, c->msg_at, c->msg_lens, c->msg_max, until);
  TNT_CHECK(c->transport->exchange_collect(c->ts, c->msg_all, c->msg_max, c->msg_lens, until));
  for (int q = 0; q < c->pl->size; q++) c->msg_at[q] = c->msg_all + (size_t)q * c->msg_max;
  return TNT_SUCCESS;
}

tnt_result_t tnt_negotiate_cycle(tnt_negotiator_t *c, tnt_response_t **responses, int *nresponses, double until) {
  *responses = NULL;
  *nresponses = 0;
  if (!c->cycle_posted) {
    TNT_CHECK(post_cycle(c));
    c->cycle_posted = 1;
  }
  tnt_result_t res = c->cycle_bits ? tnt_and_collect(c->transport, c->ts, &c->and_scratch, c->bits_and, until)
                                    : collect_messages(c, until);
  if (res != TNT_SUCCESS) return res; /* TNT_IN_PROGRESS: resumed by the next step */
  c->cycle_posted = 0;
  tnt_response_t *list = NULL;
  int n = 0, next_full = 1;
  res = c->cycle_bits ? merge_bits(c, &list, &n, &next_full) : merge_full(c, &list, &n, &next_full);
  if (res != TNT_SUCCESS) {
    tnt_responses_free(list, n);
    return res;
  }
  atomic_fetch_add(c->cycle_bits ? &c->bit_rounds : &c->full_rounds, 1);
  if (tnt_log_enabled(TNT_LOG_DEBUG)) {
    char names[512];
    size_t used = 0;
    names[0] = 0;
    for (int i = 0; i < n && used < sizeof names - 64; i++)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s%s", i ? " " : "", list[i].name,
                               list[i].error ? "(error)" : "");
    TNT_DEBUG("cycle %llu (%s round): %d responses: %s; next round %s", (unsigned long long)c->cycles,
              c->cycle_bits ? "bit" : "full", n, names, next_full ? "full" : "bit");
  }
  /* the next cycle's kind is part of what every rank must agree on */
  c->next_full = next_full || !c->params->bit_rounds;
  c->responses_digest = responses_digest(list, n) ^ (uint64_t)c->next_full;
  __atomic_fetch_add(&c->cycles, 1, __ATOMIC_RELAXED); /* read by tnt_get_stats on any thread */
  *responses = list;
  *nresponses = n;
  return TNT_SUCCESS;
}

/* A full round's outcome: cache bits, payloads and announcements of every rank. */
static tnt_result_t merge_full(tnt_negotiator_t *c, tnt_response_t **responses, int *nresponses, int *next_full) {
  const int N = c->pl->size;
  TNT_CHECK(check_messages(c));
  c->refresh = 0; /* every rank's bits are in: the per-rank readiness is current */
  tnt_response_t *list = NULL;
  int n = 0, cap = 0;
  *next_full = 0;
  for (int q = 0; q < N; q++) {
    msg_hdr_t hdr;
    memcpy(&hdr, c->msg_at[q], sizeof hdr);
    if (hdr.flags & WANT_FULL) *next_full = 1;
    c->peer_busy[q] = hdr.busy != 0;
  }
  c->full_round_at = tnt_now();
  /* 1. cache bits: sticky readiness per slot (a slot can become ready for
   * every rank only in a cycle that carries a bit for it: `seen`) */
  const int nwords = cache_words(c);
  uint64_t seen[nwords > 0 ? nwords : 1];
  memset(seen, 0, sizeof seen);
  for (int q = 0; q < N; q++) {
    const uint8_t *msg = c->msg_at[q];
    const msg_hdr_t *hdr = (const msg_hdr_t *)msg;
    const uint64_t *bits = (const uint64_t *)(msg + sizeof *hdr);
    for (uint32_t w = 0; w < hdr->nwords && (int)w < cache_words(c); w++) {
      uint64_t word;
      memcpy(&word, bits + w, sizeof word);
      seen[w] |= word;
      for (uint64_t b = word; b; b &= b - 1) {
        int slot = (int)w * 64 + __builtin_ctzll(b);
        if (slot >= c->cache_cap) continue;
        tnt_cache_entry_t *e = &c->cache[slot];
        if (e->valid && !e->ready[q]) {
          e->ready[q] = 1;
          e->nready++;
        }
      }
    }
  }
  /* 1b. payloads that rode with the bits (checked in size against the slot:
   * every rank's cache holds the same agreed meta) */
  const uint64_t stamp = c->cycles + 1;
  for (int q = 0; q < N; q++) {
    const uint8_t *msg = c->msg_at[q];
    msg_hdr_t hdr;
    memcpy(&hdr, msg, sizeof hdr);
    if (!hdr.n_payloads) continue;
    size_t off = sizeof hdr + sizeof(uint64_t) * hdr.nwords;
    for (uint32_t a = 0; a < hdr.n_ann; a++) {
      ann_hdr_t ah;
      memcpy(&ah, msg + off, sizeof ah);
      off += sizeof ah + ah.name_len;
    }
    off = align8(off);
    for (uint32_t a = 0; a < hdr.n_payloads; a++) {
      payload_hdr_t ph;
      memcpy(&ph, msg + off, sizeof ph);
      const tnt_cache_entry_t *e = &c->cache[ph.slot];
      if (e->valid) {
        /* an allgather's count is each rank's own, agreed in the announcement */
        const int64_t agreed = e->meta.coll == COLL_ALLGATHER ? e->rank_counts[q] : e->meta.count;
        if (ph.bytes != (uint64_t)agreed * tnt_dtype_size((tnt_dtype_t)e->meta.dtype))
          return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent %u bytes for '%s' (%lld elements of %s agreed): the ranks have "
                          "diverged; stopping before any data mixes", q, ph.bytes, e->name, (long long)agreed,
                          tnt_dtype_name((tnt_dtype_t)e->meta.dtype));
        c->payload_at[(size_t)ph.slot * N + q] = (uint32_t)(off + sizeof ph);
        c->payload_cycle[(size_t)ph.slot * N + q] = stamp;
      }
      off += sizeof ph + align8(ph.bytes);
    }
  }
  /* 2. slots every rank is ready for, in slot order */
  TNT_CHECK(ready_slots(c, seen, 1, &list, &n, &cap));
  /* 3. announcements, in rank order */
  int first_new = n;
  for (int q = 0; q < N; q++) {
    const uint8_t *msg = c->msg_at[q];
    const msg_hdr_t *hdr = (const msg_hdr_t *)msg;
    size_t off = sizeof *hdr + sizeof(uint64_t) * hdr->nwords;
    for (uint32_t a = 0; a < hdr->n_ann; a++) {
      ann_hdr_t ah;
      memcpy(&ah, msg + off, sizeof ah);
      char name[TNT_MAX_NAME];
      memcpy(name, msg + off + sizeof ah, ah.name_len);
      name[ah.name_len] = 0;
      off += sizeof ah + ah.name_len;
      int slot = tnt_namemap_get(&c->cache_by_name, name);
      if (slot >= 0) cache_invalidate(c, slot);
      tnt_gentry_t *g = gtable_get(c, name);
      if (!g) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
      if (g->announced[q]) continue; /* cannot happen: names are unique per rank while in flight */
      g->announced[q] = 1;
      g->metas[q] = ah.meta;
      if (++g->n_announced < N) continue;
      tnt_response_t r = {0};
      tnt_copy_str(r.name, sizeof r.name, name);
      r.meta = g->metas[0];
      r.cache_slot = -1;
      int agree = 1;
      for (int k = 1; k < N; k++) agree &= meta_agree(&g->metas[k], &g->metas[0]);
      if (!agree) {
        r.error = TNT_ERR_MISMATCH;
        r.error_msg = mismatch_message(c, g);
      } else if (r.meta.coll == COLL_ALLGATHER && (r.error_msg = gather_too_big(g, N)) != NULL) {
        r.error = TNT_ERR_INVALID_ARGUMENT;
      } else if (r.meta.coll == COLL_ALLGATHER) {
        r.rank_counts = malloc(sizeof(int64_t) * (size_t)N);
        if (!r.rank_counts) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
        for (int k = 0; k < N; k++) r.rank_counts[k] = g->metas[k].count;
      }
      g->live = 0;
      tnt_namemap_del(&c->gtable_by_name, name);
      if (push_response(&list, &n, &cap, &r)) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
    }
  }
  /* 4. remember what was newly agreed */
  for (int i = first_new; i < n; i++)
    if (list[i].error == TNT_SUCCESS && list[i].meta.coll != COLL_BARRIER) list[i].cache_slot = cache_insert(c, &list[i]);
  TNT_DEBUG("cycle %llu: sent %zu bytes", (unsigned long long)c->cycles, c->msg_out_len);
  *responses = list;
  *nresponses = n;
  return TNT_SUCCESS;
}

/* Python names the threads it starts "Thread-N" or "Thread-N (target)", N counting every thread the process
 * has started. */
static int python_default_thread_name(const char *s) {
  return strncmp(s, "Thread-", 7) == 0 && s[7] >= '0' && s[7] <= '9';
}

const char *tnt_negotiate_thread_twin(const tnt_negotiator_t *c, const char *name, int peer) {
  const char *at = strchr(name, '@');
  if (!at || !python_default_thread_name(at + 1)) return NULL;
  const size_t stem = (size_t)(at - name) + 1;
  for (int i = 0; i < c->ngtable; i++) {
    const tnt_gentry_t *g = &c->gtable[i];
    if (g->live && g->announced[peer] && !g->announced[c->pl->rank] && strncmp(g->name, name, stem) == 0 &&
        python_default_thread_name(g->name + stem) && strcmp(g->name, name) != 0)
      return g->name;
  }
  return NULL;
}

const char *tnt_negotiate_peer_waits_for(const tnt_negotiator_t *c, int peer, tnt_coll_t *coll) {
  const int me = c->pl->rank;
  for (int i = 0; i < c->ngtable; i++) {
    const tnt_gentry_t *g = &c->gtable[i];
    if (g->live && g->announced[peer] && !g->announced[me]) {
      *coll = g->metas[peer].coll;
      return g->name;
    }
  }
  for (int i = 0; i < c->cache_cap; i++) {
    const tnt_cache_entry_t *e = &c->cache[i];
    if (e->valid && e->ready[peer] && !e->ready[me]) {
      *coll = e->meta.coll;
      return e->name;
    }
  }
  return NULL;
}

const void *tnt_negotiate_payload(const tnt_negotiator_t *c, int slot, int q) {
  return c->msg_at[q] + c->payload_at[(size_t)slot * c->pl->size + q];
}

void tnt_responses_free(tnt_response_t *responses, int n) {
  for (int i = 0; i < n; i++) {
    free(responses[i].rank_counts);
    free(responses[i].error_msg);
  }
  free(responses);
}

/* Which ranks have reported `req` ([size] flags), or NULL when this rank has not
 * sent it yet and knows nothing of the others. */
static const uint8_t *reported_by(const tnt_negotiator_t *c, const tnt_request_t *req) {
  if (req->state == REQ_ANNOUNCED) {
    int g = tnt_namemap_get(&c->gtable_by_name, req->name);
    return g >= 0 ? c->gtable[g].announced : NULL;
  }
  if (req->state == REQ_CACHED_SENT && req->cache_slot >= 0) return c->cache[req->cache_slot].ready;
  return NULL;
}

void tnt_negotiate_awaited(tnt_negotiator_t *c, uint8_t *awaited) {
  memset(awaited, 0, (size_t)c->pl->size);
  for (int i = 0; i < c->pending->n; i++) {
    const uint8_t *have = reported_by(c, c->pending->items[i]);
    for (int r = 0; r < c->pl->size; r++)
      if (r != c->pl->rank && (!have || !have[r])) awaited[r] = 1;
  }
}

int tnt_negotiate_missing_busy(const tnt_negotiator_t *c, const tnt_request_t *req) {
  const uint8_t *have = reported_by(c, req);
  int missing = 0;
  if (!have || c->full_round_at == 0) return 0;
  for (int r = 0; r < c->pl->size; r++)
    if (!have[r]) {
      if (!c->peer_busy[r]) return 0;
      missing++;
    }
  return missing > 0;
}

void tnt_negotiate_missing(tnt_negotiator_t *c, const tnt_request_t *req, char *out, size_t len) {
  size_t used = 0;
  const uint8_t *have = reported_by(c, req);
  out[0] = 0;
  if (!have) {
    snprintf(out, len, "unknown");
    return;
  }
  for (int r = 0; r < c->pl->size && used < len - 8; r++)
    if (!have[r]) used += (size_t)snprintf(out + used, len - used, "%s%d", used ? ", " : "", r);
}

void tnt_negotiate_stats(const tnt_negotiator_t *c, tnt_stats_t *stats) {
  /* cycles is written under the engine's progress lock, and bumped atomically for this read */
  stats->cycles = (int64_t)__atomic_load_n(&c->cycles, __ATOMIC_RELAXED);
  stats->cache_hits = atomic_load(&c->cache_hits);
  stats->announcements = atomic_load(&c->announcements);
  stats->one_round = atomic_load(&c->one_round);
  stats->bit_rounds = atomic_load(&c->bit_rounds);
  stats->full_rounds = atomic_load(&c->full_rounds);
}
