/* gpi2.c - the gpi2 transport, a plugin (libtnt-transport-gpi2.so) that the
 * core loads at run time (transport_plugin.h). GPI-2 itself is loaded by this
 * plugin with dlopen() when the transport starts ($GPI2_HOME/lib64, /lib, or
 * libGPI2.so on the library path) and its functions are found with dlsym():
 * the few GASPI declarations below are written from the GASPI specification,
 * so nothing here is built against GPI-2 (GPL-3.0, packaged nowhere).
 *
 * Model (transport.h) over one GASPI segment per tnt_init, the same layout on
 * every rank:
 *   window | exchange in [2][n] | abort reasons [n] | exchange out [2] | reason out | AND out [2][steps] | staging
 * put = copy into staging + gaspi_write into the peer's window, held back so
 * that the notify after it goes out with it as one gaspi_write_notify; else
 * notify = gaspi_notify on the same queue (GPI-2 delivers a queue's requests
 * to one rank in order on every device: a notification is never seen before
 * the writes posted before it); wait = gaspi_notify_reset polled with our own
 * backoff.
 * GASPI notifications hold a value, not a count, and 0 means "none": a sender
 * sends its running count (31 bits, top bit set so it is never 0) and the
 * receiver widens it back; counters only grow, so a value overwritten before it
 * was read loses nothing. Notification ids, n ranks:
 *   [0, 2n) DATA/CREDIT by source | [2n, 3n) EXCH (round) | [3n, 4n) BELL (round)
 *   [4n, 5n) BEAT (heartbeat count) | [5n, 6n) CTRL (BYE, ABORT with its root)
 * Queue 0 carries puts and their notifications, queue 1 everything else (the
 * exchange, bells, heartbeats, goodbyes), so that draining one never waits for
 * the other. A full queue (GASPI_QUEUE_FULL) is drained and the call retried.
 *
 * No GASPI call blocks: every call gets a finite timeout, every wait polls
 * (GASPI_TEST) in a loop that checks the peers and sleeps when idle, as mpi.c
 * does (GPI-2's own blocking waits spin and never return on a dead peer).
 *
 * Failure: GPI-2 marks a rank GASPI_STATE_CORRUPT in its state vector when a
 * request to it fails (its connection broke: the process died); it does not
 * watch idle peers, so every rank also sends a BEAT to each peer every
 * TNT_GPI2_HEARTBEAT_S (default 1 s) from whichever poll loop runs (a send to
 * a dead process fails, so a killed remote rank is found within about one
 * heartbeat), and a peer silent for 10 heartbeats is lost (a frozen process, a
 * host cut off). Ranks on this host are also checked by pid, as shm does.
 *
 * GPI-2 itself: initialized once per process (gaspi_proc_init cannot run
 * twice) and never terminated (gaspi_proc_term waits for peers that may be
 * dead; exit closes its sockets). Its rank and size come from GASPI_RANK,
 * GASPI_NRANKS, GASPI_SOCKET and GASPI_MFILE, which gaspi_run sets; a job
 * started by tntrun on one host gets them from here (a machine file of this
 * host). Its ethernet device listens on fixed ports (12121 + local rank,
 * 12121 + 256 + local rank, 19000 + local rank), so two jobs on a host would
 * collide: every job gets its own range, TNT_GPI2_PORT or one derived from the
 * job id, checked free before GPI-2 starts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport_plugin.h"
#include "../process_state.h"
#include "peer_health.h" /* and plugin_util.h */

#define EXPORT __attribute__((visibility("default")))

/* ---- GASPI, from the specification (types and the calls we make) ---- */

typedef int gaspi_return_t;
typedef unsigned long gaspi_timeout_t;
typedef unsigned short gaspi_rank_t;
typedef unsigned char gaspi_segment_id_t, gaspi_queue_id_t, gaspi_group_t;
typedef int gaspi_state_t; /* an enum: the state vector holds one int per rank */
typedef unsigned long gaspi_offset_t, gaspi_size_t;
typedef unsigned int gaspi_number_t, gaspi_notification_t;
/* unsigned int since GPI-2 1.6, unsigned short before: passed in a register
 * either way, and our ids stay below 65536 */
typedef unsigned int gaspi_notification_id_t;
enum { GASPI_ERROR = -1, GASPI_SUCCESS = 0, GASPI_TIMEOUT = 1, GASPI_QUEUE_FULL = 23 };
enum { GASPI_STATE_HEALTHY = 0, GASPI_MEM_INITIALIZED = 1, GASPI_GROUP_ALL = 0, GASPI_ETHERNET = 2 };
#define GASPI_TEST 0ul

/* GPI-2's gaspi_config_t starts the same in 1.5 and 1.6 (the ports we set);
 * what follows differs, so the whole struct round-trips through a buffer
 * larger than either (gaspi_config_set takes it by value: the callee reads its
 * own size from the start of our copy). */
typedef struct {
  unsigned int logger, sn_port, net_info, user_net;
  int sn_persistent;
  gaspi_timeout_t sn_timeout;
  int network_type; /* dev_config */
  int ib_netdev;
  unsigned int ib_mtu, ib_port_check;
  unsigned int tcp_port;
} gpi2_config_head_t;
typedef struct {
  union {
    gpi2_config_head_t head;
    unsigned char bytes[1024];
  };
} gpi2_config_t;

static struct {
  gaspi_return_t (*config_get)(gpi2_config_t *);
  gaspi_return_t (*config_set)(gpi2_config_t);
  gaspi_return_t (*proc_init)(gaspi_timeout_t);
  gaspi_return_t (*proc_rank)(gaspi_rank_t *);
  gaspi_return_t (*proc_num)(gaspi_rank_t *);
  gaspi_return_t (*initialized)(gaspi_number_t *);
  gaspi_return_t (*version)(float *);
  gaspi_return_t (*notification_num)(gaspi_number_t *);
  gaspi_return_t (*segment_alloc)(gaspi_segment_id_t, gaspi_size_t, int);
  gaspi_return_t (*segment_register)(gaspi_segment_id_t, gaspi_rank_t, gaspi_timeout_t);
  gaspi_return_t (*segment_ptr)(gaspi_segment_id_t, void **);
  gaspi_return_t (*segment_delete)(gaspi_segment_id_t);
  gaspi_return_t (*barrier)(gaspi_group_t, gaspi_timeout_t);
  gaspi_return_t (*write)(gaspi_segment_id_t, gaspi_offset_t, gaspi_rank_t, gaspi_segment_id_t, gaspi_offset_t,
                          gaspi_size_t, gaspi_queue_id_t, gaspi_timeout_t);
  gaspi_return_t (*notify)(gaspi_segment_id_t, gaspi_rank_t, gaspi_notification_id_t, gaspi_notification_t,
                           gaspi_queue_id_t, gaspi_timeout_t);
  gaspi_return_t (*notify_waitsome)(gaspi_segment_id_t, gaspi_notification_id_t, gaspi_number_t,
                                    gaspi_notification_id_t *, gaspi_timeout_t);
  gaspi_return_t (*notify_reset)(gaspi_segment_id_t, gaspi_notification_id_t, gaspi_notification_t *);
  gaspi_return_t (*wait)(gaspi_queue_id_t, gaspi_timeout_t);
  gaspi_return_t (*state_vec_get)(gaspi_state_t *);
  gaspi_return_t (*write_notify)(gaspi_segment_id_t, gaspi_offset_t, gaspi_rank_t, gaspi_segment_id_t, gaspi_offset_t,
                                 gaspi_size_t, gaspi_notification_id_t, gaspi_notification_t, gaspi_queue_id_t,
                                 gaspi_timeout_t);
  const char *(*error_str)(gaspi_return_t); /* GPI-2's extension; may be absent */
} G;

/* ---- constants ---- */

enum { Q_DATA = 0, Q_CTRL = 1 };
/* Notification ids: id = range * n + source. Ranges 0 .. TNT_NOTIFY_KINDS-1 are
 * the core's counter kinds (DATA and CREDIT of each channel), the rest ours. */
enum { ID_EXCH = TNT_NOTIFY_KINDS, ID_BELL, ID_BEAT, ID_CTRL, ID_RANGES };
enum { CTRL_BYE = 1, CTRL_ABORT = 2 }; /* bits: a goodbye after an abort must not overwrite it */

#define EXCH_SLOT (16 + TNT_EXCHANGE_MAX) /* header (round, length) + message */
#define BELL_POLL_S 1e-3
#define YIELD_POLLS 20
#define CALL_TIMEOUT_MS 100ul /* a posting call's wait for GPI-2's queue lock */
#define BYE_WAIT_S 2.0
#define SEGMENT_FIRST 16      /* segment ids of this plugin: SEGMENT_FIRST + generation */
#define SEGMENT_LAST 250
/* The derived port ranges, PORT_LOW + k * PORT_STRIDE, lie below Linux's
 * ephemeral ports (32768-60999 by default), which any outgoing connection may
 * take, GPI-2's own included; fixed, not read from this host's settings:
 * every host of a job must derive the same range. */
#define PORT_LOW 10240
#define PORT_STRIDE (3 * MAX_PPN)
#define PORT_SLOTS 29
#define MAX_PPN 256           /* GPI-2's ranks per host (its port offsets) */
/* Each range of PORT_STRIDE holds MAX_PPN / PORT_STEP jobs of up to PORT_STEP ranks per host,
 * their bases PORT_STEP apart (a job uses base + local rank, + 256 + and + 512 + local rank):
 * 29 * 16 = 464 choices, so that two jobs on one host pick the same ports once in 464, not
 * once in 29 (a second gpi2 job on the same hosts failed 1 run in 29). A job of more ranks
 * per host reaches into its neighbours' ports, where a job using them is still named */
