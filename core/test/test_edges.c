/* test_edges.c - the core at the edges of its contract, each edge once found
 * broken: one handle shared by threads, a handle slot reused 2^31 and 2^32
 * times, shutdown under a waiter, the timeouts of tnt_wait, fork() after
 * tnt_init and before it, a rank that leaves as soon as its part of a broadcast is done,
 * ranks that diverge while the negotiation is in bit rounds, ranks that
 * pass arrays of other shapes but as many elements, and the transport marks
 * that a set-up killed midway leaves.
 * The comment above each case states the behaviour it expects and the defect
 * it was written against.
 *
 * Usage: test_edges [CASE...]   (no CASE: every case; `test_edges --list`)
 * Each case runs in a process of its own and each of its ranks in another
 * (forked as in test_ranks.c), so that a crash or a hang in one case cannot
 * hide the others' results. Prints one line per case, then "N passed, N
 * failed"; exits 1 when a case failed. Failed checks, crashes and sanitizer
 * reports go to stderr, prefixed by the case and rank where the test prints them.
 *
 * Interleavings: a case that needs one thread held at a point parks it in a
 * signal handler (see "parking"), or repeats a likely interleaving. Sleeps
 * (usleep) only make an interleaving likely; no check depends on them.
 * Hangs: every rank process has a watchdog (alarm) that kills it after
 * WATCHDOG_S. It bounds a hang; no check measures time.
 *
 * The program links the core's objects: the generation cases set a handle
 * slot's generation through tnt_ctx (src/context.h) instead of looping 2^31 times. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "context.h"
#include "ranks.h"
#include "tarantella.h"
#include "transport/host_marks.h"

#define WATCHDOG_S 60       /* a rank not finished by then hangs (cases take seconds) */
#define CHILD_WATCHDOG_S 20 /* a forked child that makes one call and exits */
#define ROUNDS 50           /* repetitions of a racy interleaving */

static const char *case_name = "";
static int my_rank = -1;
static const char *who = "rank"; /* "rank" or "forked child of rank" */

static void report(int line, const char *cond, const char *fmt, ...) {
  char detail[512] = "";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s %s %d: FAILED test_edges.c:%d: %s%s%s (last error: %s)\n", case_name, who, my_rank, line, cond,
          *detail ? ": " : "", detail, tnt_last_error());
}

/* CHECK(cond) or CHECK(cond, "format", args...): report and fail the rank. */
#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      report(__LINE__, #cond, "" __VA_ARGS__);        \
      return 1;                                       \
    }                                                 \
  } while (0)

/* EXPECT: the same, but the rank goes on (sets `failed`, which must be in scope). */
#define EXPECT(cond, ...)                             \
  do {                                                \
    if (!(cond)) {                                    \
      report(__LINE__, #cond, "" __VA_ARGS__);        \
      failed = 1;                                     \
    }                                                 \
  } while (0)

/* ---- ranks: forked processes with the launcher's environment ---- */

/* One-byte messages between the processes of a case: TO_RANKr is read by rank r,
 * written by the others. A reader gets EOF once every writer is gone. */
enum { TO_RANK0, TO_RANK1, NCHAN };
static int chan[NCHAN][2];
static pid_t rank_pid[3];

static void post(int ch) {
  char b = 1;
  if (write(chan[ch][1], &b, 1) != 1) perror("test_edges: write");
}

static int await_post(int ch) {
  char b;
  return read(chan[ch][0], &b, 1) == 1 ? 0 : -1;
}

/* The scheduler state ('R', 'S', 'T'...) in a /proc/.../stat file, or 0. */
static char proc_state(const char *fmt, int id) {
  char path[64], buf[512];
  snprintf(path, sizeof path, fmt, id);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' ? paren[2] : 0;
}

static char thread_state(int tid) { return proc_state("/proc/self/task/%d/stat", tid); }

static const char *status_text(int st, char *buf, size_t len) {
  /* the exit codes of sanitizer_options.c */
  const char *report = !WIFEXITED(st)              ? ""
                       : WEXITSTATUS(st) == 86 ? " (AddressSanitizer report above)"
                       : WEXITSTATUS(st) == 87 ? " (UndefinedBehaviorSanitizer report above)"
                       : WEXITSTATUS(st) == 66 ? " (ThreadSanitizer report above)"
                                               : "";
  if (WIFEXITED(st)) snprintf(buf, len, "exited with status %d%s", WEXITSTATUS(st), report);
  else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) snprintf(buf, len, "hung: killed by its watchdog (SIGALRM)");
  else if (WIFSIGNALED(st)) snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else snprintf(buf, len, "status %#x", st);
  return buf;
}

/* Fork n ranks (n <= 3) running fn(rank) with TNT_RANK/SIZE/JOB_ID set and
 * TNT_TIMEOUT_S=30 unless the case set it; the number of ranks that failed. */
static int run_ranks(int n, int (*fn)(int rank)) {
  char job[64];
  snprintf(job, sizeof job, "edges%d%ld", (int)getpid(), (long)time(NULL));
  setenv("TNT_TIMEOUT_S", "30", 0);
  for (int ch = 0; ch < NCHAN; ch++)
    if (pipe(chan[ch])) {
      perror("test_edges: pipe");
      return n;
    }
  fflush(NULL);
  for (int r = n - 1; r >= 0; r--) { /* highest first: rank 0 knows every peer's pid */
    pid_t pid = fork();
    if (pid < 0) {
      perror("test_edges: fork");
      return n;
    }
    if (pid == 0) {
      alarm(WATCHDOG_S);
      my_rank = r;
      for (int ch = 0; ch < NCHAN; ch++) close(ch == r ? chan[ch][1] : chan[ch][0]);
      become_rank(r, n, job);
      /* a failed rank leaves at once: what it did not finalize is no leak */
      if (fn(r)) _exit(1);
      exit(0);
    }
    rank_pid[r] = pid;
  }
  for (int ch = 0; ch < NCHAN; ch++) close(chan[ch][0]), close(chan[ch][1]);
  int failed = 0;
  for (int k = 0; k < n; k++) {
    int st;
    pid_t pid = wait(&st);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    char text[128];
    int r = 0;
    while (r < n - 1 && rank_pid[r] != pid) r++;
    fprintf(stderr, "%s rank %d: %s\n", case_name, r, status_text(st, text, sizeof text));
    failed++;
    /* a rank that stopped itself goes on to its end. Only one in group stop
     * ('T'): SIGCONT to a rank in LeakSanitizer's exit check (ptrace stop,
     * 't') makes that check hang */
    for (int q = 0; q < n; q++)
      if (proc_state("/proc/%d/stat", rank_pid[q]) == 'T') kill(rank_pid[q], SIGCONT);
  }
  return failed;
}

