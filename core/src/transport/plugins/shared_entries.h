/* shared_entries.h - the code that both run-time transport plugins
 * (plugins/mpi.c, plugins/gpi2.c) run alike on top of their own engine:
 * judging every peer at once (check_all), the wait of a resumable round and
 * the collects' waits on it (exchange, bit round), the bit round's pairing,
 * the idle thread's doorbell, and the transport entries that only forward to
 * these or to peer_health.h and plugin_util.h (check_peers, describe_peer,
 * wait_stats, cores).
 *
 * Why: the two plugins were written as copies of each other there, and the
 * copies had to be kept the same by hand; one copy makes a change to how a
 * round waits or a peer is judged reach both transports. What differs (every
 * call into MPI or GPI-2, how a wait polls its engine: poll_until) stays in
 * the plugin.
 *
 * Unlike plugin_util.h these functions work on the plugin's own state, so
 * this header is written over it: a plugin defines PLUGIN_STATE (its state
 * struct, which has the fields the functions below use, under these names),
 * includes this header once, after that struct, and defines the functions
 * declared under "from the plugin". Header-only for the reason plugin_util.h
 * is (each plugin is compiled alone, from its one .c file, at first use);
 * tarantella/common/plugins.py ships it with their sources and includes it in
 * their build digest. */
#ifndef TNT_SHARED_ENTRIES_H
#define TNT_SHARED_ENTRIES_H

#include "peer_health.h" /* and plugin_util.h */

#ifndef PLUGIN_STATE
#error "define PLUGIN_STATE (the plugin's state struct) before including shared_entries.h"
#endif

/* A wait's question (mu held): is what it waits for here? mpi.c polls its
 * engine (progress) before it asks, gpi2.c only when the answer is no. */
typedef int (*ready_fn)(PLUGIN_STATE *s, void *arg);

/* ---- from the plugin ---- */

/* One round of progress (mu held): read what arrived, send heartbeats due. */
static void progress(PLUGIN_STATE *s);
/* Is peer r alive? Dead local pids only when `pids`; silence always (mu held). */
static tnt_result_t check_alive(PLUGIN_STATE *s, int r, double now, int pids, const char *what);
/* Has peer r aborted or shut down while this rank still needs it? (mu held) */
static tnt_result_t check_gone(PLUGIN_STATE *s, int r, const char *what);
/* Poll until ready(), a failure, or `deadline` (then TNT_ERR_TIMEOUT, with no
 * message). `from`: the rank that must act (-1: any), checked in full. */
static tnt_result_t poll_until(PLUGIN_STATE *s, ready_fn ready, void *arg, int from, double deadline,
                               const char *what);
/* Has a peer started a round after the last one this rank posted? (mu held) */
static int peer_started_round(PLUGIN_STATE *s);
/* The ready_fn of an exchange's collect: every rank's message of this round is in. */
static int exchange_arrived(PLUGIN_STATE *s, void *arg);
/* The ready_fn of a bit round's collect: this rank holds the AND. */
static int and_advance(PLUGIN_STATE *s, void *arg);

/* ---- peers ---- */

enum { ROUND_NONE = 0, ROUND_AND = 1, ROUND_EXCHANGE = 2 };
static int and_receives(const PLUGIN_STATE *s, int step); /* the plugin's own */
static int and_partner(const PLUGIN_STATE *s, int step);

/* The ranks whose messages the round this rank's collect waits in still
 * needs (mask[r] = 1), or NULL outside such a wait: a peer that shut down
 * after its part of the round is no failure of the round. A bit round's
 * partners of the steps to come (the others' words reach this rank through
 * them; a rank that left without its part fails its partner, whose abort
 * reaches this one); an exchange's ranks whose message is missing. Where a
 * rank that finished the round and shut down counted, a rank still waiting
 * for a later step's message failed, naming it, while that message was on
 * its way (more likely the larger the message: seen with 64 KiB). */
static const uint8_t *round_awaited(PLUGIN_STATE *s, uint8_t *mask) {
  if (s->round_wait == ROUND_NONE) return NULL;
  memset(mask, 0, (size_t)s->n);
  if (s->round_wait == ROUND_AND) {
    for (int k = s->and_step; k < s->and_steps; k++) {
      const int p = and_partner(s, k);
      if (p >= 0 && and_receives(s, k)) mask[p] = 1;
    }
  } else {
    for (int r = 0; r < s->n; r++) mask[r] = !s->peers[r].exch_got;
  }
  return mask;
}

/* Every peer: lost ones first, so that the error names the lost rank rather
 * than one that aborted because of it; a clean shutdown only for `awaited`
 * ranks (NULL: all). mu held. */
static tnt_result_t check_all(PLUGIN_STATE *s, const uint8_t *awaited, int pids, const char *what) {
  double now = host->now();
  tnt_result_t res;
  for (int r = 0; r < s->n; r++)
    if (r != s->me && (res = check_alive(s, r, now, pids, what)) != TNT_SUCCESS) return res;
  if ((res = check_job(&s->health, what)) != TNT_SUCCESS) return res;
  for (int r = 0; r < s->n; r++)
    if (r != s->me && (!awaited || awaited[r]) && (res = check_gone(s, r, what)) != TNT_SUCCESS) return res;
  return TNT_SUCCESS;
}

