/* params.c - reads the environment contract (DESIGN.md): placement and tuning.
 *
 * Every variable is one row of a table: name, default, bounds. A bad value is an
 * error naming the variable and the accepted range (never a silent default), and
 * each value set by the environment is logged once at INFO. */
#define _GNU_SOURCE
#include "params.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"

typedef enum { AS_INT, AS_INT64, AS_DOUBLE } param_type_t;

typedef struct {
  const char *name;
  double def, min, max;
  int integer; /* whole numbers only */
  /* where tnt_params_read puts the value (INTO): tnt_params_t's field at
   * `field`, of `type`, the value times `scale` (KiB to bytes: 1024, us to
   * seconds: 1e-6, else 1) */
  size_t field;
  param_type_t type;
  double scale;
  const char *doc;
} num_param_t;

/* A row's destination: tnt_params_t's `field` (its type read from the struct,
 * so that a row cannot write another type), the value times `scale`. */
#define INTO(field, scale)                                                                          \
  offsetof(tnt_params_t, field),                                                                    \
      _Generic(((tnt_params_t *)0)->field, int: AS_INT, int64_t: AS_INT64, double: AS_DOUBLE), scale

enum { P_FUSION_KB, P_TIMEOUT_S, P_BUSY_TIMEOUT_S, P_SLOT_KB, P_SLOTS, P_CACHE, P_SPIN_US, P_HIER, P_BITS, P_SIMD, P_STREAM_KB, P_DIRECT, P_MPI_PAIR_SUM, P_MPI_PAIR_PIECE_KB, P_RIDES, P_NET_SPIN_US, P_PLACEMENT, P_COUNT };

