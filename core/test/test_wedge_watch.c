/* test_wedge_watch.c - the watch of plugins/wedge_watch.h, which ends a
 * process whose thread never comes back from its transport's engine after a
 * local peer died (Open MPI's shared-memory queue, its sender killed mid-link).
 *
 * Each case runs in a process of its own (the watch ends it), all at once:
 *   wedged        a peer's process is gone and the plugin's lock stays taken:
 *                 the process ends with WEDGED_EXIT_CODE within WATCH_S +
 *                 WEDGED_S (and a margin), its log naming the dead rank
 *   busy_not_wedged  a peer is gone, and a poll loop holds the lock 95% of the
 *                 time, freeing it between polls: the process lives on
 *   peers_alive   the lock stays taken but every peer lives (a slow call, a
 *                 debugger): the watch leaves it alone
 *   stops         a watch stops at once, and again as a no-op
 * Built and run by test/common/test_c_core.py (or `make -C core test`). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include "transport/plugins/wedge_watch.h"
#include "expect.h"

/* ---- the core's services, as a plugin sees them ---- */

static FILE *log_file; /* each case's log: the parent reads what the watch said */

static void log_line(int level, const char *file, int line, const char *msg) {
  fprintf(log_file, "[%d] %s:%d %s\n", level, file, line, msg);
  fflush(log_file);
}
static int log_on(int level) { return 1; }
static tnt_result_t fail(tnt_result_t code, int peer, const char *msg) { return code; }
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static const tnt_plugin_host_t test_host = {TNT_PLUGIN_ABI_VERSION, sizeof(tnt_plugin_host_t), log_line, log_on, fail,
                                            now_s};

static void plugin_failed(tnt_result_t code) { (void)code; }

/* ---- a job of two ranks on this host: rank 0 watches, rank 1 is `peer_pid` ---- */

static pthread_mutex_t plugin_mu = PTHREAD_MUTEX_INITIALIZER;
static peer_health_t peers[2];
static job_health_t health = {.me = 0, .n = 2, .peer = peers, .mu = &plugin_mu};
static wedge_watch_t watch;

static void start(pid_t peer_pid) {
  host = &test_host;
  peers[1] = (peer_health_t){.pid = peer_pid, .local = 1, .host = "here", .root = -1};
  if (!wedge_watch_start(&watch, &health, "the engine")) _exit(90);
}

/* A process that has exited and been reaped: its pid is gone. */
static pid_t dead_pid(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, NULL, 0);
  return pid;
}

static void wedged(pid_t peer) {
  start(peer);
  pthread_mutex_lock(&plugin_mu); /* the call that never returns */
  sleep(10);
  _exit(0); /* not ended by the watch */
}

static void busy_not_wedged(pid_t peer) {
  start(peer);
  for (double until = now_s() + WATCH_S + WEDGED_S + 1.0; now_s() < until;) {
    pthread_mutex_lock(&plugin_mu);
    for (double t = now_s(); now_s() - t < 950e-6;) {
    }
    pthread_mutex_unlock(&plugin_mu);
    sleep_s(50e-6);
  }
  wedge_watch_stop(&watch);
  _exit(0);
}

static void peers_alive(pid_t peer) {
  start(peer);
  pthread_mutex_lock(&plugin_mu);
  sleep_s(WATCH_S + WEDGED_S + 1.0);
  pthread_mutex_unlock(&plugin_mu);
  wedge_watch_stop(&watch);
  _exit(0);
}

static void stops(pid_t peer) {
  start(peer);
  double t = now_s();
  wedge_watch_stop(&watch);
  wedge_watch_stop(&watch);
  _exit(now_s() - t < 0.2 ? 0 : 91);
}

typedef struct {
  const char *name;
  void (*fn)(pid_t peer);
  int peer_dead;
  int status; /* the exit code it must end with */
  pid_t pid;
  char log[64];
} test_case_t;

int main(void) {
  test_case_t cases[] = {
      {.name = "wedged", .fn = wedged, .peer_dead = 1, .status = WEDGED_EXIT_CODE},
      {.name = "busy_not_wedged", .fn = busy_not_wedged, .peer_dead = 1},
      {.name = "peers_alive", .fn = peers_alive},
      {.name = "stops", .fn = stops, .peer_dead = 1},
  };
  enum { N = sizeof cases / sizeof cases[0] };
  const double t0 = now_s();
  for (int i = 0; i < N; i++) {
    test_case_t *c = &cases[i];
    snprintf(c->log, sizeof c->log, "/tmp/tnt-wedge-watch-%d-%d.log", (int)getpid(), i);
    pid_t peer = c->peer_dead ? dead_pid() : getpid(); /* a live one: this program */
    fflush(NULL);
    c->pid = fork();
    if (c->pid == 0) {
      log_file = fopen(c->log, "w");
      if (!log_file) _exit(92);
      alarm(20); /* a case that hangs fails instead */
      c->fn(peer);
    }
  }
  for (int i = 0; i < N; i++) {
    test_case_t *c = &cases[i];
    int status = 0;
    waitpid(c->pid, &status, 0);
    const double took = now_s() - t0;
    char said[2048] = "";
    FILE *f = fopen(c->log, "r");
    if (f) {
      size_t n = fread(said, 1, sizeof said - 1, f);
      said[n] = 0;
      fclose(f);
    }
    unlink(c->log);
    const int ok = WIFEXITED(status) && WEXITSTATUS(status) == c->status;
    EXPECT(ok);
    if (!ok) fprintf(stderr, "case %s: wait status %#x, expected exit code %d; it logged: %s\n", c->name, status,
                     c->status, said);
    if (c->status == WEDGED_EXIT_CODE) {
      EXPECT(strstr(said, "rank 0 is stuck inside the engine") && strstr(said, "since rank 1 (pid ") &&
             strstr(said, " on here) died") && strstr(said, "exit code 70"));
      EXPECT(took < WATCH_S + WEDGED_S + 5.0); /* within seconds, not at the job's time limit */
    } else {
      EXPECT(said[0] == 0); /* nothing to say */
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
