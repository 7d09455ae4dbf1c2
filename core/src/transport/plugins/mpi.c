/* mpi.c - the mpi transport, a plugin (libtnt-transport-mpi.so) that the core
 * loads at run time (transport_plugin.h): it is compiled with the MPI's own
 * compiler wrapper (mpicc), so the core never links against an MPI.
 *
 * Model (transport.h) over two-sided MPI on a private duplicate of
 * MPI_COMM_WORLD (a new one for every tnt_init, never freed: Open MPI would
 * give a freed one's context id to the next, and a message still in flight
 * to it, a peer's BYE, would land there), three tags:
 *   CTRL     small control messages, received in arrival order by a probe loop:
 *            PUT(offset, len[, kind]), NOTIFY(kind), BEAT, BYE, ABORT(root, reason)
 *   PAYLOAD  the bytes of a PUT, received straight into the window at the offset
 *            its PUT announced (the receiver posts the receive when it reads the
 *            PUT; MPI keeps the two streams of one sender in order)
 *   EXCH     the exchange's message, one to every rank, probed per source
 *   AND      one step of the AND-allreduce (the negotiation's bit round):
 *            recursive doubling, log2(N) messages per rank per round
 * A NOTIFY from a sender is applied only after every payload that sender put
 * before it has landed (a per-sender FIFO), which is what "ordered after
 * earlier puts" means. put() sends straight from the caller's buffer and
 * returns at once (interface version 2: fence() waits until the sends to a
 * peer have left); its PUT is held back until the next call for that peer, so
 * that the notify after it travels in the same message, PUT(offset, len, kind).
 * send_buffer() lends a buffer of the plugin's own per peer, so a piece the
 * ring scales on its way out needs no staging copy.
 *
 * No MPI call blocks: every wait polls (MPI_Test / MPI_Improbe) in a loop that
 * drains the control messages, checks the peers and sleeps when idle, 10 us
 * doubling up to 1 ms (spinning first only when every local rank has two cores,
 * as shm does); the doorbell sleeps on a futex that a local request wakes at
 * once, polling MPI every 1 ms at most for a peer's first message of the next
 * cycle (the doorbell: no bell messages). All MPI calls of a
 * process go through one mutex: the engine's progress lock already keeps its
 * threads apart, but wait_doorbell (the idle thread), abort and describe_peer
 * run beside it.
 *
 * Failure: MPI reports no peer failure we could rely on, so
 *   - a rank on this host (same kernel and pid namespace) is checked by pid,
 *     as shm does: a dead peer is named within ~0.1 s;
 *   - every rank sends a BEAT to each peer it sent nothing to for
 *     TNT_MPI_HEARTBEAT_S (default 1 s), from whichever poll loop runs (the idle
 *     doorbell included); a peer silent for 10 heartbeats is lost;
 *   - abort() sends ABORT(reason, root) to every peer, finalize() sends BYE
 *     (a clean shutdown: lost only for a rank that still awaits it).
 *
 * MPI itself: initialized once per process with MPI_THREAD_MULTIPLE (the
 * application may use MPI beside us), unless already initialized (mpi4py),
 * where SERIALIZED is enough for us; finalized at exit only if we initialized
 * it and no failure was seen (a fence with a dead or frozen peer never ends).
 * Placement must agree with MPI's ranks: every rank checks every rank. */
#define _GNU_SOURCE
#include <mpi.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport_plugin.h"
#include "../process_state.h"
#include "wedge_watch.h" /* and peer_health.h, plugin_util.h */

#define EXPORT __attribute__((visibility("default")))

enum { TAG_CTRL = 7301, TAG_PAYLOAD = 7302, TAG_EXCH = 7303, TAG_AND = 7304, TAG_DIRECT = 7305 };
enum { CTRL_PUT = 1, CTRL_NOTIFY, CTRL_BEAT = 4, CTRL_BYE, CTRL_ABORT }; /* 3 was BELL: see the doorbell */

#ifndef BELL_POLL_S
#define BELL_POLL_S 1e-3    /* longest sleep of the idle doorbell between polls of MPI */
#endif
#ifndef YIELD_POLLS
#define YIELD_POLLS 20      /* with a core per local rank: polls that yield before a wait sleeps */
#endif
#ifndef THREAD_LEVEL
#define THREAD_LEVEL MPI_THREAD_MULTIPLE /* what we ask of an MPI we initialize (the application may use it too) */
#endif
#define BYE_WAIT_S 2.0      /* finalize: how long our last messages may take to leave */
#define HELLO_MAGIC 0x544e544du

typedef struct {
  uint32_t type;
  int32_t a;  /* NOTIFY: kind; PUT: the kind it notifies, -1 none; ABORT: root peer */
  uint64_t b; /* PUT: offset */
  uint64_t c; /* PUT: length */
} ctrl_t;
#define CTRL_MAX (sizeof(ctrl_t) + REASON_MAX)

typedef struct {
  MPI_Request req;
  int kind; /* < 0: a payload receive; else a NOTIFY waiting for the payloads before it */
} op_t;

/* A peer as MPI sees it (its health: job_health_t) */
typedef struct {
  op_t *ops; /* FIFO of this sender's payload receives and deferred notifies */
  int head, n, cap;
  uint8_t *exch; /* this round's exchange message from this peer */
  size_t exch_len, exch_cap;
  int exch_got;
  MPI_Request exch_recv; /* its receive, while the bytes are still coming (a large message) */
  /* puts to this peer: sends in flight from the caller's memory (the ranges, so
   * that send_buffer lends no range still being sent), and the PUT held back
   * for the notify that follows it */
  MPI_Request *sends;
  const uint8_t **send_at;
  size_t *send_len;
  int nsends, capsends;
  int held;
  uint64_t held_offset, held_len;
  uint8_t *lent; /* send_buffer's memory for this peer: a window's worth, made on first use */
} peer_t;

/* What every rank tells every rank at set-up. */
typedef struct {
  uint32_t magic, abi;
  int32_t rank, size, local_rank, local_size, from_launcher, pid;
  double heartbeat_s;
  char transport[16]; /* TNT_TRANSPORT as this rank read it (auto, mpi) */
  char host[64];
  char node[96]; /* boot id and pid namespace: equal means "pids are comparable" */
  tnt_cpus_t cpus; /* the CPUs this rank may run on: its host's union counts the waits' cores */
} hello_t;

static const char *hello_node(const void *all, int r) { return ((const hello_t *)all)[r].node; }
static const tnt_cpus_t *hello_cpus(const void *all, int r) { return &((const hello_t *)all)[r].cpus; }

typedef struct {
  tnt_placement_t pl;
  int me, n;
  double timeout_s;
  wait_policy_t waits; /* how a wait polls before it sleeps */
  machine_share_t share; /* the ranks on this machine and the CPUs they may run on (machine_share) */
  wait_counts_t wait_counts;
  MPI_Comm comm;
  pthread_mutex_t mu; /* every MPI call and everything below */
  /* every peer's record (TNT_MPI_HEARTBEAT_S), and a failure seen by progress
   * (which cannot return one), reported by the next wait */
  job_health_t health;
  peer_t *peers;
  uint32_t *counters; /* [kind * n + source] */
  uint8_t *window;
  size_t window_bytes;
  /* control messages in flight: MPI_Testsome wants their requests side by side */
  MPI_Request *sreq;
  uint8_t *sbuf; /* [nslots][CTRL_MAX] */
  int *sfree, *sidx, nslots, nfree;
  int sending;  /* puts in flight, over every peer */
  int receiving; /* receives posted (payloads, large negotiation messages), not yet landed */
  int *tidx;    /* MPI_Testsome's indices, for the largest peer list */
  int tidx_cap;
  /* exchange: two rounds of sends may be in flight */
  uint8_t *exch_out[2];
  size_t exch_out_len[2];
  MPI_Request *exch_req[2];
  uint32_t round;
  _Atomic int posted; /* read by the idle thread's doorbell (mu held) */
  int missing;
  double exch_deadline;
  /* AND-allreduce (recursive doubling): a round is steps 0 (fold in the rank
   * above the largest power of two), 1..log2 P (pairs), log2 P + 1 (hand the
   * result back up); two rounds of sends may be in flight, a buffer per step */
  uint64_t *and_acc, *and_rbuf;   /* [1 + and_cap]: header word (round, step), then the words */
  uint64_t *and_sbuf[2];          /* [and_steps][1 + and_cap] per round parity */
  MPI_Request *and_req[2];        /* [and_steps] per round parity */
  int and_cap, and_nwords, and_steps, and_pow, and_log;
  _Atomic int and_posted;
  int round_wait;            /* ROUND_AND or ROUND_EXCHANGE while a collect waits in a round (round_awaited) */
  int and_step, and_sent, and_partner;
  uint32_t and_round;
  double and_deadline;
  /* a bit round's ride (transport.h's and_post_ride): per round parity,
   * and_steps + 1 buffers of ride_stride bytes, each a whole message
   * [header word | words | tag | ranks | payload at RIDE_AT]: buffer 0 a
   * copy of this rank's payload (made when a step sends it: at most one does,
   * the next adds into buffer k + 1), buffer k + 1 the sum of step k */
  uint8_t *ride_buf[2];
  size_t ride_stride[2];
  const tnt_ride_t *ride; /* of the round in flight; NULL: none */
  const uint8_t *ride_payload; /* this rank's own, the caller's (valid until the collect) */
  int ride_at;            /* the buffer of this rank's running sum (0: its own payload); -1: none */
  uint64_t ride_ranks;
  uint8_t *ride_rbuf;     /* a partner's ride message (ride_rcap bytes) */
  size_t ride_rcap;
  MPI_Request ride_recv;  /* its receive in flight, else MPI_REQUEST_NULL */
  int ride_rcount;
  doorbell_t door; /* woken by a local request (wake_local) */
  double next_beat;
  wedge_watch_t watch; /* ends this process if MPI never returns after a local peer died */
} mpi_t;

/* check_all, the rounds' waits, the doorbell, and the entries gpi2.c has too */
#define PLUGIN_STATE mpi_t
#include "shared_entries.h"

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int mpi_ours;           /* this plugin called MPI_Init_thread */
static pid_t mpi_pid;          /* ... in this process: a fork()ed child's MPI is its parent's */
static int thread_level = -1;  /* what MPI provided */
static _Atomic int job_failed; /* a failure was seen: MPI_Finalize at exit would wait forever */
static char description[256];

/* ---- core services ---- */

#define LOG(level, ...) plugin_log(level, "mpi.c", __LINE__, __VA_ARGS__)

static void plugin_failed(tnt_result_t code) {
  if (code == TNT_ERR_PEER_LOST || code == TNT_ERR_TIMEOUT) atomic_store(&job_failed, 1);
}