static const num_param_t num_params[P_COUNT] = {
    [P_FUSION_KB] = {"TNT_FUSION_THRESHOLD_KB", 1024, 0, 4194304, 1, INTO(fusion_threshold_bytes, 1024),
                     "allreduces of one dtype are packed into one buffer up to this many KiB; 0 disables fusion"},
    [P_TIMEOUT_S] = {"TNT_TIMEOUT_S", 300, 0.01, 1e9, 0, INTO(timeout_s, 1),
                     "bound on any wait for a peer, in seconds: a stalled negotiation or silent peer fails after it"},
    [P_BUSY_TIMEOUT_S] = {"TNT_BUSY_TIMEOUT_S", 3600, 0.01, 1e9, 0, INTO(busy_timeout_s, 1),
                          "bound in seconds on a wait for a peer that is alive and busy on its own (the master "
                          "writing a save, a callback that runs on the master only, tnt.rank_only(), Keras replacing a "
                          "tf.data iterator): TNT_TIMEOUT_S counts from "
                          "when it stopped being busy, and the whole wait fails after this (or TNT_TIMEOUT_S, "
                          "if larger)"},
    [P_SLOT_KB] = {"TNT_SHM_SLOT_KB", 256, 4, 65536, 1, INTO(shm_slot_bytes, 1024),
                   "shared-memory transport: size of one pipelined piece in KiB"},
    [P_SLOTS] = {"TNT_SHM_SLOTS", 8, 2, 64, 1, INTO(shm_slots, 1),
                 "shared-memory transport: pieces in flight per ring link"},
    [P_CACHE] = {"TNT_CACHE_CAPACITY", 1024, 0, 65536, 1, INTO(cache_capacity, 1),
                 "negotiated tensor names remembered (steady state costs one bit each)"},
    [P_SPIN_US] = {"TNT_SPIN_US", 50, 0, 1e6, 0, INTO(spin_s, 1e-6),
                   "microseconds a waiter polls before it sleeps: spinning while the host's ranks fit on its "
                   "cores; where they outnumber them, yielding the core at every poll, this long for every "
                   "core's worth of ranks"},
    [P_HIER] = {"TNT_HIERARCHICAL", 1, 0, 1, 1, INTO(hierarchical, 1),
                "1: across hosts with the same number of ranks each, allreduce inside each host, then between "
                "hosts; 0: one flat ring"},
    [P_BITS] = {"TNT_BIT_ROUNDS", 1, 0, 1, 1, INTO(bit_rounds, 1),
                "1: a negotiation cycle in which every name is cached is one AND-allreduce of readiness bits; "
                "0: every cycle exchanges every rank's full message (for comparison)"},
    [P_SIMD] = {"TNT_SIMD", 2, 0, 2, 1, INTO(simd, 1),
                "float16/bfloat16 sums and scaling: 2: AVX-512F or F16C+AVX2, the best the CPU has; 1: at most "
                "F16C+AVX2; 0: portable scalar code (every level gives the same bits)"},
    [P_STREAM_KB] = {"TNT_STREAM_MIN_KB", 4096, 0, 1e12, 1, INTO(stream_min_bytes, 1024),
                     "allreduces of at least this many KiB (the direct allreduce of N ranks on one host: N times "
                     "its buffer, all of the host's, and 1.5x this while a rank finds the cores near each other) "
                     "are taken to be larger than the cache: results are written "
                     "past it with streaming stores (x86-64), and the ring's last reduce step sends each "
                     "completed piece on at once (the same bits either way)"},
    [P_DIRECT] = {"TNT_SHM_DIRECT", 1, 0, 1, 1, INTO(shm_direct, 1),
                  "shared-memory transport with more than 2 ranks: 1: an allreduce above 16 KiB reads every rank's "
                  "chunk in place, two rounds per MiB; 0: the ring (the same bits either way)"},
    [P_MPI_PAIR_SUM] = {"TNT_MPI_PAIR_SUM", 1, 0, 1, 1, INTO(mpi_pair_sum, 1),
                         "a pair of ranks on two hosts over MPI (2 hosts x 1 rank, and each link of the "
                         "hierarchical allreduce between 2 hosts): 1: every dtype above 16 KiB is summed in direct "
                         "MPI messages, each receive posted before its bytes come; 0: the ring "
                         "(the same bits either way)"},
    [P_MPI_PAIR_PIECE_KB] = {"TNT_MPI_PAIR_PIECE_KB", 256, 4, 2097152, 1, INTO(mpi_pair_piece_bytes, 1024),
                             "a pair of ranks summing in direct MPI messages (TNT_MPI_PAIR_SUM=1): no message is "
                             "larger than this many KiB; what is larger goes in pieces, one message each way per "
                             "piece (Open MPI over TCP moved large messages in pieces of 256 KiB 1.3-2x as fast as "
                             "whole; where an MPI moves large messages at full speed, a larger value saves a round "
                             "trip per piece; the same bits either way)"},
    [P_RIDES] = {"TNT_RIDES", 1, 0, 1, 1, INTO(rides, 1),
                 "2 hosts x 2 ranks (the hierarchical allreduce over shm and mpi): 1: an allreduce of up to 64 "
                 "KiB that is the only request of its cycle is summed along its bit round's steps, read in "
                 "place from the host's shared memory, then sent across with the readiness bits (one round "
                 "when every rank is ready); 0: a full round up to 16 KiB, else the bit round, then the "
                 "allreduce (the same bits either way)"},
    [P_NET_SPIN_US] = {"TNT_NET_SPIN_US", 1000, 0, 1e6, 0, INTO(net_spin_s, 1e-6),
                       "across hosts (the mpi and gpi2 transports): microseconds a wait for the network polls "
                       "before it sleeps, while the host has a core free and its ranks fit on its cores (as for "
                       "TNT_SPIN_US); a round trip over TCP takes tens of microseconds, and a wait that sleeps "
                       "through it, or through a transfer that moves only while it polls, adds its wake-up"},
    [P_PLACEMENT] = {"TNT_SHM_PLACEMENT", 0, 0, 2, 1, INTO(shm_placement, 1),
                     "how a rank writes pieces of 16 KiB and more into a peer's shared memory (and the "
                     "ring's pieces into what it sends from, over any transport): 0: as its cores are found "
                     "placed, from what its plain copies cost (plain stores "
                     "near, streaming stores far apart); 1: taken as near, always plain; 2: taken as far, always "
                     "streaming (the same bits either way; ranks may differ)"},
};

/* 1 when `raw` is a value of setting p (in *out), else 0. */
static int parsed(const num_param_t *p, const char *raw, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(raw, &end);
  while (end && (*end == ' ' || *end == '\n')) end++;
  if (errno || end == raw || (end && *end) || !(v >= p->min && v <= p->max) || (p->integer && v != (double)(int64_t)v))
    return 0;
  *out = v;
  return 1;
}

