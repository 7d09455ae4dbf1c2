/* and_allreduce.h - the bitwise AND of a few words over every rank: the
 * transport's own (and_post/and_collect, e.g. recursive doubling over MPI)
 * where it has one, else the words of an exchange ANDed here. */
#ifndef TNT_AND_ALLREDUCE_H
#define TNT_AND_ALLREDUCE_H

#include "transport.h"

/* At most this many words (what one exchange message holds). */
#define TNT_AND_MAX_WORDS ((int)(TNT_EXCHANGE_MAX / sizeof(uint64_t)))

/* The fallback's scratch: every rank's words as the exchange delivers them. */
typedef struct {
  void *all;    /* [size * stride] */
  size_t stride;
  size_t *lens; /* [size] */
  int size;
  int nwords;   /* of the round in flight */
} tnt_and_scratch_t;

/* `ride`: a payload to carry in the round (transport.h's and_post_ride, which
 * the transport must have); NULL: the words alone. */
tnt_result_t tnt_and_post(const tnt_transport_t *t, void *ts, tnt_and_scratch_t *sc, const uint64_t *mine, int nwords,
                          const tnt_ride_t *ride, const void *payload, double deadline);
/* TNT_IN_PROGRESS at `until`, as exchange_collect. */
tnt_result_t tnt_and_collect(const tnt_transport_t *t, void *ts, tnt_and_scratch_t *sc, uint64_t *out, double until);

#endif