static const char *mpi_err(int rc, char *buf) {
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
  return buf;
}

/* ---- control messages ---- */

static tnt_result_t grow_slots(mpi_t *s) {
  int n = s->nslots ? 2 * s->nslots : 64;
  MPI_Request *sreq = realloc(s->sreq, (size_t)n * sizeof *sreq);
  if (sreq) s->sreq = sreq;
  uint8_t *sbuf = realloc(s->sbuf, (size_t)n * CTRL_MAX);
  if (sbuf) s->sbuf = sbuf;
  int *sfree = realloc(s->sfree, (size_t)n * sizeof *sfree);
  if (sfree) s->sfree = sfree;
  int *sidx = realloc(s->sidx, (size_t)n * sizeof *sidx);
  if (sidx) s->sidx = sidx;
  if (!sreq || !sbuf || !sfree || !sidx) return TNT_ERR_SYSTEM;
  for (int i = s->nslots; i < n; i++) {
    s->sreq[i] = MPI_REQUEST_NULL;
    s->sfree[s->nfree++] = i;
  }
  s->nslots = n;
  return TNT_SUCCESS;
}

/* Send a control message (mu held); its buffer lives until MPI is done with
 * it. Returns MPI's code (-1: out of memory): callers that must report a
 * failure name it themselves; progress, the doorbell and shutdown go on. */
static int send_ctrl(mpi_t *s, int peer, uint32_t type, int32_t a, uint64_t b, uint64_t c, const char *text) {
  if (!s->nfree && grow_slots(s) != TNT_SUCCESS) return -1;
  int i = s->sfree[--s->nfree];
  uint8_t *buf = s->sbuf + (size_t)i * CTRL_MAX;
  ctrl_t msg = {type, a, b, c};
  memcpy(buf, &msg, sizeof msg);
  size_t len = sizeof msg;
  if (text) {
    size_t tl = strnlen(text, REASON_MAX - 1);
    memcpy(buf + len, text, tl);
    buf[len + tl] = 0;
    len += tl + 1;
  }
  int rc = MPI_Isend(buf, (int)len, MPI_BYTE, peer, TAG_CTRL, s->comm, &s->sreq[i]);
  if (rc != MPI_SUCCESS) {
    s->sreq[i] = MPI_REQUEST_NULL;
    s->sfree[s->nfree++] = i;
    return rc;
  }
  s->health.peer[peer].last_sent = host->now();
  return MPI_SUCCESS;
}

/* The error of a send_ctrl that failed. */
static tnt_result_t send_failed(mpi_t *s, int peer, int rc) {
  char e[MPI_MAX_ERROR_STRING];
  if (rc < 0) return failf(TNT_ERR_SYSTEM, -1, "out of memory");
  return peer_lost(&s->health, peer, "rank %d could not send to rank %d: %s", s->me, peer, mpi_err(rc, e));
}

/* Forget the puts to peer r that MPI has sent (mu held). */
static void reap_sends(mpi_t *s, int r) {
  peer_t *p = &s->peers[r];
  if (!p->nsends) return;
  if (s->tidx_cap < p->nsends) {
    int *t = realloc(s->tidx, (size_t)p->capsends * sizeof *t);
    if (!t) return; /* tried again at the next poll */
    s->tidx = t;
    s->tidx_cap = p->capsends;
  }
  int outcount = 0;
  int rc = MPI_Testsome(p->nsends, p->sends, &outcount, s->tidx, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    char e[MPI_MAX_ERROR_STRING];
    sticky(&s->health, TNT_ERR_PEER_LOST, r, "rank %d: data could not be sent to rank %d: %s", s->me, r,
           mpi_err(rc, e));
    return;
  }
  if (outcount == MPI_UNDEFINED || outcount == 0) return;
  int k = 0; /* compact: keep the ones still in flight, in order */
  for (int i = 0; i < p->nsends; i++)
    if (p->sends[i] != MPI_REQUEST_NULL) {
      p->sends[k] = p->sends[i];
      p->send_at[k] = p->send_at[i];
      p->send_len[k] = p->send_len[i];
      k++;
    }
  s->sending -= p->nsends - k;
  p->nsends = k;
}

static void reap_puts(mpi_t *s) {
  for (int r = 0; s->sending && r < s->n; r++) reap_sends(s, r);
}

/* Give back the slots of control messages MPI has sent. */
static void reap(mpi_t *s) {
  reap_puts(s);
  if (s->nfree == s->nslots) return;
  int outcount = 0;
  int rc = MPI_Testsome(s->nslots, s->sreq, &outcount, s->sidx, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    char e[MPI_MAX_ERROR_STRING];
    sticky(&s->health, TNT_ERR_SYSTEM, -1, "rank %d: a control message could not be sent: %s", s->me, mpi_err(rc, e));
    return;
  }
  if (outcount == MPI_UNDEFINED) return;
  for (int k = 0; k < outcount; k++) s->sfree[s->nfree++] = s->sidx[k];
}

static op_t *push_op(mpi_t *s, peer_t *p) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    op_t *ops = malloc((size_t)cap * sizeof *ops);
    if (!ops) return NULL;
    for (int k = 0; k < p->n; k++) ops[k] = p->ops[(p->head + k) % p->cap];
    free(p->ops);
    p->ops = ops;
    p->head = 0;
    p->cap = cap;
  }
  op_t *op = &p->ops[(p->head + p->n) % p->cap];
  p->n++;
  return op;
}

/* A notification from src: counted at once, or after the payloads before it. */
static void notify_from(mpi_t *s, int src, int kind) {
  peer_t *p = &s->peers[src];
  if (kind < 0 || kind >= TNT_NOTIFY_KINDS) {
    sticky(&s->health, TNT_ERR_INTERNAL, src, "rank %d sent a notification of unknown kind %d", src, kind);
    return;
  }
  if (p->n == 0) {
    s->counters[kind * s->n + src]++;
    return;
  }
  op_t *op = push_op(s, p);
  if (!op) {
    sticky(&s->health, TNT_ERR_SYSTEM, -1, "out of memory");
    return;
  }
  op->kind = kind;
  op->req = MPI_REQUEST_NULL;
}

static void handle_ctrl(mpi_t *s, int src, const uint8_t *buf, int len, double now) {
  peer_t *p = &s->peers[src];
  peer_health_t *h = &s->health.peer[src];
  h->last_heard = now;
  ctrl_t c;
  memcpy(&c, buf, sizeof c);
  switch (c.type) {
    case CTRL_PUT: {
      if (c.c > INT_MAX || c.b > s->window_bytes || c.c > s->window_bytes - c.b) {
        sticky(&s->health, TNT_ERR_INTERNAL, src, "rank %d put %llu bytes at offset %llu into a window of %zu bytes",
               src, (unsigned long long)c.c, (unsigned long long)c.b, s->window_bytes);
        return;
      }
      op_t *op = push_op(s, p);
      if (!op) {
        sticky(&s->health, TNT_ERR_SYSTEM, -1, "out of memory");
        return;
      }
      op->kind = -1;
      int rc = MPI_Irecv(s->window + c.b, (int)c.c, MPI_BYTE, src, TAG_PAYLOAD, s->comm, &op->req);
      if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        op->req = MPI_REQUEST_NULL;
        sticky(&s->health, TNT_ERR_PEER_LOST, src, "rank %d could not receive from rank %d: %s", s->me, src,
               mpi_err(rc, e));
        return;
      }
      s->receiving++;
      if (c.a >= 0) notify_from(s, src, c.a); /* the notify that rode with it */
      break;
    }
    case CTRL_NOTIFY: notify_from(s, src, c.a); break;
    case CTRL_BEAT: break;
    case CTRL_BYE:
      if (h->state == PEER_ALIVE) h->state = PEER_EXITED;
      break;
    case CTRL_ABORT: {
      h->state = PEER_FAILED;
      h->root = c.a;
      int tl = len - (int)sizeof c;
      snprintf(h->reason, sizeof h->reason, "%.*s", tl > 0 ? tl : 0, (const char *)buf + sizeof c);
      bump_bell(s); /* an idle engine looks at its peers sooner */
      break;
    }
    default: sticky(&s->health, TNT_ERR_INTERNAL, src, "rank %d sent an unknown control message %u", src, c.type);
  }
}

/* Land what has arrived: payloads in order, then the notifies behind them. */
static void drain(mpi_t *s, int r) {
  peer_t *p = &s->peers[r];
  while (p->n) {
    op_t *op = &p->ops[p->head];
    if (op->kind < 0) {
      int done = 0;
      int rc = MPI_Test(&op->req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        sticky(&s->health, TNT_ERR_PEER_LOST, r, "rank %d lost data from rank %d: %s", s->me, r, mpi_err(rc, e));
        return;
      }
      if (!done) return;
      s->receiving--;
    } else {
      s->counters[op->kind * s->n + r]++;
    }
    p->head = (p->head + 1) % p->cap;
    p->n--;
  }
}

/* One round of progress (mu held): receive control messages, land payloads,
 * send heartbeats that are due. */
static void progress(mpi_t *s) {
  double now = host->now();
  for (int k = 0; k < 4096; k++) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    int rc = MPI_Improbe(MPI_ANY_SOURCE, TAG_CTRL, s->comm, &flag, &msg, &st);
    if (rc != MPI_SUCCESS) {
      char e[MPI_MAX_ERROR_STRING];
      sticky(&s->health, TNT_ERR_SYSTEM, -1, "rank %d: MPI_Improbe failed: %s", s->me, mpi_err(rc, e));
      break;
    }
    if (!flag) break;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    union {
      ctrl_t c;
      uint8_t b[CTRL_MAX];
    } buf;
    if (count < (int)sizeof(ctrl_t) || count > (int)CTRL_MAX) {
      uint8_t *junk = malloc(count > 0 ? (size_t)count : 1);
      MPI_Mrecv(junk, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      free(junk);
      sticky(&s->health, TNT_ERR_INTERNAL, st.MPI_SOURCE, "rank %d sent a control message of %d bytes: is every rank "
             "running the same release of Tarantella?", st.MPI_SOURCE, count);
      continue;
    }
    rc = MPI_Mrecv(buf.b, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char e[MPI_MAX_ERROR_STRING];
      sticky(&s->health, TNT_ERR_PEER_LOST, st.MPI_SOURCE, "rank %d could not receive from rank %d: %s", s->me,
             st.MPI_SOURCE, mpi_err(rc, e));
      break;
    }
    handle_ctrl(s, st.MPI_SOURCE, buf.b, count, now);
  }
  for (int r = 0; r < s->n; r++)
    if (s->peers[r].n) drain(s, r);
  reap(s);
  if (now >= s->next_beat) {
    for (int r = 0; r < s->n; r++) {
      const peer_health_t *p = &s->health.peer[r];
      if (r != s->me && p->state == PEER_ALIVE && now - p->last_sent >= s->health.beat_s)
        send_ctrl(s, r, CTRL_BEAT, 0, 0, 0, NULL);
    }
    s->next_beat = now + s->health.beat_s / 4;
  }
}