#define PORT_STEP 16
#define HELLO_MAGIC 0x544e5447u

/* A peer as GPI-2 sees it (its health: job_health_t) */
typedef struct {
  int lost; /* GPI-2 marked it corrupt: a request to it failed */
  uint32_t beats_seen;   /* widened BEAT value */
  uint32_t exch_round;   /* highest exchange round seen */
  int exch_got;
} peer_t;

typedef struct {
  uint32_t magic, abi;
  int32_t rank, size, pid, seg;
  double heartbeat_s;
  uint64_t window_bytes;
  char host[64];
  char node[96]; /* boot id and pid namespace: equal means "pids are comparable" */
  tnt_cpus_t cpus; /* the CPUs this rank may run on: its host's union counts the waits' cores */
} hello_t;

static const char *hello_node(const void *all, int r) { return ((const hello_t *)all)[r].node; }
static const tnt_cpus_t *hello_cpus(const void *all, int r) { return &((const hello_t *)all)[r].cpus; }

typedef struct {
  tnt_placement_t pl;
  int me, n;
  double timeout_s;
  wait_policy_t waits; /* how a wait polls before it sleeps */
  machine_share_t share; /* the ranks on this machine and the CPUs they may run on (machine_share) */
  wait_counts_t wait_counts;
  pthread_mutex_t mu; /* every GASPI call and everything below */
  job_health_t health; /* every peer's record (TNT_GPI2_HEARTBEAT_S), a failure seen by progress */
  gaspi_segment_id_t seg;
  uint8_t *base; /* the segment */
  size_t window_bytes, off_exch_in, off_reasons, off_exch_out, off_reason_out, off_stage, stage_bytes, seg_bytes;
  size_t stage_head;
  /* the last put, not yet posted: a notify to the same rank that follows it
   * (the ring's put + notify) goes out with it as one gaspi_write_notify */
  int has_pending, pend_peer;
  size_t pend_loff, pend_roff, pend_len;
  uint32_t *counters; /* [kind * n + source], widened */
  uint32_t *sent;     /* [kind * n + peer]: notifications sent */
  uint32_t beats_sent;
  uint32_t told; /* CTRL bits sent so far, and the root of an abort */
  int told_root;
  peer_t *peers;
  /* exchange, and the bit round's AND (recursive doubling), which shares its
   * round count and its slots: a cycle is one or the other */
  uint32_t round;
  int posted, missing;
  double exch_deadline;
  size_t off_and_out;
  int and_pow, and_log, and_steps, and_nwords, and_step, and_sent, and_partner, and_posted;
  int round_wait;  /* ROUND_AND or ROUND_EXCHANGE while a collect waits in a round (round_awaited) */
  tnt_result_t and_err;
  uint64_t *and_acc; /* [nwords] */
  double and_deadline;
  uint32_t bell_round; /* highest round a peer rang for (the rank above P's wake) */
  doorbell_t door; /* woken by a local request (wake_local) */
  double next_beat, next_scan;
  int segment_ok; /* every peer said goodbye: the segment may be deleted */
} gpi2_t;

/* check_all, the rounds' waits, the doorbell, and the entries mpi.c has too */
#define PLUGIN_STATE gpi2_t
#include "shared_entries.h"

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static void *gpi2_lib;
/* GPI-2's own configuration, where the library exports it (glb_gaspi_cfg, the
 * struct gaspi_config_get copies out): see set_tcp_port */
static gpi2_config_head_t *gpi2_config;
static char gpi2_path[PATH_MAX];
static int gaspi_up;          /* gaspi_proc_init succeeded in this process */
static int up_rank, up_size;  /* ... as this rank of this many */
static int generation;        /* tnt_init calls that made a segment */
static unsigned port_base;
static char description[256];

/* ---- core services ---- */

#define LOG(level, ...) plugin_log(level, "gpi2.c", __LINE__, __VA_ARGS__)

static void plugin_failed(tnt_result_t code) { (void)code; }

static const char *gerr(gaspi_return_t rc) {
  static __thread char buf[64];
  const char *text = G.error_str ? G.error_str(rc) : NULL;
  if (text && *text) return text;
  snprintf(buf, sizeof buf, "GASPI error %d", rc);
  return buf;
}

/* A notification value: the low 31 bits of a count, never 0 (GASPI's "none"). */
static gaspi_notification_t encode(uint64_t count) { return (gaspi_notification_t)((count & 0x7fffffffu) | 0x80000000u); }
/* The count `value` stands for, given `ref`, a recent count of the same sender
 * (less than 2^30 away, either way). */
static uint64_t widen(uint64_t ref, gaspi_notification_t value) {
  int32_t delta = (int32_t)(((uint32_t)value - (uint32_t)ref) << 1) >> 1;
  return ref + (uint64_t)(int64_t)delta;
}

static gaspi_notification_id_t id_of(gpi2_t *s, int range, int source) {
  return (gaspi_notification_id_t)(range * s->n + source);
}

/* Take notification `id` (0: none since the last take). */
static gaspi_notification_t take(gpi2_t *s, gaspi_notification_id_t id) {
  gaspi_notification_t v = 0;
  G.notify_reset(s->seg, id, &v);
  return v;
}

/* ---- GPI-2's library ---- */

static const char *const SYMBOLS[] = {
    "gaspi_config_get", "gaspi_config_set", "gaspi_proc_init", "gaspi_proc_rank", "gaspi_proc_num",
    "gaspi_initialized", "gaspi_version", "gaspi_notification_num", "gaspi_segment_alloc", "gaspi_segment_register",
    "gaspi_segment_ptr", "gaspi_segment_delete", "gaspi_barrier", "gaspi_write", "gaspi_notify",
    "gaspi_notify_waitsome", "gaspi_notify_reset", "gaspi_wait", "gaspi_state_vec_get", "gaspi_write_notify"};

#define INSTALL_HINT                                                                                               \
  "build GPI-2 (https://github.com/cc-hpc-itwm/GPI-2: ./autogen.sh && ./configure --with-ethernet "              \
  "--prefix=DIR && make install) and set GPI2_HOME=DIR, or put libGPI2.so on LD_LIBRARY_PATH"

/* dlopen GPI-2: $GPI2_HOME/lib64 or /lib, else libGPI2.so by the library path.
 * 0, or -1 with `why`. */
static int load_gpi2(char *why, size_t len) {
  if (gpi2_lib) return 0;
  char tried[1024] = "";
  const char *home = getenv("GPI2_HOME");
  void *lib = NULL;
  if (home && *home) {
    const char *dirs[] = {"lib64", "lib"};
    for (int i = 0; i < 2 && !lib; i++) {
      snprintf(gpi2_path, sizeof gpi2_path, "%s/%s/libGPI2.so", home, dirs[i]);
      if (access(gpi2_path, F_OK) != 0) {
        snprintf(tried + strlen(tried), sizeof tried - strlen(tried), "%s%.300s (absent)", tried[0] ? ", " : "",
                 gpi2_path);
        continue;
      }
      lib = dlopen(gpi2_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (!lib) {
        snprintf(why, len, "GPI2_HOME=%s: cannot load %s: %s", home, gpi2_path, dlerror());
        return -1;
      }
    }
    if (!lib) {
      snprintf(why, len, "GPI2_HOME=%s holds no GPI-2 library (tried %s): point GPI2_HOME at the folder GPI-2 was "
               "installed into (its --prefix), or %s", home, tried, INSTALL_HINT);
      return -1;
    }
  } else {
    snprintf(gpi2_path, sizeof gpi2_path, "libGPI2.so");
    lib = dlopen(gpi2_path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!lib) {
      const char *err = dlerror();
      snprintf(why, len, "GPI-2 not found: GPI2_HOME is unset and libGPI2.so is not on the library path (%s): %s",
               err ? err : "dlopen failed", INSTALL_HINT);
      return -1;
    }
    Dl_info info;
    void *any = dlsym(lib, "gaspi_proc_init");
    if (any && dladdr(any, &info) && info.dli_fname) snprintf(gpi2_path, sizeof gpi2_path, "%s", info.dli_fname);
  }
  void **slots = (void **)&G; /* G's members are the function pointers of SYMBOLS, in its order */
  _Static_assert(sizeof G == (sizeof SYMBOLS / sizeof SYMBOLS[0] + 1) * sizeof(void *), "G and SYMBOLS differ");
  for (size_t i = 0; i < sizeof SYMBOLS / sizeof SYMBOLS[0]; i++) {
    slots[i] = dlsym(lib, SYMBOLS[i]);
    if (!slots[i]) {
      snprintf(why, len, "%s is not a GPI-2 library this transport can use: it lacks %s (GPI-2 1.5 or later is "
               "needed)", gpi2_path, SYMBOLS[i]);
      memset(&G, 0, sizeof G);
      return -1;
    }
  }
  G.error_str = (const char *(*)(gaspi_return_t))dlsym(lib, "gaspi_error_str");
  gpi2_config = (gpi2_config_head_t *)dlsym(lib, "glb_gaspi_cfg");
  gpi2_lib = lib;
  return 0;
}

/* ---- GPI-2 itself, once per process ---- */

/* The first of this job's ports: TNT_GPI2_PORT, else one of the PORT_SLOTS ranges' bases
 * (PORT_STEP apart) chosen by the job id (every rank of the job derives the same). */
static tnt_result_t job_ports(const tnt_placement_t *pl, unsigned *out) {
  const char *raw = getenv("TNT_GPI2_PORT");
  if (raw && *raw) {
    char *end = NULL;
    long v = strtol(raw, &end, 10);
    if (end == raw || *end || v < 1024 || v > 65535 - 3 * MAX_PPN)
      return failf(TNT_ERR_INVALID_ARGUMENT, -1, "environment variable TNT_GPI2_PORT must be a port between 1024 and "
                   "%d: GPI-2 uses TNT_GPI2_PORT + local rank, + %d + local rank and + %d + local rank on every host. "
                   "Received: TNT_GPI2_PORT=%s", 65535 - 3 * MAX_PPN, MAX_PPN, 2 * MAX_PPN, raw);
    *out = (unsigned)v;
    return TNT_SUCCESS;
  }
  uint64_t h = 1469598103934665603ull;
  for (const char *c = pl->job_id; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
  const unsigned choice = (unsigned)(h % (PORT_SLOTS * (MAX_PPN / PORT_STEP)));
  *out = PORT_LOW + (choice / (MAX_PPN / PORT_STEP)) * PORT_STRIDE + (choice % (MAX_PPN / PORT_STEP)) * PORT_STEP;
  return TNT_SUCCESS;
}

/* 0 when `port` can be bound on this host, else the errno. */
static int port_taken(unsigned port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as GPI-2 does: TIME_WAIT is fine */
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = {htonl(INADDR_ANY)}};
  int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr), err = errno;
  close(fd);
  return rc == 0 ? 0 : err;
}