/* Parse `raw` as setting p; the one rule for the core, tntrun and the bindings. */
static tnt_result_t parse_num(const num_param_t *p, const char *raw, double *out) {
  double v;
  if (!parsed(p, raw, &v))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "environment variable %s must be %s between %.15g and %.15g (%s). Received: %s=%s",
                    p->name, p->integer ? "a whole number" : "a number", p->min, p->max, p->doc, p->name, raw);
  *out = v;
  return TNT_SUCCESS;
}

static tnt_result_t read_num(int which, double *out) {
  const num_param_t *p = &num_params[which];
  const char *raw = getenv(p->name);
  *out = p->def;
  if (!raw || !*raw) return TNT_SUCCESS;
  TNT_CHECK(parse_num(p, raw, out));
  TNT_INFO("%s set by environment to %s", p->name, raw);
  return TNT_SUCCESS;
}

double tnt_params_timeout_s(void) {
  const num_param_t *p = &num_params[P_TIMEOUT_S];
  const char *raw = getenv(p->name);
  double v;
  return raw && *raw && parsed(p, raw, &v) ? v : p->def;
}

int tnt_param_count(void) { return P_COUNT; }

tnt_result_t tnt_param_describe(int i, const char **name, double *def, double *min, double *max, int *integer,
                                const char **doc) {
  if (i < 0 || i >= P_COUNT) return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "no setting number %d (there are %d)", i, P_COUNT);
  const num_param_t *p = &num_params[i];
  *name = p->name;
  *def = p->def;
  *min = p->min;
  *max = p->max;
  *integer = p->integer;
  *doc = p->doc;
  return TNT_SUCCESS;
}

tnt_result_t tnt_param_check(const char *name, const char *value) {
  for (int i = 0; i < P_COUNT; i++) {
    double v;
    if (name && !strcmp(name, num_params[i].name)) return parse_num(&num_params[i], value ? value : "", &v);
  }
  return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "%s is not a setting of the core", name ? name : "(null)");
}

/* with the aliases the logger (log.c) and tntrun --log-level take: WARN was the original
   Tarantella's own default value of TNT_LOG_LEVEL */
static const char *const log_levels[] = {"DEBUG", "INFO", "WARNING", "ERROR", "WARN", "TRACE", "FATAL"};

tnt_result_t tnt_params_read(tnt_params_t *p) {
  double v;
  memset(p, 0, sizeof *p);
  for (int i = 0; i < P_COUNT; i++) {
    TNT_CHECK(read_num(i, &v));
    const num_param_t *row = &num_params[i];
    char *at = (char *)p + row->field;
    if (row->type == AS_INT) *(int *)at = (int)v * (int)row->scale;
    else if (row->type == AS_INT64) *(int64_t *)at = (int64_t)v * (int64_t)row->scale;
    else *(double *)at = v * row->scale;
  }

  const char *lvl = getenv("TNT_LOG_LEVEL"); /* the same rule as Python's logging: no silent default */
  if (lvl && *lvl) {
    int known = 0;
    for (size_t i = 0; i < sizeof log_levels / sizeof log_levels[0]; i++) known |= !strcasecmp(lvl, log_levels[i]);
    if (!known)
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "environment variable TNT_LOG_LEVEL must be DEBUG | INFO | WARNING | "
                      "ERROR (log level of Tarantella's Python and C logs). Received: TNT_LOG_LEVEL=%s", lvl);
  }
  const char *t = getenv("TNT_TRANSPORT");
  snprintf(p->transport, sizeof p->transport, "%s", (t && *t) ? t : "auto");
  if (strcmp(p->transport, "auto") && strcmp(p->transport, "shm") && strcmp(p->transport, "mpi") &&
      strcmp(p->transport, "gpi2"))
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "environment variable TNT_TRANSPORT must be one of auto, shm, mpi, gpi2. Received: TNT_TRANSPORT=%s", t);
  const char *tl = getenv("TNT_TIMELINE");
  if (tl && strlen(tl) >= sizeof p->timeline) /* cut, the trace would go to another file */
    return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "environment variable TNT_TIMELINE may be at most %zu characters long "
                    "(the path of the trace file). Received: TNT_TIMELINE=%.60s... (%zu characters)",
                    sizeof p->timeline - 1, tl, strlen(tl));
  snprintf(p->timeline, sizeof p->timeline, "%s", tl ? tl : "");
  return TNT_SUCCESS;
}

