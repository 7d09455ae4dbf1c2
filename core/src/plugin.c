/* plugin.c - loads transports that live in shared libraries (transport_plugin.h).
 *
 * dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE): the plugin's symbols (and its
 * MPI's) stay out of the process's global namespace, every undefined symbol is
 * found now rather than at the first call, and the library is never unmapped
 * (its atexit handlers and threads may outlive a tnt_finalize). Each check
 * that fails says what to do; the loaded plugins are remembered per process. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "transport_plugin.h"

typedef struct {
  char name[16];
  char path[PATH_MAX];
  const tnt_plugin_t *plugin;
} loaded_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static loaded_t loaded[4];
static int nloaded;

static void host_log(int level, const char *file, int line, const char *msg) {
  if (level < TNT_LOG_DEBUG) level = TNT_LOG_DEBUG;
  if (level > TNT_LOG_ERROR) level = TNT_LOG_ERROR;
  tnt_log(level, file ? file : "plugin", line, "%s", msg ? msg : "");
}

static tnt_result_t host_fail(tnt_result_t code, int peer, const char *msg) {
  return tnt_fail_about(code, peer, "%s", msg ? msg : "transport plugin error");
}

static double host_now(void) { return tnt_now(); }

static const tnt_plugin_host_t host = {
    .abi_version = TNT_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(tnt_plugin_host_t),
    .log = host_log,
    .log_enabled = tnt_log_enabled,
    .fail = host_fail,
    .now = host_now,
};

/* Where the plugin of `name` is: $TNT_<NAME>_PLUGIN, else beside the core. */
static int plugin_path(const char *name, char *out, size_t len, char *var, size_t var_len) {
  snprintf(var, var_len, "TNT_%s_PLUGIN", name);
  for (char *c = var; *c; c++) *c = (char)toupper((unsigned char)*c);
  const char *env = getenv(var);
  if (env && *env) {
    snprintf(out, len, "%s", env);
    return 1;
  }
  Dl_info info;
  if (dladdr((void *)&tnt_plugin_transport, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    const char *slash = strrchr(info.dli_fname, '/');
    snprintf(out, len, "%.*s/libtnt-transport-%s.so", (int)(slash - info.dli_fname), info.dli_fname, name);
    return 0;
  }
  snprintf(out, len, "libtnt-transport-%s.so", name);
  return 0;
}

/* The ABI of a library that lacks our entry: the first other version it exports. */
static int other_abi(void *lib) {
  for (int v = 0; v < 64; v++) {
    char sym[64];
    snprintf(sym, sizeof sym, TNT_PLUGIN_ENTRY_PREFIX "%d", v);
    if (v != TNT_PLUGIN_ABI_VERSION && dlsym(lib, sym)) return v;
  }
  return -1;
}

#define REBUILD "rebuild the plugin from this release of Tarantella (the Python package rebuilds it at first use)"

static tnt_result_t check_plugin(const char *name, const char *path, const tnt_plugin_t *p) {
  if (p->abi_version != TNT_PLUGIN_ABI_VERSION || p->struct_size != sizeof(tnt_plugin_t))
    return tnt_fail(TNT_ERR_INVALID_USAGE,
                    "the %s transport plugin %s declares plugin ABI version %u with a %u-byte descriptor; this "
                    "Tarantella speaks ABI version %d with a %zu-byte descriptor: %s",
                    name, path, p->abi_version, p->struct_size, TNT_PLUGIN_ABI_VERSION, sizeof(tnt_plugin_t), REBUILD);
  if (p->transport_size != sizeof(tnt_transport_t) || p->placement_size != sizeof(tnt_placement_t) ||
      p->params_size != sizeof(tnt_params_t))
    return tnt_fail(TNT_ERR_INVALID_USAGE,
                    "the %s transport plugin %s was built from other headers than this Tarantella (sizes of the "
                    "transport table, placement and settings: %u, %u, %u bytes; here %zu, %zu, %zu): %s",
                    name, path, p->transport_size, p->placement_size, p->params_size, sizeof(tnt_transport_t),
                    sizeof(tnt_placement_t), sizeof(tnt_params_t), REBUILD);
  if (!p->name || strcmp(p->name, name))
    return tnt_fail(TNT_ERR_INVALID_USAGE, "%s is the plugin of transport '%s', not of '%s': check TNT_%s_PLUGIN",
                    path, p->name ? p->name : "(unnamed)", name, name);
  const tnt_transport_t *t = p->transport;
  if (!t || !t->name || strcmp(t->name, name) || !t->can_serve || !t->init || !t->put || !t->fence ||
      !t->send_buffer || !t->window || !t->notify ||
      !t->wait || !t->exchange || !t->exchange_post || !t->exchange_collect || !t->ring_doorbell ||
      !t->cycle_wanted || !t->wait_doorbell || !t->check_peers || !t->describe_peer || !t->wake_local ||
      !t->abort || !t->finalize)
    return tnt_fail(TNT_ERR_INVALID_USAGE, "the %s transport plugin %s has an incomplete function table: %s", name,
                    path, REBUILD);
  return TNT_SUCCESS;
}

static tnt_result_t load(const char *name, const tnt_transport_t **out) {
  char path[PATH_MAX], var[48];
  int from_env = plugin_path(name, path, sizeof path, var, sizeof var);
  for (int i = 0; i < nloaded; i++)
    if (!strcmp(loaded[i].name, name) && !strcmp(loaded[i].path, path)) {
      *out = loaded[i].plugin->transport;
      return TNT_SUCCESS;
    }
  if (nloaded == (int)(sizeof loaded / sizeof loaded[0]))
    return tnt_fail(TNT_ERR_INVALID_USAGE, "too many transport plugins loaded in this process (%d)", nloaded);
  if (access(path, F_OK) != 0) {
    if (from_env)
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "the %s transport plugin %s=%s does not exist (%s): set %s to the path "
                      "of libtnt-transport-%s.so, or unset it so that the Python package builds one. Received: %s=%s",
                      name, var, path, strerror(errno), var, name, var, path);
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                    "the %s transport is a plugin loaded at run time, and none was found: %s is unset and %s does not "
                    "exist. The Python package builds it at first use where an MPI is found (mpicc); from C, build it "
                    "with `make -C core %s` and set %s to its path. Received: %s unset",
                    name, var, path, name, var, var);
  }
  dlerror();
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib) {
    const char *err = dlerror();
    return tnt_fail(TNT_ERR_INVALID_USAGE,
                    "cannot load the %s transport plugin %s: %s (a library it was built against is missing or "
                    "changed: %s)",
                    name, path, err ? err : "dlopen failed", REBUILD);
  }
  char sym[64];
  snprintf(sym, sizeof sym, TNT_PLUGIN_ENTRY_PREFIX "%d", TNT_PLUGIN_ABI_VERSION);
  tnt_plugin_entry_t entry = (tnt_plugin_entry_t)dlsym(lib, sym);
  if (!entry) {
    int other = other_abi(lib);
    dlclose(lib);
    if (other >= 0)
      return tnt_fail(TNT_ERR_INVALID_USAGE,
                      "the %s transport plugin %s was built for plugin ABI version %d (it exports %s%d, not %s); "
                      "this Tarantella speaks version %d: %s",
                      name, path, other, TNT_PLUGIN_ENTRY_PREFIX, other, sym, TNT_PLUGIN_ABI_VERSION, REBUILD);
    return tnt_fail(TNT_ERR_INVALID_USAGE,
                    "%s is not a Tarantella transport plugin: it exports no %s<N> entry (this Tarantella looks for %s)",
                    path, TNT_PLUGIN_ENTRY_PREFIX, sym);
  }
  char why[512] = "";
  const tnt_plugin_t *p = entry(&host, why, sizeof why);
  if (!p)
    return tnt_fail(TNT_ERR_INVALID_USAGE, "the %s transport plugin %s cannot be used: %s", name, path,
                    why[0] ? why : "its entry returned no descriptor");
  TNT_CHECK(check_plugin(name, path, p));
  loaded_t *l = &loaded[nloaded++];
  snprintf(l->name, sizeof l->name, "%s", name);
  snprintf(l->path, sizeof l->path, "%s", path);
  l->plugin = p;
  TNT_INFO("transport plugin %s loaded from %s (ABI %d; %s%s%s): %s", name, path, TNT_PLUGIN_ABI_VERSION,
           p->caps & TNT_TRANSPORT_CAP_MULTI_HOST ? "multi-host" : "one host",
           p->caps & TNT_TRANSPORT_CAP_ONE_SIDED ? ", one-sided puts" : ", two-sided puts",
           p->caps & TNT_TRANSPORT_CAP_HEARTBEAT ? ", heartbeats" : "", p->description ? p->description : "");
  *out = p->transport;
  return TNT_SUCCESS;
}

tnt_result_t tnt_plugin_transport(const char *name, const tnt_transport_t **out) {
  if (!name || strlen(name) >= sizeof loaded[0].name)
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "bad transport name");
  pthread_mutex_lock(&mu);
  tnt_result_t res = load(name, out);
  pthread_mutex_unlock(&mu);
  return res;
}