/* GPI-2 gives up on a port it cannot bind with no word why: try ours first. */
static tnt_result_t check_port_free(unsigned port, const char *what, int from_env) {
  const int err = port_taken(port);
  if (!err) return TNT_SUCCESS;
  return failf(TNT_ERR_INVALID_USAGE, -1,
               "the gpi2 transport cannot use port %u (%s) on this host: %s. Another GPI-2 job (or program) holds it; "
               "%s give this job another range with TNT_GPI2_PORT (it uses TNT_GPI2_PORT + local rank, + %d + local "
               "rank and + %d + local rank)",
               port, what, strerror(err), from_env ? "TNT_GPI2_PORT is set:" : "the job id chose the range:", MAX_PPN,
               2 * MAX_PPN);
}

/* The ethernet device's first port, after gaspi_config_set. GPI-2 (1.5 to
 * 1.6) copies every setting of gaspi_config_set but that one, so its device
 * listened on 19000 + local rank in every job: a second gpi2 job on a host
 * failed in gaspi_proc_init with only "Device operation error" (its debug
 * library: "Failed to bind to port 19000"). The port therefore also goes into
 * GPI-2's exported configuration, which the device reads; where that cannot
 * be done, the port it keeps is checked, and a job that finds it taken says
 * why instead. */
static tnt_result_t set_tcp_port(unsigned want, int local, int from_env) {
  if (gpi2_config && gpi2_config->network_type == GASPI_ETHERNET) gpi2_config->tcp_port = want;
  gpi2_config_t used;
  memset(&used, 0, sizeof used);
  G.config_get(&used);
  const unsigned port = used.head.tcp_port + (unsigned)local;
  if (used.head.tcp_port == want) return check_port_free(port, "GPI-2's ethernet device", from_env);
  const int err = port_taken(port);
  if (!err) return TNT_SUCCESS;
  return failf(TNT_ERR_INVALID_USAGE, -1,
               "the gpi2 transport cannot use port %u (GPI-2's ethernet device) on this host: %s. This GPI-2 keeps "
               "its device on port %u + local rank in every job (it ignores the port set through gaspi_config_set), "
               "and another GPI-2 job (or program) holds it: run one gpi2 job per host at a time",
               port, strerror(err), used.head.tcp_port);
}

/* Under gaspi_run the GASPI_* variables are set; a job tntrun started on one
 * host gets them here, with a machine file that names this host once per rank
 * (only GPI-2's rank 0 reads it, during gaspi_proc_init). */
