/* settings_agree.h - the set-up check that every rank runs the same protocol
 * with the same protocol-relevant settings. */
#ifndef TNT_SETTINGS_AGREE_H
#define TNT_SETTINGS_AGREE_H

#include "params.h"
#include "transport.h"

/* One exchange at set-up: every rank publishes the protocol version and every
 * setting that changes what ranks send each other (fusion, cache, slots, the
 * small-message threshold); any difference fails on every rank alike, naming
 * the setting and each rank's value. */
tnt_result_t tnt_settings_agree(const tnt_transport_t *t, void *ts, const tnt_placement_t *pl, const tnt_params_t *params);

#endif
