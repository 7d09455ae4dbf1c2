/* pause.h - the time this process was stopped does not count on tnt_now()'s
 * clock (pause.c). */
#ifndef TNT_PAUSE_H
#define TNT_PAUSE_H

#include <stdint.h>

/* Install the SIGCONT handler that counts pauses (once per process; chained in
 * front of the program's own handler). Until then tnt_now() is the plain
 * monotonic clock. */
void tnt_pause_arm(void);

/* on: the engine's background thread runs, and reads the clock at least
 * every second; a gap of 1.5 s or more between two readings is then time this
 * process was not run (a virtual machine the host did not run, a debugger's
 * stop), and does not count either. off: it stopped (pause.c). */
void tnt_pause_watch(int on);

#endif