static tnt_result_t gaspi_environment(const tnt_placement_t *pl, char *mfile, size_t len) {
  mfile[0] = 0;
  const char *grank = getenv("GASPI_RANK"), *gsize = getenv("GASPI_NRANKS");
  if (grank && *grank) {
    if (!gsize || atoi(gsize) != pl->size || atoi(grank) != pl->rank || !getenv("GASPI_MFILE"))
      return failf(TNT_ERR_INVALID_USAGE, -1,
                   "the placement disagrees with GPI-2's: GASPI_RANK=%s GASPI_NRANKS=%s (GASPI_MFILE=%s), but this "
                   "process is rank %d of %d by %s. Under gaspi_run leave TNT_RANK/TNT_SIZE unset (tntrun sets them "
                   "from GASPI_RANK), or give each process the same rank in both",
                   grank, gsize ? gsize : "(unset)", getenv("GASPI_MFILE") ? getenv("GASPI_MFILE") : "(unset)",
                   pl->rank, pl->size, pl->from_launcher ? "TNT_RANK/TNT_SIZE" : "the launcher's variables");
    return TNT_SUCCESS;
  }
  if (pl->local_size != pl->size)
    return failf(TNT_ERR_INVALID_USAGE, -1,
                 "the gpi2 transport needs GPI-2's placement (GASPI_RANK, GASPI_NRANKS, GASPI_SOCKET, GASPI_MFILE) for "
                 "ranks on several hosts (rank %d sees %d of the %d ranks on its host): start the job with "
                 "`tntrun --transport gpi2 --hostfile HOSTS` (through gaspi_run) or gaspi_run itself",
                 pl->rank, pl->local_size, pl->size);
  char num[32];
  if (pl->rank == 0) {
    snprintf(mfile, len, "%s/tnt-gpi2-XXXXXX", getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(mfile);
    if (fd < 0) {
      int err = errno;
      mfile[0] = 0;
      return failf(TNT_ERR_SYSTEM, -1, "the gpi2 transport cannot write GPI-2's machine file in %s: %s: set TMPDIR "
                   "to a writable folder", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", strerror(err));
    }
    FILE *f = fdopen(fd, "w");
    for (int r = 0; f && r < pl->size; r++) fputs("localhost\n", f);
    if (!f || fclose(f) != 0) {
      unlink(mfile);
      mfile[0] = 0;
      return failf(TNT_ERR_SYSTEM, -1, "the gpi2 transport cannot write GPI-2's machine file");
    }
    setenv("GASPI_MFILE", mfile, 1);
  } else {
    setenv("GASPI_MFILE", "/dev/null", 1); /* read by rank 0 only; GPI-2 wants it set */
  }
  snprintf(num, sizeof num, "%d", pl->rank);
  setenv("GASPI_RANK", num, 1);
  snprintf(num, sizeof num, "%d", pl->size);
  setenv("GASPI_NRANKS", num, 1);
  snprintf(num, sizeof num, "%d", pl->rank); /* one host: the rank is the index among this host's lines */
  setenv("GASPI_SOCKET", num, 1);
  return TNT_SUCCESS;
}

static tnt_result_t ensure_gaspi(const tnt_placement_t *pl, double timeout_s) {
  pthread_mutex_lock(&init_mu);
  tnt_result_t res = TNT_SUCCESS;
  char mfile[PATH_MAX] = "";
  if (gaspi_up) {
    if (pl->rank != up_rank || pl->size != up_size)
      res = failf(TNT_ERR_INVALID_USAGE, -1, "GPI-2 runs in this process as rank %d of %d and cannot start again "
                  "(gaspi_proc_init runs once per process): this job asks for rank %d of %d", up_rank, up_size,
                  pl->rank, pl->size);
    goto out;
  }
  gaspi_number_t already = 0;
  G.initialized(&already);
  if (already) {
    res = failf(TNT_ERR_INVALID_USAGE, -1, "GPI-2 was initialized in this process by someone else (gaspi_proc_init): "
                "the gpi2 transport initializes it itself, with its own ports; do not start GPI-2 beside Tarantella");
    goto out;
  }
  if ((res = job_ports(pl, &port_base)) != TNT_SUCCESS) goto out;
  if ((res = gaspi_environment(pl, mfile, sizeof mfile)) != TNT_SUCCESS) goto out;
  int local = atoi(getenv("GASPI_SOCKET") ? getenv("GASPI_SOCKET") : "0");
  if (local < 0 || local >= MAX_PPN) {
    res = failf(TNT_ERR_INVALID_USAGE, -1, "GASPI_SOCKET=%d: GPI-2 runs at most %d ranks per host", local, MAX_PPN);
    goto out;
  }
  gpi2_config_t conf;
  memset(&conf, 0, sizeof conf);
  G.config_get(&conf);
  int from_env = getenv("TNT_GPI2_PORT") && *getenv("TNT_GPI2_PORT");
  conf.head.sn_port = port_base;
  conf.head.sn_timeout = (gaspi_timeout_t)(timeout_s * 1000);
  conf.head.logger = 0; /* GPI-2's logger would send rank output to a daemon */
  int ethernet = conf.head.network_type == GASPI_ETHERNET;
  if (ethernet) conf.head.tcp_port = port_base + 2 * MAX_PPN;
  if ((res = check_port_free(port_base + (unsigned)local, "GPI-2's service port", from_env)) != TNT_SUCCESS ||
      (res = check_port_free(port_base + MAX_PPN + (unsigned)local, "GPI-2's start-up port", from_env)) != TNT_SUCCESS)
    goto out;
  gaspi_return_t rc = G.config_set(conf);
  if (rc != GASPI_SUCCESS) {
    res = failf(TNT_ERR_SYSTEM, -1, "gaspi_config_set failed: %s", gerr(rc));
    goto out;
  }
  if (ethernet && (res = set_tcp_port(conf.head.tcp_port, local, from_env)) != TNT_SUCCESS) goto out;
  double t0 = host->now();
  rc = G.proc_init((gaspi_timeout_t)(timeout_s * 1000));
  if (rc != GASPI_SUCCESS) {
    res = failf(rc == GASPI_TIMEOUT ? TNT_ERR_TIMEOUT : TNT_ERR_SYSTEM, -1,
                "gaspi_proc_init failed after %.1f s (%s) as GPI-2 rank %s of %s on ports %u.. : %s",
                host->now() - t0, gerr(rc), getenv("GASPI_RANK"), getenv("GASPI_NRANKS"), port_base,
                rc == GASPI_TIMEOUT ? "the other ranks did not come within TNT_TIMEOUT_S (every rank must call "
                                      "tnt.init(), with the same TNT_GPI2_PORT or job id)"
                                    : "see GPI-2's own message above, if any (GPI-2's debug library, libGPI2-dbg.so, "
                                      "says more)");
    goto out;
  }
  gaspi_rank_t grank = 0, gnum = 0;
  G.proc_rank(&grank);
  G.proc_num(&gnum);
  if (grank != pl->rank || gnum != pl->size) {
    res = failf(TNT_ERR_INVALID_USAGE, -1, "GPI-2 made this process rank %d of %d, but the placement says rank %d of "
                "%d: the machine file's order must be the ranks' order", grank, gnum, pl->rank, pl->size);
    goto out;
  }
  gaspi_up = 1;
  up_rank = pl->rank;
  up_size = pl->size;
  LOG(LOG_INFO, "gpi2: GPI-2 initialized in %.2f s, rank %d of %d, ports from %u (%s device)", host->now() - t0, grank,
      gnum, port_base, ethernet ? "ethernet" : "infiniband/other");
out:
  if (mfile[0]) unlink(mfile);
  pthread_mutex_unlock(&init_mu);
  return res;
}

/* ---- posting, with a full queue drained and retried ---- */

/* The rank a failed queue names: GPI-2's state vector (-1: none marked). */
static int corrupt_rank(gpi2_t *s) {
  gaspi_state_t *vec = calloc((size_t)s->n, sizeof *vec);
  int bad = -1;
  if (vec && G.state_vec_get(vec) == GASPI_SUCCESS)
    for (int r = 0; r < s->n && bad < 0; r++)
      if (r != s->me && vec[r] != GASPI_STATE_HEALTHY) bad = r;
  free(vec);
  return bad;
}

/* Collect finished requests of queue q (mu held); a failed one is sticky. */
static void drain(gpi2_t *s, gaspi_queue_id_t q) {
  gaspi_return_t rc = G.wait(q, GASPI_TEST);
  if (rc == GASPI_SUCCESS || rc == GASPI_TIMEOUT) return;
  int bad = corrupt_rank(s);
  if (bad >= 0 && s->health.peer[bad].state != PEER_ALIVE) return; /* it left or aborted: peer_gone says so */
  if (bad >= 0) s->peers[bad].lost = 1;
  sticky(&s->health, TNT_ERR_PEER_LOST, bad, "a request of rank %d to %s%d failed (%s): GPI-2 lost the connection",
         s->me, bad >= 0 ? "rank " : "rank (unknown) ", bad, gerr(rc));
}

typedef struct post {
  int kind; /* 0: write, 1: notify, 2: write + notify */
  gaspi_queue_id_t q;
  int peer;
  gaspi_offset_t loff, roff;
  gaspi_size_t len;
  gaspi_notification_id_t id;
  gaspi_notification_t value;
} post_t;

static gaspi_return_t post_once(gpi2_t *s, const post_t *p) {
  if (p->kind == 0)
    return G.write(s->seg, p->loff, (gaspi_rank_t)p->peer, s->seg, p->roff, p->len, p->q, CALL_TIMEOUT_MS);
  if (p->kind == 2)
    return G.write_notify(s->seg, p->loff, (gaspi_rank_t)p->peer, s->seg, p->roff, p->len, p->id, p->value, p->q,
                          CALL_TIMEOUT_MS);
  return G.notify(s->seg, (gaspi_rank_t)p->peer, p->id, p->value, p->q, CALL_TIMEOUT_MS);
}

/* Post a request (mu held); a full queue is drained until the deadline. */
static tnt_result_t post(gpi2_t *s, const post_t *p, double deadline, const char *what) {
  double sleep = SLEEP_MIN_S;
  for (;;) {
    gaspi_return_t rc = post_once(s, p);
    if (rc == GASPI_SUCCESS) {
      s->health.peer[p->peer].last_sent = host->now();
      return TNT_SUCCESS;
    }
    if (rc != GASPI_QUEUE_FULL && rc != GASPI_TIMEOUT) {
      int bad = corrupt_rank(s);
      return peer_lost(&s->health, bad >= 0 ? bad : p->peer, "rank %d could not send to rank %d while %s: %s "
                   "(GPI-2 lost the connection to rank %d: its process or host died)", s->me, p->peer, what, gerr(rc),
                   bad >= 0 ? bad : p->peer);
    }
    drain(s, p->q);
    double now = host->now();
    tnt_result_t res = held_failure(&s->health, what);
    if (res == TNT_SUCCESS) res = check_alive(s, p->peer, now, 1, what);
    if (res != TNT_SUCCESS) return res;
    if (now >= deadline)
      return failf(TNT_ERR_TIMEOUT, p->peer, "rank %d timed out %s: GPI-2's queue %d stayed full for TNT_TIMEOUT_S",
                   s->me, what, p->q);
    pthread_mutex_unlock(&s->mu);
    sleep_s(sleep);
    sleep = sleep * 2 > SLEEP_MAX_S ? SLEEP_MAX_S : sleep * 2;
    pthread_mutex_lock(&s->mu);
  }
}

static tnt_result_t post_notify(gpi2_t *s, gaspi_queue_id_t q, int peer, gaspi_notification_id_t id,
                                gaspi_notification_t value, double deadline, const char *what) {
  post_t p = {.kind = 1, .q = q, .peer = peer, .id = id, .value = value};
  return post(s, &p, deadline, what);
}

/* A notification that must not wait (heartbeats, bells, goodbyes): a full
 * queue drops it, as a lost heartbeat would be (the next one goes out). */
static void post_quiet(gpi2_t *s, int peer, gaspi_notification_id_t id, gaspi_notification_t value) {
  gaspi_return_t rc = G.notify(s->seg, (gaspi_rank_t)peer, id, value, Q_CTRL, GASPI_TEST);
  if (rc == GASPI_SUCCESS) s->health.peer[peer].last_sent = host->now();
}

/* ---- progress: what every poll does (mu held) ---- */

static void scan_ctrl(gpi2_t *s, double now) {
  gaspi_notification_id_t first = 0;
  while (G.notify_waitsome(s->seg, id_of(s, ID_CTRL, 0), (gaspi_number_t)s->n, &first, GASPI_TEST) == GASPI_SUCCESS) {
    int src = (int)first - ID_CTRL * s->n;
    gaspi_notification_t v = take(s, first);
    if (!v || src < 0 || src >= s->n) continue;
    peer_health_t *p = &s->health.peer[src];
    p->last_heard = now;
    if (v & CTRL_ABORT) {
      p->state = PEER_FAILED;
      p->root = (int)((v >> 8) & 0x7fffff) - 1;
      const char *reason = (const char *)s->base + s->off_reasons + (size_t)src * REASON_MAX;
      snprintf(p->reason, sizeof p->reason, "%.*s", REASON_MAX - 1, reason);
      bump_bell(s);
    } else if ((v & CTRL_BYE) && p->state == PEER_ALIVE) {
      p->state = PEER_EXITED;
    }
  }
}

static void scan_bells(gpi2_t *s) {
  gaspi_notification_id_t first = 0;
  while (G.notify_waitsome(s->seg, id_of(s, ID_BELL, 0), (gaspi_number_t)s->n, &first, GASPI_TEST) == GASPI_SUCCESS) {
    gaspi_notification_t v = take(s, first);
    if (!v) continue;
    uint32_t round = (uint32_t)widen(s->round, v);
    if ((int32_t)(round - s->bell_round) > 0) s->bell_round = round;
    bump_bell(s);
  }
}

static void progress(gpi2_t *s) {
  double now = host->now();
  scan_bells(s);
  drain(s, Q_CTRL); /* the exchange and the bells fill it every cycle */
  if (now < s->next_scan) return;
  s->next_scan = now + s->health.beat_s / 8;
  drain(s, Q_DATA);
  scan_ctrl(s, now);
  for (int r = 0; r < s->n; r++) {
    if (r == s->me) continue;
    gaspi_notification_t v = take(s, id_of(s, ID_BEAT, r));
    if (v) {
      s->peers[r].beats_seen = (uint32_t)widen(s->peers[r].beats_seen, v);
      s->health.peer[r].last_heard = now;
    }
  }
  if (now >= s->next_beat) {
    s->beats_sent++;
    for (int r = 0; r < s->n; r++)
      if (r != s->me && s->health.peer[r].state == PEER_ALIVE)
        post_quiet(s, r, id_of(s, ID_BEAT, s->me), encode(s->beats_sent));
    s->next_beat = now + s->health.beat_s;
  }
}

/* ---- peers' health (mu held): peer_health.h's checks, and GPI-2's own ---- */

static tnt_result_t check_alive(gpi2_t *s, int r, double now, int pids, const char *what) {
  const peer_health_t *h = &s->health.peer[r];
  peer_t *p = &s->peers[r];
  if (h->state != PEER_ALIVE) return TNT_SUCCESS; /* an aborted or departed rank: peer_gone */
  int dead = pids && peer_pid_gone(&s->health, r);
  if (pids && !p->lost) {
    gaspi_state_t *vec = calloc((size_t)s->n, sizeof *vec);
    p->lost = vec && G.state_vec_get(vec) == GASPI_SUCCESS && vec[r] != GASPI_STATE_HEALTHY;
    free(vec);
  }
  if (dead || p->lost) {
    scan_ctrl(s, now); /* what has arrived: progress reads it only every beat / 8 */
    tnt_result_t res;
    if (!blame_gone(&s->health, r, now, what, &res)) return res;
    if (dead) return peer_died(&s->health, r, what);
    return failf(TNT_ERR_PEER_LOST, r, "rank %d (pid %d on %s) is unreachable while rank %d was %s: GPI-2 lost its "
                 "connection to it (its process or host died)", r, h->pid, h->host, s->me, what);
  }
  return peer_silent(&s->health, r, now, what);
}

static tnt_result_t check_gone(gpi2_t *s, int r, const char *what) { return peer_gone(&s->health, r, what); }

/* ---- waiting ---- */

/* Poll until ready(), a failure, or `deadline` (TNT_ERR_TIMEOUT, no message).
 * `from`: the rank that must act (-1: any), checked in full. */
static tnt_result_t poll_until(gpi2_t *s, ready_fn ready, void *arg, int from, double deadline, const char *what) {
  backoff_t b = {0};
  double next_pids = host->now() + PID_CHECK_S;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    int ok = ready(s, arg);
    tnt_result_t res = TNT_SUCCESS;
    double now = host->now();
    if (!ok) {
      progress(s);
      int pids = now >= next_pids;
      if (pids) next_pids = now + PID_CHECK_S;
      if (from >= 0) {
        res = check_alive(s, from, now, pids, what);
        if (res == TNT_SUCCESS) res = check_job(&s->health, what);
        if (res == TNT_SUCCESS) res = check_gone(s, from, what);
      } else {
        uint8_t mask[s->n];
        res = check_all(s, round_awaited(s, mask), pids, what);
      }
    }
    pthread_mutex_unlock(&s->mu);
    if (ok || res != TNT_SUCCESS || now >= deadline) {
      backoff_end(&b, &s->wait_counts);
      return ok ? TNT_SUCCESS : res != TNT_SUCCESS ? res : TNT_ERR_TIMEOUT;
    }
    backoff_pause(&b, &s->waits, now);
  }
}

/* ---- data ---- */

static void *gpi2_window(void *st) { return ((gpi2_t *)st)->base; }

static int queue_empty(gpi2_t *s, void *arg) {
  gaspi_return_t rc = G.wait(*(gaspi_queue_id_t *)arg, GASPI_TEST);
  if (rc == GASPI_SUCCESS) return 1;
  if (rc != GASPI_TIMEOUT) drain(s, *(gaspi_queue_id_t *)arg); /* records the failure */
  return 0;
}

/* Post the put held back for a notify (mu held). */
static tnt_result_t flush_put(gpi2_t *s, double deadline) {
  if (!s->has_pending) return TNT_SUCCESS;
  s->has_pending = 0;
  post_t p = {.kind = 0, .q = Q_DATA, .peer = s->pend_peer, .loff = s->pend_loff, .roff = s->pend_roff,
              .len = s->pend_len};
  return post(s, &p, deadline, "sending data");
}

/* put = copy into the staging area + gaspi_write, held back until the next
 * call so that a notify to the same rank goes with it. The staging area is
 * reused from its start once every write from it is complete (queue 0 empty). */
static tnt_result_t gpi2_put(void *st, int peer, size_t offset, const void *src, size_t len) {
  gpi2_t *s = st;
  char what[64];
  snprintf(what, sizeof what, "sending data to rank %d", peer);
  if (offset > s->window_bytes || len > s->window_bytes - offset)
    return failf(TNT_ERR_INTERNAL, peer, "a put of %zu bytes at offset %zu overflows the window of %zu bytes", len,
                 offset, s->window_bytes);
  const double deadline = host->now() + s->timeout_s;
  while (len) {
    size_t chunk = len < s->stage_bytes ? len : s->stage_bytes;
    pthread_mutex_lock(&s->mu);
    tnt_result_t res = flush_put(s, deadline);
    int full = s->stage_head + chunk > s->stage_bytes;
    pthread_mutex_unlock(&s->mu);
    if (res != TNT_SUCCESS) return res;
    if (full) {
      gaspi_queue_id_t q = Q_DATA;
      tnt_result_t res = poll_until(s, queue_empty, &q, peer, deadline, what);
      if (res == TNT_ERR_TIMEOUT) return timed_out(&s->health, peer, what);
      if (res != TNT_SUCCESS) return res;
      s->stage_head = 0;
    }
    pthread_mutex_lock(&s->mu);
    size_t at = s->off_stage + s->stage_head;
    if (src != s->base + at) memcpy(s->base + at, src, chunk); /* else lent by send_buffer: in place */
    s->has_pending = 1;
    s->pend_peer = peer;
    s->pend_loff = at;
    s->pend_roff = offset;
    s->pend_len = chunk;
    s->stage_head += (chunk + 63) & ~(size_t)63;
    pthread_mutex_unlock(&s->mu);
    src = (const uint8_t *)src + chunk;
    offset += chunk;
    len -= chunk;
  }
  return TNT_SUCCESS;
}

/* A put's source is copied into the segment before put returns: nothing of the
 * caller's is read later. */
static tnt_result_t gpi2_fence(void *st, int peer, double deadline) {
  (void)st, (void)peer, (void)deadline;
  return TNT_SUCCESS;
}

/* The place in the staging area (registered memory) where the next put will
 * be copied to: a piece scaled into it is written by gaspi_write from there,
 * with no copy. NULL when it does not fit the staging area in one piece, or the
 * area could not be drained (put reports why). */
static void *gpi2_send_buffer(void *st, int peer, size_t offset, size_t len) {
  gpi2_t *s = st;
  (void)offset;
  if (len > s->stage_bytes) return NULL;
  pthread_mutex_lock(&s->mu);
  tnt_result_t res = flush_put(s, host->now() + s->timeout_s);
  int full = s->stage_head + len > s->stage_bytes;
  pthread_mutex_unlock(&s->mu);
  if (res != TNT_SUCCESS) return NULL;
  if (full) {
    gaspi_queue_id_t q = Q_DATA;
    char what[64];
    snprintf(what, sizeof what, "sending data to rank %d", peer);
    if (poll_until(s, queue_empty, &q, peer, host->now() + s->timeout_s, what) != TNT_SUCCESS) return NULL;
    s->stage_head = 0;
  }
  return s->base + s->off_stage + s->stage_head;
}

static tnt_result_t gpi2_notify(void *st, int peer, int kind) {
  gpi2_t *s = st;
  pthread_mutex_lock(&s->mu);
  uint32_t count = ++s->sent[kind * s->n + peer];
  const double deadline = host->now() + s->timeout_s;
  const char *what = kind == TNT_NOTIFY_DATA ? "announcing data" : "returning a slot";
  tnt_result_t res;
  if (s->has_pending && s->pend_peer == peer) { /* the put it announces: one request */
    s->has_pending = 0;
    post_t p = {.kind = 2, .q = Q_DATA, .peer = peer, .loff = s->pend_loff, .roff = s->pend_roff, .len = s->pend_len,
                .id = id_of(s, kind, s->me), .value = encode(count)};
    res = post(s, &p, deadline, what);
  } else {
    res = flush_put(s, deadline);
    if (res == TNT_SUCCESS) res = post_notify(s, Q_DATA, peer, id_of(s, kind, s->me), encode(count), deadline, what);
  }
  pthread_mutex_unlock(&s->mu);
  return res;
}

typedef struct {
  int kind, from;
  uint32_t target;
} counter_target_t;

static int counter_reached(gpi2_t *s, void *arg) {
  counter_target_t *ct = arg;
  uint32_t *c = &s->counters[ct->kind * s->n + ct->from];
  if (reached(*c, ct->target)) return 1;
  gaspi_notification_t v = take(s, id_of(s, ct->kind, ct->from));
  if (!v) return 0;
  *c = (uint32_t)widen(*c, v);
  s->health.peer[ct->from].last_heard = host->now();
  return reached(*c, ct->target);
}

static tnt_result_t gpi2_wait(void *st, int kind, int from, uint32_t target, double deadline) {
  gpi2_t *s = st;
  counter_target_t ct = {kind, from, target};
  pthread_mutex_lock(&s->mu);
  tnt_result_t flushed = flush_put(s, deadline);
  pthread_mutex_unlock(&s->mu);
  if (flushed != TNT_SUCCESS) return flushed;
  char what[96];
  snprintf(what, sizeof what, "waiting for %s from rank %d", kind == TNT_NOTIFY_DATA ? "data" : "a free slot", from);
  tnt_result_t res = poll_until(s, counter_reached, &ct, from, deadline, what);
  return res == TNT_ERR_TIMEOUT ? timed_out(&s->health, from, what) : res;
}

/* ---- exchange: a slot per source and round parity in every rank's segment ---- */

static size_t exch_in_offset(gpi2_t *s, uint32_t round, int src) {
  return s->off_exch_in + ((size_t)(round & 1) * (size_t)s->n + (size_t)src) * EXCH_SLOT;
}

static tnt_result_t gpi2_exchange_post(void *st, const void *mine, size_t len, double deadline) {
  gpi2_t *s = st;
  if (len > TNT_EXCHANGE_MAX) return failf(TNT_ERR_INTERNAL, -1, "exchange of %zu bytes is too large", len);
  if (s->posted) return failf(TNT_ERR_INTERNAL, -1, "exchange posted twice");
  uint32_t round = s->round + 1;
  /* round - 2 used this buffer: every peer has it (it went on to round - 1) */
  size_t out = s->off_exch_out + (size_t)(round & 1) * EXCH_SLOT;
  uint32_t header[4] = {round, (uint32_t)len, 0, 0};
  pthread_mutex_lock(&s->mu);
  memcpy(s->base + out, header, sizeof header);
  memcpy(s->base + out + sizeof header, mine, len);
  tnt_result_t res = flush_put(s, deadline);
  const char *what = "sending the negotiation message";
  for (int r = 0; r < s->n && res == TNT_SUCCESS; r++) {
    s->peers[r].exch_got = (r == s->me) || reached(s->peers[r].exch_round, round);
    if (r == s->me) continue;
    post_t p = {.kind = 2, .q = Q_CTRL, .peer = r, .loff = out, .roff = exch_in_offset(s, round, s->me),
                .len = sizeof header + len, .id = id_of(s, ID_EXCH, s->me), .value = encode(round)};
    res = post(s, &p, deadline, what);
  }
  s->missing = 0;
  for (int r = 0; r < s->n; r++) s->missing += !s->peers[r].exch_got;
  if (res == TNT_SUCCESS) {
    s->round = round; /* under mu: the idle thread's doorbell compares with it */
    s->posted = 1;
    s->exch_deadline = deadline;
  }
  pthread_mutex_unlock(&s->mu);
  return res;
}

static int exchange_arrived(gpi2_t *s, void *arg) {
  for (int r = 0; r < s->n && s->missing; r++) {
    peer_t *p = &s->peers[r];
    if (p->exch_got) continue;
    gaspi_notification_t v = take(s, id_of(s, ID_EXCH, r));
    if (v) {
      p->exch_round = (uint32_t)widen(p->exch_round, v);
      s->health.peer[r].last_heard = host->now();
    }
    if (reached(p->exch_round, s->round)) { /* taken here, or by the doorbell's scan */
      p->exch_got = 1;
      s->missing--;
    }
  }
  return s->missing == 0;
}

static tnt_result_t gpi2_exchange_collect(void *st, void *all, size_t stride, size_t *lens, double until) {
  gpi2_t *s = st;
  tnt_result_t res = exchange_wait(s, until);
  if (res != TNT_SUCCESS) return res;
  for (int r = 0; r < s->n; r++) {
    const uint8_t *slot = s->base + (r == s->me ? s->off_exch_out + (size_t)(s->round & 1) * EXCH_SLOT
                                                : exch_in_offset(s, s->round, r));
    uint32_t header[4];
    memcpy(header, slot, sizeof header);
    if (header[0] != s->round || header[1] > TNT_EXCHANGE_MAX || header[1] > stride)
      return failf(TNT_ERR_INTERNAL, r, "rank %d's negotiation message is from round %u with %u bytes (expected round "
                   "%u, at most %zu bytes): is every rank running the same release of Tarantella?",
                   r, header[0], header[1], s->round, stride);
    lens[r] = header[1];
    if (lens[r]) memcpy((uint8_t *)all + (size_t)r * stride, slot + sizeof header, lens[r]);
  }
  pthread_mutex_lock(&s->mu);
  s->posted = 0;
  pthread_mutex_unlock(&s->mu);
  return TNT_SUCCESS;
}

/* ---- AND-allreduce: the negotiation's bit round ----
 *
 * Recursive doubling among the largest power of two P <= N ranks, as in
 * mpi.c: step 0 folds rank r + P into r, steps 1..log2 P pair the ranks, the
 * last step hands the result back up to r + P. A step's message is a
 * write_notify into the partner's exchange slot for this rank (the same slot,
 * notification and round count as an exchange: a cycle is one or the other),
 * with (round, length, step) in its header; a rank sends each partner at most
 * one message per round, so "its notification reached this round" means
 * "its message of this round is in". Rank r + P learns of the cycle from a
 * bare BELL notification of r (its wake), since its data comes only at the
 * end. Each step's outgoing words have their own buffer (GASPI writes from
 * registered memory, asynchronously), two rounds of them. */

static int and_sends(const gpi2_t *s, int step) {
  if (s->me >= s->and_pow) return step == 0;
  return step > 0 && and_partner(s, step) >= 0; /* step 0: only the wake, sent at post */
}
static int and_receives(const gpi2_t *s, int step) {
  if (s->me >= s->and_pow) return step == s->and_log + 1;
  return step <= s->and_log && and_partner(s, step) >= 0;
}

static tnt_result_t and_send(gpi2_t *s) {
  const int step = s->and_step, peer = and_partner(s, step);
  const size_t len = (size_t)s->and_nwords * sizeof(uint64_t);
  const size_t out = s->off_and_out + ((size_t)(s->round & 1) * (size_t)s->and_steps + (size_t)step) * EXCH_SLOT;
  uint32_t header[4] = {s->round, (uint32_t)len, (uint32_t)step, 0};
  memcpy(s->base + out, header, sizeof header);
  memcpy(s->base + out + sizeof header, s->and_acc, len);
  post_t p = {.kind = 2, .q = Q_CTRL, .peer = peer, .loff = out, .roff = exch_in_offset(s, s->round, s->me),
              .len = sizeof header + len, .id = id_of(s, ID_EXCH, s->me), .value = encode(s->round)};
  return post(s, &p, s->and_deadline, "sending a bit round");
}

/* The partner's message of this step, if in (mu held): ANDed into the words. */
static int and_receive(gpi2_t *s) {
  const int step = s->and_step, peer = and_partner(s, step);
  peer_t *p = &s->peers[peer];
  gaspi_notification_t v = take(s, id_of(s, ID_EXCH, peer));
  if (v) {
    p->exch_round = (uint32_t)widen(p->exch_round, v);
    s->health.peer[peer].last_heard = host->now();
  }
  if (!reached(p->exch_round, s->round)) return 0;
  const uint8_t *slot = s->base + exch_in_offset(s, s->round, peer);
  uint32_t header[4];
  memcpy(header, slot, sizeof header);
  const size_t len = (size_t)s->and_nwords * sizeof(uint64_t);
  if (header[0] != s->round || header[1] != len || header[2] != (uint32_t)step) {
    sticky(&s->health, TNT_ERR_INTERNAL, peer, "rank %d sent round %u step %u of %u bytes where rank %d expected round "
           "%u step %d of %zu bytes in a bit round: the ranks have diverged", peer, header[0], header[2], header[1],
           s->me, s->round, step, len);
    return 0;
  }
  for (int w = 0; w < s->and_nwords; w++) {
    uint64_t x;
    memcpy(&x, slot + sizeof header + (size_t)w * sizeof x, sizeof x);
    s->and_acc[w] &= x;
  }
  return 1;
}

/* Advance as far as the arrived messages allow (mu held); 1 when done, or
 * when a send failed (and_err). */
static int and_advance(gpi2_t *s, void *arg) {
  while (s->and_step < s->and_steps) {
    s->and_partner = and_partner(s, s->and_step);
    if (and_sends(s, s->and_step) && !s->and_sent) {
      if ((s->and_err = and_send(s)) != TNT_SUCCESS) return 1; /* its error is this thread's last: reported */
      s->and_sent = 1;
    }
    if (and_receives(s, s->and_step) && !and_receive(s)) return 0;
    s->and_step++;
    s->and_sent = 0;
  }
  return 1;
}

static tnt_result_t gpi2_and_post(void *st, const uint64_t *mine, int nwords, double deadline) {
  gpi2_t *s = st;
  if (s->and_posted || s->posted) return failf(TNT_ERR_INTERNAL, -1, "bit round posted twice");
  if (nwords < 1 || (size_t)nwords * sizeof(uint64_t) > TNT_EXCHANGE_MAX)
    return failf(TNT_ERR_INTERNAL, -1, "a bit round of %d words", nwords);
  uint64_t *acc = realloc(s->and_acc, (size_t)nwords * sizeof *acc);
  if (!acc) return failf(TNT_ERR_SYSTEM, -1, "out of memory");
  pthread_mutex_lock(&s->mu);
  s->and_acc = acc;
  memcpy(acc, mine, (size_t)nwords * sizeof *acc);
  s->and_nwords = nwords;
  s->round++; /* round - 2 used these buffers and slots: every rank is past it */
  s->and_step = 0;
  s->and_sent = 0;
  s->and_deadline = deadline;
  s->and_posted = 1;
  s->and_err = TNT_SUCCESS;
  tnt_result_t res = flush_put(s, deadline);
  if (res == TNT_SUCCESS && s->me < s->and_pow && s->me + s->and_pow < s->n) /* wake the rank folded in */
    res = post_notify(s, Q_CTRL, s->me + s->and_pow, id_of(s, ID_BELL, s->me), encode(s->round), deadline,
                      "sending a bit round");
  if (res == TNT_SUCCESS) {
    and_advance(s, NULL); /* the first message leaves now */
    res = s->and_err;
  }
  pthread_mutex_unlock(&s->mu);
  return res;
}

static tnt_result_t gpi2_and_collect(void *st, uint64_t *out, double until) {
  gpi2_t *s = st;
  tnt_result_t res = and_wait(s, until);
  if (res == TNT_SUCCESS) res = s->and_err;
  if (res != TNT_SUCCESS) return res;
  pthread_mutex_lock(&s->mu);
  memcpy(out, s->and_acc, (size_t)s->and_nwords * sizeof *out);
  s->and_posted = 0;
  pthread_mutex_unlock(&s->mu);
  return TNT_SUCCESS;
}

static tnt_result_t gpi2_exchange(void *st, const void *mine, size_t len, void *all, size_t stride, size_t *lens,
                                  double deadline) {
  if (len > stride) return failf(TNT_ERR_INTERNAL, -1, "exchange of %zu bytes is too large", len);
  tnt_result_t res = gpi2_exchange_post(st, mine, len, deadline);
  if (res != TNT_SUCCESS) return res;
  return gpi2_exchange_collect(st, all, stride, lens, deadline);
}

/* ---- doorbell ---- */

/* The doorbell is the cycle's own first message, as in mpi.c: a rank with
 * news posts its round right after ringing, and a rank between rounds that
 * holds a peer's exchange or AND message of a later round (or the wake of
 * the rank below it, see the AND) runs the cycle. No bells to every rank:
 * ringing (plugin_ring_doorbell, shared_entries.h) only records the cycle. */

/* Take the exchange notifications that arrived (mu held): a peer's message of
 * a round after the last one this rank posted means the peer started a cycle. */
static int peer_started_round(gpi2_t *s) {
  gaspi_notification_id_t first = 0;
  while (G.notify_waitsome(s->seg, id_of(s, ID_EXCH, 0), (gaspi_number_t)s->n, &first, GASPI_TEST) == GASPI_SUCCESS) {
    int src = (int)first - ID_EXCH * s->n;
    gaspi_notification_t v = take(s, first);
    if (!v || src < 0 || src >= s->n) continue;
    s->peers[src].exch_round = (uint32_t)widen(s->peers[src].exch_round, v);
    s->health.peer[src].last_heard = host->now();
  }
  if (s->posted || s->and_posted) return 0;
  if ((int32_t)(s->bell_round - s->round) > 0) return 1;
  for (int r = 0; r < s->n; r++)
    if (r != s->me && (int32_t)(s->peers[r].exch_round - s->round) > 0) return 1;
  return 0;
}

static int gpi2_cycle_wanted(void *st, uint64_t done) {
  gpi2_t *s = st;
  return atomic_load(&s->door.cycle_wanted) > done || peer_round_begun(s);
}

/* ---- abort, shutdown ---- */

/* Send CTRL `what` (BYE, or ABORT after the reason) to every peer still there,
 * then give queue 1 up to `wait_s` to deliver it. */
static void tell_everyone(gpi2_t *s, int what, const char *reason, int root, double wait_s) {
  pthread_mutex_lock(&s->mu);
  if (reason && !(s->told & CTRL_ABORT)) {
    snprintf((char *)s->base + s->off_reason_out, REASON_MAX, "%s", reason);
    s->told_root = root;
  }
  s->told |= (uint32_t)what;
  for (int r = 0; r < s->n; r++) {
    if (r == s->me || s->health.peer[r].state == PEER_EXITED || s->peers[r].lost) continue;
    if (what == CTRL_ABORT)
      G.write(s->seg, s->off_reason_out, (gaspi_rank_t)r, s->seg, s->off_reasons + (size_t)s->me * REASON_MAX,
              REASON_MAX, Q_CTRL, CALL_TIMEOUT_MS);
    gaspi_notification_t v = s->told | ((gaspi_notification_t)(s->told_root + 1) << 8);
    G.notify(s->seg, (gaspi_rank_t)r, id_of(s, ID_CTRL, s->me), v, Q_CTRL, CALL_TIMEOUT_MS);
  }
  pthread_mutex_unlock(&s->mu);
  double until = host->now() + wait_s;
  gaspi_queue_id_t q = Q_CTRL;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    int done = G.wait(q, GASPI_TEST) != GASPI_TIMEOUT;
    pthread_mutex_unlock(&s->mu);
    if (done || host->now() >= until) return;
    sleep_s(SLEEP_MAX_S);
  }
}

