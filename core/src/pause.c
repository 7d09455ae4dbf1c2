/* pause.c - a pause of the whole process (SIGSTOP, Ctrl+Z through tntrun) is no
 * peer's silence (common.h's tnt_now).
 *
 * Every wait of the core is bounded by a deadline on tnt_now()'s clock
 * (TNT_TIMEOUT_S after it began). Ranks stopped together (tntrun's Ctrl+Z, a
 * `kill -STOP` of every rank) and continued later found, once continued, that
 * their deadlines had passed while they were stopped, and failed: a rank that
 * waited for a peer still computing named it "alive but did not answer". So
 * tnt_now() does not count the time this process was stopped: it is the
 * monotonic clock less `tnt_pause_offset_ns`, which grows by each pause.
 *
 * A process cannot see itself stop (SIGSTOP has no handler), only its
 * continuation: SIGCONT, whose handler (installed by tnt_pause_arm, chained in
 * front of the program's own) notes it. The pause is the gap since the last
 * reading of the clock by any thread of the process (`tnt_clock_seen_ns`):
 * while a wait is under way its thread reads the clock at least every slice
 * of its sleep (0.1 s, 1 s for the background thread's nap), so the gap is
 * the pause and at most such a slice more (a deadline then comes that much
 * later, never sooner). The gap is counted only after a SIGCONT: a gap without
 * one (a process that had no wait under way, or that the machine did not run)
 * is time that counts, as before.
 *
 * The threads resume together, and one of them may read the clock before the
 * handler (run by another) has counted the pause: a reader that finds a gap
 * of PAUSE_EVIDENCE_GAP_NS or more without a SIGCONT noted waits up to
 * EVIDENCE_WAIT_NS for one, so that it does not take its deadline for passed.
 *
 * A handler the program installs after ours (Python's signal.signal) replaces
 * it: the slow path of tnt_now puts ours back in front of it (rearm_if_replaced).
 *
 * A rank stopped alone is reported as before: its peers, not stopped, count
 * their waits in full and fail at TNT_TIMEOUT_S naming it ("is stopped").
 *
 * A process can also not run without a signal: a virtual machine that the host
 * did not run for seconds (CI machines did, twice in ~15 runs of one test), a
 * debugger's ptrace stop, a machine too loaded to schedule it. Every rank of
 * a job then found, once it ran again, that its deadlines had passed while it
 * could not look, and the first to wake failed its wait ("ranks [1] never
 * submitted it") just before the peer, a moment behind, submitted. While the
 * engine's background thread runs (tnt_pause_watch), some thread reads the
 * clock at least every second (its nap), so a gap of PAUSE_EVIDENCE_GAP_NS or
 * more between two readings is time this process was not run, and counts as
 * a pause with or without a SIGCONT. A peer's silence is then timed over the
 * time this process could watch it: a hang is still found, TNT_TIMEOUT_S of
 * this process's running time after it began. Outside that window (set-up,
 * after tnt.shutdown(), a forked child) nothing reads the clock on a timer,
 * and a gap is time, as before. */
#define _GNU_SOURCE
#include "pause.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "common.h"

_Atomic int64_t tnt_pause_offset_ns;
_Atomic int64_t tnt_clock_seen_ns;

/* A gap this long between two readings, without a SIGCONT yet, is worth waiting
 * for one: longer than the longest sleep of a waiting thread between readings
 * (the background thread naps for 1 s at most), so that ordinary waits never
 * pay for it. */
#define PAUSE_EVIDENCE_GAP_NS 1500000000LL
#define EVIDENCE_WAIT_NS 20000000LL /* how long such a reader waits for the handler */

static _Atomic int watched;            /* the background thread reads the clock every second (tnt_pause_watch) */
static _Atomic uint32_t conts;         /* SIGCONTs received */
static _Atomic uint32_t conts_counted; /* ... of which the pause was counted */
static atomic_flag counting = ATOMIC_FLAG_INIT;
/* The program's SIGCONT handler, called after ours: two slots, so that a re-arm (below)
 * never rewrites the one a handler running on another thread reads. */
static struct sigaction previous[2];
static _Atomic int previous_at;
static _Atomic int armed;
/* A handler the program installs after ours (Python's signal.signal(SIGCONT, ...)) replaces
 * it, and the job's pauses counted again: the slow path looks every HANDLER_CHECK_NS
 * whether ours is still in place, and puts it back in front of the program's. */
#define HANDLER_CHECK_NS 250000000LL
static int64_t handler_checked_ns; /* under `counting` */
static void rearm_if_replaced(int64_t raw);

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The shortest gap counted as a pause. A waiting thread reads the clock at
 * least every 0.1 s, so while a deadline runs the gaps are shorter than this
 * unless the process was really stopped; SIGCONTs sent to a process that was
 * not stopped (a tool that sends them over and over: every 50 ms stretched a
 * TNT_TIMEOUT_S of 3 s to 15 s, each counting the gap since the last reading)
 * then count nothing. A pause shorter than this counts as time, as before. */
#define PAUSE_MIN_NS 250000000LL

/* Under `counting`: the gap from the last reading to `raw`, counted as a pause
 * when a SIGCONT came since the last count, or when it is too long for a
 * process that ran while watched; the reading advanced to `raw`. A SIGCONT
 * whose gap is too short stays uncounted: a thread that read the clock just
 * before the process stopped may count first, with a reading from before the
 * pause, and the pause is then counted by the next reading. */
