"""The TNT_* environment contract in one table.

The runner sets these variables for every rank; users may set them too. The
core's own numeric settings (fusion, timeout, shm slots, cache, spin) are rows
of the C table in core/src/params.c, read through the binding: their defaults,
bounds, docs and parsing rule exist once, for the core, `tntrun`'s validation,
its --help and docs/environment.md. The rest (placement, logging, files) are
Python's own rows below.
"""
import functools
import os
from dataclasses import dataclass

from tarantella.common.errors import InvalidArgumentError


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "int", "float", "bool", "str", "choice"
    default: object
    doc: str
    choices: tuple = ()
    bounds: tuple = ()  # (min, max) of the core's settings
    in_core: bool = False  # a row of core/src/params.c: parsed by the core's rule


def _core_rows():
    """The core's settings table, through the binding (no TNT_* is read)."""
    from tarantella.common import core

    lib, ffi = core.lib(), core.ffi()
    name, doc = ffi.new("const char **"), ffi.new("const char **")
    default, low, high, integer = (ffi.new("double *"), ffi.new("double *"), ffi.new("double *"),
                                   ffi.new("int *"))
    rows = {}
    for i in range(lib.tnt_param_count()):
        core.check(lib.tnt_param_describe(i, name, default, low, high, integer, doc))
        kind = "int" if integer[0] else "float"
        cast = int if integer[0] else float
        key = ffi.string(name[0]).decode()
        rows[key] = Param(key, kind, cast(default[0]), ffi.string(doc[0]).decode(),
                          bounds=(cast(low[0]), cast(high[0])), in_core=True)
    return rows


_CORE = object()  # placeholder: the row comes from the core's table