static void gpi2_abort(void *st, const char *reason, int root_peer) {
  gpi2_t *s = st;
  tell_everyone(s, CTRL_ABORT, reason ? reason : "aborted", root_peer < 0 ? s->me : root_peer, 1.0);
}

static int everyone_left(gpi2_t *s, void *arg) {
  for (int r = 0; r < s->n; r++)
    if (r != s->me && s->health.peer[r].state == PEER_ALIVE) return 0;
  return 1;
}

static void free_state(gpi2_t *s) {
  if (!s) return;
  free(s->counters);
  free(s->sent);
  free(s->peers);
  free(s->health.peer);
  free(s->and_acc);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void gpi2_finalize(void *st) {
  gpi2_t *s = st;
  pthread_mutex_lock(&s->mu);
  int failed = flush_put(s, host->now() + 1.0) != TNT_SUCCESS || s->health.err_code != TNT_SUCCESS;
  for (int r = 0; r < s->n; r++) failed |= s->peers[r].lost || s->health.peer[r].state == PEER_FAILED;
  pthread_mutex_unlock(&s->mu);
  /* after a failure nobody waits for goodbyes: a dead peer never sends one */
  tell_everyone(s, CTRL_BYE, NULL, -1, failed ? 0.1 : BYE_WAIT_S);
  /* a peer may still write into our segment (its goodbye) until we have its
   * own goodbye; a segment deleted under a write would take it into freed
   * memory, so one that is not known quiet is left to the process's end */
  double until = host->now() + (failed ? 0 : s->timeout_s < BYE_WAIT_S ? s->timeout_s : BYE_WAIT_S);
  int quiet = 0;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    scan_ctrl(s, host->now());
    quiet = everyone_left(s, NULL);
    pthread_mutex_unlock(&s->mu);
    if (quiet || host->now() >= until) break;
    sleep_s(SLEEP_MAX_S);
  }
  int clean = quiet;
  for (int r = 0; r < s->n; r++) clean &= r == s->me || s->health.peer[r].state == PEER_EXITED;
  pthread_mutex_lock(&s->mu);
  if (clean && G.wait(Q_DATA, GASPI_TEST) == GASPI_SUCCESS && G.wait(Q_CTRL, GASPI_TEST) == GASPI_SUCCESS)
    G.segment_delete(s->seg);
  else
    LOG(LOG_DEBUG, "gpi2: segment %d kept until exit (not every peer said goodbye)", s->seg);
  pthread_mutex_unlock(&s->mu);
  free_state(s);
}

