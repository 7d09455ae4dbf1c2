/* transport_plugin.h - the ABI between the core and a transport loaded at run
 * time (docs/transport.md, "Plugins").
 *
 * Transports other than shm live in shared libraries (libtnt-transport-<name>.so)
 * that the core dlopen()s with RTLD_LOCAL: the plugin cannot see the core's
 * symbols, and the core sees only one of the plugin's, the entry
 *
 *     const tnt_plugin_t *tnt_transport_plugin_v<ABI>(const tnt_plugin_host_t *host,
 *                                                    char *why, size_t why_len);
 *
 * (NCCL's ncclNetPlugin_v<N> pattern: the version is in the symbol's name, so a
 * plugin may export several entries and an old core finds the one it speaks).
 * The core passes a table of callbacks (logging, recording an error that names
 * a peer, the clock its deadlines use); the plugin returns a descriptor with
 * the ABI version and the sizes it was compiled with, its capabilities, and the
 * transport's function table (transport.h), or NULL with `why` filled in.
 *
 * The ABI covers this file, transport.h and the structs of params.h that
 * transport.h passes (tnt_placement_t, tnt_params_t): change any of them and
 * bump TNT_PLUGIN_ABI_VERSION. The sizes in the descriptor catch a forgotten
 * bump. A plugin is loaded once per process and never unloaded. */
#ifndef TNT_TRANSPORT_PLUGIN_H
#define TNT_TRANSPORT_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define TNT_PLUGIN_ABI_VERSION 8
#define TNT_PLUGIN_ENTRY_PREFIX "tnt_transport_plugin_v"
/* The entry a plugin built from these headers exports: tnt_transport_plugin_v<ABI>. */
#define TNT_PLUGIN_ENTRY_NAME_(v) tnt_transport_plugin_v##v
#define TNT_PLUGIN_ENTRY_NAME(v) TNT_PLUGIN_ENTRY_NAME_(v)
#define TNT_PLUGIN_ENTRY TNT_PLUGIN_ENTRY_NAME(TNT_PLUGIN_ABI_VERSION)

/* What a transport can do, for selection and logs. */
enum {
  TNT_TRANSPORT_CAP_MULTI_HOST = 1u << 0, /* connects ranks on different hosts */
  TNT_TRANSPORT_CAP_ONE_SIDED = 1u << 1,  /* put is a one-sided write (RDMA); else two-sided messages */
  TNT_TRANSPORT_CAP_HEARTBEAT = 1u << 2,  /* a lost remote peer is found by silence (heartbeats), not reported */
};

/* The core's services, for a plugin that cannot link against the core. */
typedef struct tnt_plugin_host {
  uint32_t abi_version; /* TNT_PLUGIN_ABI_VERSION of the core */
  uint32_t struct_size; /* sizeof(tnt_plugin_host_t) of the core */
  /* A log line at TNT_LOG_DEBUG..ERROR (common.h's levels), shown as the core's
   * own lines are (TNT_LOG_LEVEL, rank prefix); `file`/`line` name the source. */
  void (*log)(int level, const char *file, int line, const char *msg);
  int (*log_enabled)(int level);
  /* Record `msg` as the calling thread's last error (tnt_last_error) and return
   * `code`; `peer` is the rank a PEER_LOST or TIMEOUT is about (-1: none). */
  tnt_result_t (*fail)(tnt_result_t code, int peer, const char *msg);
  /* The monotonic clock, in seconds, of every deadline the core passes in. */
  double (*now)(void);
} tnt_plugin_host_t;

typedef struct tnt_plugin {
  uint32_t abi_version;    /* TNT_PLUGIN_ABI_VERSION the plugin was built with */
  uint32_t struct_size;    /* sizeof(tnt_plugin_t) */
  uint32_t transport_size; /* sizeof(tnt_transport_t) */
  uint32_t placement_size; /* sizeof(tnt_placement_t) */
  uint32_t params_size;    /* sizeof(tnt_params_t) */
  uint32_t caps;           /* TNT_TRANSPORT_CAP_* */
  const char *name;        /* the transport's name: what TNT_TRANSPORT selects */
  const char *description; /* one line for the log, e.g. the MPI library's version */
  const tnt_transport_t *transport;
} tnt_plugin_t;

typedef const tnt_plugin_t *(*tnt_plugin_entry_t)(const tnt_plugin_host_t *host, char *why, size_t why_len);

/* The descriptor's fixed part, filled in by a plugin built from these headers. */
#define TNT_PLUGIN_SIZES                                                                        \
  .abi_version = TNT_PLUGIN_ABI_VERSION, .struct_size = sizeof(tnt_plugin_t),                   \
  .transport_size = sizeof(tnt_transport_t), .placement_size = sizeof(tnt_placement_t),         \
  .params_size = sizeof(tnt_params_t)

/* The core's loader (plugin.c): the transport `name` from its plugin library,
 * loaded on first use. Where the library is: $TNT_<NAME>_PLUGIN (the Python
 * package sets it after building the plugin), else libtnt-transport-<name>.so
 * beside the core's own library. The error says why it cannot be used. */
tnt_result_t tnt_plugin_transport(const char *name, const tnt_transport_t **out);

#endif
