/* shm.c - the shared-memory transport: every rank of one host maps one POSIX
 * shared-memory segment, /dev/shm/tnt-<job id>.
 *
 * Segment layout (offsets computed at init, identical on every rank):
 *   header | rank block 0 | rank block 1 | ...
 *   rank block = control (pid, state, abort reason, doorbell, exchange sequence,
 *                notification counters [kind][source], one cache line each)
 *              | exchange buffers [2][SHM_EXCHANGE_BYTES] | receive window
 *
 * Waiting: a futex on the counter word, after a spin of at most TNT_SPIN_US
 * only under a host-wide budget (spin_allowed: ranks that outnumber the cores
 * never spin, and neither may anyone while other jobs fill the cores). An exchange
 * round has one arrival counter in the header: only the last rank to post
 * wakes the sleepers. Doorbells are rung lazily (pay_bells). Sleeps are cut
 * into slices of 100 ms; after each slice the waiter checks its peers, so a
 * dead peer is seen within ~0.1 s, a hang within the deadline.
 *
 * Liveness: a waiter checks the peer it waits for after each sleep slice (died,
 * aborted, stopped, or shut down before providing what is awaited), and only
 * the cheap state words of the others (an abort anywhere fails the job): a peer
 * that shut down cleanly after doing its part is not a failure.
 *
 * Security and cleanup: rank 0 creates the segment O_EXCL with mode 0600 under
 * the launcher's random job id; the last rank to attach unlinks the name, so
 * nothing is left in /dev/shm even if ranks are SIGKILLed later (the mapping
 * lives until the last process unmaps it). A job killed during set-up leaves the
 * name behind: `tntrun` removes tnt-<job id>* when the job ends. Joining ranks
 * accept only a segment owned by their own user with no group/other access, and
 * claim their rank's block with a compare-and-swap: a second process claiming
 * the same rank (two jobs started with one TNT_JOB_ID) marks the segment
 * collided, and every rank in it fails with that message. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"
#include "host_marks.h"
#include "job_void.h"
#include "launcher_ended.h"
#include "transport.h"
#include "ancestry.h"
#include "host_load.h"
#include "process_state.h"
#include "put_copy.h"
#include "../setup_interrupt.h"

#define SHM_MAGIC 0x544e5432u /* "TNT2": changes with the segment's layout, so that ranks of two builds do not share one */
/* What a joining rank of another build (another SHM_MAGIC) leaves in the magic word, so
 * that rank 0 fails at once too: the same in every build, never to change. */
#define SHM_MAGIC_FOREIGN 0x544e5446u /* "TNTF" */
#define CACHE_LINE 64
/* Each of a rank's two exchange buffers: the negotiation's message needs
 * TNT_EXCHANGE_MAX; the direct allreduce (allreduce_direct.c) moves a chunk of
 * this size per two rounds, so that 1 MB takes two rounds, not sixteen. */
#define SHM_EXCHANGE_BYTES (1024 * 1024)
_Static_assert(SHM_EXCHANGE_BYTES >= TNT_EXCHANGE_MAX, "an exchange buffer must hold a negotiation message");
#define SLICE_S 0.1
#define HOST_LOAD_EVERY_S 0.005 /* how often a spinner re-reads the host's count of runnable threads */
#define BELL_GRACE_S 200e-6 /* how long a cycle waits for its peers to join by themselves before waking them */
#define IDLE_BELL_S 0.1     /* ... and for the peers that sleep with nothing pending */
#define PENDING_NAP_S 1.0   /* a background thread sleeping no longer than this has requests pending */

enum { RANK_EMPTY = 0, RANK_ALIVE = 1, RANK_EXITED = 2, RANK_FAILED = 3 };

typedef struct {
  _Atomic uint32_t value;
  _Atomic uint32_t waiters;
  char pad[CACHE_LINE - 8];
} shm_word_t;

typedef struct {
  _Atomic uint32_t magic;
  uint32_t size;
  uint64_t total_bytes, window_bytes, block_bytes;
  shm_word_t attached;
  _Atomic uint64_t cycle_wanted;
  _Atomic uint32_t collided; /* two processes claimed one rank, or a rank disagreed on the set-up: the job is void */
  char pad0[CACHE_LINE];
  shm_word_t arrived;           /* exchange posts of every rank, all rounds: round r is complete at r * size */
  _Atomic uint32_t spinners;    /* threads of this host busy-waiting now (at most one per core) */
  _Atomic uint32_t host_busy;   /* more runnable threads on the machine than online CPUs (any process's), as last read */
  _Atomic int64_t load_read_us; /* when host_busy was last read */
  /* the CPUs the ranks may run on: the union of their affinity masks (CPU i:
   * bit i % 64 of word i / 64), and the most CPUs of one rank whose mask did
   * not fit (or could not be read) */
  _Atomic uint64_t cpus[TNT_CPU_WORDS];
  _Atomic uint32_t cpus_unlisted;
  char collision[512];
  char pad[CACHE_LINE];
} shm_header_t;

typedef struct {
  _Atomic int32_t pid;
  _Atomic uint32_t state;
  _Atomic int32_t root_peer; /* when FAILED because of another rank: that rank, else -1 */
  char reason[512];
  uint32_t exch_len[2];
  char pad[CACHE_LINE - 12];
  _Atomic int64_t nap_until_us; /* while the background thread sleeps on the bell: when it wakes by itself, else 0 */
  shm_word_t bell;      /* doorbell: bumped by peers wanting a cycle and by local requests */
  shm_word_t exch_seq;  /* rounds of exchange this rank has published */
  shm_word_t counters[]; /* [kind * size + source] */
} shm_rank_t;

typedef struct {
  tnt_placement_t pl;
  char name[160];
  int fd;
  uint8_t *base;
  size_t total;
  shm_header_t *hdr;
  shm_rank_t **ranks;  /* [size] */
  uint8_t **exch;      /* [size] base of the two exchange buffers */
  uint8_t **windows;   /* [size] */
  uint32_t exch_round;
  int exch_posted;     /* this round is published and not yet collected */
  double exch_deadline; /* the bound of the posted round (TNT_TIMEOUT_S after posting) */
  uint32_t bell_seen;
  double spin_s;       /* TNT_SPIN_US: the longest spin (or yielding poll) of one wait */
  _Atomic int64_t waits_spun, waits_yielded, waits_slept; /* how waits that had to wait ended (tnt_get_stats) */
  long ncpu;           /* the cores of the budget: the CPUs the ranks may run on (host_cpus) */
  long online;         /* the machine's online CPUs, what its count of runnable threads is measured against */
  int bells_owed;      /* a cycle was asked for: wake the peers' threads if they do not join it by themselves */
  int *global;         /* [size] job-wide rank of each member, for messages (a group of a larger job) */
  char host[64];       /* this host's name, for messages: every peer of this segment is on it */
  tnt_put_copier_t put_copier; /* how puts copy, from what they cost lately (put_copy.h) */
  int setting_up;      /* inside tnt_shm_init_group: its waits look for the job's void mark */
  int failed_on_mark;  /* the set-up failed on that mark: it is the reason, and stays (tnt_shm_init_group) */
  double setup_timeout_s;
} shm_t;

/* The rank a message names: the job-wide one when this segment serves one host of many. */
#define G(s, r) ((s)->global[(r)])

/* The job's void mark (job_void.h), as this segment's rank reads it. */
static int voided_lately(shm_t *s, double timeout_s, int remove_stale, tnt_result_t *res) {
  return s->failed_on_mark = tnt_job_void_lately(s->name, G(s, s->pl.rank), s->pl.job_id, timeout_s, remove_stale, res);
}

/* Void this segment's job for the ranks that come later (job_void.h): the segment's name goes. */
static void leave_void_mark(const shm_t *s, const char *why) { tnt_job_void_leave(s->name, -1, s->setup_timeout_s, why); }

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
  return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* Increment w and wake whoever sleeps on it. */
static void bump(shm_word_t *w) {
  atomic_fetch_add(&w->value, 1);
  if (atomic_load(&w->waiters)) futex(&w->value, FUTEX_WAKE, INT_MAX, NULL);
}

static int reached(uint32_t value, uint32_t target) { return (int32_t)(value - target) >= 0; }


static int process_dead(pid_t pid) {
  char st = tnt_process_state(pid);
  return st == 'X' || st == 'Z';
}

/* PEER_LOST for a rank that aborted, naming the rank that caused it when the
 * abort was itself caused by another rank (so that every report names the root). */
