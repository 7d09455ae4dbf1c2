/* negotiate.h - one negotiation cycle: which named requests are ready on every
 * rank, do they agree, and in which order to run them (identical everywhere). */
#ifndef TNT_NEGOTIATE_H
#define TNT_NEGOTIATE_H

#include "context.h"

/* 1 when this rank has something the others have not heard of yet. */
int tnt_negotiate_has_news(tnt_ctx_t *c);
/* Run one cycle: exchange, merge, and fill *responses (caller frees with
 * tnt_responses_free). Fails on transport errors and on ranks that diverged.
 * TNT_IN_PROGRESS when the other ranks did not answer by `until` (a caller's
 * own shorter wait): the next call resumes the same cycle. */
tnt_result_t tnt_negotiate_cycle(tnt_ctx_t *c, tnt_response_t **responses, int *nresponses, double until);
/* 1 while a cycle is posted and not yet collected. */
static inline int tnt_negotiate_in_cycle(const tnt_ctx_t *c) { return c->cycle_posted; }
/* awaited[r] = 1 for every peer some pending request still waits for. */
void tnt_negotiate_awaited(tnt_ctx_t *c, uint8_t *awaited);
void tnt_responses_free(tnt_response_t *responses, int n);
/* Cache slot bookkeeping after a response ran (LRU order). */
void tnt_negotiate_executed(tnt_ctx_t *c, const tnt_response_t *resp);
tnt_result_t tnt_negotiate_setup(tnt_ctx_t *c);
void tnt_negotiate_teardown(tnt_ctx_t *c);
/* The ranks (as text, e.g. "1, 3") that have not submitted `req` yet, as far as
 * this rank knows; for stall reports. */
void tnt_negotiate_missing(tnt_ctx_t *c, const tnt_request_t *req, char *out, size_t len);
const char *tnt_coll_name(int coll);
/* This rank's pending request of that name, or NULL. */
tnt_request_t *tnt_pending_find(tnt_ctx_t *c, const char *name);

#endif
