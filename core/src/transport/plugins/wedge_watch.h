/* wedge_watch.h - a thread that ends a process stuck for good inside its
 * transport's engine after a local peer died (plugins/mpi.c starts one).
 *
 * Why: Open MPI's shared-memory transport (btl vader) links a message into
 * its receiver's queue in two steps, and a sender killed between them leaves
 * the receiver spinning inside MPI for ever, waiting for the link
 * (vader_fifo_read, btl_vader_fifo.h). The plugin's thread in that call holds
 * the plugin's lock and never returns, so none of the plugin's checks runs
 * again: the rank would hang until the job's time limit, though the death that
 * caused it is plain to see.
 *
 * The rule: every call a plugin makes into its engine under its lock returns
 * at once (the plugins poll), so while a local peer's process is gone the lock
 * must come free within WEDGED_S. If it does not, the process is stuck: the
 * watch says so, naming the dead rank, and ends the process
 * (_exit(WEDGED_EXIT_CODE)), so that the job ends and its launcher reports the
 * dead rank as the root cause. The other ranks name this one as lost, as they
 * would any rank that died.
 *
 * While every peer lives it costs a look at each local peer's /proc entry
 * every WATCH_S, and takes nothing: the lock is tried only once a peer is gone.
 *
 * Header-only, shipped and digested with the plugins' sources as
 * peer_health.h is. */
#ifndef TNT_WEDGE_WATCH_H
#define TNT_WEDGE_WATCH_H

#include "peer_health.h" /* and plugin_util.h */

#define WATCH_S 0.1          /* how often the watch looks at the local peers (often enough to see the
                              * first death alone: the ranks it brings down follow within a fraction
                              * of a second, and the message must name the one that died first) */
#define WEDGED_S 2.0         /* how long the lock may stay taken once a peer is gone */
#define WEDGE_TRY_S 0.005    /* how often the lock is tried meanwhile */
#define WEDGED_EXIT_CODE 70  /* EX_SOFTWARE: the process ended itself, stuck in its engine */

typedef struct {
  pthread_t thread;
  pid_t owner; /* the process that started the thread: a fork()ed child has no thread to stop */
  _Atomic uint32_t stop; /* 1: end the watch; the thread sleeps on it (futex) between looks */
  /* what is watched: health->mu, the plugin's lock; of the peers only their
   * pids and hosts are read, which never change after set-up */
  const job_health_t *health;
  const char *engine; /* "MPI": named in the message */
} wedge_watch_t;

/* The first local peer whose process is gone, from `from` on, or -1. */
static inline int gone_local_peer(const job_health_t *h, int from) {
  for (int r = from; r < h->n; r++)
    if (r != h->me && peer_pid_gone(h, r)) return r;
  return -1;
}

/* Sleep up to `seconds` unless stopped (a signal may end it sooner: the next
 * look comes early, no harm): 1 when stopped. */
static inline int watch_pause(wedge_watch_t *w, double seconds) {
  struct timespec ts = timespec_of(seconds);
  if (!atomic_load(&w->stop)) futex(&w->stop, FUTEX_WAIT, 0, &ts);
  return (int)atomic_load(&w->stop);
}

/* Whether the plugin's lock stays taken for WEDGED_S. It is tried rather than
 * waited for (pthread_mutex_timedlock counts on the wall clock, which may
 * jump): a poll loop that frees it between polls is caught free long before. */
static inline int lock_stays_taken(wedge_watch_t *w) {
  const double until = host->now() + WEDGED_S;
  while (host->now() < until) {
    if (pthread_mutex_trylock(w->health->mu) == 0) {
      pthread_mutex_unlock(w->health->mu);
      return 0;
    }
    if (watch_pause(w, WEDGE_TRY_S)) return 0;
  }
  return 1;
}

static inline void *wedge_watch_main(void *arg) {
  wedge_watch_t *w = arg;
  const job_health_t *h = w->health;
  int dead = -1; /* the first peer seen gone: the others a death brings down go after it */
  while (!watch_pause(w, WATCH_S)) {
    if (dead < 0) dead = gone_local_peer(h, 0);
    if (dead < 0 || !lock_stays_taken(w)) continue;
    const peer_health_t *p = &h->peer[dead];
    char also[96] = ""; /* " (gone since: ranks 0 3)": the deaths seen after the first */
    for (int r = gone_local_peer(h, 0); r >= 0; r = gone_local_peer(h, r + 1)) {
      const size_t used = strlen(also);
      if (r != dead && used < sizeof also - 16) snprintf(also + used, sizeof also - used, "%s %d", used ? "" : " (gone since: ranks", r);
    }
    if (also[0]) strcat(also, ")");
    plugin_log(LOG_ERROR, "wedge_watch.h", __LINE__,
               "rank %d is stuck inside %s: a call into it has not returned for %.0f s since rank %d (pid %d on %s) "
               "died%s, and it never will (an MPI's shared-memory transport can wait for ever for a message whose "
               "sender died writing it: Open MPI's does). This process ends now with exit code %d, so that the job "
               "does not hang; rank %d's own output says why it died",
               h->me, w->engine, WEDGED_S, dead, p->pid, p->host, also, WEDGED_EXIT_CODE, dead);
    _exit(WEDGED_EXIT_CODE);
  }
  return NULL;
}

/* Start watching `health`'s lock; 0 when the thread could not start (the
 * plugin then runs unwatched, as it did before, and says so). */
static inline int wedge_watch_start(wedge_watch_t *w, const job_health_t *health, const char *engine) {
  memset(w, 0, sizeof *w);
  w->health = health;
  w->engine = engine;
  if (pthread_create(&w->thread, NULL, wedge_watch_main, w) != 0) return 0;
  w->owner = getpid();
  return 1;
}

/* Stop the watch (not with the plugin's lock held: the watch may be trying it). */
static inline void wedge_watch_stop(wedge_watch_t *w) {
  if (!w->owner) return;
  if (w->owner == getpid()) {
    atomic_store(&w->stop, 1);
    futex(&w->stop, FUTEX_WAKE, INT_MAX, NULL);
    pthread_join(w->thread, NULL);
  }
  w->owner = 0;
}

#endif