static tnt_result_t peer_aborted(shm_t *s, int r, const char *what) {
  shm_rank_t *p = s->ranks[r];
  int root = atomic_load(&p->root_peer);
  if (root >= 0 && root != G(s, r) && root != G(s, s->pl.rank))
    return tnt_fail_peer(root, "rank %d aborted because of rank %d (%s) while rank %d was %s", G(s, r), root,
                         p->reason, G(s, s->pl.rank), what);
  return tnt_fail_peer(G(s, r), "rank %d aborted (%s) while rank %d was %s", G(s, r), p->reason, G(s, s->pl.rank),
                       what);
}

/* A segment voided (shm_header_t's collided): its reason. */
static tnt_result_t check_voided(const shm_t *s) {
  return atomic_load(&s->hdr->collided) ? tnt_fail(TNT_ERR_INVALID_USAGE, "%s", s->hdr->collision) : TNT_SUCCESS;
}

/* The job-wide failures that cost no system call: a collided segment, an aborted rank. */
static tnt_result_t check_job(shm_t *s, const char *what) {
  TNT_CHECK(check_voided(s));
  if (atomic_load(&s->hdr->magic) == SHM_MAGIC_FOREIGN) /* joinable(), in a rank of another build */
    return tnt_fail(TNT_ERR_INVALID_USAGE, "a rank of another build of Tarantella (another layout of the shared "
                    "memory) tried to join job %s, and failed: every rank must run the same release of Tarantella "
                    "(the same install, or the same version built alike)", s->pl.job_id);
  for (int r = 0; r < s->pl.size; r++)
    if (r != s->pl.rank && atomic_load(&s->ranks[r]->state) == RANK_FAILED) return peer_aborted(s, r, what);
  return TNT_SUCCESS;
}

/* The awaited peer `from` in full: gone, aborted, or shut down (it will never
 * provide what we wait for; had it provided it, the wait would have ended). */
static tnt_result_t check_awaited(shm_t *s, int from, const char *what) {
  shm_rank_t *p = s->ranks[from];
  uint32_t state = atomic_load(&p->state);
  if (state == RANK_ALIVE && process_dead(atomic_load(&p->pid)))
    return tnt_fail_peer(G(s, from), "rank %d (pid %d on %s) died while rank %d was %s", G(s, from),
                         (int)atomic_load(&p->pid), s->host, G(s, s->pl.rank), what);
  if (state == RANK_FAILED) return peer_aborted(s, from, what);
  if (state == RANK_EXITED)
    return tnt_fail_peer(G(s, from), "rank %d has shut down while rank %d was %s: every rank must make the same "
                         "collective calls before shutdown", G(s, from), G(s, s->pl.rank), what);
  return TNT_SUCCESS;
}

/* PEER_LOST when tntrun saw rank r end, which has not joined the job (launcher_ended.h): it
 * never will. */
static tnt_result_t check_ended_before_joining(shm_t *s, int r, const char *what) {
  char how[64];
  if (!tnt_launcher_rank_ended(G(s, r), how, sizeof how)) return TNT_SUCCESS;
  return tnt_fail_peer(G(s, r), "rank %d ended (%s) before it joined the job, while rank %d was %s: every rank must "
                       "make the same collective calls (does the program return or exit on some ranks before its "
                       "first collective?)", G(s, r), how, G(s, s->pl.rank), what);
}

/* The ranks that have not attached (only while every rank attaches) and have ended. */
static tnt_result_t check_never_joined(shm_t *s, const char *what) {
  for (int r = 0; r < s->pl.size; r++)
    if (r != s->pl.rank && atomic_load(&s->ranks[r]->state) == RANK_EMPTY)
      TNT_CHECK(check_ended_before_joining(s, r, what));
  return TNT_SUCCESS;
}

/* Every peer, dead ones first so that the error names the lost rank rather than
 * a rank that aborted because it lost it. `awaited[r]` (NULL: every peer) says
 * whose clean shutdown is a failure. */
static tnt_result_t check_all(shm_t *s, const uint8_t *awaited, const char *what) {
  for (int r = 0; r < s->pl.size; r++) {
    shm_rank_t *p = s->ranks[r];
    /* the state again after the pid: a rank that aborted or shut down between
     * the two loads has said why it is gone */
    if (r != s->pl.rank && atomic_load(&p->state) == RANK_ALIVE && process_dead(atomic_load(&p->pid)) &&
        atomic_load(&p->state) == RANK_ALIVE)
      return tnt_fail_peer(G(s, r), "rank %d (pid %d on %s) died while rank %d was %s", G(s, r),
                           (int)atomic_load(&p->pid), s->host, G(s, s->pl.rank), what);
  }
  TNT_CHECK(check_job(s, what));
  for (int r = 0; r < s->pl.size; r++)
    if (r != s->pl.rank && (!awaited || awaited[r])) TNT_CHECK(check_awaited(s, r, what));
  return check_never_joined(s, what);
}

static void shm_describe_peer(void *st, int peer, char *out, size_t len) {
  shm_t *s = st;
  pid_t pid = atomic_load(&s->ranks[peer]->pid);
  snprintf(out, len, "rank %d (pid %d on %s) %s", G(s, peer), (int)pid, s->host,
           tnt_process_doing(tnt_process_state(pid)));
}

/* The error of a wait that reached its deadline, naming the awaited rank and
 * what its process is doing (a stopped rank is the usual culprit). */
static tnt_result_t wait_timed_out(shm_t *s, int from, const char *what) {
  if (from < 0)
    return tnt_fail(TNT_ERR_TIMEOUT, "rank %d timed out %s (TNT_TIMEOUT_S bound reached)", G(s, s->pl.rank), what);
  char doing[256];
  shm_describe_peer(s, from, doing, sizeof doing);
  return tnt_fail_about(TNT_ERR_TIMEOUT, G(s, from), "rank %d timed out %s after TNT_TIMEOUT_S: %s", G(s, s->pl.rank),
                        what, doing);
}

/* Adaptive waiting under a host-wide budget. A waiter spins only while it can
 * help: the host's ranks fit on its cores, so a spinner never takes the core
 * of the rank it waits for, and fewer threads spin than there are cores. 2
 * ranks on 2 cores spin (a 4-byte allreduce costs microseconds). Ranks that
 * outnumber the cores poll while yielding their core (yield_until), then
 * sleep on a futex, and the last arrival wakes them: when
 * the last ranks to arrive of 4 or 8 on 2 cores were let spin (while the
 * others slept), a spinner often held the core that the rank it waited for
 * was queued on, and a 4-byte allreduce took 1.13-1.25x as long as with no
 * spin at all (docs/benchmarks.md). */
static int host_has_free_cores(shm_t *s) {
  /* the kernel's count of runnable threads (/proc/loadavg's "running/total"),
   * read by one thread of the host at most every HOST_LOAD_EVERY_S: other
   * jobs' threads need cores too */
  int64_t now = tnt_now_us(), last = atomic_load_explicit(&s->hdr->load_read_us, memory_order_relaxed);
  if (now - last >= (int64_t)(HOST_LOAD_EVERY_S * 1e6) &&
      atomic_compare_exchange_strong(&s->hdr->load_read_us, &last, now)) {
    atomic_store_explicit(&s->hdr->host_busy, tnt_running_threads() > s->online, memory_order_relaxed);
  }
  return !atomic_load_explicit(&s->hdr->host_busy, memory_order_relaxed);
}

static int spin_allowed(shm_t *s) {
  if (s->spin_s <= 0 || s->pl.local_size > s->ncpu || !host_has_free_cores(s)) return 0;
  return (long)atomic_load_explicit(&s->hdr->spinners, memory_order_relaxed) < s->ncpu;
}

/* Busy-wait for at most s->spin_s until ready(s, arg), when spin_allowed; 1 if it became ready. */
static int spin_until(shm_t *s, int (*ready)(shm_t *, const void *), const void *arg) {
  if (!spin_allowed(s)) return 0;
  if ((long)atomic_fetch_add(&s->hdr->spinners, 1) >= s->ncpu) { /* lost the race for the last core */
    atomic_fetch_sub(&s->hdr->spinners, 1);
    return 0;
  }
  double until = tnt_now() + s->spin_s;
  int got = 0;
  for (int i = 0;; i++) {
    if (ready(s, arg)) {
      got = 1;
      break;
    }
    if ((i & 63) == 63 && tnt_now() > until) break;
    tnt_cpu_relax();
  }
  atomic_fetch_sub(&s->hdr->spinners, 1);
  return got;
}

