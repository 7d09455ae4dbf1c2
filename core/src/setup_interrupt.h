/* setup_interrupt.h - Ctrl-C during tnt_init's waits for the other ranks.
 *
 * tnt_init waits for the job's other ranks (the shared segment, every rank to attach) up to
 * TNT_TIMEOUT_S, 300 s by default, inside one C call. Python's SIGINT handler only records the
 * signal for the interpreter, which acts on it when the call returns: Ctrl-C on a hand-made
 * rank waiting for one that never started did nothing for those 300 s. While tnt_init runs, a
 * handler of ours, chained in front of the program's own (never in place of the default action
 * or of an ignored SIGINT), notes the signal; the set-up's waits look at it at every check and
 * fail at once, and the program's handler has run as ever (Python: KeyboardInterrupt). */
#ifndef TNT_SETUP_INTERRUPT_H
#define TNT_SETUP_INTERRUPT_H

#include "common.h"

/* Chain the handler (when the program has one of its own for SIGINT) and clear the note. */
void tnt_setup_interrupt_arm(void);
/* Put the program's handler back (if ours is still the one installed). */
void tnt_setup_interrupt_disarm(void);
/* TNT_SUCCESS, or the failure of a set-up interrupted by SIGINT, or by the process's exit. */
tnt_result_t tnt_setup_interrupt_check(void);
/* The process is exiting (exit() in another thread while tnt_init waits: context.c's exit
 * handler): the set-up's waits fail at their next check, whatever the SIGINT handling, so that
 * the failure path removes what the set-up made and tells the other ranks. Once per process. */
void tnt_setup_interrupt_exiting(void);

#endif