/* An integer variable, or -1 when unset; -2 when set but not a non-negative integer that
 * fits an int (the placement's fields: TNT_SIZE=4294967297 must not become a size of 1). */
static long env_int(const char *name) {
  const char *raw = name ? getenv(name) : NULL;
  if (!raw || !*raw) return -1;
  char *end = NULL;
  errno = 0;
  long v = strtol(raw, &end, 10);
  if (errno || *end || v < 0 || v > INT_MAX) return -2;
  return v;
}

/* env_int for the launcher's own TNT_* placement, where a variable set but empty is a bad value
 * (-2), not an unset one: `TNT_RANK=$RANK TNT_SIZE=$WORLD python train.py` with those unset made
 * every process a serial rank 0 of 1 without a word, each training alone (Python's config.get
 * refused the same empty TNT_RANK, in the logger, before tnt.init). */
static long env_int_strict(const char *name) {
  const char *raw = name ? getenv(name) : NULL;
  return raw && !*raw ? -2 : env_int(name);
}

typedef struct {
  const char *rank, *size, *local_rank, *local_size, *engine;
} placement_source_t;

/* The launcher's variables first, then the engines' (DESIGN.md "Environment contract"),
 * in the order of tarantella/common/engine_ranks.py. Slurm's last: an engine
 * started inside an sbatch script (gaspi_run, mpirun, mpiexec) hands its ranks
 * the script's SLURM_PROCID=0 and SLURM_NTASKS, or, across nodes, those of the
 * daemon srun started on each node (SLURM_PROCID = the node's index), which are
 * no rank of its job: read first, every rank of a node took the same rank.
 * GPI-2 gives no local variables: see gaspi_local. */