static int init_and_sync(void) {
  tnt_handle_t h;
  CHECK(tnt_init() == TNT_SUCCESS);
  CHECK(tnt_barrier_async("sync", &h) == TNT_SUCCESS);
  CHECK(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
  return 0;
}

/* Allreduce (sum) of one float, each rank contributing rank + 1; 0 if the sum is right. */
static int sum_of_ranks(const char *name) {
  float in = (float)(my_rank + 1), out = 0;
  tnt_handle_t h;
  CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS, "'%s'", name);
  CHECK(tnt_wait(h, -1) == TNT_SUCCESS, "'%s'", name);
  CHECK(tnt_release(h) == TNT_SUCCESS, "'%s'", name);
  CHECK(out == 3.0f, "'%s' gave %g, want 3", name, out);
  return 0;
}

/* A thread that waits on a handle, and releases it when asked and the wait succeeded. */
typedef struct {
  pthread_t thread;
  _Atomic int tid; /* set just before it calls tnt_wait */
  tnt_handle_t handle;
  double timeout_s;
  int release;
  tnt_result_t wait_result, release_result;
  char message[256];
} waiter_t;

static void *waiter_main(void *arg) {
  waiter_t *w = arg;
  w->tid = (int)syscall(SYS_gettid);
  w->wait_result = tnt_wait(w->handle, w->timeout_s);
  snprintf(w->message, sizeof w->message, "%s", w->wait_result == TNT_SUCCESS ? "" : tnt_last_error());
  w->release_result = TNT_IN_PROGRESS; /* not attempted */
  if (w->release && w->wait_result == TNT_SUCCESS) w->release_result = tnt_release(w->handle);
  return NULL;
}

static int start_waiter(waiter_t *w, tnt_handle_t h, double timeout_s, int release) {
  memset(w, 0, sizeof *w);
  w->handle = h;
  w->timeout_s = timeout_s;
  w->release = release;
  return pthread_create(&w->thread, NULL, waiter_main, w);
}

/* 1 once the waiter sleeps inside tnt_wait (it blocks nowhere else). */
static int waiter_asleep(const waiter_t *w) { return w->tid && thread_state(w->tid) == 'S'; }

/* A wait that lost the handle to another thread's tnt_release. */
static int released_error(const waiter_t *w) {
  return w->wait_result != TNT_SUCCESS && strstr(w->message, "released") != NULL;
}

/* ---- parking a thread: a signal handler that blocks until told ----
 * Some interleavings are made certain instead of likely by holding one thread
 * still at a chosen point (a waiter asleep inside tnt_wait, the background
 * thread outside the engine) while the others go on. One thread at a time. */
static int park_pipe[2] = {-1, -1}, parked_pipe[2] = {-1, -1};

static void park_handler(int sig) {
  char b = 1;
  if (write(parked_pipe[1], &b, 1) != 1 || read(park_pipe[0], &b, 1) != 1) _exit(3);
}

static int park(pthread_t t) {
  if (park_pipe[0] < 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = park_handler;
    sa.sa_flags = SA_RESTART;
    if (pipe(park_pipe) || pipe(parked_pipe) || sigaction(SIGUSR1, &sa, NULL)) return -1;
  }
  char b;
  return pthread_kill(t, SIGUSR1) == 0 && read(parked_pipe[0], &b, 1) == 1 ? 0 : -1;
}

static void unpark(void) {
  char b = 1;
  if (write(park_pipe[1], &b, 1) != 1) perror("test_edges: unpark");
}

/* 1 when no thread holds the engine lock (`progress`) or the context mutex. */
static int engine_free(void) {
  if (pthread_mutex_trylock(&tnt_ctx.engine.progress)) return 0;
  pthread_mutex_unlock(&tnt_ctx.engine.progress);
  if (pthread_mutex_trylock(&tnt_ctx.requests.mu)) return 0;
  pthread_mutex_unlock(&tnt_ctx.requests.mu);
  return 1;
}

/* Park a thread where it holds neither lock. With tid > 0: only once that
 * thread sleeps too; a waiter that has called tnt_wait, sleeps and holds no
 * lock is in tnt_wait's condition wait (it blocks nowhere else). */
static int park_outside_engine(pthread_t t, int tid) {
  for (;;) {
    if (tid > 0 && (thread_state(tid) != 'S' || !engine_free())) {
      usleep(1000);
      continue;
    }
    if (park(t)) return -1;
    if (engine_free()) return 0;
    unpark(); /* parked inside: let it go on, try again */
    usleep(1000);
  }
}

static int park_waiter(waiter_t *w) {
  while (!w->tid) usleep(1000);
  return park_outside_engine(w->thread, w->tid);
}

/* ---- a. one handle, several threads ---- */

/* two_waiters: rank 0 submits an allreduce and two threads wait on its handle;
 * each thread releases the handle after its wait succeeded. Rank 1 submits only
 * once both threads started. ROUNDS rounds; in odd rounds the second thread is
 * parked asleep inside tnt_wait until the first one has released the handle
 * (certain), in even rounds the two race freely (likely).
 * Expected: no crash; each tnt_wait returns TNT_SUCCESS, or an error whose
 * message says the handle was released (the other thread released it first);
 * at least one returns TNT_SUCCESS and the sum is right; exactly one tnt_release
 * returns TNT_SUCCESS, the other TNT_ERR_INVALID_ARGUMENT (already released).
 * Reported: the second waiter dereferences NULL in tnt_wait when the first one
 * released the slot between the completion and the second one's re-lookup. */