/* ---- peers' health (mu held): peer_health.h's checks ---- */

/* Has local peer r died? (a system call) */
static tnt_result_t check_died(mpi_t *s, int r, double now, const char *what) {
  if (s->health.peer[r].state != PEER_ALIVE || !peer_pid_gone(&s->health, r)) return TNT_SUCCESS;
  progress(s); /* what it, or the rank it named, sent before it exited */
  tnt_result_t res;
  return blame_gone(&s->health, r, now, what, &res) ? peer_died(&s->health, r, what) : res;
}

/* Is peer r alive? Dead local pids only when `pids`; silence always. */
static tnt_result_t check_alive(mpi_t *s, int r, double now, int pids, const char *what) {
  if (s->health.peer[r].state != PEER_ALIVE) return TNT_SUCCESS;
  if (pids && peer_pid_gone(&s->health, r)) return check_died(s, r, now, what);
  return peer_silent(&s->health, r, now, what);
}

static tnt_result_t check_gone(mpi_t *s, int r, const char *what) {
  /* a BYE overtakes the payloads still landing from that rank (it sent them all
   * before it): not gone until they and the notifications behind them are in */
  if (s->health.peer[r].state == PEER_EXITED && s->peers[r].n) return TNT_SUCCESS;
  return peer_gone(&s->health, r, what);
}

/* ---- waiting ---- */

/* Poll until ready(), a failure, or `deadline` (then TNT_ERR_TIMEOUT, with no
 * message: the caller names what it waited for). `from` is the rank that must
 * act (-1: any rank): it is checked in full, the others for aborts and, on
 * this host, death. */
static tnt_result_t poll_until(mpi_t *s, ready_fn ready, void *arg, int from, double deadline, const char *what) {
  backoff_t b = {0};
  double next_pids = host->now() + PID_CHECK_S;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    progress(s);
    int ok = ready(s, arg);
    int moving = s->sending || s->receiving;
    tnt_result_t res = TNT_SUCCESS;
    double now = host->now();
    if (!ok) {
      int pids = now >= next_pids;
      if (pids) next_pids = now + PID_CHECK_S;
      if (from >= 0) {
        res = check_alive(s, from, now, pids, what);
        /* a rank on this host that died ends the job whoever this wait is for: named
         * now, not when `from` fails because of it (or, stuck inside MPI by that
         * death, is ended by its wedge watch and taken for the culprit) */
        for (int r = 0; pids && res == TNT_SUCCESS && r < s->n; r++)
          if (r != s->me && r != from) res = check_died(s, r, now, what);
        if (res == TNT_SUCCESS) res = check_job(&s->health, what);
        if (res == TNT_SUCCESS) res = check_gone(s, from, what);
      } else {
        uint8_t mask[s->n];
        res = check_all(s, round_awaited(s, mask), pids, what);
      }
    }
    pthread_mutex_unlock(&s->mu);
    if (ok || res != TNT_SUCCESS || now >= deadline) {
      backoff_end(&b, &s->wait_counts);
      return ok ? TNT_SUCCESS : res != TNT_SUCCESS ? res : TNT_ERR_TIMEOUT;
    }
    if (moving && host_has_free_cores(now)) {
      /* bytes on the wire: MPI over TCP moves them only while we call into it,
       * and a growing sleep throttles the stream; poll again after a yield (a
       * spinner under the host-wide budget: yielding threads count as running,
       * so oversubscribed ranks fall back to sleeping by themselves) */
      sched_yield();
      b.idle = 0; /* the backoff starts afresh once the data has landed */
      b.stage = 2;
    } else {
      backoff_pause(&b, &s->waits, now);
    }
  }
}

/* A request of set-up, before the state exists. */
static tnt_result_t wait_setup(MPI_Request *req, double deadline) {
  double sleep = SLEEP_MIN_S;
  for (;;) {
    int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return TNT_ERR_SYSTEM;
    if (done) return TNT_SUCCESS;
    if (host->now() >= deadline) return TNT_ERR_TIMEOUT;
    sleep_s(sleep);
    sleep = sleep * 2 > SLEEP_MAX_S ? SLEEP_MAX_S : sleep * 2;
  }
}

/* ---- MPI itself, once per process ---- */

static const char *level_name(int level) {
  return level == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
         : level == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
         : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
         : level == MPI_THREAD_MULTIPLE   ? "MPI_THREAD_MULTIPLE"
                                          : "unknown";
}

/* Run by exit() with the process's exit status (glibc's on_exit; elsewhere
 * atexit, and the status is taken as 0). */
static void finalize_at_exit(int status, void *arg) {
  (void)arg;
  /* A fork()ed child that exits normally runs its parent's atexit handlers:
   * MPI_Finalize there crashed in Open MPI's shared-memory transport and, over
   * TCP, wrote on the parent's connections, and the parent's job lost its
   * peers (a rank's data loader forking, on 2 hosts x 2 ranks) */
  if (getpid() != mpi_pid) return;
  int ini = 0, fin = 0;
  MPI_Initialized(&ini);
  MPI_Finalized(&fin);
  if (!ini || fin) return;
  if (atomic_load(&job_failed)) {
    /* MPI_Finalize waits for every process: a dead or frozen one never comes */
    LOG(LOG_INFO, "mpi: not calling MPI_Finalize at exit: the job failed");
    return;
  }
  if (status != 0) {
    /* This rank fails (sys.exit(3), an uncaught exception): MPI_Finalize would
     * wait in Open MPI's fence for the others, which, told that it had shut
     * down, failed in turn without finalizing; mpirun then killed it and
     * reported their exit 1 as the job's, never its 3. Ending now, mpirun sees
     * this rank's own status first, as the shm transport's launcher does. */
    LOG(LOG_INFO, "mpi: not calling MPI_Finalize at exit: this rank exits with status %d", status);
    return;
  }
  MPI_Finalize();
}

#ifndef __GLIBC__
static void finalize_at_exit_status_unknown(void) { finalize_at_exit(0, NULL); }
#endif

/* Open MPI's TCP transport sends a message above btl_tcp_eager_limit (64 KiB
 * by default, its header included) by rendezvous: a round trip before the
 * bytes move. A negotiation message that carries a 64 KiB one-round payload
 * (TNT_ONE_ROUND_NET_BYTES) is just above it; under a limit of 72 KiB it
 * leaves at once (the header and the readiness bits fit in the rest, and the
 * announcements of a new name but rarely go beyond): a 64 KB allreduce on 2
 * hosts x 1 rank took 0.14 ms, and 0.10 with it (docs/benchmarks.md, "Across
 * hosts"). Not more: a ring's piece of 128 KiB sent eagerly lands before its
 * receive is posted and is copied twice. Set only where this plugin
 * initializes MPI, only for Open MPI, and never over the user's value (mpirun
 * --mca passes it the same way, as OMPI_MCA_btl_tcp_eager_limit). */
#define OMPI_EAGER_VAR "OMPI_MCA_btl_tcp_eager_limit"
#define OMPI_EAGER_BYTES "73728"

static void tune_open_mpi(void) {
#ifdef OPEN_MPI
  const char *set = getenv(OMPI_EAGER_VAR);
  if (set) {
    LOG(LOG_DEBUG, "mpi: %s=%s, as the environment sets it", OMPI_EAGER_VAR, set);
    return;
  }
  if (setenv(OMPI_EAGER_VAR, OMPI_EAGER_BYTES, 0) == 0)
    LOG(LOG_INFO, "mpi: %s=%s (messages of a one-round collective go without a rendezvous; set it to choose "
        "another)", OMPI_EAGER_VAR, OMPI_EAGER_BYTES);
#endif
}

/* MPI_Init_thread waits in Open MPI's start-up fence for every process of the
 * job, with no time limit of its own: a rank that ended before it called
 * tnt.init() (its program finished or failed early, with an exit status of 0
 * that mpirun accepts) left the others there for ever, where on one host they
 * end with a TimeoutError after TNT_TIMEOUT_S. A thread watches the call: if it
 * has not returned by then, it says so and ends this process, so that the job
 * ends and its launcher names this rank with the reason. */
#define INIT_STUCK_EXIT_CODE 1 /* as a rank that raised its TimeoutError */

typedef struct {
  _Atomic uint32_t done; /* 1: MPI_Init_thread returned; the thread sleeps on it (futex) */
  double timeout_s;
  int rank;
} init_watch_t;

static void *init_watch_main(void *arg) {
  init_watch_t *w = arg;
  const double until = host->now() + w->timeout_s;
  for (double left = w->timeout_s; !atomic_load(&w->done) && left > 0; left = until - host->now()) {
    struct timespec ts = timespec_of(left);
    futex(&w->done, FUTEX_WAIT, 0, &ts);
  }
  if (atomic_load(&w->done)) return NULL;
  plugin_log(LOG_ERROR, "mpi.c", __LINE__,
             "TimeoutError: rank %d waited %.0f s (TNT_TIMEOUT_S) in MPI_Init for the other processes of the MPI job: "
             "one never came (a rank that ended before it called tnt.init(), or one that was never started), and "
             "MPI would wait for it for ever. This process ends now with exit code %d, so that the job does not hang",
             w->rank, w->timeout_s, INIT_STUCK_EXIT_CODE);
  _exit(INIT_STUCK_EXIT_CODE);
  return NULL;
}

/* MPI_Init_thread, ended by init_watch_main after `timeout_s`. */
static int init_thread_watched(double timeout_s, int rank, int *provided) {
  init_watch_t w = {0, timeout_s, rank};
  pthread_t thread;
  const int watched = pthread_create(&thread, NULL, init_watch_main, &w) == 0;
  if (!watched) LOG(LOG_WARNING, "mpi: no thread to watch MPI_Init: it may wait for ever for a rank that never comes");
  int rc = MPI_Init_thread(NULL, NULL, THREAD_LEVEL, provided);
  if (watched) {
    atomic_store(&w.done, 1);
    futex(&w.done, FUTEX_WAKE, INT_MAX, NULL);
    pthread_join(thread, NULL);
  }
  return rc;
}