/* Where the host's ranks outnumber its cores nobody spins, but a waiter still
 * polls, giving its core away at every poll (sched_yield): the rank it waits
 * for is then usually queued on the same core, runs at once, and the waiter
 * sees its arrival at its next turn, with no futex wake-up and no trip through
 * the scheduler's wake-up path. That is how Open MPI waits when
 * oversubscribed. 4-byte allreduce on 2 cores: 4 ranks 39-52 us -> 17-21 us
 * (Open MPI 13-17), 8 ranks 124-127 us -> 76-84 us (docs/benchmarks.md,
 * "Yielding the core"). The poll lasts s->spin_s for every core's worth of
 * ranks (a collective waits about one turn of every rank that shares a core:
 * 8 ranks on 2 cores, 200 us, were 0.76-0.93 of the time of 50 us at 4 bytes),
 * then the futex. */
static int yield_until(shm_t *s, int (*ready)(shm_t *, const void *), const void *arg) {
  if (s->spin_s <= 0 || s->pl.local_size <= s->ncpu) return 0;
  const double until = tnt_now() + s->spin_s * (double)s->pl.local_size / (double)s->ncpu;
  for (;;) {
    sched_yield();
    if (ready(s, arg)) return 1;
    if (tnt_now() > until) return 0;
  }
}

typedef struct {
  shm_word_t *word;
  uint32_t target;
} word_target_t;

static int word_reached(shm_t *s, const void *arg) {
  const word_target_t *wt = arg;
  return reached(atomic_load_explicit(&wt->word->value, memory_order_acquire), wt->target);
}

#define FROM_EXCHANGE (-2) /* wait_word's `from` for an exchange round: the ranks that have not posted it */

/* The first rank that has not posted the current exchange round, else -1. */
static int first_missing(shm_t *s) {
  for (int r = 0; r < s->pl.size; r++)
    if (r != s->pl.rank && !reached(atomic_load(&s->ranks[r]->exch_seq.value), s->exch_round)) return r;
  return -1;
}

/* Every rank that has not posted the current exchange round, in full (a rank
 * that posted it and then shut down cleanly did its part: not a failure). */
static tnt_result_t check_missing(shm_t *s, const char *what) {
  for (int r = 0; r < s->pl.size; r++)
    if (r != s->pl.rank && !reached(atomic_load(&s->ranks[r]->exch_seq.value), s->exch_round))
      TNT_CHECK(check_awaited(s, r, what));
  return TNT_SUCCESS;
}

/* Wake the background threads of the peers that have not joined a cycle this
 * rank asked for, lazily: in a steady loop the peers' application threads join
 * within microseconds, and a wake-up would only make a sleeping thread compete
 * with them for the cores (and run an empty cycle). A peer whose background
 * thread is awake sees the cycle wanted before it sleeps: no bell. One that
 * sleeps with requests pending (it wakes within LIVENESS_S by itself) is rung
 * after BELL_GRACE_S; an idle one (it sleeps for seconds: nothing of its own
 * waits for this cycle) only after IDLE_BELL_S, for the stall reports. */
static void pay_bells(shm_t *s, double waited) {
  if (!s->bells_owed) return;
  const int64_t now = tnt_now_us();
  for (int r = 0; r < s->pl.size; r++) {
    if (r == s->pl.rank || reached(atomic_load(&s->ranks[r]->exch_seq.value), s->exch_round)) continue;
    int64_t nap = atomic_load(&s->ranks[r]->nap_until_us);
    if (nap && (nap - now <= (int64_t)(PENDING_NAP_S * 1e6) || waited >= IDLE_BELL_S)) bump(&s->ranks[r]->bell);
  }
  if (waited >= IDLE_BELL_S) s->bells_owed = 0;
}

/* The wait's quick part: reached already, or within the spin or the yielding
 * poll (most waits end here, before anything is set up for a long wait, such
 * as its message). */
static int word_reached_soon(shm_t *s, shm_word_t *w, uint32_t target) {
  word_target_t wt = {w, target};
  if (word_reached(s, &wt)) return 1;
  if (spin_until(s, word_reached, &wt)) {
    atomic_fetch_add_explicit(&s->waits_spun, 1, memory_order_relaxed);
    return 1;
  }
  if (yield_until(s, word_reached, &wt)) {
    atomic_fetch_add_explicit(&s->waits_yielded, 1, memory_order_relaxed);
    return 1;
  }
  return 0;
}

/* The wait's long part, after the spin: sleeps, bells and peer checks. */
static tnt_result_t sleep_until_word(shm_t *s, shm_word_t *w, uint32_t target, int from, double deadline,
                                     const char *what) {
  const double start = tnt_now();
  double bell_at = start + BELL_GRACE_S, next_check = start + SLICE_S;
  atomic_fetch_add_explicit(&s->waits_slept, 1, memory_order_relaxed);
  for (;;) {
    uint32_t v = atomic_load(&w->value);
    if (reached(v, target)) return TNT_SUCCESS;
    double now = tnt_now();
    if (s->bells_owed && now >= bell_at) {
      pay_bells(s, now - start);
      bell_at = start + IDLE_BELL_S;
    }
    if (now >= next_check) { /* not before the first slice: most waits end within it */
      next_check = now + SLICE_S;
      TNT_CHECK(check_job(s, what));
      TNT_CHECK(tnt_host_marks_poll()); /* during the set-up: a rank of this host took another transport */
      TNT_CHECK(tnt_setup_interrupt_check()); /* during the set-up: Ctrl-C */
      tnt_result_t voided;
      if (s->setting_up && voided_lately(s, s->setup_timeout_s, 0, &voided)) return voided; /* a rank failed */
      if (from >= 0) TNT_CHECK(check_awaited(s, from, what));
      else if (from == FROM_EXCHANGE) TNT_CHECK(check_missing(s, what));
      else TNT_CHECK(check_all(s, NULL, what));
    }
    if (now >= deadline) return wait_timed_out(s, from == FROM_EXCHANGE ? first_missing(s) : from, what);
    double wake = deadline < next_check ? deadline : next_check;
    if (s->bells_owed && bell_at < wake) wake = bell_at;
    struct timespec ts = tnt_timespec(wake - now);
    atomic_fetch_add(&w->waiters, 1);
    v = atomic_load(&w->value);
    if (!reached(v, target)) futex(&w->value, FUTEX_WAIT, v, &ts);
    atomic_fetch_sub(&w->waiters, 1);
  }
}

/* Wait until w reaches target: spin while spin_allowed (or poll yielding the
 * core where ranks outnumber the cores), then sleep on a futex.
 * The bells a cycle owes are rung only after BELL_GRACE_S more of sleeping (a
 * peer that joins by itself needs none). After every SLICE_S of sleep `from`
 * is checked in full (-1: every rank; FROM_EXCHANGE: the ranks missing from
 * the current exchange round), the others only for aborts. */
static tnt_result_t wait_word(shm_t *s, shm_word_t *w, uint32_t target, int from, double deadline, const char *what) {
  return word_reached_soon(s, w, target) ? TNT_SUCCESS : sleep_until_word(s, w, target, from, deadline, what);
}

static void shm_wait_stats(void *st, int64_t *spun, int64_t *yielded, int64_t *slept) {
  shm_t *s = st;
  *spun = atomic_load_explicit(&s->waits_spun, memory_order_relaxed);
  *yielded = atomic_load_explicit(&s->waits_yielded, memory_order_relaxed);
  *slept = atomic_load_explicit(&s->waits_slept, memory_order_relaxed);
}

static long shm_cores(void *st) { return ((shm_t *)st)->ncpu; }

static int shm_can_serve(const tnt_placement_t *pl) { return pl->local_size == pl->size; }

static size_t block_bytes_for(int size, size_t window_bytes) {
  size_t control = align_up(sizeof(shm_rank_t) + sizeof(shm_word_t) * TNT_NOTIFY_KINDS * (size_t)size, 4096);
  return control + 2 * SHM_EXCHANGE_BYTES + align_up(window_bytes, 4096);
}

static void layout(shm_t *s, size_t window_bytes) {
  size_t block = block_bytes_for(s->pl.size, window_bytes);
  size_t control = block - 2 * SHM_EXCHANGE_BYTES - align_up(window_bytes, 4096);
  for (int r = 0; r < s->pl.size; r++) {
    uint8_t *b = s->base + align_up(sizeof(shm_header_t), 4096) + (size_t)r * block;
    s->ranks[r] = (shm_rank_t *)b;
    s->exch[r] = b + control;
    s->windows[r] = b + control + 2 * SHM_EXCHANGE_BYTES;
  }
}

