/* ancestry.h - is this process a child of a rank of the job it is joining? */
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

#endif