static tnt_result_t ensure_mpi(double timeout_s, int rank) {
  pthread_mutex_lock(&init_mu);
  tnt_result_t res = TNT_SUCCESS;
  int ini = 0, fin = 0;
  MPI_Finalized(&fin);
  if (fin) {
    res = failf(TNT_ERR_INVALID_USAGE, -1, "MPI was already finalized in this process (MPI_Finalize, or mpi4py at "
                "exit) and cannot start again: keep MPI initialized while Tarantella runs");
    goto out;
  }
  MPI_Initialized(&ini);
  if (!ini) {
    tune_open_mpi();
    int rc = init_thread_watched(timeout_s, rank, &thread_level);
    if (rc != MPI_SUCCESS) {
      char e[MPI_MAX_ERROR_STRING];
      res = failf(TNT_ERR_SYSTEM, -1, "MPI_Init_thread failed: %s", mpi_err(rc, e));
      goto out;
    }
    mpi_ours = 1;
    mpi_pid = getpid();
#ifdef __GLIBC__
    on_exit(finalize_at_exit, NULL);
#else
    atexit(finalize_at_exit_status_unknown);
#endif
    LOG(LOG_INFO, "mpi: MPI initialized, thread level %s", level_name(thread_level));
  } else {
    MPI_Query_thread(&thread_level);
  }
  if (thread_level < MPI_THREAD_SERIALIZED) {
    res = failf(TNT_ERR_INVALID_USAGE, -1,
                "MPI was initialized %swith thread level %s, but the mpi transport calls MPI from Tarantella's "
                "background thread and needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (mpi4py asks for MULTIPLE "
                "unless mpi4py.rc.thread_level says otherwise)",
                mpi_ours ? "" : "by the application ", level_name(thread_level));
    goto out;
  }
  if (thread_level < MPI_THREAD_MULTIPLE)
    LOG(LOG_WARNING, "mpi: MPI provides %s only: the application must not call MPI while Tarantella has collectives "
        "in flight", level_name(thread_level));
out:
  pthread_mutex_unlock(&init_mu);
  return res;
}

/* ---- set-up ---- */

static void free_state(mpi_t *s) {
  if (!s) return;
  wedge_watch_stop(&s->watch); /* it watched finalize's last calls into MPI too */
  for (int r = 0; s->peers && r < s->n; r++) {
    peer_t *p = &s->peers[r];
    free(p->ops);
    /* a receive still in flight after a failure (0: set-up failed before this peer): MPI may still write there */
    if (p->exch_recv != MPI_REQUEST_NULL && p->exch_recv) {
      int fin = 1;
      MPI_Finalized(&fin);
      if (!fin) MPI_Request_free(&p->exch_recv);
      p->exch = NULL; /* left to MPI, not freed */
    }
    free(p->exch);
    free(p->sends);
    free(p->send_at);
    free(p->send_len);
    free(p->lent);
  }
  free(s->peers);
  free(s->health.peer);
  free(s->counters);
  free(s->window);
  free(s->sreq);
  free(s->sbuf);
  free(s->sfree);
  free(s->sidx);
  free(s->tidx);
  for (int b = 0; b < 2; b++) {
    free(s->exch_out[b]);
    free(s->exch_req[b]);
    free(s->and_sbuf[b]);
    free(s->and_req[b]);
  }
  free(s->and_acc);
  free(s->and_rbuf);
  for (int b = 0; b < 2; b++) free(s->ride_buf[b]);
  free(s->ride_rbuf);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Every rank checks every rank's placement against MPI's, so that all of
 * them fail with the same message. */
static tnt_result_t check_hellos(const tnt_placement_t *pl, const char *transport, const hello_t *all, int msize,
                                 double beat) {
  if (msize != pl->size) {
    if (msize == 1 && pl->from_launcher && pl->local_size < pl->size && !strcmp(transport, "auto"))
      /* by hand: TNT_LOCAL_SIZE alone sent auto to mpi, and no MPI launcher started the ranks;
       * most likely they are all on this host and the local size is wrong */
      return failf(TNT_ERR_INVALID_USAGE, -1,
                   "TNT_LOCAL_SIZE=%d with TNT_SIZE=%d puts this rank on a host with %d of the job's %d ranks, the others "
                   "on other hosts, which TNT_TRANSPORT=auto reaches over MPI; but MPI sees only this process "
                   "(MPI_COMM_WORLD has 1 process: no MPI launcher started the job). If every rank is on this host, "
                   "give each TNT_LOCAL_SIZE=%d and its own TNT_LOCAL_RANK (0 to %d), or leave both unset; ranks on "
                   "several hosts need an MPI launcher (tntrun --hostfile, or mpirun/srun without TNT_RANK and "
                   "TNT_SIZE). Received: TNT_LOCAL_SIZE=%d, TNT_SIZE=%d",
                   pl->local_size, pl->size, pl->local_size, pl->size, pl->size, pl->size - 1, pl->local_size,
                   pl->size);
    if (msize == 1)
      return failf(TNT_ERR_INVALID_USAGE, -1,
                   "the mpi transport needs ranks started by an MPI launcher, but MPI sees only this process "
                   "(MPI_COMM_WORLD has 1 process) while the job has %d ranks: start it with `mpirun -np %d` (or "
                   "srun), not tntrun -n, or use TNT_TRANSPORT=shm on one host",
                   pl->size, pl->size);
    return failf(TNT_ERR_INVALID_USAGE, -1,
                 "MPI_COMM_WORLD has %d processes but the environment says the job has %d ranks (%s): under mpirun "
                 "or srun leave TNT_RANK/TNT_SIZE unset, so that the placement comes from the launcher's own "
                 "variables (OMPI_COMM_WORLD_*, PMI_*, SLURM_*)",
                 msize, pl->size, pl->from_launcher ? "TNT_SIZE" : "the launcher's variables");
  }
  for (int q = 0; q < msize; q++) {
    const hello_t *h = &all[q];
    if (h->magic != HELLO_MAGIC || h->abi != TNT_PLUGIN_ABI_VERSION)
      return failf(TNT_ERR_INVALID_USAGE, -1, "process %d of MPI_COMM_WORLD runs another release of Tarantella's "
                   "mpi transport (plugin ABI %u, here %d): give every rank the same installation",
                   q, h->abi, TNT_PLUGIN_ABI_VERSION);
    if (h->rank != q || h->size != msize)
      return failf(TNT_ERR_INVALID_USAGE, -1,
                   "the placement disagrees with MPI: process %d of MPI_COMM_WORLD (%d processes; pid %d on %s) is "
                   "rank %d of %d by its environment (%s). Under mpirun or srun leave TNT_RANK and TNT_SIZE unset so "
                   "that the placement comes from the launcher (OMPI_COMM_WORLD_*, PMI_*, SLURM_*), or give each "
                   "process MPI's rank and size",
                   q, msize, h->pid, h->host, h->rank, h->size,
                   h->from_launcher ? "TNT_RANK/TNT_SIZE" : "the launcher's variables");
    /* The first exchange of every rank over MPI, whatever it selected: a rank of
     * shm+mpi (auto) goes on to discover the hosts, one of mpi to its own
     * set-up, so that their next exchanges no longer pair up. mpirun gives
     * ranks it starts through ssh only the variables -x names: TNT_TRANSPORT=mpi
     * set before a bare mpirun reaches this host's ranks, not the others'. */
    if (strncmp(h->transport, all[0].transport, sizeof h->transport))
      return failf(TNT_ERR_INVALID_USAGE, -1, "the ranks disagree on TNT_TRANSPORT (rank 0 on %s: %s, rank %d on %s: "
                   "%s): give every rank the same environment (tntrun does; a bare mpirun passes a variable to the "
                   "ranks of other hosts only with -x NAME)",
                   all[0].host, all[0].transport, q, h->host, h->transport);
    if (h->heartbeat_s != beat)
      return failf(TNT_ERR_INVALID_USAGE, -1, "the ranks disagree on TNT_MPI_HEARTBEAT_S (rank 0: %g, rank %d: %g): "
                   "give every rank the same environment", all[0].heartbeat_s, q, h->heartbeat_s);
  }
  return TNT_SUCCESS;
}

static tnt_result_t mpi_init(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes, void **state) {
  double beat;
  tnt_result_t res = read_seconds("TNT_MPI_HEARTBEAT_S", 1.0, 0.01, 60,
                                  "seconds between the mpi transport's heartbeats; 10 missed ones mean a peer is lost",
                                  &beat);
  if (res != TNT_SUCCESS) return res;
  if ((res = ensure_mpi(params->timeout_s, pl->rank)) != TNT_SUCCESS) return res;
  double deadline = host->now() + params->timeout_s;
  char e[MPI_MAX_ERROR_STRING];

  /* a private communicator: the application's own MPI traffic never matches ours */
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req;
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req);
  if (rc != MPI_SUCCESS) return failf(TNT_ERR_SYSTEM, -1, "MPI_Comm_idup failed: %s", mpi_err(rc, e));
  res = wait_setup(&req, deadline);
  if (res == TNT_ERR_TIMEOUT)
    return failf(TNT_ERR_TIMEOUT, -1, "rank %d waited %.0f s (TNT_TIMEOUT_S) for the other processes of "
                 "MPI_COMM_WORLD to start Tarantella's mpi transport: every process of the MPI job must call tnt.init()",
                 pl->rank, params->timeout_s);
  if (res != TNT_SUCCESS) return failf(TNT_ERR_SYSTEM, -1, "MPI_Comm_idup failed");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int mrank = 0, msize = 0;
  MPI_Comm_rank(comm, &mrank);
  MPI_Comm_size(comm, &msize);

  hello_t mine;
  memset(&mine, 0, sizeof mine);
  mine.magic = HELLO_MAGIC;
  mine.abi = TNT_PLUGIN_ABI_VERSION;
  mine.rank = pl->rank;
  mine.size = pl->size;
  mine.local_rank = pl->local_rank;
  mine.local_size = pl->local_size;
  mine.from_launcher = pl->from_launcher;
  mine.pid = (int32_t)getpid();
  mine.heartbeat_s = beat;
  snprintf(mine.transport, sizeof mine.transport, "%s", params->transport);
  gethostname(mine.host, sizeof mine.host - 1);
  node_id(mine.node, sizeof mine.node);
  tnt_cpus_mine(&mine.cpus);
  hello_t *all = calloc((size_t)msize, sizeof *all);
  mpi_t *s = calloc(1, sizeof *s);
  if (!all || !s) {
    free(all);
    free(s);
    MPI_Comm_free(&comm);
    return failf(TNT_ERR_SYSTEM, -1, "out of memory");
  }
  pthread_mutex_init(&s->mu, NULL);
  s->ride_recv = MPI_REQUEST_NULL;
  s->ride_at = -1;
  rc = MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, comm, &req);
  res = rc == MPI_SUCCESS ? wait_setup(&req, deadline) : TNT_ERR_SYSTEM;
  if (res == TNT_ERR_TIMEOUT)
    res = failf(TNT_ERR_TIMEOUT, -1, "rank %d waited %.0f s (TNT_TIMEOUT_S) for the other processes of MPI_COMM_WORLD "
                "to introduce themselves", pl->rank, params->timeout_s);
  else if (res != TNT_SUCCESS)
    res = failf(TNT_ERR_SYSTEM, -1, "MPI_Iallgather of the set-up records failed");
  if (res == TNT_SUCCESS) res = check_hellos(pl, params->transport, all, msize, beat);
  if (res != TNT_SUCCESS) goto fail;

  s->pl = *pl;
  s->me = mrank;
  s->n = msize;
  s->comm = comm;
  s->timeout_s = params->timeout_s;
  s->share = machine_share(msize, mrank, hello_node, hello_cpus, all);
  s->waits = wait_policy(params, s->share, YIELD_POLLS);
  s->health = (job_health_t){.me = mrank, .n = msize, .beat_s = beat, .silence_s = SILENT_BEATS * beat,
                              .beat_var = "TNT_MPI_HEARTBEAT_S", .mu = &s->mu};
  s->window_bytes = window_bytes;
  s->peers = calloc((size_t)msize, sizeof *s->peers);
  s->health.peer = calloc((size_t)msize, sizeof *s->health.peer);
  s->counters = calloc((size_t)msize * TNT_NOTIFY_KINDS, sizeof *s->counters);
  if (posix_memalign((void **)&s->window, 4096, window_bytes ? window_bytes : 1)) s->window = NULL;
  for (int b = 0; b < 2; b++) {
    s->exch_out[b] = malloc(TNT_EXCHANGE_MAX);
    s->exch_req[b] = malloc((size_t)msize * sizeof(MPI_Request));
    for (int r = 0; s->exch_req[b] && r < msize; r++) s->exch_req[b][r] = MPI_REQUEST_NULL;
  }
  if (!s->peers || !s->health.peer || !s->counters || !s->window || !s->exch_out[0] || !s->exch_out[1] ||
      !s->exch_req[0] || !s->exch_req[1] || grow_slots(s) != TNT_SUCCESS) {
    res = failf(TNT_ERR_SYSTEM, -1, "out of memory for the mpi transport (window of %zu bytes, %d ranks)", window_bytes,
                msize);
    goto fail;
  }
  double now = host->now();
  int local_rank = 0, local_size = 0;
  for (int r = 0; r < msize; r++) {
    peer_health_t *p = &s->health.peer[r];
    s->peers[r].exch_recv = MPI_REQUEST_NULL;
    p->root = -1;
    p->pid = all[r].pid;
    p->local = node_ids_match(all[r].node, mine.node);
    snprintf(p->host, sizeof p->host, "%s", all[r].host);
    p->last_heard = p->last_sent = now;
    /* a host is a host name, as for launchers (pids may be comparable across
     * hosts that share a kernel: the namespaces of a test bed) */
    if (!strcmp(all[r].host, mine.host)) {
      local_size++;
      if (r < mrank) local_rank++;
    }
  }
  if (local_rank != pl->local_rank || local_size != pl->local_size)
    LOG(LOG_WARNING, "mpi: rank %d is local rank %d of %d by its environment, but %d of %d by the host names ranks "
        "report",
        pl->rank, pl->local_rank, pl->local_size, local_rank, local_size);
  s->next_beat = now + beat / 4;
  free(all);
  if (!wedge_watch_start(&s->watch, &s->health, "MPI"))
    LOG(LOG_WARNING, "mpi: the thread that ends a process stuck inside MPI after a peer died could not start: "
        "such a rank would hang");
  *state = s;
  LOG(LOG_INFO, "mpi: %d ranks, %d on this host; %d on this machine on %ld cores (the CPUs they may run on, of %ld "
      "online), window %zu bytes, heartbeat %g s, %s", msize, local_size, s->share.ranks, s->share.cores,
      tnt_online_cpus(), window_bytes, beat, description);
  return TNT_SUCCESS;