/* ---- set-up ---- */

static tnt_result_t make_segment(gpi2_t *s, double deadline) {
  if (SEGMENT_FIRST + generation > SEGMENT_LAST)
    return failf(TNT_ERR_INVALID_USAGE, -1, "the gpi2 transport has started %d times in this process and GPI-2 has no "
                 "segment ids left: call tnt.init() fewer times", generation);
  s->seg = (gaspi_segment_id_t)(SEGMENT_FIRST + generation++); /* every rank counts alike: tnt_init is collective */
  gaspi_return_t rc = G.segment_alloc(s->seg, s->seg_bytes, GASPI_MEM_INITIALIZED);
  if (rc != GASPI_SUCCESS)
    return failf(TNT_ERR_SYSTEM, -1, "gaspi_segment_alloc of %zu bytes failed: %s", s->seg_bytes, gerr(rc));
  void *ptr = NULL;
  G.segment_ptr(s->seg, &ptr);
  s->base = ptr;
  /* gaspi_segment_create would also do this, but through an all-gather on a
   * fixed port (23333) that two jobs on one host would share */
  for (int r = 0; r < s->n; r++) {
    if (r == s->me) continue;
    double left = deadline - host->now();
    rc = G.segment_register(s->seg, (gaspi_rank_t)r, (gaspi_timeout_t)((left > 0 ? left : 0) * 1000));
    if (rc != GASPI_SUCCESS)
      return failf(rc == GASPI_TIMEOUT ? TNT_ERR_TIMEOUT : TNT_ERR_PEER_LOST, r,
                   "rank %d could not make its GPI-2 segment known to rank %d: %s", s->me, r, gerr(rc));
  }
  double left = deadline - host->now();
  rc = G.barrier(GASPI_GROUP_ALL, (gaspi_timeout_t)((left > 0 ? left : 0) * 1000));
  if (rc != GASPI_SUCCESS)
    return failf(rc == GASPI_TIMEOUT ? TNT_ERR_TIMEOUT : TNT_ERR_SYSTEM, -1,
                 "rank %d: the other ranks did not finish setting up the gpi2 transport within TNT_TIMEOUT_S (%s)",
                 s->me, gerr(rc));
  return TNT_SUCCESS;
}

