/* ancestry.h - is this process a child of a rank of the job it is joining, or
 * has a child of this one taken its rank? */
#ifndef TNT_ANCESTRY_H
#define TNT_ANCESTRY_H

#include <sys/types.h>

/* The nearest ancestor of this process (its parent, the parent's parent, ...)
 * that maps the shared-memory object `name` ("/tnt-<job>") after its name
 * was removed (the kernel shows "/dev/shm/tnt-<job> (deleted)" in its maps):
 * a rank of a job whose ranks have all attached. 0 when there is none, or
 * when /proc cannot tell. */
pid_t tnt_ancestor_in_job(const char *name);

/* Whether `pid` is an ancestor of this process (its parent, the parent's
 * parent, ...); 0 also when /proc cannot tell. */
int tnt_is_ancestor(pid_t pid);

/* Whether this process is an ancestor of `pid` (its parent, the parent's
 * parent, ...); 0 also when /proc cannot tell. */
int tnt_is_descendant(pid_t pid);

/* This process's descendants (children, their children, ...), found by
 * reading every /proc/<pid>/stat: up to `cap` of them into `out`; how many. */
int tnt_descendants(pid_t *out, int cap);

/* A descriptor (O_RDWR, close-on-exec) of the shared-memory object `name`
 * ("/tnt-<job>", its name removed or not) that process `pid` holds open, opened
 * through /proc/<pid>/fd; -1 when it holds none or /proc will not open it. */
int tnt_open_object_of(pid_t pid, const char *name);

#endif