fail:
  free(all);
  free_state(s);
  MPI_Comm_free(&comm);
  return res;
}

static int mpi_can_serve(const tnt_placement_t *pl) { return pl->size >= 1; }

/* ---- data ---- */

static void *mpi_window(void *st) { return ((mpi_t *)st)->window; }

/* Send the PUT held back for peer r, with no notify (mu held). */
static int flush_held(mpi_t *s, int r) {
  peer_t *p = &s->peers[r];
  if (!p->held) return MPI_SUCCESS;
  p->held = 0;
  return send_ctrl(s, r, CTRL_PUT, -1, p->held_offset, p->held_len, NULL);
}

static int grow_sends(peer_t *p) {
  int cap = p->capsends ? 2 * p->capsends : 16;
  MPI_Request *sends = realloc(p->sends, (size_t)cap * sizeof *sends);
  if (sends) p->sends = sends;
  const uint8_t **at = realloc(p->send_at, (size_t)cap * sizeof *at);
  if (at) p->send_at = at;
  size_t *len = realloc(p->send_len, (size_t)cap * sizeof *len);
  if (len) p->send_len = len;
  if (!sends || !at || !len) return -1;
  p->capsends = cap;
  return 0;
}

/* The payload goes now, from the caller's memory (no copy: fence() says when
 * it has left); its PUT waits for the notify that follows, so that one control
 * message carries both. MPI keeps a sender's payloads in order, and the
 * receiver posts their receives in the order of the PUTs. */
static tnt_result_t mpi_put(void *st, int peer, size_t offset, const void *src, size_t len) {
  mpi_t *s = st;
  if (!len) return TNT_SUCCESS;
  if (len > INT_MAX) return failf(TNT_ERR_INTERNAL, -1, "a put of %zu bytes is too large for MPI", len);
  peer_t *p = &s->peers[peer];
  pthread_mutex_lock(&s->mu);
  int rc = flush_held(s, peer);
  if (rc == MPI_SUCCESS && p->nsends == p->capsends && grow_sends(p)) rc = -1;
  if (rc == MPI_SUCCESS) rc = MPI_Isend(src, (int)len, MPI_BYTE, peer, TAG_PAYLOAD, s->comm, &p->sends[p->nsends]);
  if (rc == MPI_SUCCESS) {
    p->send_at[p->nsends] = src;
    p->send_len[p->nsends++] = len;
    s->sending++;
    p->held = 1;
    p->held_offset = offset;
    p->held_len = len;
    s->health.peer[peer].last_sent = host->now();
  }
  tnt_result_t res = rc == MPI_SUCCESS ? TNT_SUCCESS : send_failed(s, peer, rc);
  pthread_mutex_unlock(&s->mu);
  return res;
}

static int sent_to(mpi_t *s, void *arg) {
  int r = *(int *)arg;
  if (r >= 0) return s->peers[r].nsends == 0;
  return s->sending == 0;
}

/* Cancel the sends to `peer` (-1: every peer) still in flight (mu held): after
 * a failure the caller's memory is no longer ours to read. */
static void cancel_sends(mpi_t *s, int peer) {
  for (int r = 0; r < s->n; r++) {
    peer_t *p = &s->peers[r];
    if (peer >= 0 && r != peer) continue;
    for (int i = 0; i < p->nsends; i++)
      if (p->sends[i] != MPI_REQUEST_NULL) {
        MPI_Cancel(&p->sends[i]);
        MPI_Request_free(&p->sends[i]);
      }
    s->sending -= p->nsends;
    p->nsends = 0;
  }
}

static tnt_result_t mpi_fence(void *st, int peer, double deadline) {
  mpi_t *s = st;
  pthread_mutex_lock(&s->mu);
  int rc = MPI_SUCCESS, bad = -1;
  for (int r = 0; r < s->n && rc == MPI_SUCCESS; r++)
    if (peer < 0 || r == peer) rc = flush_held(s, bad = r);
  int done = sent_to(s, &peer);
  pthread_mutex_unlock(&s->mu);
  if (rc != MPI_SUCCESS) return send_failed(s, bad, rc);
  if (done) return TNT_SUCCESS;
  char what[64] = "sending data";
  if (peer >= 0) snprintf(what, sizeof what, "sending data to rank %d", peer);
  tnt_result_t res = poll_until(s, sent_to, &peer, peer, deadline, what);
  if (res == TNT_ERR_TIMEOUT) res = timed_out(&s->health, peer, what);
  if (res != TNT_SUCCESS) {
    pthread_mutex_lock(&s->mu);
    cancel_sends(s, peer);
    pthread_mutex_unlock(&s->mu);
  }
  return res;
}

/* A window's worth of memory per peer, lent at the offset the piece goes to:
 * the ring reuses an offset only after the peer has consumed the piece there,
 * so its send has normally completed; one still in flight over the range
 * (tested once, never waited for) makes the ring stage the piece itself. */
static void *mpi_send_buffer(void *st, int peer, size_t offset, size_t len) {
  mpi_t *s = st;
  if (offset > s->window_bytes || len > s->window_bytes - offset) return NULL;
  peer_t *p = &s->peers[peer];
  void *out = NULL;
  pthread_mutex_lock(&s->mu);
  if (!p->lent) p->lent = malloc(s->window_bytes);
  if (p->lent) {
    reap_sends(s, peer);
    const uint8_t *a = p->lent + offset, *b = a + len;
    int busy = 0;
    for (int i = 0; i < p->nsends && !busy; i++)
      busy = p->send_at[i] < b && p->send_at[i] + p->send_len[i] > a;
    if (!busy) out = p->lent + offset;
  }
  pthread_mutex_unlock(&s->mu);
  return out;
}

static tnt_result_t mpi_notify(void *st, int peer, int kind) {
  mpi_t *s = st;
  peer_t *p = &s->peers[peer];
  pthread_mutex_lock(&s->mu);
  int rc;
  if (p->held) { /* the put it announces: one message */
    p->held = 0;
    rc = send_ctrl(s, peer, CTRL_PUT, kind, p->held_offset, p->held_len, NULL);
  } else {
    rc = send_ctrl(s, peer, CTRL_NOTIFY, kind, 0, 0, NULL);
  }
  pthread_mutex_unlock(&s->mu);
  return rc == MPI_SUCCESS ? TNT_SUCCESS : send_failed(s, peer, rc);
}

typedef struct {
  uint32_t *counter;
  uint32_t target;
} counter_target_t;

static int counter_reached(mpi_t *s, void *arg) {
  counter_target_t *ct = arg;
  return reached(*ct->counter, ct->target);
}

static tnt_result_t mpi_wait(void *st, int kind, int from, uint32_t target, double deadline) {
  mpi_t *s = st;
  counter_target_t ct = {&s->counters[kind * s->n + from], target};
  char what[96];
  snprintf(what, sizeof what, "waiting for %s from rank %d", kind % 2 == TNT_NOTIFY_DATA ? "data" : "a free slot", from);
  tnt_result_t res = poll_until(s, counter_reached, &ct, from, deadline, what);
  return res == TNT_ERR_TIMEOUT ? timed_out(&s->health, from, what) : res;
}