static tnt_result_t check_hellos(gpi2_t *s, const hello_t *all, const size_t *lens) {
  for (int q = 0; q < s->n; q++) {
    const hello_t *h = &all[q];
    if (lens[q] != sizeof *h || h->magic != HELLO_MAGIC || h->abi != TNT_PLUGIN_ABI_VERSION)
      return failf(TNT_ERR_INVALID_USAGE, -1, "GPI-2 rank %d runs another release of Tarantella's gpi2 transport "
                   "(plugin ABI %u, here %d): give every rank the same installation", q,
                   lens[q] == sizeof *h ? h->abi : 0, TNT_PLUGIN_ABI_VERSION);
    if (h->rank != q || h->size != s->n || h->seg != s->seg || h->window_bytes != s->window_bytes)
      return failf(TNT_ERR_INVALID_USAGE, -1, "GPI-2 rank %d (pid %d on %s) is rank %d of %d with segment %d and a "
                   "%llu-byte window by its settings; here rank %d of %d, segment %d, %zu bytes: give every rank the "
                   "same TNT_* settings", q, h->pid, h->host, h->rank, h->size, h->seg,
                   (unsigned long long)h->window_bytes, s->me, s->n, s->seg, s->window_bytes);
    if (h->heartbeat_s != s->health.beat_s)
      return failf(TNT_ERR_INVALID_USAGE, -1, "the ranks disagree on TNT_GPI2_HEARTBEAT_S (rank %d: %g, rank %d: %g): "
                   "give every rank the same environment", s->me, s->health.beat_s, q, h->heartbeat_s);
  }
  return TNT_SUCCESS;
}

