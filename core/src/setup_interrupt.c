/* setup_interrupt.c - Ctrl-C during tnt_init's waits (setup_interrupt.h). */
#define _GNU_SOURCE
#include "setup_interrupt.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>

static struct sigaction previous; /* the program's handler, called after ours */
static _Atomic int armed, interrupted;
/* the last set-up failed on `interrupted` (tnt_setup_was_interrupted): kept past the disarm */
static _Atomic int gave_up;
/* 0: the program's SIGINT handler decides alone (tnt_setup_sigint) */
static _Atomic int chain = 1;
/* the process is exiting (tnt_setup_interrupt_exiting): never cleared, it ends for good */
static _Atomic int exiting;
/* tnt_setup_cancel(1): the set-up in progress (or the next one) gives up; tnt_setup_cancel(0) clears it */
static _Atomic int cancelled;
/* between arm and disarm: a set-up is in progress. The collectives' waits share the set-up's
 * checks; `exiting` and `cancelled` fail only the set-up's */
static _Atomic int in_setup;

void tnt_setup_cancel(int on) { atomic_store(&cancelled, on != 0); }

void tnt_setup_sigint(int on) { atomic_store(&chain, on != 0); }

static void on_sigint(int sig, siginfo_t *info, void *context) {
  atomic_store(&interrupted, 1);
  if (previous.sa_flags & SA_SIGINFO) previous.sa_sigaction(sig, info, context);
  else previous.sa_handler(sig);
}

int tnt_setup_was_interrupted(void) { return atomic_load(&gave_up); }

void tnt_setup_interrupt_arm(void) {
  atomic_store(&interrupted, 0);
  atomic_store(&gave_up, 0);
  atomic_store(&in_setup, 1);
  struct sigaction now;
  if (!atomic_load(&chain) || atomic_load(&armed) || sigaction(SIGINT, NULL, &now) != 0) return;
  /* the default action ends the process at once anyway; an ignored SIGINT stays ignored */
  if (!(now.sa_flags & SA_SIGINFO) && (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN)) return;
  previous = now;
  struct sigaction ours;
  memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = on_sigint;
  ours.sa_mask = now.sa_mask;
  ours.sa_flags = (now.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
  if (sigaction(SIGINT, &ours, NULL) == 0) atomic_store(&armed, 1);
}

void tnt_setup_interrupt_disarm(void) {
  atomic_store(&in_setup, 0);
  if (!atomic_load(&armed)) return;
  struct sigaction now;
  /* a handler the program installed meanwhile is its own: leave it */
  if (sigaction(SIGINT, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigint)
    sigaction(SIGINT, &previous, NULL);
  atomic_store(&armed, 0);
  atomic_store(&interrupted, 0); /* the collectives' waits, which share the set-up's checks, never see it */
}

void tnt_setup_interrupt_exiting(void) { atomic_store(&exiting, 1); }

tnt_result_t tnt_setup_interrupt_check(void) {
  if (atomic_load(&in_setup) && atomic_load(&exiting))
    return tnt_fail(TNT_ERR_SYSTEM, "the process exited while this rank was setting up the job (exit() or the end of "
                    "the main thread while another thread was in tnt_init waiting for the others)");
  if (atomic_load(&in_setup) && atomic_load(&cancelled))
    return tnt_fail(TNT_ERR_INVALID_USAGE, "tnt.shutdown() (tnt_setup_cancel) was called in another thread while this "
                    "rank was setting up the job: it gave up waiting for the others");
  if (!atomic_load(&armed) || !atomic_load(&interrupted)) return TNT_SUCCESS;
  atomic_store(&gave_up, 1);
  return tnt_fail(TNT_ERR_SYSTEM, "interrupted (SIGINT, Ctrl-C) while setting up the job: this rank gave up "
                  "waiting for the others");
}