static void shm_free(shm_t *s) {
  if (s->base && s->base != MAP_FAILED) munmap(s->base, s->total);
  if (s->fd >= 0) close(s->fd);
  free(s->ranks);
  free(s->exch);
  free(s->windows);
  free(s->global);
  free(s);
}

/* The host's cores, for the budget of waits (spin_allowed, yield_until): the
 * CPUs its ranks may run on, the union of their affinity masks, not the
 * machine's online CPUs: ranks confined by taskset, a container's cpuset or
 * Slurm's binding to fewer cores than the machine has must count as many
 * ranks per core as they really are: 2 ranks under `taskset -c 0` on 2 cores
 * slept in every wait as if each had its own (docs/benchmarks.md, "Ranks on
 * fewer cores than the machine has"). A CPU quota (docker --cpus) leaves the
 * masks whole and is not seen. Each rank adds its mask (host_load.h's
 * tnt_cpus_t) before it counts as attached; returns how many CPUs its own
 * holds. */
static long add_my_cpus(shm_header_t *hdr) {
  tnt_cpus_t mine;
  const long n = tnt_cpus_mine(&mine);
  for (int w = 0; w < TNT_CPU_WORDS; w++)
    if (mine.words[w]) atomic_fetch_or(&hdr->cpus[w], mine.words[w]);
  for (uint32_t seen = atomic_load(&hdr->cpus_unlisted); seen < mine.unlisted;)
    if (atomic_compare_exchange_weak(&hdr->cpus_unlisted, &seen, mine.unlisted)) break;
  return n;
}

/* Once every rank has attached: the count of the union. */
static long host_cpus(shm_header_t *hdr) {
  tnt_cpus_t all = {.unlisted = atomic_load(&hdr->cpus_unlisted)};
  for (int w = 0; w < TNT_CPU_WORDS; w++) all.words[w] = atomic_load(&hdr->cpus[w]);
  return tnt_cpus_count(&all);
}

/* The pid of rank 0 of the segment mapped at `base` (its block follows the
 * header at the same offset whatever the job's size), where that process is
 * gone; else 0. A segment whose rank 0 is gone can only be the leftover of a
 * job killed before all its ranks attached (the last to attach unlinks the
 * name): with an id of the user's own, reused, a new rank 0 found the name taken
 * ("File exists"), and a new rank r joined it and failed later, on the dead rank
 * 0 or waiting for the new one, neither naming the leftover. */
static pid_t gone_rank0(const uint8_t *base) {
  const shm_header_t *hdr = (const shm_header_t *)base;
  if (atomic_load(&hdr->magic) != SHM_MAGIC) return 0;
  const shm_rank_t *r0 = (const shm_rank_t *)(base + align_up(sizeof(shm_header_t), 4096));
  pid_t pid = atomic_load(&r0->pid);
  return pid > 0 && process_dead(pid) ? pid : 0;
}

static tnt_result_t stale_segment(const shm_t *s, pid_t pid) {
  return tnt_fail(TNT_ERR_INVALID_USAGE,
                  "rank %d: the shared segment /dev/shm%s is left from a job with TNT_JOB_ID=%s that ended before "
                  "all its ranks started (its rank 0, pid %d, is gone). Remove it (rm /dev/shm%s) and start again, "
                  "or give every job a fresh TNT_JOB_ID (tntrun makes one per job, and removes what its jobs leave)",
                  G(s, s->pl.rank), s->name, s->pl.job_id, (int)pid, s->name);
}

/* The rank above this process that a failed set-up found (tnt_worker_of). */
static _Atomic int32_t worker_of_pid;

int tnt_worker_of(void) { return atomic_load(&worker_of_pid); }

/* A process started by a rank of a job whose ranks have all attached (tnt_ancestor_in_job). */
static tnt_result_t worker_of_started_job(const shm_t *s, pid_t rank_pid) {
  atomic_store(&worker_of_pid, (int32_t)rank_pid);
  return tnt_fail(TNT_ERR_INVALID_USAGE,
                  "this process (pid %d) was started by pid %d, directly or not, which is a rank of job %s, whose %d "
                  "ranks have all started: this process is not one of them (a worker of a rank, such as a process "
                  "pool's or a data loader's, made before or after tnt.init()) and cannot use collectives or the "
                  "rank API (it would claim rank %d a second time). Call them in the rank itself, and give a worker "
                  "what it needs (e.g. tnt.get_rank()) as an argument",
                  (int)getpid(), (int)rank_pid, s->pl.job_id, s->pl.size, G(s, s->pl.rank));
}

/* A process that a rank started (a worker made before its tnt.init(), which
 * inherited its TNT_RANK) and that calls in while the rank is still inside its
 * set-up: tnt_ancestor_in_job cannot see it yet (the name is not removed), but
 * the rank's claim names the worker's own ancestor. It fails alone: voiding the
 * segment, as a second job's claimant does, would fail the rank's whole job. */
static tnt_result_t worker_of_starting_rank(const shm_t *s, pid_t rank_pid) {
  atomic_store(&worker_of_pid, (int32_t)rank_pid);
  return tnt_fail(TNT_ERR_INVALID_USAGE,
                  "this process (pid %d) was started by pid %d, directly or not, which is rank %d of job %s (still "
                  "starting): this process is not a rank (a worker of a rank, such as a process pool's or a data "
                  "loader's) and cannot use collectives or the rank API (it would claim rank %d a second time). Call "
                  "them in the rank itself, and give a worker what it needs (e.g. tnt.get_rank()) as an argument",
                  (int)getpid(), (int)rank_pid, G(s, s->pl.rank), s->pl.job_id, G(s, s->pl.rank));
}

/* The words for a worker of this rank, started before its tnt_init, that has taken this
 * rank in a job of this id (ancestry.c: it inherited TNT_RANK and called in first). */
static void worker_took_rank(const shm_t *s, pid_t worker, char *out, size_t len) {
  snprintf(out, len,
           "rank %d of job %s was taken by pid %d, a worker that pid %d started before its tnt.init() (fork, a "
           "process pool, a data loader) and that used Tarantella first: a worker is not a rank, and the job cannot "
           "go on. Call tnt.init() in each rank before it starts workers, and keep collectives and the rank API out "
           "of the workers",
           G(s, s->pl.rank), s->pl.job_id, (int)worker, (int)getpid());
}

/* The words for process `other`, which holds rank `rank` of this job where this process
 * claims it too: this rank's own worker (worker_took_rank), or the rank of a second job
 * started under the same id. */
static void second_claimant(const shm_t *s, pid_t other, int rank, char *out, size_t len) {
  if (other > 0 && tnt_is_descendant(other))
    worker_took_rank(s, other, out, len);
  else
    snprintf(out, len,
             "two processes (pids %d and %d) claimed rank %d of job %s: two jobs were started with the same "
             "TNT_JOB_ID; give every job its own id (tntrun makes a fresh one per job)",
             (int)other, (int)getpid(), rank, s->pl.job_id);
}

/* Void the segment at `hdr` with `why`: every rank in it fails with that message. */
static void void_segment(shm_header_t *hdr, const char *why) {
  if (atomic_load(&hdr->collided)) return; /* the first reason stands */
  snprintf(hdr->collision, sizeof hdr->collision, "%s", why);
  atomic_store(&hdr->collided, 1);
}

/* A worker of this process (a descendant) that holds a segment of this job open and whose pid
 * is in this rank's block: it took the rank before this process called in. Its job (the
 * other ranks, with the worker in this rank's place) is voided with the words in `why`, and
 * the worker's pid returned; else 0. Descendants that hold it under other ranks are the ranks
 * a launcher of one's own started: they are left alone. */
