/* timeline.h - per-rank Chrome-trace / Perfetto JSON of the core's phases.
 * One row (tid) per tensor name, so overlap between tensors is visible. */
#ifndef TNT_TIMELINE_H
#define TNT_TIMELINE_H

#include <stdint.h>

#include "tarantella.h"

typedef struct tnt_timeline tnt_timeline_t;

/* NULL (and no error) when path is empty. With several ranks, "trace.json"
 * becomes "trace.rank<r>.json" so that ranks never write the same file. */
tnt_result_t tnt_timeline_open(tnt_timeline_t **tl, const char *path, int rank, int size);
/* A complete event: `phase` on the row of `tensor`, from start_us to end_us. */
void tnt_timeline_event(tnt_timeline_t *tl, const char *tensor, const char *phase, int64_t start_us, int64_t end_us,
                        const char *detail);
void tnt_timeline_close(tnt_timeline_t *tl);

#endif
