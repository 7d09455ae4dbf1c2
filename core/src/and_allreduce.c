/* and_allreduce.c - see and_allreduce.h. The fallback exchanges every rank's
 * words and ANDs them: N messages per rank per round, cheap where the
 * exchange is a read of shared memory (shm), and the way every transport
 * without an AND of its own (gpi2) still gets the smaller bit rounds. */
#include "and_allreduce.h"

#include <string.h>

#include "common.h"

tnt_result_t tnt_and_post(const tnt_transport_t *t, void *ts, tnt_and_scratch_t *sc, const uint64_t *mine, int nwords,
                          const tnt_ride_t *ride, const void *payload, double deadline) {
  if (nwords < 1 || nwords > TNT_AND_MAX_WORDS || (size_t)nwords * sizeof *mine > sc->stride)
    return tnt_fail(TNT_ERR_INTERNAL, "an AND-allreduce of %d words (1 to %d, and %zu bytes per rank)", nwords,
                    TNT_AND_MAX_WORDS, sc->stride);
  sc->nwords = nwords;
  if (ride) return t->and_post_ride(ts, mine, nwords, ride, payload, deadline);
  if (t->and_post) return t->and_post(ts, mine, nwords, deadline);
  return t->exchange_post(ts, mine, (size_t)nwords * sizeof *mine, deadline);
}

tnt_result_t tnt_and_collect(const tnt_transport_t *t, void *ts, tnt_and_scratch_t *sc, uint64_t *out, double until) {
  if (t->and_collect) return t->and_collect(ts, out, until);
  tnt_result_t res = t->exchange_collect(ts, sc->all, sc->stride, sc->lens, until);
  if (res != TNT_SUCCESS) return res;
  const size_t len = (size_t)sc->nwords * sizeof *out;
  for (int w = 0; w < sc->nwords; w++) out[w] = ~0ull;
  for (int q = 0; q < sc->size; q++) {
    if (sc->lens[q] != len)
      return tnt_fail(TNT_ERR_INTERNAL, "rank %d sent %zu bytes to a bit round of %zu: the ranks have diverged "
                      "(different TNT_* settings or library versions?); stopping before any data mixes",
                      q, sc->lens[q], len);
    const uint8_t *words = (const uint8_t *)sc->all + (size_t)q * sc->stride;
    for (int w = 0; w < sc->nwords; w++) {
      uint64_t v;
      memcpy(&v, words + (size_t)w * sizeof v, sizeof v);
      out[w] &= v;
    }
  }
  return TNT_SUCCESS;
}