/* ---- direct messages with one peer (transport.h's sendrecv) ----
 *
 * The allreduce of a pair of ranks on two hosts (allreduce_pair_direct.c):
 * plain MPI_Isend/MPI_Irecv, without the window, PUTs and counters. */

typedef struct {
  MPI_Request *reqs; /* [2]: the send, the receive */
  int peer;
} direct_t;

static int direct_done(mpi_t *s, void *arg) {
  direct_t *d = arg;
  MPI_Status st[2];
  int flag = 0, rc = MPI_Testall(2, d->reqs, &flag, st);
  if (rc == MPI_ERR_IN_STATUS && st[1].MPI_ERROR == MPI_ERR_TRUNCATE) /* not the peer's loss: a disagreement */
    sticky(&s->health, TNT_ERR_INTERNAL, d->peer, "rank %d: rank %d sent more bytes than this rank expected (the two "
           "disagree on what they exchange)", s->me, d->peer);
  else if (rc != MPI_SUCCESS) {
    char e[MPI_MAX_ERROR_STRING];
    sticky(&s->health, TNT_ERR_PEER_LOST, d->peer, "rank %d: a direct message with rank %d failed: %s", s->me,
           d->peer, mpi_err(rc, e));
  }
  return flag;
}

/* The send is posted first: Open MPI over TCP then starts its rendezvous
 * before the peer's matching receive is up (1 MB on 2 hosts x 1 rank: 0.55 ms,
 * against 0.91 with each rank's receive posted first; a C program on the test
 * bed). A failed call cancels what it started: MPI must not go on reading or
 * writing the caller's memory. */
static tnt_result_t mpi_sendrecv(void *st, int peer, const void *send, size_t send_bytes, void *recv,
                                 size_t recv_bytes, double deadline) {
  mpi_t *s = st;
  if (peer < 0 || peer >= s->n || peer == s->me || send_bytes > INT_MAX || recv_bytes > INT_MAX)
    return failf(TNT_ERR_INTERNAL, -1, "mpi: no messages of %zu and %zu bytes with rank %d", send_bytes, recv_bytes,
                 peer);
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  pthread_mutex_lock(&s->mu);
  int rc = MPI_Isend(send, (int)send_bytes, MPI_BYTE, peer, TAG_DIRECT, s->comm, &req[0]);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Irecv(recv, (int)recv_bytes, MPI_BYTE, peer, TAG_DIRECT, s->comm, &req[1]);
    if (rc != MPI_SUCCESS) {
      MPI_Cancel(&req[0]);
      MPI_Request_free(&req[0]);
    } else {
      s->receiving++; /* bytes on the wire: the poll yields rather than sleeps */
    }
  }
  pthread_mutex_unlock(&s->mu);
  if (rc != MPI_SUCCESS) {
    char e[MPI_MAX_ERROR_STRING];
    return failf(TNT_ERR_SYSTEM, -1, "rank %d: MPI could not start a direct message with rank %d: %s", s->me, peer,
                 mpi_err(rc, e));
  }
  direct_t d = {req, peer};
  /* the errors name the peer themselves: no formatting on every message */
  const char *what = "exchanging direct messages with the other rank of its pair";
  tnt_result_t res = poll_until(s, direct_done, &d, peer, deadline, what);
  pthread_mutex_lock(&s->mu);
  s->receiving--;
  for (int i = 0; res != TNT_SUCCESS && i < 2; i++)
    if (req[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&req[i]);
      MPI_Request_free(&req[i]);
    }
  pthread_mutex_unlock(&s->mu);
  return res == TNT_ERR_TIMEOUT ? timed_out(&s->health, peer, what) : res;
}

/* ---- exchange ---- */