static pid_t worker_holding_my_rank(const shm_t *s, char *why, size_t len) {
  enum { MAX_WORKERS = 256 };
  pid_t workers[MAX_WORKERS];
  const size_t head = align_up(sizeof(shm_header_t), 4096);
  int n = tnt_descendants(workers, MAX_WORKERS);
  for (int i = 0; i < n; i++) {
    int fd = tnt_open_object_of(workers[i], s->name);
    if (fd < 0) continue;
    struct stat st;
    pid_t took = 0;
    size_t block = block_bytes_for(s->pl.size, 0), need = head + (size_t)(s->pl.rank + 1) * block;
    /* its header first: the size of a rank block follows from the job's size and window */
    uint8_t *base = fstat(fd, &st) == 0 && (size_t)st.st_size >= head + block
                        ? mmap(NULL, head, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (base != MAP_FAILED) {
      shm_header_t *hdr = (shm_header_t *)base;
      int same_job = atomic_load(&hdr->magic) == SHM_MAGIC && hdr->size == (uint32_t)s->pl.size;
      block = block_bytes_for(s->pl.size, hdr->window_bytes);
      need = head + (size_t)(s->pl.rank + 1) * block;
      munmap(base, head);
      base = same_job && (size_t)st.st_size >= need ? mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                                    : MAP_FAILED;
    }
    if (base != MAP_FAILED) {
      const shm_rank_t *mine = (const shm_rank_t *)(base + head + (size_t)s->pl.rank * block);
      if (atomic_load(&mine->pid) == (int32_t)workers[i]) {
        took = workers[i];
        worker_took_rank(s, took, why, len);
        void_segment((shm_header_t *)base, why);
      }
      munmap(base, need);
    }
    close(fd);
    if (took) return took;
  }
  return 0;
}

/* Rank 0 found its segment's name taken: the error, naming a leftover (gone_rank0).
 * Where the segment's rank 0 lives, two jobs were started with one TNT_JOB_ID
 * and the other one is still setting up (the last rank to attach unlinks the
 * name): its ranks and ours are about to join it, whichever comes first, and
 * a rank of ours that did would compute with its rank 0, without a word (a
 * hand-made job started while another of the same id was attaching summed
 * the two jobs' data, and both exited 0). So void it as a second claimant of
 * any rank does (tnt_shm_init_group's compare-and-swap): every rank in it
 * fails with the collision, at the end of its set-up or its next wait. A
 * segment all of whose ranks attached is left alone: it is the other job's
 * own (its name is about to go). */
static tnt_result_t name_taken(const shm_t *s, int err) {
  int fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0);
  struct stat st;
  size_t need = align_up(sizeof(shm_header_t), 4096) + sizeof(shm_rank_t);
  pid_t gone = 0, other = 0, worker_of = 0;
  int voided = 0;
  char why[sizeof ((shm_header_t *)0)->collision] = "";
  if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077) && (size_t)st.st_size >= need) {
    uint8_t *base = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED) {
      shm_header_t *hdr = (shm_header_t *)base;
      /* its rank 0 stores the magic just after sizing it: wait for that a moment */
      for (int i = 0; i < 200 && atomic_load(&hdr->magic) != SHM_MAGIC; i++) usleep(1000);
      gone = gone_rank0(base);
      const shm_rank_t *r0 = (const shm_rank_t *)(base + align_up(sizeof(shm_header_t), 4096));
      if (!gone && atomic_load(&hdr->magic) == SHM_MAGIC && atomic_load(&hdr->attached.value) < hdr->size) {
        other = atomic_load(&r0->pid); /* 0 for a moment: it claims its block after the magic */
        worker_of = other > 0 && tnt_is_ancestor(other) ? other : 0;
        voided = !worker_of;
        if (voided) {
          second_claimant(s, other, 0, why, sizeof why);
          void_segment(hdr, why);
        }
      }
      munmap(base, need);
    }
  }
  if (fd >= 0) close(fd);
  if (gone) return stale_segment(s, gone);
  if (worker_of) return worker_of_starting_rank(s, worker_of);
  if (voided) return tnt_fail(TNT_ERR_INVALID_USAGE, "%s", why);
  return tnt_fail(TNT_ERR_SYSTEM, "shm_open(%s) failed: %s (a job with this TNT_JOB_ID exists: /dev/shm%s; use a fresh "
                  "id, or, if no job with this id runs, remove it: rm /dev/shm%s)", s->name, strerror(err), s->name,
                  s->name);
}

/* A joining rank's look at the segment rank 0 made, before it maps the whole of
 * it: 1 when it may, 0 while rank 0 is still setting it up, -1 (and *res) when it
 * never can. A rank whose segment would have another size (another TNT_SIZE,
 * TNT_SHM_SLOTS or TNT_SHM_SLOT_KB than rank 0's) or whose build has another
 * layout waited for a segment of its own size or magic until TNT_TIMEOUT_S ("is
 * rank 0 running with the same TNT_JOB_ID?"), or failed at once with "TNT_SIZE 2
 * vs 2" and wrote its failure where rank 0 did not look, while rank 0 waited
 * until TNT_TIMEOUT_S for it "to start". Now both fail at once, saying what
 * differs: rank 0 through the segment's collision (a disagreement) or its magic
 * word (another build, which cannot know the rest of the layout). */
static int joinable(shm_t *s, size_t file_size, tnt_result_t *res) {
  const size_t head = align_up(sizeof(shm_header_t), 4096), need = head + sizeof(shm_rank_t);
  if (file_size < need) return 0; /* rank 0 is still sizing it (any build's segment is larger) */
  uint8_t *base = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (base == MAP_FAILED) {
    *res = tnt_fail(TNT_ERR_SYSTEM, "mmap of %s failed: %s", s->name, strerror(errno));
    return -1;
  }
  shm_header_t *hdr = (shm_header_t *)base;
  const shm_rank_t *r0 = (const shm_rank_t *)(base + head);
  uint32_t magic = atomic_load(&hdr->magic);
  int verdict = 0;
  pid_t gone = gone_rank0(base);
  if (gone) { /* never join it, nor mark it: the new rank 0 finds it and says the same */
    *res = stale_segment(s, gone);
    verdict = -1;
  } else if (magic == SHM_MAGIC && hdr->size == (uint32_t)s->pl.size && hdr->total_bytes == s->total) {
    verdict = 1;
  } else if (magic == SHM_MAGIC) {
    char differs[256];
    if (hdr->size != (uint32_t)s->pl.size)
      snprintf(differs, sizeof differs, "it has TNT_SIZE=%d, rank %d (pid %d, which made the job's shared memory) "
               "TNT_SIZE=%u", s->pl.size, G(s, 0), (int)atomic_load(&r0->pid), hdr->size);
    else
      snprintf(differs, sizeof differs, "its shared-memory window is %llu bytes, rank %d's (pid %d) %llu: "
               "TNT_SHM_SLOTS or TNT_SHM_SLOT_KB differ", (unsigned long long)s->total, G(s, 0),
               (int)atomic_load(&r0->pid), (unsigned long long)hdr->total_bytes);
    if (!atomic_load(&hdr->collided)) {
      snprintf(hdr->collision, sizeof hdr->collision, "rank %d (pid %d) disagrees with the job %s on its set-up: %s; "
               "give every rank the same environment (tntrun does), and every job its own TNT_JOB_ID", G(s, s->pl.rank), (int)getpid(),
               s->pl.job_id, differs);
      atomic_store(&hdr->collided, 1);
    }
    *res = tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d (pid %d) disagrees with the job %s on its set-up: %s; give every "
                    "rank the same environment (tntrun does), and every job its own TNT_JOB_ID", G(s, s->pl.rank),
                    (int)getpid(), s->pl.job_id, differs);
    verdict = -1;
  } else if (magic == SHM_MAGIC_FOREIGN) { /* a rank of another build came first, and voided it */
    *res = tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d: a rank of another build of Tarantella (another layout of the "
                    "shared memory) tried to join job %s, and failed: every rank must run the same release of "
                    "Tarantella (the same install, or the same version built alike)", G(s, s->pl.rank), s->pl.job_id);
    verdict = -1;
  } else if (magic != 0) {
    uint32_t theirs = magic;
    atomic_compare_exchange_strong(&hdr->magic, &theirs, SHM_MAGIC_FOREIGN);
    *res = tnt_fail(TNT_ERR_INVALID_USAGE, "rank %d: the shared memory of job %s (/dev/shm%s) has another layout "
                    "(0x%08x) than this build of Tarantella makes (0x%08x): rank %d runs another build or release; "
                    "every rank must run the same release of Tarantella (the same install)", G(s, s->pl.rank),
                    s->pl.job_id, s->name, magic, SHM_MAGIC, G(s, 0));
    verdict = -1;
  }
  munmap(base, need);
  return verdict;
}