static void count_gap(int64_t raw) {
  const int64_t seen = atomic_load(&tnt_clock_seen_ns);
  if (raw <= seen) return;
  const uint32_t n = atomic_load(&conts);
  const int continued = n != atomic_load(&conts_counted) && raw - seen >= PAUSE_MIN_NS;
  if (continued || (atomic_load(&watched) && raw - seen >= PAUSE_EVIDENCE_GAP_NS)) {
    atomic_fetch_add(&tnt_pause_offset_ns, raw - seen); /* first: a reader that sees the new reading sees it */
    if (continued) atomic_store(&conts_counted, n);
  }
  atomic_store(&tnt_clock_seen_ns, raw);
}

/* The time of a reading `raw` (tnt_now's slow path: the reading is due for an
 * update, or a pause was counted since the caller read the offset). Never a
 * time before the latest reading: a thread that read the clock before a pause
 * and the offset after it would otherwise get a time early by the pause (a
 * deadline computed from it too early). */
double tnt_now_slow(int64_t raw) {
  if (atomic_load(&armed)) {
    while (atomic_flag_test_and_set(&counting)) sched_yield(); /* another thread counts: a moment */
    const int64_t seen = atomic_load(&tnt_clock_seen_ns);
    if (raw - seen >= PAUSE_EVIDENCE_GAP_NS && atomic_load(&conts) == atomic_load(&conts_counted) &&
        !atomic_load(&watched)) { /* watched, the gap counts either way */
      /* a pause, whose SIGCONT another thread is about to handle? (the handler
       * only notes it while we hold `counting`) */
      const int64_t until = mono_ns() + EVIDENCE_WAIT_NS;
      const struct timespec nap = {0, 1000000};
      while (atomic_load(&conts) == atomic_load(&conts_counted) && mono_ns() < until) nanosleep(&nap, NULL);
    }
    count_gap(raw);
    if (raw - handler_checked_ns >= HANDLER_CHECK_NS) rearm_if_replaced(raw);
    const int64_t now = atomic_load(&tnt_clock_seen_ns), off = atomic_load(&tnt_pause_offset_ns);
    atomic_flag_clear(&counting); /* read under it: every count adds the offset and moves the reading */
    return (double)(now - off) * 1e-9;
  }
  if (raw > atomic_load(&tnt_clock_seen_ns)) atomic_store(&tnt_clock_seen_ns, raw); /* nothing counts pauses */
  return (double)(raw - atomic_load(&tnt_pause_offset_ns)) * 1e-9;
}

static void on_sigcont(int sig, siginfo_t *info, void *context) {
  atomic_fetch_add(&conts, 1);
  /* the thread this interrupted may hold `counting`: it then counts the gap itself */
  if (!atomic_flag_test_and_set(&counting)) {
    count_gap(mono_ns());
    atomic_flag_clear(&counting);
  }
  const struct sigaction *prev = &previous[atomic_load(&previous_at)];
  if (prev->sa_flags & SA_SIGINFO) prev->sa_sigaction(sig, info, context);
  else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) prev->sa_handler(sig);
}

/* Install on_sigcont in front of the handler `now` (the current one); 0 on success. The
 * handler actually replaced (one the program installed since `now` was read) is the one
 * chained. */
static int install(const struct sigaction *now) {
  const int slot = !atomic_load(&previous_at);
  previous[slot] = *now;
  atomic_store(&previous_at, slot);
  struct sigaction ours, replaced;
  memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = on_sigcont;
  ours.sa_mask = now->sa_mask;
  /* SA_RESTART: the program's system calls go on after the continuation, as they
   * did without a handler */
  ours.sa_flags = (now->sa_flags | SA_SIGINFO | SA_RESTART) & ~SA_RESETHAND;
  if (sigaction(SIGCONT, &ours, &replaced) != 0) return -1;
  if (!((replaced.sa_flags & SA_SIGINFO) && replaced.sa_sigaction == on_sigcont) &&
      memcmp(&replaced.sa_handler, &now->sa_handler, sizeof replaced.sa_handler) != 0) {
    previous[!slot] = replaced;
    atomic_store(&previous_at, !slot);
  }
  return 0;
}

static void rearm_if_replaced(int64_t raw) {
  handler_checked_ns = raw;
  struct sigaction now;
  if (sigaction(SIGCONT, NULL, &now) != 0 || ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigcont)) return;
  install(&now);
}

/* A fork() child has the one thread that forked: a flag another thread held at the fork
 * would never come free there. */
static void after_fork_in_child(void) {
  atomic_flag_clear(&counting);
  atomic_store(&watched, 0); /* the background thread is not forked */
}

void tnt_pause_arm(void) {
  if (atomic_exchange(&armed, 1)) return; /* once per process: it stays for later jobs */
  pthread_atfork(NULL, NULL, after_fork_in_child);
  atomic_store(&tnt_clock_seen_ns, mono_ns());
  struct sigaction now;
  if (sigaction(SIGCONT, NULL, &now) != 0 || install(&now) != 0) atomic_store(&armed, 0);
}

void tnt_pause_watch(int on) {
  (void)tnt_now(); /* a gap before the watch began is judged as before (a stop, or time) */
  atomic_store(&watched, on);
}