static int two_waiters_rank(int r) {
  if (init_and_sync()) return 1;
  for (int round = 0; round < ROUNDS; round++) {
    char name[32];
    snprintf(name, sizeof name, "two-waiters-%d", round);
    float in = (float)(r + 1), out = 0;
    tnt_handle_t h;
    if (r == 1) {
      CHECK(await_post(TO_RANK1) == 0, "rank 0 is gone");
      usleep(2000);
      CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
      CHECK(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
      CHECK(out == 3.0f, "round %d: sum %g, want 3", round, out);
      continue;
    }
    waiter_t w[2];
    CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
    CHECK(start_waiter(&w[0], h, -1, 1) == 0 && start_waiter(&w[1], h, -1, 1) == 0);
    int parked = round % 2;
    if (parked) CHECK(park_waiter(&w[1]) == 0, "cannot park a waiter");
    post(TO_RANK1);
    pthread_join(w[0].thread, NULL);
    if (parked) unpark();
    pthread_join(w[1].thread, NULL);
    for (int k = 0; k < 2; k++)
      CHECK(w[k].wait_result == TNT_SUCCESS || released_error(&w[k]), "round %d, thread %d: tnt_wait returned %d (%s)",
            round, k, (int)w[k].wait_result, w[k].message);
    CHECK(w[0].wait_result == TNT_SUCCESS || w[1].wait_result == TNT_SUCCESS, "round %d", round);
    CHECK(out == 3.0f, "round %d: sum %g, want 3", round, out);
    int released = (w[0].release_result == TNT_SUCCESS) + (w[1].release_result == TNT_SUCCESS);
    CHECK(released == 1, "round %d: %d tnt_release calls succeeded (results %d, %d)", round, released,
          (int)w[0].release_result, (int)w[1].release_result);
    for (int k = 0; k < 2; k++)
      CHECK(w[k].release_result == TNT_SUCCESS || w[k].release_result == TNT_ERR_INVALID_ARGUMENT ||
                w[k].release_result == TNT_IN_PROGRESS /* its wait lost the handle */,
            "round %d, thread %d: tnt_release returned %d", round, k, (int)w[k].release_result);
  }
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* release_while_waiting: a thread waits on a handle while the main thread
 * releases it: first while the request is still in flight, then in a tight
 * loop until the release succeeds, i.e. the moment the request completes.
 * ROUNDS rounds; in odd rounds the waiter is parked asleep inside tnt_wait
 * until the release succeeded (certain), in even rounds its wake-up races the
 * release (likely).
 * Expected: no crash; the release in flight returns TNT_ERR_INVALID_USAGE; the
 * loop ends with TNT_SUCCESS; the waiter's tnt_wait returns TNT_SUCCESS or an
 * error whose message says the handle was released; the sum is right.
 * Reported: NULL dereference in tnt_wait (the slot is gone when it looks again). */
static int release_while_waiting_rank(int r) {
  if (init_and_sync()) return 1;
  for (int round = 0; round < ROUNDS; round++) {
    char name[32];
    snprintf(name, sizeof name, "release-waiting-%d", round);
    float in = (float)(r + 1), out = 0;
    tnt_handle_t h;
    if (r == 1) {
      CHECK(await_post(TO_RANK1) == 0, "rank 0 is gone");
      usleep(2000);
      CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
      CHECK(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
      continue;
    }
    waiter_t w;
    CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
    CHECK(start_waiter(&w, h, -1, 0) == 0);
    tnt_result_t in_flight = tnt_release(h); /* rank 1 has not submitted: certainly in flight */
    int parked = round % 2;
    if (parked) CHECK(park_waiter(&w) == 0, "cannot park the waiter");
    post(TO_RANK1);
    tnt_result_t res;
    while ((res = tnt_release(h)) == TNT_ERR_INVALID_USAGE) sched_yield();
    if (parked) unpark();
    pthread_join(w.thread, NULL);
    CHECK(in_flight == TNT_ERR_INVALID_USAGE, "round %d: tnt_release of a request in flight returned %d", round,
          (int)in_flight);
    CHECK(res == TNT_SUCCESS, "round %d: tnt_release returned %d", round, (int)res);
    CHECK(w.wait_result == TNT_SUCCESS || released_error(&w), "round %d: tnt_wait returned %d (%s)", round,
          (int)w.wait_result, w.message);
    CHECK(out == 3.0f, "round %d: sum %g, want 3", round, out);
  }
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* ---- b. handle generations ---- */

/* generation_2_31, generation_2_32 (one rank): after a first request, the one
 * handle slot's generation is set to just below 2^31 (resp. 2^32), then six
 * requests reuse the slot, crossing that bound.
 * Expected: every submission returns TNT_SUCCESS with a handle distinct from
 * the other five; tnt_wait returns TNT_SUCCESS with the right value; tnt_release
 * returns TNT_SUCCESS; afterwards every one of these handles is refused
 * (TNT_ERR_INVALID_ARGUMENT); tnt_finalize returns TNT_SUCCESS; no undefined
 * behaviour (UBSan) and no double free (ASan).
 * Reported: `(tnt_handle_t)gen << 32` shifts into the sign bit (UB) from
 * 2^31 on; the negative handle then reads as "out of memory", the request is
 * freed while its slot still points at it, and tnt_finalize frees it again. */
static int generation_cross(uint32_t start) {
  double in = 2, out = 0;
  tnt_handle_t h, seen[6];
  int nseen = 0, failed = 0;
  CHECK(tnt_init() == TNT_SUCCESS);
  CHECK(tnt_allreduce_async("gen", &in, &out, 1, TNT_FLOAT64, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
  CHECK(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
  pthread_mutex_lock(&tnt_ctx.requests.mu);
  int slots = tnt_ctx.requests.nslots;
  if (slots == 1) tnt_ctx.requests.slots[0].generation = start; /* the free slot every later request reuses */
  pthread_mutex_unlock(&tnt_ctx.requests.mu);
  CHECK(slots == 1, "%d handle slots after one request", slots);
  /* failures do not end the sequence: tnt_finalize must still run clean */
  for (int i = 0; i < 6; i++) {
    out = 0;
    tnt_result_t res = tnt_allreduce_async("gen", &in, &out, 1, TNT_FLOAT64, TNT_SUM, 1.0, &h);
    EXPECT(res == TNT_SUCCESS, "submission %d after generation %#x returned %d", i + 1, (unsigned)start, (int)res);
    if (res != TNT_SUCCESS) continue;
    for (int j = 0; j < nseen; j++)
      EXPECT(h != seen[j], "two submissions got the same handle %#llx", (unsigned long long)h);
    seen[nseen++] = h;
    EXPECT(tnt_wait(h, -1) == TNT_SUCCESS, "handle %#llx", (unsigned long long)h);
    EXPECT(out == 2.0, "handle %#llx: value %g, want 2", (unsigned long long)h, out);
    EXPECT(tnt_release(h) == TNT_SUCCESS, "handle %#llx", (unsigned long long)h);
    for (int j = 0; j < nseen; j++)
      EXPECT(tnt_test(seen[j]) == TNT_ERR_INVALID_ARGUMENT, "released handle %#llx is still accepted",
             (unsigned long long)seen[j]);
  }
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return failed;
}

static int generation_2_31_rank(int r) { return generation_cross(0x7ffffffdu); }
static int generation_2_32_rank(int r) { return generation_cross(0xfffffffdu); }

/* ---- c. shutdown under a waiter ---- */

/* finalize_while_waiting: rank 0 submits two requests rank 1 never submits;
 * eight threads wait on them (half without a timeout, half with 30 s); once
 * all sleep inside tnt_wait, the main thread calls tnt_finalize. Rank 1
 * finalizes only after rank 0's tnt_finalize returned, so rank 0's requests
 * fail because of rank 0's own shutdown, not because its peer left. The race
 * is TSan's to see; plain and asan builds catch it in some runs only.
 * Expected: tnt_finalize returns TNT_SUCCESS; every wait returns
 * TNT_ERR_INVALID_USAGE with a message that says Tarantella was shut down (or
 * finalized); no data race (TSan), no use of freed memory (ASan), no crash, no
 * hang.
 * Reported: tnt_finalize frees the handle table and destroys the mutex and the
 * condition variable under the waiting threads. */
static int finalize_while_waiting_rank(int r) {
  enum { W = 8 }; /* waiters: the more, the likelier one is still waking up when tnt_finalize frees */
  if (init_and_sync()) return 1;
  if (r == 1) {
    CHECK(await_post(TO_RANK1) == 0, "rank 0 is gone");
    CHECK(tnt_finalize() == TNT_SUCCESS);
    return 0;
  }
  float in = 1, out = 0;
  tnt_handle_t a, b;
  waiter_t w[W];
  CHECK(tnt_allreduce_async("never-allreduce", &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &a) == TNT_SUCCESS);
  CHECK(tnt_barrier_async("never-barrier", &b) == TNT_SUCCESS);
  for (int k = 0; k < W; k++) CHECK(start_waiter(&w[k], k % 2 ? b : a, k % 2 ? 30 : -1, 0) == 0);
  for (int k = 0; k < W; k++)
    while (!waiter_asleep(&w[k])) usleep(1000);
  tnt_result_t fin = tnt_finalize();
  for (int k = 0; k < W; k++) pthread_join(w[k].thread, NULL);
  post(TO_RANK1);
  CHECK(fin == TNT_SUCCESS, "tnt_finalize returned %d", (int)fin);
  for (int k = 0; k < W; k++)
    CHECK(w[k].wait_result == TNT_ERR_INVALID_USAGE &&
              (strstr(w[k].message, "shut down") || strstr(w[k].message, "finalized")),
          "waiter %d: tnt_wait returned %d (%s)", k, (int)w[k].wait_result, w[k].message);
  return 0;
}

/* ---- d. the timeouts of tnt_wait ---- */

/* wait_timeout: rank 1 stops itself (SIGSTOP: a peer that is alive but makes no
 * progress), so no request can complete and no negotiation with it can finish.
 * TNT_TIMEOUT_S=30. Rank 0 parks its background thread in a signal handler
 * (outside the engine), so that the thread calling tnt_wait is the one that
 * drives the engine, as it is whenever it wins the engine lock (without parking:
 * about one run in six here). Rank 0 submits five allreduces and waits 0.05 s
 * on each, then 0 s on the first (a poll), then lets its background thread and
 * rank 1 go on; rank 1 submits the same five, rank 0 waits without a timeout.
 * Expected: each timed wait returns TNT_ERR_TIMEOUT with tnt_wait's own message
 * ("tnt_wait gave up ..."), not the core's fatal one ("TNT_TIMEOUT_S bound
 * reached"): it returned long before TNT_TIMEOUT_S (the message tells; no clock
 * is read); tnt_test then returns TNT_IN_PROGRESS; the timed waits fail no
 * request: once rank 1 goes on, all five complete with the right sum.
 * Reported: a thread that drives the engine inside tnt_wait blocks in the
 * negotiation for up to TNT_TIMEOUT_S, which then fails the whole job. */
static int wait_timeout_rank(int r) {
  enum { N = 5 };
  float in[N], out[N];
  tnt_handle_t h[N];
  char name[N][32];
  for (int i = 0; i < N; i++) {
    h[i] = -1;
    in[i] = (float)(r + 1);
    out[i] = 0;
    snprintf(name[i], sizeof name[i], "timed-%d", i);
  }
  if (init_and_sync()) return 1;
  if (r == 1) {
    post(TO_RANK0);
    raise(SIGSTOP); /* rank 0 sends SIGCONT */
    for (int i = 0; i < N; i++)
      CHECK(tnt_allreduce_async(name[i], &in[i], &out[i], 1, TNT_FLOAT32, TNT_SUM, 1.0, &h[i]) == TNT_SUCCESS);
    for (int i = 0; i < N; i++) CHECK(tnt_wait(h[i], -1) == TNT_SUCCESS && tnt_release(h[i]) == TNT_SUCCESS);
    CHECK(tnt_finalize() == TNT_SUCCESS);
    return 0;
  }
  CHECK(await_post(TO_RANK0) == 0, "rank 1 is gone");
  while (proc_state("/proc/%d/stat", rank_pid[1]) != 'T') usleep(1000);
  CHECK(park_outside_engine(tnt_ctx.engine.thread, 0) == 0, "cannot park the background thread");
  tnt_result_t timed[N], poll, test;
  char message[N][256], poll_message[256];
  for (int i = 0; i < N; i++) { /* no CHECK before rank 1 and the background thread go on */
    tnt_result_t sub = tnt_allreduce_async(name[i], &in[i], &out[i], 1, TNT_FLOAT32, TNT_SUM, 1.0, &h[i]);
    timed[i] = sub == TNT_SUCCESS ? tnt_wait(h[i], 0.05) : sub;
    snprintf(message[i], sizeof message[i], "%s%s", sub == TNT_SUCCESS ? "" : "submission failed: ", tnt_last_error());
  }
  poll = tnt_wait(h[0], 0);
  snprintf(poll_message, sizeof poll_message, "%s", tnt_last_error());
  test = tnt_test(h[0]);
  unpark();
  kill(rank_pid[1], SIGCONT);
  for (int i = 0; i < N; i++)
    CHECK(timed[i] == TNT_ERR_TIMEOUT && strstr(message[i], "tnt_wait gave up"),
          "tnt_wait('%s', 0.05) returned %d (%s)", name[i], (int)timed[i], message[i]);
  CHECK(poll == TNT_ERR_TIMEOUT && strstr(poll_message, "tnt_wait gave up"), "tnt_wait(h, 0) returned %d (%s)", (int)poll,
        poll_message);
  CHECK(test == TNT_IN_PROGRESS, "tnt_test returned %d", (int)test);
  for (int i = 0; i < N; i++) {
    CHECK(tnt_wait(h[i], -1) == TNT_SUCCESS && tnt_release(h[i]) == TNT_SUCCESS, "'%s'", name[i]);
    CHECK(out[i] == 3.0f, "'%s': sum %g, want 3", name[i], out[i]);
  }
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* wait_forever: a timeout that is not a finite non-negative number means "no
 * timeout" (our choice, written down here for the header):
 *   INFINITY, and finite values too large for a timespec (1e300);
 *   every negative value (-1 as documented, also -2 and -INFINITY) and NaN
 *   (neither < 0 nor >= 0: without a rule it falls through to an undefined
 *   conversion).
 * For each value rank 0 submits an allreduce, tells rank 1, and waits; rank 1
 * submits a moment later, so that rank 0 is most likely already waiting.
 * Expected: every tnt_wait returns TNT_SUCCESS with the right sum; no undefined
 * behaviour (UBSan: float-cast-overflow).
 * Reported: INFINITY and 1e300 are converted to time_t and long (undefined;
 * UBSan: "inf is outside the range of representable values"); on x86-64 the
 * deadline's tv_nsec comes out invalid, pthread_cond_timedwait returns EINVAL,
 * which tnt_wait does not expect: it loops at full speed and never returns. */
static int wait_forever_rank(int r) {
  const double timeouts[] = {INFINITY, 1e300, NAN, -INFINITY, -2.0, -1.0};
  const int n = (int)(sizeof timeouts / sizeof timeouts[0]);
  if (init_and_sync()) return 1;
  for (int i = 0; i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "forever-%d", i);
    float in = (float)(r + 1), out = 0;
    tnt_handle_t h;
    if (r == 1) {
      CHECK(await_post(TO_RANK1) == 0, "rank 0 is gone");
      usleep(50000);
      CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
      CHECK(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS, "'%s'", name);
      continue;
    }
    CHECK(tnt_allreduce_async(name, &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
    post(TO_RANK1);
    tnt_result_t res = tnt_wait(h, timeouts[i]);
    CHECK(res == TNT_SUCCESS, "tnt_wait(h, %g) returned %d", timeouts[i], (int)res);
    CHECK(out == 3.0f, "tnt_wait(h, %g): sum %g, want 3", timeouts[i], out);
    CHECK(tnt_release(h) == TNT_SUCCESS);
  }
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* ---- e. fork() after tnt_init ---- */

/* Run child() in a child of this rank (with its own watchdog); its wait status. */
/* LeakSanitizer asks this before its exit-time check. In a fork child, memory
 * the parent's other threads held only on their stacks (the engine's response
 * list in the middle of a cycle) is unreachable, since those threads do not
 * exist in the child: a leak check there reports it, a false positive of fork,
 * not a leak. The parent and the ranks are still checked. */
static volatile int in_fork_child;
int __lsan_is_turned_off(void) { return in_fork_child; }

static int in_forked_child(int (*child)(void), int use_exit) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    in_fork_child = 1;
    alarm(CHILD_WATCHDOG_S);
    who = "forked child of rank";
    int res = child();
    if (use_exit) exit(res);
    _exit(res);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return st;
}

static int child_calls_collectives(void) {
  float in = 1, out = 0;
  tnt_handle_t h;
  tnt_result_t a = tnt_allreduce_async("in-child", &in, &out, 1, TNT_FLOAT32, TNT_SUM, 1.0, &h);
  char msg[256];
  snprintf(msg, sizeof msg, "%s", tnt_last_error());
  /* never tnt_wait on a handle a child got: it would drive the parent's engine */
  CHECK(a == TNT_ERR_INVALID_USAGE && strstr(msg, "fork"), "forked child: allreduce returned %d (%s)", (int)a, msg);
  tnt_result_t b = tnt_barrier_async("in-child-barrier", &h);
  CHECK(b == TNT_ERR_INVALID_USAGE && strstr(tnt_last_error(), "fork"), "forked child: barrier returned %d", (int)b);
  return 0;
}

static void finalize_at_exit(void) { tnt_finalize(); } /* what Python's atexit hook does */

static int child_finalizes_and_exits(void) {
  tnt_finalize(); /* its result is not specified; it must return */
  return 0;       /* then exit(0) runs finalize_at_exit */
}

/* fork_child_collective: rank 0 forks after tnt_init and a first collective; the
 * child calls tnt_allreduce_async and tnt_barrier_async, then leaves with
 * _exit (what exit does in a child is the next case's subject).
 * Expected: both calls return TNT_ERR_INVALID_USAGE with a message saying that
 * Tarantella cannot be used in a forked child (the test looks for "fork"); the
 * child exits 0; rank 0's next collectives with rank 1 succeed.
 * Reported: the child's submission succeeds; it queues in the child's copy of
 * the context, where no background thread runs, and a tnt_wait would drive the
 * parent's engine state (shared memory) from the child. */
static int fork_child_collective_rank(int r) {
  if (init_and_sync() || sum_of_ranks("before-fork")) return 1;
  int st = 0;
  if (r == 0) st = in_forked_child(child_calls_collectives, 0);
  if (sum_of_ranks("after-fork")) return 1;
  char text[128];
  CHECK(r == 1 || (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0), "forked child %s", status_text(st, text, sizeof text));
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* fork_child_exit: rank 0 registers an atexit handler that calls tnt_finalize
 * (as Python's tarantella does), then forks after tnt_init and a first
 * collective; the child calls tnt_finalize and exit(0), so the handler runs in
 * the child as well.
 * Expected: the child exits 0 (its tnt_finalize returns, whatever it returns);
 * rank 0's next collectives with rank 1 succeed (the child did not mark rank 0
 * as shut down in the shared segment, nor touched its engine).
 * Reported: the child's tnt_finalize joins a background thread that does not
 * exist in the child (under TSan it hangs; glibc alone returns), then
 * shm_finalize marks the parent's rank EXITED in the shared segment, so rank 1
 * fails with "rank 0 has shut down". */
static int fork_child_exit_rank(int r) {
  if (r == 0) atexit(finalize_at_exit);
  if (init_and_sync() || sum_of_ranks("before-fork")) return 1;
  int st = 0;
  if (r == 0) st = in_forked_child(child_finalizes_and_exits, 1);
  if (sum_of_ranks("after-fork")) return 1;
  char text[128];
  CHECK(r == 1 || (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0), "forked child %s", status_text(st, text, sizeof text));
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* fork_child_before_init: rank 0 forks before tnt_init (a worker pool made
 * early, a data loader's workers); once rank 0 has initialized and made a
 * collective with rank 1, the child calls tnt_init with the same environment
 * (TNT_RANK=0 and the job's TNT_JOB_ID), as a worker calling get_rank() does.
 * Expected: the child's tnt_init returns TNT_ERR_INVALID_USAGE at once, with a
 * message that names rank 0's pid as the process that started it ("started
 * by pid N"); rank 0's next collectives with rank 1 succeed.
 * Reported: the job's segment is unlinked once every rank has attached, so the
 * child created a new one under the same name as rank 0 of a second job: it
 * waited TNT_TIMEOUT_S for a rank 1 that never came (a pool's worker hung),
 * or, where every rank's worker did the same, the workers formed a job of
 * their own without a word; a worker started after tnt_init was refused. */
static int child_inits_after_parent(int ready_fd) {
  char b;
  CHECK(read(ready_fd, &b, 1) == 1, "the parent never said it had initialized");
  setenv("TNT_TIMEOUT_S", "5", 1); /* the defect waits this long for a rank 1 of a second job */
  tnt_result_t res = tnt_init();
  char msg[512], want[64];
  snprintf(msg, sizeof msg, "%s", tnt_last_error());
  snprintf(want, sizeof want, "started by pid %d", (int)getppid());
  CHECK(res == TNT_ERR_INVALID_USAGE && strstr(msg, want), "child of rank 0: tnt_init returned %d (%s)", (int)res, msg);
  return 0;
}

static int fork_child_before_init_rank(int r) {
  int ready[2] = {-1, -1};
  pid_t child = -1;
  if (r == 0) {
    CHECK(pipe(ready) == 0);
    fflush(NULL);
    child = fork();
    CHECK(child >= 0);
    if (child == 0) {
      in_fork_child = 1;
      alarm(CHILD_WATCHDOG_S);
      who = "forked child of rank";
      close(ready[1]);
      _exit(child_inits_after_parent(ready[0]));
    }
    close(ready[0]);
  }
  if (init_and_sync() || sum_of_ranks("before-child")) return 1;
  int st = 0;
  if (r == 0) {
    CHECK(write(ready[1], "g", 1) == 1);
    close(ready[1]);
    CHECK(waitpid(child, &st, 0) == child);
  }
  if (sum_of_ranks("after-child")) return 1;
  char text[128];
  CHECK(r == 1 || (WIFEXITED(st) && WEXITSTATUS(st) == 0), "forked child %s", status_text(st, text, sizeof text));
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return 0;
}

/* ---- f. a rank that is done leaves ---- */

/* root_leaves_after_broadcast (3 ranks; found by `make asan`, where test_ranks
 * failed about one run in 40): rank 2 broadcasts 4 MiB (64 pipeline pieces
 * along the chain 2 -> 0 -> 1, all of which fit rank 0's window) and calls
 * tnt_finalize as soon as its own part is done, as a rank that made every
 * collective call may; ranks 0 and 1 wait for the whole message. The job runs
 * up to 10 times: the interleaving is likely, not certain.
 * Expected: ranks 0 and 1 get TNT_SUCCESS and rank 2's data; a rank that has
 * shut down after its last collective fails only the ranks that still need it.
 * Reported (by this test): rank 1, waiting for a piece from rank 0 (alive),
 * fails with TNT_ERR_PEER_LOST "rank 2 has shut down while rank 1 was waiting
 * for data from rank 0": the shm transport fails a wait when any peer exited. */
static int root_leaves_after_broadcast_rank(int r) {
  enum { COUNT = 1 << 20 }; /* floats: 4 MiB, 64 pieces of TNT_SHM_SLOT_KB=64 */
  float *buf = malloc(COUNT * sizeof *buf);
  CHECK(buf != NULL);
  for (int i = 0; i < COUNT; i++) buf[i] = r == 2 ? (float)(i % 1000) : -1.0f;
  tnt_handle_t h;
  int failed = 0;
  EXPECT(init_and_sync() == 0);
  EXPECT(tnt_broadcast_async("from-2", buf, buf, COUNT, TNT_FLOAT32, 2, &h) == TNT_SUCCESS);
  EXPECT(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
  EXPECT(tnt_finalize() == TNT_SUCCESS);
  for (int i = 0; i < COUNT && !failed; i += 4099)
    EXPECT(buf[i] == (float)(i % 1000), "element %d is %g, want %d", i, buf[i], i % 1000);
  free(buf);
  return failed;
}

/* ---- f. ranks that diverge in the steady state ---- */

/* diverged_in_a_bit_round: two ranks run a cached 64 KiB allreduce until the
 * negotiation is in bit rounds (an AND of readiness bits, no messages); then
 * rank 1's record of the last cycle's responses is changed, as a rank that
 * computed other responses would have it, and both submit once more.
 * Expected: that allreduce fails on both ranks with TNT_ERR_INTERNAL and a
 * message that says the ranks have diverged, in a bit round: a bit round
 * carries the digest and its complement, whose AND equals a rank's own only
 * when every rank sent the same. Written with the bit rounds, which no longer
 * send the full message that the digest check used to read. */
static int diverged_rank(int r) {
  enum { COUNT = 16384 };
  int failed = 0;
  float *in = calloc(COUNT, sizeof *in), *out = calloc(COUNT, sizeof *out);
  CHECK(in && out);
  tnt_handle_t h;
  CHECK(init_and_sync() == 0);
  for (int i = 0; i < 6; i++) {
    CHECK(tnt_allreduce_async("grad", in, out, COUNT, TNT_FLOAT32, TNT_SUM, 1.0, &h) == TNT_SUCCESS);
    CHECK(tnt_wait(h, -1) == TNT_SUCCESS && tnt_release(h) == TNT_SUCCESS);
  }
  tnt_stats_t st;
  CHECK(tnt_get_stats(&st) == TNT_SUCCESS);
  CHECK(st.bit_rounds > 0, "%lld bit rounds in a steady loop", (long long)st.bit_rounds);
  if (r == 1) {
    pthread_mutex_lock(&tnt_ctx.engine.progress);
    int bits_next = !tnt_ctx.engine.neg.next_full && !tnt_ctx.engine.neg.cycle_posted;
    tnt_ctx.engine.neg.responses_digest ^= 1u << 7;
    pthread_mutex_unlock(&tnt_ctx.engine.progress);
    CHECK(bits_next, "the next cycle is not a bit round");
    post(TO_RANK0);
  } else {
    CHECK(await_post(TO_RANK0) == 0);
  }
  /* the peer's round may reach this rank's idle thread first (its message is
   * the doorbell): then the engine has failed before this rank submits */
  tnt_result_t res = tnt_allreduce_async("grad", in, out, COUNT, TNT_FLOAT32, TNT_SUM, 1.0, &h);
  if (res == TNT_SUCCESS) {
    res = tnt_wait(h, -1);
    tnt_release(h);
  }
  EXPECT(res == TNT_ERR_INTERNAL, "the allreduce after the divergence returned %d", (int)res);
  EXPECT(strstr(tnt_last_error(), "diverged") && strstr(tnt_last_error(), "bit round"), "error: %s", tnt_last_error());
  tnt_finalize();
  free(in);
  free(out);
  return failed;
}

/* ---- g. arrays of the same count but other shapes ---- */

/* shapes_that_differ (2 ranks): each collective's _layout form with the
 * tnt_shape_layout of (2, 3) on rank 0 and (3, 2) on rank 1 (allgather: rows
 * of those shapes), blocking and asynchronous, twice (the second time after
 * the same name succeeded with equal shapes and was cached).
 * Expected: TNT_ERR_MISMATCH on both ranks, the message naming both shapes;
 * equal shapes under the same names succeed.
 * Reported: the layout was 0 for every plain array, so (2, 3) was summed into
 * (3, 2) element by element without a word. */
static int one_shaped(int kind, const char *name, uint64_t layout, int async) {
  float in[6] = {1, 2, 3, 4, 5, 6}, out[12];
  tnt_handle_t h = 0;
  tnt_result_t r;
  if (kind == 0)
    r = async ? tnt_allreduce_layout_async(name, in, out, 6, TNT_FLOAT32, TNT_SUM, 1.0, layout, &h)
              : tnt_allreduce_layout(name, in, out, 6, TNT_FLOAT32, TNT_SUM, 1.0, layout, -1, &h);
  else if (kind == 1)
    r = async ? tnt_broadcast_layout_async(name, in, out, 6, TNT_FLOAT32, 0, layout, &h)
              : tnt_broadcast_layout(name, in, out, 6, TNT_FLOAT32, 0, layout, -1, &h);
  else
    r = async ? tnt_allgather_into_layout_async(name, in, 6, 6, TNT_FLOAT32, out, 12, layout, &h)
              : tnt_allgather_into_layout(name, in, 6, 6, TNT_FLOAT32, out, 12, layout, -1, &h);
  if (r == TNT_SUCCESS && (async || kind == 2)) {
    if (async) r = tnt_wait(h, -1);
    tnt_release(h);
  }
  return (int)r;
}

static int shapes_that_differ_rank(int r) {
  const int64_t mine[3] = {1, r ? 3 : 2, r ? 2 : 3}, same[3] = {1, 2, 3};
  int failed = 0;
  CHECK(init_and_sync() == 0);
  for (int round = 0; round < 2; round++)
    for (int kind = 0; kind < 3; kind++)
      for (int async = 0; async < 2; async++) {
        char name[32];
        snprintf(name, sizeof name, "shaped-%d-%d", kind, async);
        /* (1, 2, 3) against (1, 3, 2): allgather's rows, and for the others the arrays of those rows */
        const uint64_t differ = tnt_shape_layout(2, mine + 1), alike = tnt_shape_layout(2, same + 1);
        int res = one_shaped(kind, name, differ, async);
        EXPECT(res == TNT_ERR_MISMATCH, "%s (round %d) returned %d", name, round, res);
        EXPECT(strstr(tnt_last_error(), "shape (2, 3)") && strstr(tnt_last_error(), "shape (3, 2)"), "%s: %s", name,
               tnt_last_error());
        res = one_shaped(kind, name, alike, async);
        EXPECT(res == TNT_SUCCESS, "%s with equal shapes (round %d) returned %d", name, round, res);
      }
  CHECK(tnt_finalize() == TNT_SUCCESS);
  return failed;
}

/* ---- g. the set-up's leftovers ---- */

/* A process of its own, started now, marks `transport` as local rank `local` of `job`
 * (host_marks.h) and ends without removing the marks, as a rank killed during its set-up does:
 * its exit status (0: the marks' check passed, 3: it failed). With `marked` (a pipe), it stays in
 * its "set-up" instead, having written a byte there once its slot is whole: its pid (0 on error). */
static int marking_process(const char *job, int local, const char *transport, int marked) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(CHILD_WATCHDOG_S);
    tnt_placement_t pl;
    memset(&pl, 0, sizeof pl);
    pl.rank = pl.local_rank = local;
    pl.size = pl.local_size = 2;
    snprintf(pl.job_id, sizeof pl.job_id, "%s", job);
    tnt_result_t res = tnt_host_marks_begin(&pl, transport, transport);
    if (marked >= 0) {
      if (write(marked, "m", 1) != 1) _exit(4);
      pause();
    }
    _exit(res == TNT_SUCCESS ? 0 : 3); /* no tnt_host_marks_end: the name stays */
  }
  if (marked >= 0) return pid > 0 ? pid : 0;
  int st = 0;
  return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* leftover_host_marks (one process; the marks of transport/host_marks.c): a job killed during its
 * set-up leaves /dev/shm/tnt-<id>-marks-<host>, whose slots name processes that are gone. Its
 * relaunch with the same id and another transport failed at once on them ("the ranks of this host
 * took different transports: ... rank 1 (pid <dead>) mpi"). Expected: a slot whose writer is gone
 * and that was written before the checking process started does not count; one written after it
 * started (a rank of its own launch that failed and exited: its mark is why) does, and so does the
 * slot of a writer that lives (a job that still runs), whenever it was written. */
static int leftover_host_marks_rank(int r) {
  int failed = 0;
  char job[64], name[128], host[64] = "host";
  snprintf(job, sizeof job, "edges-marks-%d", (int)getpid());
  if (gethostname(host, sizeof host - 1) != 0 || strchr(host, '/')) snprintf(host, sizeof host, "host");
  snprintf(name, sizeof name, "/tnt-%s-marks-%s", job, host);
  CHECK(marking_process(job, 1, "mpi", -1) == 0);
  /* this process started before the writer marked: the dead writer's slot is of its own launch */
  tnt_placement_t pl;
  memset(&pl, 0, sizeof pl);
  pl.size = pl.local_size = 2;
  snprintf(pl.job_id, sizeof pl.job_id, "%s", job);
  EXPECT(tnt_host_marks_begin(&pl, "shm", "shm") == TNT_ERR_INVALID_USAGE, "a failed rank of this launch");
  EXPECT(strstr(tnt_last_error(), "took different transports"), "%s", tnt_last_error());
  tnt_host_marks_end(); /* removes the name, as a failed set-up does */
  CHECK(marking_process(job, 1, "mpi", -1) == 0);
  /* a process started after the mark (a relaunch). Process starts are read in clock ticks (10 ms),
   * rounded down, which errs toward counting the slot: the relaunch starts a tick or more later */
  usleep(100 * 1000);
  EXPECT(marking_process(job, 0, "shm", -1) == 0, "a relaunch failed on a dead writer's leftover slot");
  /* the writer lives on (a job of this id still setting up): its slot counts for a relaunch too */
  shm_unlink(name);
  int marked[2];
  CHECK(pipe(marked) == 0);
  pid_t writer = marking_process(job, 1, "mpi", marked[1]);
  char b;
  CHECK(writer > 0 && read(marked[0], &b, 1) == 1);
  usleep(100 * 1000); /* a tick or more later, as above: only its life makes it count */
  EXPECT(marking_process(job, 0, "shm", -1) == 3, "a live job's slot was ignored");
  kill(writer, SIGKILL);
  int st;
  waitpid(writer, &st, 0);
  close(marked[0]);
  close(marked[1]);
  shm_unlink(name);
  return failed;
}

/* ---- the driver ---- */

typedef struct {
  const char *name;
  int nranks;
  int (*rank_main)(int rank);
  int jobs;            /* runs of the whole job, until one fails (0: one) */
  const char *env[3];  /* "NAME=VALUE" set for this case */
} edge_case_t;

static const edge_case_t cases[] = {
    {.name = "two_waiters", .nranks = 2, .rank_main = two_waiters_rank},
    {.name = "release_while_waiting", .nranks = 2, .rank_main = release_while_waiting_rank},
    {.name = "generation_2_31", .nranks = 1, .rank_main = generation_2_31_rank},
    {.name = "generation_2_32", .nranks = 1, .rank_main = generation_2_32_rank},
    {.name = "finalize_while_waiting", .nranks = 2, .rank_main = finalize_while_waiting_rank},
    {.name = "wait_timeout", .nranks = 2, .rank_main = wait_timeout_rank},
    {.name = "wait_forever", .nranks = 2, .rank_main = wait_forever_rank},
    {.name = "fork_child_collective", .nranks = 2, .rank_main = fork_child_collective_rank},
    {.name = "fork_child_exit", .nranks = 2, .rank_main = fork_child_exit_rank},
    {.name = "fork_child_before_init", .nranks = 2, .rank_main = fork_child_before_init_rank},
    /* 64 slots of 64 KiB: the root can put the whole message and leave at once */
    {.name = "root_leaves_after_broadcast", .nranks = 3, .rank_main = root_leaves_after_broadcast_rank, .jobs = 10,
     .env = {"TNT_SHM_SLOTS=64", "TNT_SHM_SLOT_KB=64"}},
    {.name = "diverged_in_a_bit_round", .nranks = 2, .rank_main = diverged_rank},
    {.name = "shapes_that_differ", .nranks = 2, .rank_main = shapes_that_differ_rank},
    {.name = "leftover_host_marks", .nranks = 1, .rank_main = leftover_host_marks_rank},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

static int run_case(const edge_case_t *c) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    case_name = c->name;
    for (int i = 0; i < 3 && c->env[i]; i++) putenv((char *)c->env[i]);
    int failed = 0;
    for (int job = 0; job < (c->jobs ? c->jobs : 1) && !failed; job++) failed = run_ranks(c->nranks, c->rank_main);
    exit(failed ? 1 : 0);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 0;
  char text[128];
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) printf("%s: passed\n", c->name);
  else printf("%s: FAILED (%s)\n", c->name, WIFEXITED(st) && WEXITSTATUS(st) == 1 ? "see above" : status_text(st, text, sizeof text));
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int passed = 0, failed = 0;
  if (argc > 1 && !strcmp(argv[1], "--list")) {
    for (int i = 0; i < NCASES; i++) printf("%s\n", cases[i].name);
    return 0;
  }
  for (int a = 1; a < argc; a++) {
    int known = 0;
    for (int i = 0; i < NCASES; i++) known |= !strcmp(argv[a], cases[i].name);
    if (!known) {
      fprintf(stderr, "test_edges: no case named '%s' (see test_edges --list)\n", argv[a]);
      return 2;
    }
  }
  for (int i = 0; i < NCASES; i++) {
    int chosen = argc == 1;
    for (int a = 1; a < argc; a++) chosen |= !strcmp(argv[a], cases[i].name);
    if (!chosen) continue;
    if (run_case(&cases[i])) passed++;
    else failed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