tnt_result_t tnt_shm_init_group(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes,
                                const int *global, void **state) {
  shm_t *s = calloc(1, sizeof *s);
  if (!s) return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  s->pl = *pl;
  s->fd = -1;
  s->ranks = calloc((size_t)pl->size, sizeof *s->ranks);
  s->exch = calloc((size_t)pl->size, sizeof *s->exch);
  s->windows = calloc((size_t)pl->size, sizeof *s->windows);
  s->global = calloc((size_t)pl->size, sizeof *s->global);
  if (!s->ranks || !s->exch || !s->windows || !s->global) {
    shm_free(s);
    return tnt_fail(TNT_ERR_SYSTEM, "out of memory");
  }
  for (int i = 0; i < pl->size; i++) s->global[i] = global ? global[i] : i;
  s->spin_s = params->spin_s; /* spin_allowed decides per wait, from the whole host's state */
  s->online = tnt_online_cpus();
  /* named as the network transports name a rank (peer_health.h: "pid N on HOST"), so
   * that a rank lost on a host of several reads alike whichever transport saw it first */
  if (gethostname(s->host, sizeof s->host) != 0) snprintf(s->host, sizeof s->host, "this host");
  s->host[sizeof s->host - 1] = 0;
  snprintf(s->name, sizeof s->name, "/tnt-%s", pl->job_id);
  s->total = align_up(sizeof(shm_header_t), 4096) + (size_t)pl->size * block_bytes_for(pl->size, window_bytes);
  double deadline = tnt_now() + params->timeout_s, next_check = tnt_now() + SLICE_S;
  tnt_result_t res = TNT_SUCCESS;
  s->setting_up = 1;
  s->setup_timeout_s = params->timeout_s;
  /* 0 for a failure that is not this job's own (a leftover or another job's segment): the
   * failure path leaves no mark for it (a worker of a rank, a voided job: neither do they) */
  int own_failure = 1;

  /* a worker a rank started before its tnt_init inherited TNT_RANK and TNT_JOB_ID: refuse it
   * before it makes a second job under the same name (ancestry.c) */
  pid_t rank_above = tnt_ancestor_in_job(s->name);
  if (rank_above) {
    res = worker_of_started_job(s, rank_above);
    goto fail;
  }
  /* and the other way round: such a worker that called in first took this rank. Its job
   * goes (voided), and this process says why instead of making a second job of this id */
  char took_why[sizeof s->hdr->collision];
  if (worker_holding_my_rank(s, took_why, sizeof took_why)) {
    res = tnt_fail(TNT_ERR_INVALID_USAGE, "%s", took_why);
    leave_void_mark(s, took_why); /* for the ranks of this launch still to come */
    own_failure = 0;              /* the mark says it: not "rank N failed to start" */
    goto fail;
  }
  if (pl->rank == 0) {
    if (voided_lately(s, params->timeout_s, 1, &res)) goto fail; /* a job of this id was voided: it is over */
    tnt_job_void_sweep_stale();
    s->fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (s->fd < 0) {
      const int taken = errno == EEXIST; /* another job's, or a leftover: name_taken says which */
      res = taken ? name_taken(s, errno)
                  : tnt_fail(TNT_ERR_SYSTEM, "shm_open(%s) failed: %s", s->name, strerror(errno));
      own_failure = !taken;
      goto fail;
    }
    /* fail now, not with SIGBUS later. tmpfs gives up with EINTR when a signal with a
     * handler arrives while it reserves (SA_RESTART does not restart fallocate): the
     * core's own SIGCONT handler, the program's, or a Ctrl-C, which the set-up's check
     * then reports as such; any other signal is no reason to fail, so try again */
    int err;
    while ((err = posix_fallocate(s->fd, 0, (off_t)s->total)) == EINTR) {
      if ((res = tnt_setup_interrupt_check()) != TNT_SUCCESS) break;
    }
    if (err == EINTR) goto fail; /* interrupted: the name goes there */
    if (err) {
      res = tnt_fail(TNT_ERR_SYSTEM, "cannot reserve %zu bytes of shared memory in /dev/shm for %d ranks: %s (in a "
                     "container, give it more, e.g. docker run --shm-size=1g; or shrink each rank's window with "
                     "TNT_SHM_SLOTS or TNT_SHM_SLOT_KB)", s->total, pl->size, strerror(err));
      shm_unlink(s->name);
      goto fail;
    }
  } else {
    int seen_uninitialized = 0;
    for (;;) {
      s->fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0600);
      if (s->fd >= 0) {
        struct stat st;
        if (fstat(s->fd, &st) != 0) {
          res = tnt_fail(TNT_ERR_SYSTEM, "fstat(%s) failed: %s", s->name, strerror(errno));
          goto fail;
        }
        /* never join a segment another user made, or one others may write */
        if (st.st_uid != geteuid() || (st.st_mode & 077)) {
          res = tnt_fail(TNT_ERR_INVALID_USAGE,
                         "shared segment %s belongs to uid %u with mode %03o, not to this user (uid %u) with mode 600: "
                         "refusing to join it; use a fresh TNT_JOB_ID (tntrun makes one per job)",
                         s->name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
          close(s->fd);
          s->fd = -1; /* not ours: never unlink it */
          own_failure = 0;
          goto fail;
        }
        int ok = joinable(s, (size_t)st.st_size, &res);
        if (ok > 0) break;
        seen_uninitialized = ok == 0; /* its name is there, its header not (yet): a leftover, if it stays so */
        close(s->fd);
        s->fd = -1; /* rank 0's, not ours: never unlink it */
        if (ok < 0) { /* a leftover (rank 0 says so too), or the collision that voids the job */
          own_failure = 0;
          goto fail;
        }
      } else if (errno != ENOENT) {
        res = tnt_fail(TNT_ERR_SYSTEM, "shm_open(%s) failed: %s", s->name, strerror(errno));
        goto fail;
      } else {
        seen_uninitialized = 0;
      }
      if ((res = tnt_host_marks_poll()) != TNT_SUCCESS) goto fail; /* rank 0 took another transport */
      if ((res = tnt_setup_interrupt_check()) != TNT_SUCCESS) goto fail; /* Ctrl-C */
      if (tnt_now() >= next_check) { /* a file read: not at every poll */
        next_check = tnt_now() + SLICE_S;
        /* a worker of a rank that was still starting when it called in, and whose job has
         * started meanwhile (its name is gone): it waited until TNT_TIMEOUT_S */
        if ((rank_above = tnt_ancestor_in_job(s->name)) != 0) {
          res = worker_of_started_job(s, rank_above);
          goto fail;
        }
        if ((res = check_ended_before_joining(s, 0, "waiting for rank 0 to create the job's shared memory")) !=
            TNT_SUCCESS)
          goto fail;
        /* no segment, and the job of this id was voided (its name removed): nothing will make one */
        if (s->fd < 0 && voided_lately(s, params->timeout_s, 0, &res)) goto fail;
      }
      if (tnt_now() > deadline) {
        if (seen_uninitialized)
          res = tnt_fail(TNT_ERR_TIMEOUT, "rank %d: shared segment /dev/shm%s was never initialized by rank 0 (if no "
                         "job with this TNT_JOB_ID runs, a killed one left it: rm /dev/shm%s)", pl->rank, s->name,
                         s->name);
        else
          res = tnt_fail(TNT_ERR_TIMEOUT, "rank %d waited %.0f s for rank 0 to create %s: is rank 0 running with the same TNT_JOB_ID?",
                         pl->rank, params->timeout_s, s->name);
        goto fail;
      }
      usleep(1000); /* set-up only */
    }
  }
  s->base = mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (s->base == MAP_FAILED) {
    res = tnt_fail(TNT_ERR_SYSTEM, "mmap of %zu bytes failed: %s", s->total, strerror(errno));
    goto fail;
  }
  s->hdr = (shm_header_t *)s->base;
  layout(s, window_bytes);
  if (pl->rank == 0) {
    s->hdr->size = (uint32_t)pl->size;
    s->hdr->total_bytes = s->total;
    s->hdr->window_bytes = window_bytes;
    atomic_store(&s->hdr->magic, SHM_MAGIC);
  } else {
    while (atomic_load(&s->hdr->magic) != SHM_MAGIC) {
      if ((res = tnt_setup_interrupt_check()) != TNT_SUCCESS) goto fail;
      if (tnt_now() > deadline) {
        res = tnt_fail(TNT_ERR_TIMEOUT, "rank %d: shared segment /dev/shm%s was never initialized by rank 0 (if no job "
                       "with this TNT_JOB_ID runs, a killed one left it: rm /dev/shm%s)", pl->rank, s->name, s->name);
        goto fail;
      }
      usleep(1000);
    }
    pid_t gone = gone_rank0(s->base);
    if (gone) { /* never join it, nor remove it: the new rank 0 finds it and says the same */
      res = stale_segment(s, gone);
      s->ranks[pl->rank] = NULL; /* not ours: the failure path must not mark it */
      close(s->fd);
      s->fd = -1;
      own_failure = 0;
      goto fail;
    }
    if (s->hdr->size != (uint32_t)pl->size || s->hdr->total_bytes != s->total) {
      res = tnt_fail(TNT_ERR_INVALID_ARGUMENT, "rank %d disagrees with rank 0 on the job: TNT_SIZE %d vs %u, or different TNT_SHM_* settings; give every rank the same environment",
                     pl->rank, pl->size, s->hdr->size);
      goto fail;
    }
  }
  shm_rank_t *me = s->ranks[pl->rank];
  int32_t nobody = 0;
  if (!atomic_compare_exchange_strong(&me->pid, &nobody, (int32_t)getpid()) && nobody > 0 &&
      tnt_is_ancestor(nobody)) {
    res = worker_of_starting_rank(s, nobody); /* the rank's own worker: the job is not void */
    s->ranks[pl->rank] = NULL;              /* not ours: the failure path must not mark it */
    close(s->fd);
    s->fd = -1; /* nor unlink the name: the job's ranks are still attaching */
    goto fail;
  }
  if (nobody != 0) {
    /* another process holds this rank: two jobs share the id, or this rank's own worker
     * took it. Void the whole segment so that nobody computes with a stranger's data. */
    char why[sizeof s->hdr->collision];
    second_claimant(s, nobody, pl->rank, why, sizeof why);
    void_segment(s->hdr, why);
    bump(&s->hdr->attached);
    res = tnt_fail(TNT_ERR_INVALID_USAGE, "%s", s->hdr->collision);
    s->ranks[pl->rank] = NULL; /* not ours: the failure path must not mark it */
    leave_void_mark(s, s->hdr->collision);
    shm_unlink(s->name);
    goto fail;
  }
  atomic_store(&me->root_peer, -1);
  atomic_store(&me->state, RANK_ALIVE);
  s->ncpu = add_my_cpus(s->hdr); /* this rank's own, for the attach wait; then the host's (host_cpus) */
  uint32_t attached = atomic_fetch_add(&s->hdr->attached.value, 1) + 1;
  if (atomic_load(&s->hdr->attached.waiters)) futex(&s->hdr->attached.value, FUTEX_WAKE, INT_MAX, NULL);
  if (attached == (uint32_t)pl->size) shm_unlink(s->name); /* everyone is in: nothing can leak from now on */
  res = wait_word(s, &s->hdr->attached, (uint32_t)pl->size, -1, deadline, "waiting for every rank to attach");
  if (res == TNT_ERR_TIMEOUT) {
    char missing[256] = "";
    size_t used = 0;
    for (int r = 0; r < pl->size && used < sizeof missing - 12; r++)
      if (atomic_load(&s->ranks[r]->state) == RANK_EMPTY)
        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", G(s, r));
    res = tnt_fail(TNT_ERR_TIMEOUT, "rank %d waited %.0f s (TNT_TIMEOUT_S) for ranks [%s] to start: launch every rank "
                   "of the job (TNT_SIZE=%d) with the same TNT_JOB_ID, e.g. with tntrun",
                   pl->rank, params->timeout_s, missing, pl->size);
  }
  if (res == TNT_SUCCESS) res = check_voided(s);
  if (res != TNT_SUCCESS) goto fail;
  s->ncpu = host_cpus(s->hdr); /* every rank has added its mask: the same count on every rank */
  s->setting_up = 0;
  *state = s;
  TNT_INFO("shm: %s, %zu bytes, %d ranks on %ld cores (the CPUs they may run on, of %ld online)", s->name, s->total,
           pl->size, s->ncpu, s->online);
  return TNT_SUCCESS;
fail:
  /* The ranks still to come (of this launch, late to call in: a long import) cannot read this
   * failure in the segment, whose name goes now or was never found: they waited for a rank 0
   * until TNT_TIMEOUT_S (a rank 0 interrupted with Ctrl-C), or, a rank 0, made a new segment and
   * waited for this rank. The job's mark names it (job_void.h), before this rank's block says it
   * failed, so that the mark's reason is this rank's own and not that of a peer that saw it fail.
   * None where every rank attached (they see it in the segment), for a voided job (its own mark),
   * a failure on a mark (the first reason stands), a worker of a rank, or another job's segment. */
  if (own_failure && !s->failed_on_mark && !tnt_worker_of() &&
      !(s->hdr && (atomic_load(&s->hdr->collided) || atomic_load(&s->hdr->attached.value) >= (uint32_t)pl->size)))
    tnt_job_void_note_failed_rank(s->name, G(s, pl->rank), s->setup_timeout_s, tnt_last_error());
  if (s->base && s->base != MAP_FAILED && pl->rank < pl->size && s->ranks[pl->rank]) {
    /* why, for the ranks that attached: they read "rank N aborted ()" without the rank it waited for */
    snprintf(s->ranks[pl->rank]->reason, sizeof s->ranks[pl->rank]->reason, "%s", tnt_last_error());
    atomic_store(&s->ranks[pl->rank]->state, RANK_FAILED);
  }
  /* the set-up failed: leave no name behind (ranks already attached keep their mapping), but
   * the mark of a voided job for the ranks that come later */
  if (s->fd >= 0 && s->hdr && atomic_load(&s->hdr->collided)) leave_void_mark(s, s->hdr->collision);
  if (s->fd >= 0) shm_unlink(s->name);
  shm_free(s);
  return res;
}