static int sends_done(mpi_t *s, void *arg) {
  int flag = 0;
  if (MPI_Testall(s->n, (MPI_Request *)arg, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    sticky(&s->health, TNT_ERR_SYSTEM, -1, "rank %d: sending the negotiation message failed", s->me);
    return 0;
  }
  return flag;
}

static tnt_result_t mpi_exchange_post(void *st, const void *mine, size_t len, double deadline) {
  mpi_t *s = st;
  if (len > TNT_EXCHANGE_MAX) return failf(TNT_ERR_INTERNAL, -1, "exchange of %zu bytes is too large", len);
  if (s->posted) return failf(TNT_ERR_INTERNAL, -1, "exchange posted twice");
  uint32_t round = s->round + 1, b = round & 1;
  /* the sends of round - 2 used this buffer: every peer has received them (it
   * went on to round - 1), MPI may just not have told us yet */
  tnt_result_t res = poll_until(s, sends_done, s->exch_req[b], -1, deadline, "sending the negotiation message");
  if (res == TNT_ERR_TIMEOUT) return timed_out(&s->health, -1, "sending the negotiation message");
  if (res != TNT_SUCCESS) return res;
  memcpy(s->exch_out[b], mine, len);
  s->exch_out_len[b] = len;
  pthread_mutex_lock(&s->mu);
  double now = host->now();
  for (int r = 0; r < s->n; r++) {
    s->peers[r].exch_got = (r == s->me);
    if (r == s->me) continue;
    int rc = MPI_Isend(s->exch_out[b], (int)len, MPI_BYTE, r, TAG_EXCH, s->comm, &s->exch_req[b][r]);
    if (rc != MPI_SUCCESS) {
      char e[MPI_MAX_ERROR_STRING];
      s->exch_req[b][r] = MPI_REQUEST_NULL;
      res = peer_lost(&s->health, r, "rank %d could not send its negotiation message to rank %d: %s", s->me, r,
                  mpi_err(rc, e));
      break;
    }
    s->health.peer[r].last_sent = now;
  }
  pthread_mutex_unlock(&s->mu);
  if (res != TNT_SUCCESS) return res;
  s->round = round;
  s->missing = s->n - 1;
  s->posted = 1;
  s->exch_deadline = deadline;
  return TNT_SUCCESS;
}

/* A peer's message has landed (mu held). */
static void exchange_landed(mpi_t *s, int r) {
  s->peers[r].exch_got = 1;
  s->health.peer[r].last_heard = host->now();
  s->missing--;
}

/* Receive what has arrived of this round (mu held); 1 when every rank's is here.
 * A message is matched when it is probed, and its receive completes in a later
 * poll: a large one (a one-round payload) goes by MPI's rendezvous, whose
 * bytes move only while the sender calls into MPI, and a blocking receive
 * (MPI_Mrecv) would spin inside MPI meanwhile, never sleeping: with more ranks
 * than cores that kept the sender off the CPU, and a 64 KB allreduce on 2
 * hosts x 2 ranks took 2.8-4.6 ms (docs/benchmarks.md, "Across hosts"). */
static int exchange_arrived(mpi_t *s, void *arg) {
  (void)arg;
  for (int r = 0; r < s->n && s->missing; r++) {
    peer_t *p = &s->peers[r];
    if (p->exch_got) continue;
    int flag = 0;
    if (p->exch_recv != MPI_REQUEST_NULL) {
      if (MPI_Test(&p->exch_recv, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        sticky(&s->health, TNT_ERR_PEER_LOST, r, "rank %d could not receive rank %d's negotiation message", s->me, r);
        return 0;
      }
      if (flag) {
        s->receiving--;
        exchange_landed(s, r);
      }
      continue;
    }
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(r, TAG_EXCH, s->comm, &flag, &msg, &st) != MPI_SUCCESS) {
      sticky(&s->health, TNT_ERR_PEER_LOST, r, "rank %d could not probe for rank %d's negotiation message", s->me, r);
      return 0;
    }
    if (!flag) continue;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count < 0 || (size_t)count > p->exch_cap) {
      size_t cap = count > 0 ? (size_t)count : 1;
      uint8_t *buf = realloc(p->exch, cap);
      if (!buf) {
        sticky(&s->health, TNT_ERR_SYSTEM, -1, "out of memory");
        return 0;
      }
      p->exch = buf;
      p->exch_cap = cap;
    }
    p->exch_len = (size_t)count;
    if (MPI_Imrecv(p->exch, count, MPI_BYTE, &msg, &p->exch_recv) != MPI_SUCCESS ||
        MPI_Test(&p->exch_recv, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      sticky(&s->health, TNT_ERR_PEER_LOST, r, "rank %d could not receive rank %d's negotiation message", s->me, r);
      return 0;
    }
    if (flag) exchange_landed(s, r); /* at once: a small (eager) message */
    else s->receiving++;             /* bytes on the wire: the wait polls for them (poll_until) */
  }
  return s->missing == 0;
}

static tnt_result_t mpi_exchange_collect(void *st, void *all, size_t stride, size_t *lens, double until) {
  mpi_t *s = st;
  tnt_result_t res = exchange_wait(s, until);
  if (res != TNT_SUCCESS) return res;
  uint32_t b = s->round & 1;
  for (int r = 0; r < s->n; r++) {
    const uint8_t *src = r == s->me ? s->exch_out[b] : s->peers[r].exch;
    lens[r] = r == s->me ? s->exch_out_len[b] : s->peers[r].exch_len;
    if (lens[r] > stride)
      return failf(TNT_ERR_INTERNAL, r, "rank %d sent %zu exchange bytes, more than %zu", r, lens[r], stride);
    if (lens[r]) memcpy((uint8_t *)all + (size_t)r * stride, src, lens[r]);
  }
  s->posted = 0;
  return TNT_SUCCESS;
}

static tnt_result_t mpi_exchange(void *st, const void *mine, size_t len, void *all, size_t stride, size_t *lens,
                                 double deadline) {
  mpi_t *s = st;
  if (len > stride) return failf(TNT_ERR_INTERNAL, -1, "exchange of %zu bytes is too large", len);
  tnt_result_t res = mpi_exchange_post(s, mine, len, deadline);
  if (res != TNT_SUCCESS) return res;
  return mpi_exchange_collect(s, all, stride, lens, deadline);
}

/* ---- AND-allreduce: the negotiation's bit round ----
 *
 * Recursive doubling among the largest power of two P <= N ranks; a rank
 * r >= P first swaps words with r - P and gets the result back from it at
 * the end. Each step's message carries (round, step) in its first word: MPI
 * keeps one sender's messages in order per tag and a sender sends a receiver
 * at most one per round, so the next message from the partner is the expected
 * one; anything else means the ranks diverged. */

static uint64_t and_tag(uint32_t round, int step) { return (uint64_t)round << 8 | (uint64_t)step; }

/* Does this rank send / receive in `step`? Step 0 goes both ways, though
 * the rank above P needs nothing from below: that message is its doorbell
 * (it learns of the cycle from it, as every other rank does from its first
 * partner; see the doorbell). Above P: receive the result in the last step. */
static int and_sends(const mpi_t *s, int step) {
  if (s->me >= s->and_pow) return step == 0;
  return and_partner(s, step) >= 0;
}
static int and_receives(const mpi_t *s, int step) {
  if (s->me >= s->and_pow) return step == 0 || step == s->and_log + 1;
  return step <= s->and_log && and_partner(s, step) >= 0;
}

static tnt_result_t and_buffers(mpi_t *s, int nwords) {
  if (nwords <= s->and_cap) return TNT_SUCCESS;
  and_shape(s);
  const size_t w = (size_t)nwords + 1;
  free(s->and_acc);
  free(s->and_rbuf);
  s->and_acc = calloc(w, sizeof(uint64_t));
  s->and_rbuf = calloc(w, sizeof(uint64_t));
  for (int b = 0; b < 2; b++) {
    free(s->and_sbuf[b]);
    free(s->and_req[b]);
    s->and_sbuf[b] = calloc(w * (size_t)s->and_steps, sizeof(uint64_t));
    s->and_req[b] = malloc((size_t)s->and_steps * sizeof(MPI_Request));
    for (int k = 0; s->and_req[b] && k < s->and_steps; k++) s->and_req[b][k] = MPI_REQUEST_NULL;
  }
  if (!s->and_acc || !s->and_rbuf || !s->and_sbuf[0] || !s->and_sbuf[1] || !s->and_req[0] || !s->and_req[1]) {
    s->and_cap = 0;
    return failf(TNT_ERR_SYSTEM, -1, "out of memory");
  }
  s->and_cap = nwords;
  return TNT_SUCCESS;
}

static int and_sends_done(mpi_t *s, void *arg) {
  int flag = 0;
  if (MPI_Testall(s->and_steps, (MPI_Request *)arg, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
    sticky(&s->health, TNT_ERR_SYSTEM, -1, "rank %d: sending a bit round failed", s->me);
    return 0;
  }
  return flag;
}

/* ---- rides (transport.h's and_post_ride) ---- */

/* Where a ride message's payload begins: after its header word, the words
 * (at most and_cap), the tag and the ranks. */
#define RIDE_AT(s) (((size_t)(s)->and_cap + 3) * sizeof(uint64_t))

static uint8_t *ride_buffer(mpi_t *s, int k) { return s->ride_buf[s->and_round & 1] + (size_t)k * s->ride_stride[s->and_round & 1]; }

/* The round's buffers hold `bytes` of payload (the round's parity's sends
 * are done: mpi_and_post waited for them). */
static tnt_result_t ride_buffers(mpi_t *s, size_t bytes) {
  const int b = s->and_round & 1;
  const size_t stride = RIDE_AT(s) + bytes;
  if (stride <= s->ride_stride[b]) return TNT_SUCCESS;
  free(s->ride_buf[b]);
  s->ride_buf[b] = malloc(stride * (size_t)(s->and_steps + 1));
  s->ride_stride[b] = s->ride_buf[b] ? stride : 0;
  return s->ride_buf[b] ? TNT_SUCCESS : failf(TNT_ERR_SYSTEM, -1, "out of memory for a bit round's payload");
}

/* This rank's running sum (ride_at >= 0). */
static const uint8_t *ride_sum(mpi_t *s) {
  return s->ride_at == 0 ? s->ride_payload : ride_buffer(s, s->ride_at) + RIDE_AT(s);
}

/* A partner's ride message (in ride_rbuf, `count` bytes, its words already
 * ANDed in): add its sum to this rank's, or take it as the result in the
 * last step of a rank above P; anything else ends this rank's sum. A message
 * of the header alone is a partner's own payload, which the core reads where
 * it lies (tnt_ride_t's `shared`). */
static void ride_take(mpi_t *s, int count) {
  const int step = s->and_step;
  const size_t head = ((size_t)s->and_nwords + 1) * sizeof(uint64_t);
  uint64_t tag, ranks;
  memcpy(&tag, s->ride_rbuf + head, sizeof tag);
  memcpy(&ranks, s->ride_rbuf + head + sizeof tag, sizeof ranks);
  const size_t bytes = (size_t)count - head - 2 * sizeof(uint64_t);
  const uint8_t *theirs = bytes ? s->ride_rbuf + head + 2 * sizeof(uint64_t) : NULL;
  const int result = s->me >= s->and_pow && step == s->and_log + 1;
  const int shared_own = !bytes && s->ride && (ranks == (1ull << and_partner(s, step))) && (s->ride->shared & ranks);
  if (!s->ride || tag != s->ride->tag || (bytes != s->ride->bytes && !shared_own) || (result && !bytes) ||
      (!result && s->ride_at < 0) || (!result && (ranks & s->ride_ranks))) {
    s->ride_at = -1;
    return;
  }
  uint8_t *out = ride_buffer(s, step + 1) + RIDE_AT(s);
  if (result) {
    memcpy(out, theirs, bytes);
    s->ride_ranks = ranks;
  } else {
    if (!s->ride->combine(s->ride->ctx, out, ride_sum(s), s->ride_ranks, theirs, ranks)) {
      s->ride_at = -1;
      return;
    }
    s->ride_ranks |= ranks;
  }
  s->ride_at = step + 1;
}

/* Send the running AND for this step (mu held), with this rank's running sum
 * where it holds one; 0 on failure (sticky). */
static int and_send(mpi_t *s) {
  const int step = s->and_step, peer = and_partner(s, step);
  const size_t w = (size_t)s->and_nwords + 1;
  uint64_t *buf = s->and_sbuf[s->and_round & 1] + (size_t)step * w;
  size_t len = w * sizeof(uint64_t);
  if (s->ride_at >= 0) { /* the message ends where the sum begins */
    /* its own payload only, to a rank that reads it where it lies: the header alone */
    const int header_only = s->ride_at == 0 && (s->ride->shared & (1ull << peer));
    uint8_t *sum = ride_buffer(s, s->ride_at) + RIDE_AT(s);
    if (s->ride_at == 0 && !header_only) memcpy(sum, s->ride_payload, s->ride->bytes);
    buf = (uint64_t *)(sum - len - 2 * sizeof(uint64_t));
    buf[w] = s->ride->tag;
    buf[w + 1] = s->ride_ranks;
    len += 2 * sizeof(uint64_t) + (header_only ? 0 : s->ride->bytes);
  }
  buf[0] = and_tag(s->and_round, step);
  memcpy(buf + 1, s->and_acc + 1, (size_t)s->and_nwords * sizeof(uint64_t));
  int rc = MPI_Isend(buf, (int)len, MPI_BYTE, peer, TAG_AND, s->comm, &s->and_req[s->and_round & 1][step]);
  if (rc != MPI_SUCCESS) {
    char e[MPI_MAX_ERROR_STRING];
    s->and_req[s->and_round & 1][step] = MPI_REQUEST_NULL;
    sticky(&s->health, TNT_ERR_PEER_LOST, peer, "rank %d could not send a bit round to rank %d: %s", s->me, peer,
           mpi_err(rc, e));
    return 0;
  }
  s->health.peer[peer].last_sent = host->now();
  return 1;
}

/* Take the partner's message of this step if it is here (mu held): 1 when
 * taken (ANDed in, or the result itself in the last step above P). A ride
 * message is received into ride_rbuf without blocking: its payload may take
 * a while over TCP, and a wait must keep its deadline. */
static int and_receive(mpi_t *s) {
  const int step = s->and_step, peer = and_partner(s, step);
  const size_t w = (size_t)s->and_nwords + 1, words = w * sizeof(uint64_t);
  int count = 0;
  if (s->ride_recv != MPI_REQUEST_NULL) { /* a ride message on its way in */
    int done = 0;
    if (MPI_Test(&s->ride_recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      sticky(&s->health, TNT_ERR_PEER_LOST, peer, "rank %d could not receive rank %d's bit round", s->me, peer);
      return 0;
    }
    if (!done) return 0;
    count = s->ride_rcount;
    memcpy(s->and_rbuf, s->ride_rbuf, words);
  } else {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(peer, TAG_AND, s->comm, &flag, &msg, &st) != MPI_SUCCESS) {
      sticky(&s->health, TNT_ERR_PEER_LOST, peer, "rank %d could not probe for rank %d's bit round", s->me, peer);
      return 0;
    }
    if (!flag) return 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count != (int)words && count < (int)(words + 2 * sizeof(uint64_t))) {
      uint8_t *junk = malloc(count > 0 ? (size_t)count : 1);
      MPI_Mrecv(junk, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      free(junk);
      sticky(&s->health, TNT_ERR_INTERNAL, peer, "rank %d sent a bit round of %d bytes, rank %d expected %zu: the ranks "
             "have diverged (different TNT_* settings or library versions?)", peer, count, s->me, words);
      return 0;
    }
    if (count != (int)words) { /* a ride: receive it in the background */
      if ((size_t)count > s->ride_rcap) {
        free(s->ride_rbuf);
        s->ride_rbuf = malloc((size_t)count);
        s->ride_rcap = s->ride_rbuf ? (size_t)count : 0;
      }
      if (!s->ride_rbuf || MPI_Imrecv(s->ride_rbuf, count, MPI_BYTE, &msg, &s->ride_recv) != MPI_SUCCESS) {
        sticky(&s->health, TNT_ERR_PEER_LOST, peer, "rank %d could not receive rank %d's bit round", s->me, peer);
        return 0;
      }
      s->ride_rcount = count;
      return and_receive(s);
    }
    if (MPI_Mrecv(s->and_rbuf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      sticky(&s->health, TNT_ERR_PEER_LOST, peer, "rank %d could not receive rank %d's bit round", s->me, peer);
      return 0;
    }
  }
  s->health.peer[peer].last_heard = host->now();
  if (s->and_rbuf[0] != and_tag(s->and_round, step)) {
    sticky(&s->health, TNT_ERR_INTERNAL, peer, "rank %d sent step %u of bit round %u, rank %d expected step %d of "
           "round %u: the ranks have diverged", peer, (unsigned)(s->and_rbuf[0] & 0xff),
           (unsigned)(s->and_rbuf[0] >> 8), s->me, step, s->and_round);
    return 0;
  }
  for (size_t k = 1; k < w; k++) s->and_acc[k] &= s->and_rbuf[k];
  if (count != (int)words) ride_take(s, count);
  else s->ride_at = -1; /* the partner holds no sum: neither does this rank from here on */
  return 1;
}

/* Advance the round as far as the messages that arrived allow (mu held);
 * 1 when this rank holds the result. */
static int and_advance(mpi_t *s, void *arg) {
  while (s->and_step < s->and_steps) {
    const int step = s->and_step;
    s->and_partner = and_partner(s, step);
    if (and_sends(s, step) && !s->and_sent) {
      if (!and_send(s)) return 0;
      s->and_sent = 1;
    }
    if (and_receives(s, step) && !and_receive(s)) return 0;
    s->and_step++;
    s->and_sent = 0;
  }
  return 1;
}

static tnt_result_t and_post(mpi_t *s, const uint64_t *mine, int nwords, const tnt_ride_t *ride, const void *payload,
                             double deadline) {
  if (s->and_posted) return failf(TNT_ERR_INTERNAL, -1, "bit round posted twice");
  if (nwords < 1) return failf(TNT_ERR_INTERNAL, -1, "a bit round of %d words", nwords);
  if (nwords > s->and_cap && s->and_cap) return failf(TNT_ERR_INTERNAL, -1, "a bit round grew to %d words", nwords);
  tnt_result_t res = and_buffers(s, nwords);
  if (res != TNT_SUCCESS) return res;
  uint32_t round = s->and_round + 1;
  /* the sends of round - 2 used these buffers: every rank has taken them (the
   * result of round - 1 needed every rank to have finished round - 2) */
  res = poll_until(s, and_sends_done, s->and_req[round & 1], -1, deadline, "sending a bit round");
  if (res == TNT_ERR_TIMEOUT) return timed_out(&s->health, -1, "sending a bit round");
  if (res != TNT_SUCCESS) return res;
  pthread_mutex_lock(&s->mu);
  s->and_round = round;
  s->ride = ride;
  s->ride_at = -1;
  if (ride) {
    if ((res = ride_buffers(s, ride->bytes)) != TNT_SUCCESS) {
      pthread_mutex_unlock(&s->mu);
      return res;
    }
    s->ride_payload = payload;
    s->ride_at = 0;
    s->ride_ranks = 1ull << s->me;
  }
  s->and_nwords = nwords;
  s->and_acc[0] = 0;
  memcpy(s->and_acc + 1, mine, (size_t)nwords * sizeof *mine);
  s->and_step = 0;
  s->and_sent = 0;
  s->and_posted = 1;
  s->and_deadline = deadline;
  and_advance(s, NULL); /* the first send leaves now */
  pthread_mutex_unlock(&s->mu);
  return TNT_SUCCESS;
}

static tnt_result_t mpi_and_post(void *st, const uint64_t *mine, int nwords, double deadline) {
  return and_post(st, mine, nwords, NULL, NULL, deadline);
}

static tnt_result_t mpi_and_post_ride(void *st, const uint64_t *mine, int nwords, const tnt_ride_t *ride,
                                      const void *payload, double deadline) {
  mpi_t *s = st;
  if (s->n > 64) return failf(TNT_ERR_INTERNAL, -1, "a ride among %d ranks (64 at most)", s->n);
  return and_post(s, mine, nwords, ride, payload, deadline);
}

static const void *mpi_ride_result(void *st, uint64_t *ranks) {
  mpi_t *s = st;
  if (s->and_posted || !s->ride || s->ride_at < 0) return NULL;
  *ranks = s->ride_ranks;
  return ride_sum(s);
}

static tnt_result_t mpi_and_collect(void *st, uint64_t *out, double until) {
  mpi_t *s = st;
  tnt_result_t res = and_wait(s, until);
  if (res != TNT_SUCCESS) return res;
  memcpy(out, s->and_acc + 1, (size_t)s->and_nwords * sizeof *out);
  s->and_posted = 0;
  return TNT_SUCCESS;
}

/* ---- doorbell ---- */

/* The doorbell is the cycle's own first message: a rank with news posts its
 * round right after ringing, and a rank that is between rounds and finds a
 * peer's exchange or bit-round message waiting knows that a peer started the
 * next cycle (a round ends only when all its messages are in, and no peer can
 * be two rounds ahead). So ringing sends nothing: a full round reaches every
 * rank at once, a bit round wakes the sleeping ranks along its recursive
 * doubling (log2 N hops), and the steady state sends no all-to-all bells. */
static int peer_started_round(mpi_t *s) { /* mu held */
  if (atomic_load(&s->posted) || atomic_load(&s->and_posted)) return 0;
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, TAG_AND, s->comm, &flag, MPI_STATUS_IGNORE);
  if (!flag) MPI_Iprobe(MPI_ANY_SOURCE, TAG_EXCH, s->comm, &flag, MPI_STATUS_IGNORE);
  return flag;
}

static int mpi_cycle_wanted(void *st, uint64_t done) {
  mpi_t *s = st;
  if (atomic_load(&s->door.cycle_wanted) > done) return 1;
  pthread_mutex_lock(&s->mu);
  int started = peer_started_round(s);
  pthread_mutex_unlock(&s->mu);
  return started;
}

/* ---- abort, shutdown ---- */

static void mpi_abort(void *st, const char *reason, int root_peer) {
  mpi_t *s = st;
  atomic_store(&job_failed, 1);
  pthread_mutex_lock(&s->mu);
  for (int r = 0; r < s->n; r++)
    if (r != s->me && s->health.peer[r].state != PEER_EXITED)
      send_ctrl(s, r, CTRL_ABORT, root_peer, 0, 0, reason ? reason : "aborted");
  progress(s);
  pthread_mutex_unlock(&s->mu);
}

static int all_sent(mpi_t *s, void *arg) {
  int flag = 0;
  reap(s);
  if (s->nfree != s->nslots || s->sending) return 0;
  for (int b = 0; b < 2; b++) {
    MPI_Testall(s->n, s->exch_req[b], &flag, MPI_STATUSES_IGNORE);
    if (!flag) return 0;
    if (s->and_req[b]) MPI_Testall(s->and_steps, s->and_req[b], &flag, MPI_STATUSES_IGNORE);
    if (!flag) return 0;
  }
  return 1;
}

static void mpi_finalize(void *st) {
  mpi_t *s = st;
  pthread_mutex_lock(&s->mu);
  for (int r = 0; r < s->n; r++) {
    flush_held(s, r);
    if (r != s->me && s->health.peer[r].state == PEER_ALIVE) send_ctrl(s, r, CTRL_BYE, 0, 0, 0, NULL);
  }
  pthread_mutex_unlock(&s->mu);
  /* let the last messages leave (over TCP they go only while we call MPI) */
  double until = host->now() + (s->timeout_s < BYE_WAIT_S ? s->timeout_s : BYE_WAIT_S);
  for (;;) {
    pthread_mutex_lock(&s->mu);
    progress(s);
    int done = all_sent(s, NULL);
    pthread_mutex_unlock(&s->mu);
    if (done || host->now() >= until) break;
    sleep_s(SLEEP_MAX_S);
  }
  pthread_mutex_lock(&s->mu);
  for (int r = 0; r < s->n; r++) {
    peer_t *p = &s->peers[r];
    for (; p->n; p->n--, p->head = (p->head + 1) % p->cap) {
      op_t *op = &p->ops[p->head];
      if (op->kind < 0 && op->req != MPI_REQUEST_NULL) {
        MPI_Cancel(&op->req);
        MPI_Request_free(&op->req);
      }
    }
  }
  for (int i = 0; i < s->nslots; i++)
    if (s->sreq[i] != MPI_REQUEST_NULL) MPI_Request_free(&s->sreq[i]);
  for (int b = 0; b < 2; b++)
    for (int r = 0; r < s->n; r++)
      if (s->exch_req[b][r] != MPI_REQUEST_NULL) MPI_Request_free(&s->exch_req[b][r]);
  for (int r = 0; r < s->n; r++)
    if (s->peers[r].nsends) { /* its peer is gone: MPI may still read the lent buffer, which stays */
      s->peers[r].lent = NULL;
      cancel_sends(s, r);
    }
  for (int b = 0; b < 2 && s->and_cap; b++) /* a bit-round send still pending (its peer is gone) keeps its buffers */
    for (int k = 0; k < s->and_steps; k++)
      if (s->and_req[b][k] != MPI_REQUEST_NULL) {
        MPI_Request_free(&s->and_req[b][k]);
        s->and_sbuf[b] = NULL;
        s->ride_buf[b] = NULL; /* the send may be a ride's */
      }
  if (s->ride_recv != MPI_REQUEST_NULL) { /* MPI may still write there: left to it */
    MPI_Cancel(&s->ride_recv);
    MPI_Request_free(&s->ride_recv);
    s->ride_rbuf = NULL;
  }
  /* the communicator is never freed: Open MPI gives a freed communicator's
   * context id to the next one, and a message still in flight to this one (a
   * peer's BYE) would land in the communicator of the next tnt_init */
  pthread_mutex_unlock(&s->mu);
  free_state(s);
}

static const tnt_transport_t transport = {
    .name = "mpi",
    .can_serve = mpi_can_serve,
    .init = mpi_init,
    .put = mpi_put,
    .fence = mpi_fence,
    .send_buffer = mpi_send_buffer,
    .window = mpi_window,
    .notify = mpi_notify,
    .wait = mpi_wait,
    .exchange = mpi_exchange,
    .exchange_post = mpi_exchange_post,
    .exchange_collect = mpi_exchange_collect,
    .ring_doorbell = plugin_ring_doorbell,
    .cycle_wanted = mpi_cycle_wanted,
    .wait_doorbell = plugin_wait_doorbell,
    .check_peers = plugin_check_peers,
    .describe_peer = plugin_describe_peer,
    .wake_local = plugin_wake_local,
    .abort = mpi_abort,
    .finalize = mpi_finalize,
    .and_post = mpi_and_post,
    .and_collect = mpi_and_collect,
    .sendrecv = mpi_sendrecv,
    .wait_stats = plugin_wait_stats,
    .cores = plugin_cores,
    .and_post_ride = mpi_and_post_ride,
    .ride_result = mpi_ride_result,
};

static const tnt_plugin_t plugin = {
    TNT_PLUGIN_SIZES,
    .caps = TNT_TRANSPORT_CAP_MULTI_HOST | TNT_TRANSPORT_CAP_HEARTBEAT,
    .name = "mpi",
    .description = description,
    .transport = &transport,
};

EXPORT const tnt_plugin_t *TNT_PLUGIN_ENTRY(const tnt_plugin_host_t *h, char *why, size_t why_len) {
  if (!plugin_abi_matches(h, why, why_len)) return NULL;
  host = h;
  if (!description[0]) { /* MPI_Get_library_version may be called before MPI_Init */
    char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    MPI_Get_library_version(v, &len);
    v[strcspn(v, "\n,")] = 0;
    snprintf(description, sizeof description, "%s (MPI %d.%d)", v, MPI_VERSION, MPI_SUBVERSION);
  }
  return &plugin;
}
