/* host_load.h - how many threads the machine runs now, for the host-wide
 * budget of spinning (a waiter may busy-wait only while a core is free).
 *
 * Header-only (static inline), compiled into the core (shm.c) and into the
 * run-time transport plugins (plugins/plugin_util.h), as process_state.h. */
#ifndef TNT_HOST_LOAD_H
#define TNT_HOST_LOAD_H

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

/* The kernel's count of runnable threads, /proc/loadavg's "running/total":
 * the whole machine's, whatever namespace we are in (-1: unknown). */
static inline long tnt_running_threads(void) {
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  long running = -1;
  if (n > 0) {
    buf[n] = 0;
    if (sscanf(buf, "%*s %*s %*s %ld/", &running) != 1) running = -1;
  }
  return running;
}

#endif