static tnt_result_t shm_init(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes, void **state) {
  return tnt_shm_init_group(pl, params, window_bytes, NULL, state);
}

/* A put is a memcpy, complete when it returns; one from the send buffer below
 * is already in place. */
static tnt_result_t shm_put(void *st, int peer, size_t offset, const void *src, size_t len) {
  shm_t *s = st;
  uint8_t *dst = s->windows[peer] + offset;
  if (src != dst) tnt_put_copy(&s->put_copier, dst, src, len); /* plain, or streaming while the cores are far */
  return TNT_SUCCESS;
}

static tnt_result_t shm_fence(void *st, int peer, double deadline) {
  (void)st, (void)peer, (void)deadline;
  return TNT_SUCCESS;
}

/* The peer's window itself: a piece scaled or reduced into it is delivered
 * without a copy (the peer reads it only after the notify). */
static void *shm_send_buffer(void *st, int peer, size_t offset, size_t len) {
  shm_t *s = st;
  return offset + len <= s->hdr->window_bytes ? s->windows[peer] + offset : NULL;
}

static void *shm_window(void *st) {
  shm_t *s = st;
  return s->windows[s->pl.rank];
}

static tnt_result_t shm_notify(void *st, int peer, int kind) {
  shm_t *s = st;
  bump(&s->ranks[peer]->counters[kind * s->pl.size + s->pl.rank]);
  return TNT_SUCCESS;
}

static tnt_result_t shm_wait(void *st, int kind, int from, uint32_t target, double deadline) {
  shm_t *s = st;
  shm_word_t *w = &s->ranks[s->pl.rank]->counters[kind * s->pl.size + from];
  if (word_reached_soon(s, w, target)) return TNT_SUCCESS; /* without formatting the message below */
  char what[96];
  snprintf(what, sizeof what, "waiting for %s from rank %d", kind % 2 == TNT_NOTIFY_DATA ? "data" : "a free slot",
           G(s, from));
  return sleep_until_word(s, w, target, from, deadline, what);
}

/* Publish this rank's bytes for the next round (double-buffered: a rank is at
 * most one round ahead of the slowest, so the other buffer is never being read).
 * One arrival counter for the host: the last rank to post a round wakes every
 * sleeper of that round with one system call (no N^2 wake-ups). */
