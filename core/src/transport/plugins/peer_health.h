/* peer_health.h - how both run-time transport plugins (plugins/mpi.c,
 * plugins/gpi2.c) judge their peers' health and word their failures: one
 * copy, so that a lost rank reads the same under either transport.
 *
 * Neither engine tells of a peer that died or froze (GPI-2 marks only a broken
 * connection, which gpi2.c checks besides these), so both plugins keep the
 * same record of every peer, each from its own engine's messages (heard from,
 * a goodbye, an abort), and judge it by the same rules: a local peer whose
 * process is gone is lost, and so is a peer silent for SILENT_BEATS
 * heartbeats.
 *
 * Header-only, shipped and digested with the plugins' sources as plugin_util.h
 * is. The functions expect the plugin's lock held, but where they say not. */
#ifndef TNT_PEER_HEALTH_H
#define TNT_PEER_HEALTH_H

#include "plugin_util.h"

enum { PEER_ALIVE = 0, PEER_EXITED = 1, PEER_FAILED = 2 };

#define REASON_MAX 512  /* an abort's reason, as it travels */
#define SILENT_BEATS 10 /* heartbeats a peer may miss before it is lost */
#define PID_CHECK_S 0.1 /* how often a waiter checks local peers' pids */
#define GONE_GRACE_S 0.25 /* gone_past_grace */

typedef struct {
  int state;      /* PEER_ALIVE, PEER_EXITED (it said goodbye) or PEER_FAILED (it aborted) */
  int root;       /* the rank an aborted peer named as the cause (-1: none) */
  int pid, local; /* local: same kernel and pid namespace (node_ids_match), so its pid can be checked */
  char host[64];
  char reason[REASON_MAX]; /* why it aborted */
  double last_heard, last_sent;
  double gone_since; /* when its pid or connection was first seen gone (0: not seen) */
} peer_health_t;

/* What this rank knows of the job's health. Guarded by the plugin's lock (`mu`),
 * which the functions below expect held, but for describe and timed_out,
 * which take it. */
typedef struct {
  int me, n;
  peer_health_t *peer;      /* [n] */
  double beat_s, silence_s; /* the heartbeat's period, and the silence that loses a peer */
  const char *beat_var;     /* the heartbeat's environment variable, named in messages */
  pthread_mutex_t *mu;
  /* a failure seen where none can be returned (an engine's progress): the
   * first is kept, and the next wait reports it */
  tnt_result_t err_code;
  int err_peer;
  char err[768];
} job_health_t;

/* Local peer r's process is gone (a system call: only when a pid check is due). */
static inline int peer_pid_gone(const job_health_t *h, int r) {
  const peer_health_t *p = &h->peer[r];
  if (!p->local) return 0;
  char st = tnt_process_state(p->pid);
  return st == 'X' || st == 'Z';
}

/* The words that open a failure peer r caused: "rank r (pid p on host) died: "
 * where r is local and its process is gone, else "". A dead rank is often
 * noticed first by a request to it that failed, or by the abort of a rank that
 * noticed it so; the error still says it died, as the pid check's would. */
static inline const char *died_opening(const job_health_t *h, int r, char *buf, size_t len) {
  buf[0] = 0;
  if (r >= 0 && r < h->n && r != h->me && peer_pid_gone(h, r))
    snprintf(buf, len, "rank %d (pid %d on %s) died: ", r, h->peer[r].pid, h->peer[r].host);
  return buf;
}

/* Keep a failure seen where it cannot be returned (the first one only). */
static inline void sticky(job_health_t *h, tnt_result_t code, int peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void sticky(job_health_t *h, tnt_result_t code, int peer, const char *fmt, ...) {
  if (h->err_code != TNT_SUCCESS) return;
  char opening[160] = "";
  if (code == TNT_ERR_PEER_LOST) died_opening(h, peer, opening, sizeof opening);
  size_t at = (size_t)snprintf(h->err, sizeof h->err, "%s", opening);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->err + at, sizeof h->err - at, fmt, ap);
  va_end(ap);
  h->err_code = code;
  h->err_peer = peer;
}