static const placement_source_t sources[] = {
    {"TNT_RANK", "TNT_SIZE", "TNT_LOCAL_RANK", "TNT_LOCAL_SIZE", "tntrun"},
    {"GASPI_RANK", "GASPI_NRANKS", NULL, NULL, "GPI-2"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OpenMPI"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "Slurm"},
};

/* The local rank and size of a rank gaspi_run started: gaspi_run exports only
 * GASPI_RANK, GASPI_NRANKS, GASPI_SOCKET (the index among this host's ranks)
 * and GASPI_MFILE, its machine file (one host per line, rank r on line r).
 * The file is in /tmp of the host gaspi_run ran on: where it can be read, the
 * ranks named on the line of this rank are this host's; where it cannot (a
 * host of a cluster without a shared /tmp), GASPI_SOCKET gives the local rank
 * and the local size is only known to be larger (a warning says so). */
static void gaspi_local(tnt_placement_t *pl) {
  long socket = env_int("GASPI_SOCKET");
  pl->local_rank = socket >= 0 ? (int)socket : 0;
  pl->local_size = pl->local_rank + 1;
  const char *path = getenv("GASPI_MFILE");
  FILE *f = path && *path ? fopen(path, "r") : NULL;
  if (!f) {
    TNT_WARN("GPI-2's machine file GASPI_MFILE=%s cannot be read on this host: local rank %d from GASPI_SOCKET, "
             "the number of ranks on this host is unknown (get_local_size() says %d)",
             path ? path : "(unset)", pl->local_rank, pl->local_size);
    return;
  }
  char line[256], mine[256] = "";
  char(*hosts)[256] = calloc((size_t)pl->size, sizeof *hosts);
  int n = 0;
  while (hosts && n < pl->size && fgets(line, sizeof line, f)) {
    line[strcspn(line, " \t\r\n")] = 0;
    if (line[0]) snprintf(hosts[n++], sizeof hosts[0], "%s", line);
  }
  fclose(f);
  if (hosts && n == pl->size) {
    snprintf(mine, sizeof mine, "%s", hosts[pl->rank]);
    int before = 0, same = 0;
    for (int r = 0; r < n; r++)
      if (!strcmp(hosts[r], mine)) {
        before += r < pl->rank;
        same++;
      }
    pl->local_rank = before;
    pl->local_size = same;
  } else if (hosts) {
    TNT_WARN("GPI-2's machine file GASPI_MFILE=%s names %d ranks, GASPI_NRANKS=%d: local rank %d from GASPI_SOCKET",
             path, n, pl->size, pl->local_rank);
  }
  free(hosts);
}

/* The number of tasks of this job step on this node, from Slurm's compressed
 * counts per node ("2(x3),1": 2, 2, 2, 1), SLURM_STEP_TASKS_PER_NODE (the
 * step's; else the job's SLURM_TASKS_PER_NODE), at this node's index
 * SLURM_NODEID; -1 where they cannot be read. Not SLURM_NTASKS_PER_NODE: srun
 * sets it only when --ntasks-per-node was given, and its tasks inherit the
 * allocation's (salloc --ntasks-per-node=4, then srun -n 2: 4, with 2 tasks on
 * the node); engine_ranks.slurm_local_size is the same rule in Python. */
static long slurm_step_local_size(void) {
  const char *counts = getenv("SLURM_STEP_TASKS_PER_NODE");
  if (!counts || !*counts) counts = getenv("SLURM_TASKS_PER_NODE");
  long node = env_int("SLURM_NODEID");
  if (!counts || node < 0) return -1;
  for (const char *c = counts; *c;) {
    char *end = NULL;
    long n = strtol(c, &end, 10), times = 1;
    if (end == c || n < 1 || n > INT_MAX) return -1;
    if (!strncmp(end, "(x", 2)) {
      c = end + 2;
      times = strtol(c, &end, 10);
      if (end == c || times < 1 || *end != ')') return -1;
      end++;
    }
    if (node < times) return n;
    node -= times;
    if (*end != ',' && *end) return -1;
    c = *end ? end + 1 : end;
  }
  return -1;
}

/* A job id every rank of an engine-launched job derives alike. It is guessable,
 * but the objects it names are owner-only; tntrun always passes a random one. */
static void engine_job_id(char *out, size_t len) {
  /* gaspi_run's machine file is a fresh mktemp name per job; its folder may be
   * written differently on the first host (readlink -f on the others) */
  const char *keys[] = {"SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid",
                        "PMIX_NAMESPACE", "PMI_JOBID", "GASPI_MFILE", NULL};
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; keys[i]; i++) {
    const char *v = getenv(keys[i]);
    if (v && !strcmp(keys[i], "GASPI_MFILE") && strrchr(v, '/')) v = strrchr(v, '/') + 1;
    for (const char *c = v ? v : ""; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    h = (h ^ (uint64_t)i) * 1099511628211ull;
  }
  snprintf(out, len, "engine-%u-%016llx", (unsigned)getuid(), (unsigned long long)h);
}

/* The job a rank with a bad local placement belongs to (its TNT_RANK, TNT_SIZE and a well-formed
 * TNT_JOB_ID): its failure then leaves the job's mark (tnt_job_void_note_failed_start), and the others
 * fail at once instead of waiting for it until TNT_TIMEOUT_S. */
static void note_job(tnt_placement_t *pl, long rank, long size) {
  const char *job = getenv("TNT_JOB_ID");
  if (!job || !*job || strlen(job) > 100) return;
  for (const char *c = job; *c; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '-' || *c == '_'))
      return;
  pl->rank = (int)rank;
  pl->size = (int)size;
  snprintf(pl->job_id, sizeof pl->job_id, "%s", job);
}