static tnt_result_t shm_exchange_post(void *st, const void *mine, size_t len, double deadline) {
  shm_t *s = st;
  if (len > SHM_EXCHANGE_BYTES) return tnt_fail(TNT_ERR_INTERNAL, "exchange of %zu bytes is too large", len);
  if (s->exch_posted) return tnt_fail(TNT_ERR_INTERNAL, "exchange posted twice");
  /* a job voided after it started (a worker had taken a rank: worker_holding_my_rank) ends
   * at its next cycle, not only at the next wait long enough to check */
  TNT_CHECK(check_voided(s));
  uint32_t round = ++s->exch_round, buf = round & 1;
  shm_rank_t *me = s->ranks[s->pl.rank];
  uint8_t *at = s->exch[s->pl.rank] + buf * SHM_EXCHANGE_BYTES;
  if (mine != at) memcpy(at, mine, len); /* else built in place (shm_exchange_buffer) */
  me->exch_len[buf] = (uint32_t)len;
  atomic_store_explicit(&me->exch_seq.value, round, memory_order_release); /* publishes the bytes above */
  uint32_t arrived = atomic_fetch_add(&s->hdr->arrived.value, 1) + 1;
  if (arrived == round * (uint32_t)s->pl.size && atomic_load(&s->hdr->arrived.waiters))
    futex(&s->hdr->arrived.value, FUTEX_WAKE, INT_MAX, NULL);
  s->exch_posted = 1;
  s->exch_deadline = deadline;
  return TNT_SUCCESS;
}

/* Every rank's bytes of the posted round, where they lie in the segment. They
 * stay there until this rank posts again: a peer overwrites its buffer of this
 * round only two rounds on, and it can post the next one only after this rank
 * has. `until` may end the wait before the round's own deadline: then
 * TNT_IN_PROGRESS, and a later call (from any thread holding the engine)
 * resumes it. */
static tnt_result_t shm_exchange_view(void *st, const uint8_t **msgs, size_t *lens, size_t max, double until) {
  shm_t *s = st;
  if (!s->exch_posted) return tnt_fail(TNT_ERR_INTERNAL, "exchange collected before it was posted");
  uint32_t round = s->exch_round, buf = round & 1;
  double deadline = until < s->exch_deadline ? until : s->exch_deadline;
  tnt_result_t res = wait_word(s, &s->hdr->arrived, round * (uint32_t)s->pl.size, FROM_EXCHANGE, deadline,
                               "negotiating with the other ranks");
  if (res == TNT_ERR_TIMEOUT && deadline < s->exch_deadline) return TNT_IN_PROGRESS;
  TNT_CHECK(res);
  s->bells_owed = 0;
  for (int r = 0; r < s->pl.size; r++) {
    lens[r] = s->ranks[r]->exch_len[buf];
    if (lens[r] > max) return tnt_fail(TNT_ERR_INTERNAL, "rank %d published %zu exchange bytes, more than %zu", r, lens[r], max);
    msgs[r] = s->exch[r] + buf * SHM_EXCHANGE_BYTES;
  }
  s->exch_posted = 0;
  return TNT_SUCCESS;
}

/* The buffer the next round publishes. The peers stopped reading it when they
 * posted the round this rank last collected, two rounds after it was written. */
static void *shm_exchange_buffer(void *st, size_t *capacity) {
  shm_t *s = st;
  *capacity = SHM_EXCHANGE_BYTES;
  return s->exch_posted ? NULL : s->exch[s->pl.rank] + ((s->exch_round + 1) & 1) * SHM_EXCHANGE_BYTES;
}

void *tnt_shm_exchange_area(void *st, int rank, int parity, size_t *capacity) {
  shm_t *s = st;
  *capacity = SHM_EXCHANGE_BYTES;
  return rank >= 0 && rank < s->pl.size ? s->exch[rank] + (size_t)(parity & 1) * SHM_EXCHANGE_BYTES : NULL;
}

/* The same, copied out into all[r * stride]. */
static tnt_result_t shm_exchange_collect(void *st, void *all, size_t stride, size_t *lens, double until) {
  shm_t *s = st;
  const uint8_t *msgs[s->pl.size];
  TNT_CHECK(shm_exchange_view(st, msgs, lens, stride, until));
  for (int r = 0; r < s->pl.size; r++) memcpy((uint8_t *)all + (size_t)r * stride, msgs[r], lens[r]);
  return TNT_SUCCESS;
}

static tnt_result_t shm_exchange(void *st, const void *mine, size_t len, void *all, size_t stride, size_t *lens,
                                 double deadline) {
  if (len > stride) return tnt_fail(TNT_ERR_INTERNAL, "exchange of %zu bytes is too large", len);
  TNT_CHECK(shm_exchange_post(st, mine, len, deadline));
  return shm_exchange_collect(st, all, stride, lens, deadline);
}

static void shm_ring_doorbell(void *st, uint64_t cycle) {
  shm_t *s = st;
  uint64_t cur = atomic_load(&s->hdr->cycle_wanted);
  while (cur < cycle && !atomic_compare_exchange_weak(&s->hdr->cycle_wanted, &cur, cycle)) {
  }
  s->bells_owed = 1; /* rung by the wait for the cycle's exchange, for the peers that did not join (pay_bells) */
}

static int bell_rang(shm_t *s, const void *done) {
  return atomic_load(&s->ranks[s->pl.rank]->bell.value) != s->bell_seen ||
         atomic_load(&s->hdr->cycle_wanted) > *(const uint64_t *)done;
}

static void shm_wait_doorbell(void *st, uint64_t done, double deadline) {
  shm_t *s = st;
  shm_word_t *bell = &s->ranks[s->pl.rank]->bell;
  /* the next request usually follows within microseconds (a training step
   * submits its gradients back to back): spin briefly before sleeping */
  spin_until(s, bell_rang, &done);
  for (;;) {
    uint32_t b = atomic_load(&bell->value);
    if (b != s->bell_seen || atomic_load(&s->hdr->cycle_wanted) > done) {
      s->bell_seen = b;
      return;
    }
    double now = tnt_now();
    if (now >= deadline) return;
    struct timespec ts = tnt_timespec(deadline - now < 1.0 ? deadline - now : 1.0);
    /* published before the last look at cycle_wanted: a peer that asks for a
     * cycle after it rings this bell (pay_bells), one that asked before is seen */
    /* on the peers' clock (tnt_now_us: the monotonic one), not on this process's tnt_now, less its pauses */
    atomic_store(&s->ranks[s->pl.rank]->nap_until_us,
                 deadline < 1e12 ? (int64_t)(deadline * 1e6) + atomic_load(&tnt_pause_offset_ns) / 1000 : INT64_MAX);
    atomic_fetch_add(&bell->waiters, 1);
    if (atomic_load(&bell->value) == b && atomic_load(&s->hdr->cycle_wanted) <= done) futex(&bell->value, FUTEX_WAIT, b, &ts);
    atomic_fetch_sub(&bell->waiters, 1);
    atomic_store(&s->ranks[s->pl.rank]->nap_until_us, 0);
  }
}

static int shm_cycle_wanted(void *st, uint64_t done) {
  shm_t *s = st;
  return atomic_load(&s->hdr->cycle_wanted) > done;
}

static tnt_result_t shm_check_peers(void *st, const uint8_t *awaited) {
  return check_all((shm_t *)st, awaited, "waiting for the other ranks to submit the same collectives");
}

static void shm_wake_local(void *st) {
  shm_t *s = st;
  bump(&s->ranks[s->pl.rank]->bell);
}

static void shm_abort(void *st, const char *reason, int root_peer) {
  shm_t *s = st;
  shm_rank_t *me = s->ranks[s->pl.rank];
  snprintf(me->reason, sizeof me->reason, "%s", reason ? reason : "aborted");
  atomic_store(&me->root_peer, root_peer);
  atomic_store(&me->state, RANK_FAILED);
}

static void shm_finalize(void *st) {
  shm_t *s = st;
  shm_rank_t *me = s->ranks[s->pl.rank];
  uint32_t expected = RANK_ALIVE;
  atomic_compare_exchange_strong(&me->state, &expected, RANK_EXITED);
  shm_free(s);
}

const tnt_transport_t tnt_transport_shm = {
    .name = "shm",
    .can_serve = shm_can_serve,
    .init = shm_init,
    .put = shm_put,
    .fence = shm_fence,
    .send_buffer = shm_send_buffer,
    .window = shm_window,
    .notify = shm_notify,
    .wait = shm_wait,
    .exchange = shm_exchange,
    .exchange_post = shm_exchange_post,
    .exchange_collect = shm_exchange_collect,
    .exchange_view = shm_exchange_view,
    .exchange_buffer = shm_exchange_buffer,
    .ring_doorbell = shm_ring_doorbell,
    .cycle_wanted = shm_cycle_wanted,
    .wait_doorbell = shm_wait_doorbell,
    .check_peers = shm_check_peers,
    .describe_peer = shm_describe_peer,
    .wake_local = shm_wake_local,
    .abort = shm_abort,
    .finalize = shm_finalize,
    .wait_stats = shm_wait_stats,
    .cores = shm_cores,
};
