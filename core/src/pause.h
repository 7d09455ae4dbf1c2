/* pause.h - the time this process was stopped does not count on tnt_now()'s
 * clock (pause.c). */
#ifndef TNT_PAUSE_H
#define TNT_PAUSE_H

#include <stdint.h>

/* Install the SIGCONT handler that counts pauses (once per process; chained in
 * front of the program's own handler). Until then tnt_now() is the plain
 * monotonic clock. */
void tnt_pause_arm(void);

#endif