/* A request to peer r failed: TNT_ERR_PEER_LOST, opened as sticky opens it. */
static inline tnt_result_t peer_lost(const job_health_t *h, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline tnt_result_t peer_lost(const job_health_t *h, int r, const char *fmt, ...) {
  char opening[160], msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return failf(TNT_ERR_PEER_LOST, r, "%s%s", died_opening(h, r, opening, sizeof opening), msg);
}

/* The failure sticky kept, reported as met while this rank was `what`
 * (TNT_SUCCESS: none kept). */
static inline tnt_result_t held_failure(const job_health_t *h, const char *what) {
  if (h->err_code == TNT_SUCCESS) return TNT_SUCCESS;
  return failf(h->err_code, h->err_peer, "%s (while rank %d was %s)", h->err, h->me, what);
}

/* Peer r aborted: the error names the rank it blamed, if another. */
static inline tnt_result_t peer_aborted(const job_health_t *h, int r, const char *what) {
  const peer_health_t *p = &h->peer[r];
  if (p->root >= 0 && p->root != r && p->root != h->me)
    return failf(TNT_ERR_PEER_LOST, p->root, "rank %d aborted because of rank %d (%s) while rank %d was %s", r, p->root,
                 p->reason, h->me, what);
  return failf(TNT_ERR_PEER_LOST, r, "rank %d aborted (%s) while rank %d was %s", r, p->reason, h->me, what);
}

/* What a local peer's process is doing ("" for a remote one: we cannot tell). */
static inline const char *local_doing(const peer_health_t *p) {
  if (!p->local) return "";
  return tnt_process_doing(tnt_process_state(p->pid));
}

/* Peer r in a line, for an error (takes the lock itself). */
static inline void describe(const job_health_t *h, int r, char *out, size_t len) {
  pthread_mutex_lock(h->mu);
  const peer_health_t *p = &h->peer[r];
  const char *doing = local_doing(p);
  snprintf(out, len, "rank %d (pid %d on %s) %s%swas last heard from %.1f s ago", r, p->pid, p->host, doing,
           doing[0] ? "; it " : "", host->now() - p->last_heard);
  pthread_mutex_unlock(h->mu);
}

/* The message of peer `r` silent past the bound. A host cut off silences all
 * its ranks at once, but their last heartbeats came at slightly different
 * times: when `r` crosses the bound, the others of the same loss have been
 * silent for nearly as long. Every peer silent for half the bound is named
 * with it, grouped by host, r's host first: "ranks 2 (pid 71), 3 (pid 72) on
 * hostB sent nothing for 2.0 s while rank 0 was ...: their process or host
 * died, ..." (a healthy peer is silent for about one heartbeat), with what r's
 * process is doing where that can be told. */
static inline void silent_message(const job_health_t *h, int r, double now, const char *what, char *out, size_t len) {
  const int n = h->n, me = h->me;
  const double bound = h->silence_s;
  char who[512] = "";
  size_t at = 0;
  int named = 0, count = 0;
  uint8_t *done = calloc((size_t)n, 1);
  for (int k = -1; done && k < n; k++) { /* k = -1: r's host first */
    int l = k < 0 ? r : k;
    const peer_health_t *lead = &h->peer[l];
    if (l == me || done[l] || lead->state != PEER_ALIVE || now - lead->last_heard <= bound / 2) continue;
    char ranks[384] = "";
    size_t rat = 0;
    int here = 0;
    for (int p = 0; p < n; p++) {
      const peer_health_t *q = &h->peer[p];
      if (p == me || done[p] || q->state != PEER_ALIVE || strcmp(q->host, lead->host) ||
          now - q->last_heard <= bound / 2)
        continue;
      done[p] = 1;
      if (rat < sizeof ranks)
        rat += (size_t)snprintf(ranks + rat, sizeof ranks - rat, "%s%d (pid %d)", here ? ", " : "", p, q->pid);
      here++;
    }
    if (at < sizeof who)
      at += (size_t)snprintf(who + at, sizeof who - at, "%s%s %s on %s", named ? " and " : "",
                             here > 1 ? "ranks" : "rank", ranks, lead->host);
    named++;
    count += here;
  }
  free(done);
  const peer_health_t *lost = &h->peer[r];
  if (!count) { /* out of memory: r alone */
    snprintf(who, sizeof who, "rank %d (pid %d) on %s", r, lost->pid, lost->host);
    count = 1;
  }
  int many = count > 1;
  const char *doing = local_doing(lost);
  snprintf(out, len,
           "%s sent nothing for %.1f s while rank %d was %s: %s process or host died, %s cut off, or %s hang%s%s%s "
           "(every rank sends a heartbeat every %g s, %s; %d missed mean lost)",
           who, now - lost->last_heard, me, what, many ? "their" : "its", many ? "they are" : "it is",
           many ? "they" : "it", many ? "" : "s", doing[0] ? "; it " : "", doing, h->beat_s, h->beat_var,
           SILENT_BEATS);
}

/* Peer r has been seen gone (its pid, its connection) for GONE_GRACE_S; the
 * first sighting starts the clock. The grace, spent reading what arrives: a
 * rank exits soon after it has aborted or named another rank's failure, and
 * that message, or the abort of the rank it named, may still be on its way
 * (GPI-2 lands it from its own thread, late on a loaded host). Without it the
 * survivor that exited first would be blamed for the failure it reported. */
static inline int gone_past_grace(job_health_t *h, int r, double now) {
  peer_health_t *p = &h->peer[r];
  if (p->gone_since == 0) p->gone_since = now;
  return now - p->gone_since >= GONE_GRACE_S;
}

/* Local peer r's process is gone (peer_pid_gone, past the grace): the error. */
static inline tnt_result_t peer_died(const job_health_t *h, int r, const char *what) {
  const peer_health_t *p = &h->peer[r];
  return failf(TNT_ERR_PEER_LOST, r, "rank %d (pid %d on %s) died while rank %d was %s", r, p->pid, p->host, h->me,
               what);
}

/* Peer r has been silent past the bound. */
static inline tnt_result_t peer_silent(const job_health_t *h, int r, double now, const char *what) {
  if (now - h->peer[r].last_heard <= h->silence_s) return TNT_SUCCESS;
  char msg[1024];
  silent_message(h, r, now, what, msg, sizeof msg);
  return failf(TNT_ERR_PEER_LOST, r, "%s", msg);
}

/* Peer r aborted or has shut down: gone, while this rank still needs it. */
static inline tnt_result_t peer_gone(const job_health_t *h, int r, const char *what) {
  const peer_health_t *p = &h->peer[r];
  if (p->state == PEER_FAILED) return peer_aborted(h, r, what);
  if (p->state == PEER_EXITED)
    return failf(TNT_ERR_PEER_LOST, r, "rank %d has shut down while rank %d was %s: every rank must make the same "
                 "collective calls before shutdown", r, h->me, what);
  return TNT_SUCCESS;
}

/* The job-wide failures: a held one, an aborted rank. */
static inline tnt_result_t check_job(const job_health_t *h, const char *what) {
  tnt_result_t res = held_failure(h, what);
  if (res != TNT_SUCCESS) return res;
  for (int r = 0; r < h->n; r++)
    if (r != h->me && h->peer[r].state == PEER_FAILED) return peer_aborted(h, r, what);
  return TNT_SUCCESS;
}

/* Peer r has been seen gone (its pid, its connection), and the plugin has
 * just read what arrived: 1 when r is to be blamed now; else 0 with *res the
 * job's failure that explains it (an abort), or TNT_SUCCESS while r has said
 * goodbye or aborted (peer_gone judges it) or the grace runs. */
static inline int blame_gone(job_health_t *h, int r, double now, const char *what, tnt_result_t *res) {
  *res = check_job(h, what);
  return *res == TNT_SUCCESS && h->peer[r].state == PEER_ALIVE && gone_past_grace(h, r, now);
}

/* A wait for rank `from` (-1: no one rank) ran out of time (takes the lock). */
static inline tnt_result_t timed_out(const job_health_t *h, int from, const char *what) {
  if (from < 0) return failf(TNT_ERR_TIMEOUT, -1, "rank %d timed out %s (TNT_TIMEOUT_S bound reached)", h->me, what);
  char doing[320];
  describe(h, from, doing, sizeof doing);
  return failf(TNT_ERR_TIMEOUT, from, "rank %d timed out %s after TNT_TIMEOUT_S: %s", h->me, what, doing);
}

#endif