_ROWS = (
    Param("TNT_RANK", "int", None, "rank of this process, 0 <= rank < TNT_SIZE"),
    Param("TNT_SIZE", "int", None, "number of ranks in the job"),
    Param("TNT_LOCAL_RANK", "int", None, "rank among the ranks of this host"),
    Param("TNT_LOCAL_SIZE", "int", None, "number of ranks on this host"),
    Param("TNT_JOB_ID", "str", None, "per-job random id that names the job's shared-memory objects "
          "(letters, digits, `-` and `_`, at most 100)"),
    Param("TNT_RANK_PID", "int", None,
          "set by a rank of several in its own environment once initialized: a process it starts "
          "(multiprocessing workers, subprocesses) is not a rank, and Tarantella refuses to initialize there"),
    ("TNT_FUSION_THRESHOLD_KB", _CORE),
    ("TNT_TIMEOUT_S", _CORE),
    ("TNT_BUSY_TIMEOUT_S", _CORE),
    Param("TNT_TRANSPORT", "choice", "auto", "transport between ranks", ("auto", "shm", "mpi", "gpi2")),
    Param("TNT_MPI_HEARTBEAT_S", "float", 1.0,
          "mpi transport: seconds between heartbeats (0.01 to 60); a peer silent for 10 of them is lost"),
    Param("TNT_MPI_PLUGIN", "str", None,
          "mpi transport: path of its plugin library; unset: built at first use with mpicc into "
          "~/.cache/tarantella/plugins"),
    Param("TNT_MPICC", "str", None,
          "mpi transport: the MPI compiler wrapper that builds its plugin (else $MPICC, else mpicc on PATH)"),
    Param("TNT_GPI2_HEARTBEAT_S", "float", 1.0,
          "gpi2 transport: seconds between heartbeats (0.01 to 60); a peer silent for 10 of them is lost"),
    Param("TNT_GPI2_PORT", "int", None,
          "gpi2 transport: first TCP port of GPI-2's range on every host (this + local rank, + 256 + local rank, "
          "+ 512 + local rank); unset: one of 464 bases from 10240 (below the ephemeral ports), by the job id"),
    Param("TNT_GPI2_PLUGIN", "str", None,
          "gpi2 transport: path of its plugin library; unset: built at first use with cc into "
          "~/.cache/tarantella/plugins"),
    Param("TNT_CC", "str", None, "gpi2 transport: the C compiler that builds its plugin (else $CC, else cc on PATH)"),
    ("TNT_SHM_SLOT_KB", _CORE),
    ("TNT_SHM_SLOTS", _CORE),
    ("TNT_CACHE_CAPACITY", _CORE),
    ("TNT_SPIN_US", _CORE),
    ("TNT_HIERARCHICAL", _CORE),
    ("TNT_BIT_ROUNDS", _CORE),
    ("TNT_SIMD", _CORE),
    ("TNT_STREAM_MIN_KB", _CORE),
    ("TNT_SHM_DIRECT", _CORE),
    ("TNT_MPI_PAIR_SUM", _CORE),
    ("TNT_MPI_PAIR_PIECE_KB", _CORE),
    ("TNT_RIDES", _CORE),
    ("TNT_NET_SPIN_US", _CORE),
    ("TNT_SHM_PLACEMENT", _CORE),
    Param("TNT_TF_OPS", "choice", "auto",
          "how collectives inside tf.function reach the core: auto (compiled TensorFlow ops, built at first "
          "use into ~/.cache/tarantella/plugins; tf.numpy_function with a WARNING when they cannot be built), "
          "compiled (an error instead), numpy (always tf.numpy_function)", ("auto", "compiled", "numpy")),
    Param("TNT_NCCL_LIBRARY", "str", None,
          "the NCCL library the core loads (2.14 or newer; default: the nvidia-nccl-cu12 wheel's, else "
          "libnccl.so.2 on the library path); `tntrun --version` says whether it loads"),
    Param("TNT_TIMELINE", "str", None, "write a Chrome-trace JSON of each rank's collectives to this path; "
          "with several ranks one file per rank, `.rank<r>` before the extension (trace.rank0.json)"),
    Param("TNT_STARTUP_LOG", "str", None,
          "append when each step of starting the job happened (tntrun and every rank, one line per event) to "
          "this file, to measure the time to the first training step (bench/startup.py)"),
    Param("TNT_LOG_LEVEL", "choice", "WARNING", "log level of Tarantella's Python and C logs",
          ("DEBUG", "INFO", "WARNING", "ERROR")),
    Param("TNT_LOG_ON_ALL_DEVICES", "bool", False, "log on every rank, not only the master rank"),
    Param("TNT_OUTPUT_ON_ALL_DEVICES", "bool", False, "show the output of every rank (set by tntrun)"),
    Param("TNT_TENSORBOARD_ON_ALL_DEVICES", "bool", False, "TensorBoard callbacks write on every rank, each "
          "its own rank's metrics in log_dir/rank_<r> (unset: the master writes the global metrics)"),
    Param("TNT_LAUNCHER_DIR", "str", None,
          "the folder where tntrun notes how each rank's process ended (set by tntrun): a rank that waits "
          "for one that ended before it joined fails at once, naming it, instead of at TNT_TIMEOUT_S"),
    Param("TNT_JOIN_NOTES", "str", None,
          "a named pipe where a rank notes each tnt.init() it begins (set by tntrun's rank wrapper across "
          "hosts): tntrun ends a job whose ranks wait in tnt.init() for one that ended without joining, "
          "naming it, instead of at TNT_TIMEOUT_S"),
    Param("TNT_ERROR_FILE", "str", None,
          "where an uncaught Python exception of this rank is written as JSON (set by tntrun); also, at "
          "exit, a collective's PeerLostError or TimeoutError that the program caught"),
)


_PYTHON_ROWS = {row.name: row for row in _ROWS if isinstance(row, Param)}


@functools.lru_cache(maxsize=None)
def _table():
    core_rows = _core_rows()
    params = tuple(core_rows[row[0]] if isinstance(row, tuple) else row for row in _ROWS)
    missing = set(core_rows) - {p.name for p in params}
    assert not missing, f"core settings without a place in config._ROWS: {sorted(missing)}"
    return params