static tnt_result_t plugin_check_peers(void *st, const uint8_t *awaited) {
  PLUGIN_STATE *s = st;
  pthread_mutex_lock(&s->mu);
  progress(s);
  tnt_result_t res = check_all(s, awaited, 1, "waiting for the other ranks to submit the same collectives");
  pthread_mutex_unlock(&s->mu);
  return res;
}

static void plugin_describe_peer(void *st, int peer, char *out, size_t len) {
  describe(&((PLUGIN_STATE *)st)->health, peer, out, len);
}

/* ---- resumable rounds: the exchange and the bit round ---- */

/* Poll a resumable round (the exchange, a bit round) until `until`: then
 * TNT_IN_PROGRESS, and another call (maybe another thread's) resumes it. At
 * the round's own deadline TNT_ERR_TIMEOUT, which the caller turns into an
 * error naming the rank it waits for. */
static tnt_result_t poll_round(PLUGIN_STATE *s, ready_fn ready, double round_deadline, double until,
                               const char *what) {
  double deadline = until < round_deadline ? until : round_deadline;
  tnt_result_t res = poll_until(s, ready, NULL, -1, deadline, what);
  return res == TNT_ERR_TIMEOUT && deadline < round_deadline ? TNT_IN_PROGRESS : res;
}

/* An exchange's collect, up to its messages: wait until every rank's message
 * of the posted round is in (TNT_IN_PROGRESS at `until`, before the round's
 * own deadline); a timeout names the first rank whose message is missing. */
static tnt_result_t exchange_wait(PLUGIN_STATE *s, double until) {
  if (!s->posted) return failf(TNT_ERR_INTERNAL, -1, "exchange collected before it was posted");
  const char *what = "negotiating with the other ranks";
  s->round_wait = ROUND_EXCHANGE;
  tnt_result_t res = poll_round(s, exchange_arrived, s->exch_deadline, until, what);
  s->round_wait = ROUND_NONE;
  if (res == TNT_ERR_TIMEOUT) {
    int first = -1; /* the first rank whose message is missing */
    for (int r = 0; r < s->n && first < 0; r++)
      if (!s->peers[r].exch_got) first = r;
    return timed_out(&s->health, first, what);
  }
  return res;
}

/* A bit round's collect, up to its result: as exchange_wait; a timeout names
 * the partner of the step this rank waits in. */
static tnt_result_t and_wait(PLUGIN_STATE *s, double until) {
  if (!s->and_posted) return failf(TNT_ERR_INTERNAL, -1, "bit round collected before it was posted");
  const char *what = "in a bit round of the negotiation";
  s->round_wait = ROUND_AND;
  tnt_result_t res = poll_round(s, and_advance, s->and_deadline, until, what);
  s->round_wait = ROUND_NONE;
  return res == TNT_ERR_TIMEOUT ? timed_out(&s->health, s->and_partner, what) : res;
}

/* The bit round's recursive doubling among the largest power of two
 * P = and_pow <= N ranks: steps 0 (rank r + P folded into r), 1 .. log2 P
 * (pairs), log2 P + 1 (the result handed back up to r + P). */
static void and_shape(PLUGIN_STATE *s) {
  int P = 1, L = 0;
  while (2 * P <= s->n) P *= 2, L++;
  s->and_pow = P;
  s->and_log = L;
  s->and_steps = L + 2;
}

/* The partner of `step` (-1: none: this rank skips the step). */
static int and_partner(const PLUGIN_STATE *s, int step) {
  const int r = s->me, P = s->and_pow;
  if (step >= 1 && step <= s->and_log) return r < P ? r ^ (1 << (step - 1)) : -1;
  return r >= P ? r - P : (r + P < s->n ? r + P : -1); /* step 0, and the last */
}

/* ---- the idle thread's doorbell (plugin_util.h's doorbell_t) ---- */

static void bump_bell(PLUGIN_STATE *s) { doorbell_ring_local(&s->door); }

static void plugin_ring_doorbell(void *st, uint64_t cycle) { doorbell_want_cycle(&((PLUGIN_STATE *)st)->door, cycle); }

/* Whether a peer's round has begun (polling the engine first): the doorbell's
 * question between its sleeps. */
static int peer_round_begun(void *st) {
  PLUGIN_STATE *s = st;
  pthread_mutex_lock(&s->mu);
  progress(s);
  int started = peer_started_round(s);
  pthread_mutex_unlock(&s->mu);
  return started;
}

/* The idle thread's wait: it polls the engine for peers' rounds, and sends
 * heartbeats (progress), every BELL_POLL_S at most. */
static void plugin_wait_doorbell(void *st, uint64_t done, double deadline) {
  (void)done; /* a cycle this rank asked for is run by the thread that asked (cycle_wanted) */
  doorbell_wait(&((PLUGIN_STATE *)st)->door, deadline, BELL_POLL_S, host->now, peer_round_begun, st);
}

static void plugin_wake_local(void *st) { bump_bell((PLUGIN_STATE *)st); }

/* ---- what the core asks of a running transport ---- */

static void plugin_wait_stats(void *st, int64_t *spun, int64_t *yielded, int64_t *slept) {
  wait_counts_read(&((PLUGIN_STATE *)st)->wait_counts, spun, yielded, slept);
}

static long plugin_cores(void *st) { return ((PLUGIN_STATE *)st)->share.cores; }

#endif