tnt_result_t tnt_placement_read(tnt_placement_t *pl) {
  memset(pl, 0, sizeof *pl);
  pl->size = 1;
  pl->local_size = 1;
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    const placement_source_t *s = &sources[i];
    long (*read)(const char *) = i == 0 ? env_int_strict : env_int;
    long rank = read(s->rank), size = read(s->size);
    if (rank == -1 && size == -1 && i == 0 && (getenv(s->local_rank) || getenv(s->local_size)))
      /* a local placement alone was ignored: under mpirun (-x TNT_LOCAL_SIZE=1) the engine's own
       * local rank and size were taken, and alone a serial rank was local 0 of 1, without a word */
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                      "%s or %s is set without %s and %s, where it has no effect: the placement then comes from "
                      "the launcher's variables (OMPI_COMM_WORLD_*, PMI_*, SLURM_*), or the process runs serially. "
                      "Set %s and %s too, or unset it. Received: %s=%s, %s=%s",
                      s->local_rank, s->local_size, s->rank, s->size, s->rank, s->size, s->local_rank,
                      getenv(s->local_rank) ? getenv(s->local_rank) : "(unset)", s->local_size,
                      getenv(s->local_size) ? getenv(s->local_size) : "(unset)");
    if (rank == -1 && size == -1) continue;
    if (rank < 0 || size < 1 || rank >= size)
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                      "bad placement from %s: %s and %s must be whole numbers with 0 <= rank < size; start the job "
                      "with tntrun or unset them to run serially. Received: %s=%s, %s=%s",
                      s->engine, s->rank, s->size, s->rank, getenv(s->rank) ? getenv(s->rank) : "(unset)", s->size,
                      getenv(s->size) ? getenv(s->size) : "(unset)");
    long lrank = read(s->local_rank), lsize = read(s->local_size);
    /* The launcher's local placement picks the transport (shm serves a job whose ranks
     * are all local) and the GPU: a bad TNT_LOCAL_* is an error, as every TNT_* is,
     * never the global rank and size instead. (The engines' own variables keep the
     * fallback: their spelling is the engine's, not the user's.) */
    if (i == 0 && (lrank == -2 || lsize == -2 || lsize == 0 || (lsize > 0 && lsize > size) ||
                   (lrank >= 0 && lrank >= (lsize > 0 ? lsize : size)))) {
      note_job(pl, rank, size);
      return tnt_fail(TNT_ERR_INVALID_ARGUMENT,
                      "bad placement from %s: %s and %s must be whole numbers with "
                      "0 <= local rank < local size <= size (%s=%ld); unset, they are the rank and size. "
                      "Received: %s=%s, %s=%s",
                      s->engine, s->local_rank, s->local_size, s->size, size, s->local_rank,
                      getenv(s->local_rank) ? getenv(s->local_rank) : "(unset)", s->local_size,
                      getenv(s->local_size) ? getenv(s->local_size) : "(unset)");
    }
    if (!strcmp(s->engine, "Slurm")) {
      const long step = slurm_step_local_size();
      if (step >= 1) lsize = step;
    }
    pl->rank = (int)rank;
    pl->size = (int)size;
    tnt_log_init(pl->rank); /* the lines below are this rank's (they read "rank 0" on every rank) */
    pl->local_rank = lrank >= 0 ? (int)lrank : (int)rank;
    pl->local_size = lsize >= 1 ? (int)lsize : (int)size;
    if (!s->local_rank) gaspi_local(pl);
    pl->from_launcher = (i == 0);
    const char *job = getenv("TNT_JOB_ID");
    if (job && *job) {
      for (const char *c = job; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '-' || *c == '_'))
          return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "TNT_JOB_ID may contain only letters, digits, '-' and '_'. Received: TNT_JOB_ID=%s", job);
      /* cut to 100, two ids alike in their first 100 characters named one job's shared
       * memory: the second job failed as "two jobs were started with the same TNT_JOB_ID" */
      if (strlen(job) > 100)
        return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "TNT_JOB_ID may be at most 100 characters long. Received: "
                        "TNT_JOB_ID=%.40s... (%zu characters)", job, strlen(job));
      snprintf(pl->job_id, sizeof pl->job_id, "%s", job);
    } else if (size > 1) {
      if (i == 0)
        return tnt_fail(TNT_ERR_INVALID_ARGUMENT, "TNT_SIZE=%ld but TNT_JOB_ID is unset: start the job with tntrun, "
                        "or give every rank the same random TNT_JOB_ID. Received: TNT_SIZE=%ld, TNT_JOB_ID=%s",
                        size, size, job ? "(empty)" : "(unset)");
      engine_job_id(pl->job_id, sizeof pl->job_id);
    }
    TNT_INFO("placement from %s: rank %d of %d (local %d of %d)", s->engine, pl->rank, pl->size, pl->local_rank, pl->local_size);
    return TNT_SUCCESS;
  }
  return TNT_SUCCESS;
}

double tnt_spin_seconds(const tnt_params_t *params, const tnt_placement_t *pl, long cores) {
  /* every rank has two busy threads (the application's and ours): a spinning
   * waiter only helps when both have a core, else it steals the core of the
   * thread it waits for (measured: 2 ranks on 2 cores, 4-byte allreduce
   * 40 us without spinning, 120-250 us with). `cores`: the CPUs the host's
   * ranks may run on (the transport's count of the union of their masks) */
  return 2L * pl->local_size <= cores ? params->spin_s : 0.0;
}