static tnt_result_t gpi2_init(const tnt_placement_t *pl, const tnt_params_t *params, size_t window_bytes, void **state) {
  double beat;
  tnt_result_t res = read_seconds("TNT_GPI2_HEARTBEAT_S", 1.0, 0.01, 60,
                                  "seconds between the gpi2 transport's heartbeats; 10 missed ones mean a peer is lost",
                                  &beat);
  if (res != TNT_SUCCESS) return res;
  if (pl->size > 10000)
    return failf(TNT_ERR_INVALID_USAGE, -1, "the gpi2 transport serves at most 10000 ranks (GPI-2's notification ids)");
  if ((res = ensure_gaspi(pl, params->timeout_s)) != TNT_SUCCESS) return res;
  gaspi_number_t nids = 0;
  G.notification_num(&nids);
  if ((long)nids < (long)ID_RANGES * pl->size)
    return failf(TNT_ERR_INVALID_USAGE, -1, "GPI-2 offers %u notifications per segment; the gpi2 transport needs %d for "
                 "%d ranks", nids, ID_RANGES * pl->size, pl->size);
  double deadline = host->now() + params->timeout_s;
  gpi2_t *s = calloc(1, sizeof *s);
  if (!s) return failf(TNT_ERR_SYSTEM, -1, "out of memory");
  pthread_mutex_init(&s->mu, NULL);
  s->pl = *pl;
  s->me = pl->rank;
  s->n = pl->size;
  s->timeout_s = params->timeout_s;
  /* this rank alone on its own CPUs until the set-up records tell (below) */
  tnt_cpus_t my_cpus;
  s->share = (machine_share_t){1, tnt_cpus_mine(&my_cpus)};
  s->waits = wait_policy(params, s->share, YIELD_POLLS);
  s->health = (job_health_t){.me = s->me, .n = s->n, .beat_s = beat, .silence_s = SILENT_BEATS * beat,
                              .beat_var = "TNT_GPI2_HEARTBEAT_S", .mu = &s->mu};
  s->window_bytes = window_bytes;
  s->stage_bytes = 2 * window_bytes < (1u << 20) ? (1u << 20) : 2 * window_bytes;
  size_t n = (size_t)s->n;
  s->off_exch_in = (window_bytes + 4095) & ~(size_t)4095;
  s->off_reasons = s->off_exch_in + 2 * n * EXCH_SLOT;
  s->off_exch_out = s->off_reasons + n * REASON_MAX;
  s->off_reason_out = s->off_exch_out + 2 * EXCH_SLOT;
  and_shape(s);
  s->off_and_out = (s->off_reason_out + REASON_MAX + 4095) & ~(size_t)4095;
  s->off_stage = (s->off_and_out + 2 * (size_t)s->and_steps * EXCH_SLOT + 4095) & ~(size_t)4095;
  s->seg_bytes = s->off_stage + s->stage_bytes;
  s->counters = calloc(n * TNT_NOTIFY_KINDS, sizeof *s->counters);
  s->sent = calloc(n * TNT_NOTIFY_KINDS, sizeof *s->sent);
  s->peers = calloc(n, sizeof *s->peers);
  s->health.peer = calloc(n, sizeof *s->health.peer);
  if (!s->counters || !s->sent || !s->peers || !s->health.peer) {
    free_state(s);
    return failf(TNT_ERR_SYSTEM, -1, "out of memory");
  }
  pthread_mutex_lock(&init_mu);
  res = make_segment(s, deadline);
  pthread_mutex_unlock(&init_mu);
  if (res != TNT_SUCCESS) {
    free_state(s); /* the segment, if any, stays: a peer may write into it */
    return res;
  }
  double now = host->now();
  for (int r = 0; r < s->n; r++) {
    s->health.peer[r].root = -1;
    s->health.peer[r].last_heard = s->health.peer[r].last_sent = now;
  }
  s->next_beat = now + beat;
  /* the first exchange introduces the ranks */
  hello_t mine;
  memset(&mine, 0, sizeof mine);
  mine.magic = HELLO_MAGIC;
  mine.abi = TNT_PLUGIN_ABI_VERSION;
  mine.rank = pl->rank;
  mine.size = pl->size;
  mine.pid = (int32_t)getpid();
  mine.seg = s->seg;
  mine.heartbeat_s = beat;
  mine.window_bytes = window_bytes;
  gethostname(mine.host, sizeof mine.host - 1);
  node_id(mine.node, sizeof mine.node);
  mine.cpus = my_cpus;
  hello_t *all = calloc(n, sizeof *all);
  size_t *lens = calloc(n, sizeof *lens);
  res = all && lens ? gpi2_exchange(s, &mine, sizeof mine, all, sizeof mine, lens, deadline)
                    : failf(TNT_ERR_SYSTEM, -1, "out of memory");
  if (res == TNT_SUCCESS) res = check_hellos(s, all, lens);
  if (res == TNT_SUCCESS) {
    s->share = machine_share(s->n, s->me, hello_node, hello_cpus, all);
    s->waits = wait_policy(params, s->share, YIELD_POLLS);
  }
  for (int r = 0; res == TNT_SUCCESS && r < s->n; r++) {
    peer_health_t *p = &s->health.peer[r];
    p->pid = all[r].pid;
    p->local = node_ids_match(all[r].node, mine.node);
    snprintf(p->host, sizeof p->host, "%s", all[r].host);
  }
  free(all);
  free(lens);
  if (res != TNT_SUCCESS) {
    free_state(s);
    return res;
  }
  *state = s;
  LOG(LOG_INFO, "gpi2: %d ranks, %d on this machine on %ld cores (the CPUs they may run on, of %ld online), segment "
      "%d of %zu bytes (window %zu), heartbeat %g s, %s", s->n, s->share.ranks, s->share.cores, tnt_online_cpus(), s->seg,
      s->seg_bytes, window_bytes, beat, description);
  return TNT_SUCCESS;
}

static int gpi2_can_serve(const tnt_placement_t *pl) { return pl->size >= 1; }

static const tnt_transport_t transport = {
    .name = "gpi2",
    .can_serve = gpi2_can_serve,
    .init = gpi2_init,
    .put = gpi2_put,
    .fence = gpi2_fence,
    .send_buffer = gpi2_send_buffer,
    .window = gpi2_window,
    .notify = gpi2_notify,
    .wait = gpi2_wait,
    .exchange = gpi2_exchange,
    .exchange_post = gpi2_exchange_post,
    .exchange_collect = gpi2_exchange_collect,
    .ring_doorbell = plugin_ring_doorbell,
    .cycle_wanted = gpi2_cycle_wanted,
    .wait_doorbell = plugin_wait_doorbell,
    .check_peers = plugin_check_peers,
    .describe_peer = plugin_describe_peer,
    .wake_local = plugin_wake_local,
    .abort = gpi2_abort,
    .finalize = gpi2_finalize,
    .and_post = gpi2_and_post,
    .and_collect = gpi2_and_collect,
    .wait_stats = plugin_wait_stats,
    .cores = plugin_cores,
};

static const tnt_plugin_t plugin = {
    TNT_PLUGIN_SIZES,
    .caps = TNT_TRANSPORT_CAP_MULTI_HOST | TNT_TRANSPORT_CAP_ONE_SIDED | TNT_TRANSPORT_CAP_HEARTBEAT,
    .name = "gpi2",
    .description = description,
    .transport = &transport,
};

EXPORT const tnt_plugin_t *TNT_PLUGIN_ENTRY(const tnt_plugin_host_t *h, char *why, size_t why_len) {
  if (!plugin_abi_matches(h, why, why_len)) return NULL;
  host = h;
  pthread_mutex_lock(&init_mu);
  int rc = load_gpi2(why, why_len);
  if (rc == 0 && !description[0]) {
    float v = 0;
    G.version(&v);
    snprintf(description, sizeof description, "GPI-2 %g (%.200s)", v, gpi2_path);
  }
  pthread_mutex_unlock(&init_mu);
  return rc == 0 ? &plugin : NULL;
}