@functools.lru_cache(maxsize=None)
def _by_name():
    return {p.name: p for p in _table()}


def __getattr__(name):
    # PARAMS / BY_NAME load the core's table on first use, so importing stays cheap
    if name == "PARAMS":
        return _table()
    if name == "BY_NAME":
        return _by_name()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# TNT_* names read outside the table: overrides for tests and unusual systems
_UNLISTED = ("TNT_CUDART_LIBRARY", "TNT_GPU_LISTING", "TNT_STAGING_ON_HOST", "TNT_STATE_DIR", "TNT_SYSFS_NODE_DIR")


# the original Tarantella's settings that are not read here (docs/migration.md)
_ORIGINAL = {"TNT_GPUS_PER_NODE": "tntrun counts each host's GPUs (--no-gpu hides them)",
             "TNT_LOG_DIR": "the original Tarantella's, not available",
             # "did you mean TNT_FUSION_THRESHOLD_KB?" led to its byte count given as KiB
             "TNT_FUSION_THRESHOLD": "the original Tarantella's, in bytes: set "
                                     "TNT_FUSION_THRESHOLD_KB, in KiB (bytes / 1024)"}


def unknown_names(environ=None):
    """[(name, a hint)] for each TNT_* variable in the environment that
    Tarantella does not read: a misspelled setting (TNT_TIMOUT_S=5) has no
    effect, which nothing else would say. The hint names the setting it most
    likely meant, or what replaces an original Tarantella's setting."""
    import difflib

    known = set(_by_name()) | set(_UNLISTED)
    environ = os.environ if environ is None else environ
    out = []
    for name in sorted(environ):
        if not name.startswith("TNT_") or name in known or name.startswith("TNT_TEST_"):
            continue
        meant = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        out.append((name, _ORIGINAL.get(name) or (f"did you mean {meant[0]}?" if meant else
                                                  "docs/environment.md lists the settings")))
    return out


LOG_LEVEL_ALIASES = {"WARN": "WARNING", "TRACE": "DEBUG", "FATAL": "ERROR"}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def get(name, environ=None):
    """The value of a TNT_* variable, parsed, or its default. Bad values raise
    InvalidArgumentError naming the variable and what it accepts."""
    # a row of Python's own is found without the core's table, whose reading loads the
    # compiled core: tntrun reads its settings (TNT_LOG_LEVEL, ...) on every start
    param = _PYTHON_ROWS.get(name) or _by_name()[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None:
        return param.default
    if param.in_core:  # the core's own rule and message
        from tarantella.common import core

        lib = core.lib()
        if lib.tnt_param_check(name.encode(), raw.encode()) != 0:
            raise InvalidArgumentError(core.ffi().string(lib.tnt_last_error()).decode())
        return int(float(raw)) if param.kind == "int" else float(raw)
    try:
        if param.kind == "int":
            return int(raw)
        if param.kind == "float":
            return float(raw)
        if param.kind == "bool":
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if param.kind == "choice":
            value = raw.strip().upper() if name == "TNT_LOG_LEVEL" else raw.strip().lower()
            if name == "TNT_LOG_LEVEL":
                # the aliases the core's logger and tntrun --log-level take (WARN: the original
                # Tarantella's own default value, refused here while tntrun took it)
                value = LOG_LEVEL_ALIASES.get(value, value)
            if value not in param.choices:
                raise ValueError
            return value
        return raw
    except ValueError:
        accepted = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "choice": " | ".join(param.choices)}[param.kind]
        raise InvalidArgumentError(
            f"environment variable {name} must be {accepted} ({param.doc}). Received: {name}={raw}"
        ) from None


def markdown_table():
    """The docs table of variables, generated from PARAMS."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for p in _table():
        default = "" if p.default is None else f"`{p.default}`"
        rows.append(f"| `{p.name}` | {default} | {p.doc} |")
    return "\n".join(rows)
