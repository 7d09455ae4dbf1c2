"""The process's connection to the C core: init/shutdown, rank API, result checks.

The extension tarantella._core is loaded on first use, so `import tarantella`
stays cheap. Collectives initialize the core on first use (the seed's
"one line change" contract); after an explicit shutdown() they raise
InvalidUsageError until init() is called again.
"""
import os
import stat
import sys
import threading

from tarantella.common import codes, errors
from tarantella.common.startup_log import mark

_lock = threading.Lock()
_lib = None
_ffi = None
# _state == "up" in the process that initialized (not a fork() child), kept as
# one flag: tarantella._fastpath's whole check, one global read per call
_running = False
_state = "new"  # "new" -> "up" -> "down" (-> "up" again through init())
_pid = None  # the process that initialized: a fork() child must not act as its rank
_initializing = None  # the thread inside init() (holding _lock), else None; under _cancel_lock
_cancel_lock = threading.Lock()  # _initializing and the core's cancel flag (tnt_setup_cancel) together
_context_number = 0  # counts the contexts this process started: 1 is the first init's
MASTER_RANK = 0



def _load():
    global _lib, _ffi
    if _lib is None:
        try:
            from tarantella import _core
        except ImportError as exc:  # pragma: no cover - only on a broken install
            raise errors.InternalError(
                "the compiled core tarantella._core is missing: reinstall with `pip install .` "
                f"from the source tree ({exc})"
            ) from exc
        _lib, _ffi = _core.lib, _core.ffi
    return _lib, _ffi


def lib():
    """The cffi lib object, loaded but not necessarily initialized."""
    return _load()[0]


def ffi():
    return _load()[1]


def library_path():
    """The file of the loaded extension: compiled code that calls the core
    (the TensorFlow ops) binds to this copy, so it shares this context."""
    _load()
    from tarantella import _core

    return os.path.abspath(_core.__file__)


def check(result):
    """Raise the TarantellaError subclass for a core result code (no-op on success)."""
    if result == codes.SUCCESS:
        return
    raise _error(result)


def _error(result):
    """The TarantellaError for a failed core result code, with the thread's last error."""
    lib_, ffi_ = _load()
    message = ffi_.string(lib_.tnt_last_error()).decode("utf-8", "replace")
    hint = ffi_.string(lib_.tnt_strerror(result)).decode()
    # messages about a call already say how to fix it; the job-level ones
    # (peer lost, timeout, system, internal) get the general advice appended
    self_explaining = (codes.ERR_INVALID_ARGUMENT, codes.ERR_INVALID_USAGE, codes.ERR_MISMATCH)
    text = message if message and result in self_explaining else \
        f"{message} ({hint})" if message else hint
    return errors.error_for_code(result, text, rank=lib_.tnt_last_error_rank()
                                 if result in (codes.ERR_PEER_LOST, codes.ERR_TIMEOUT) else None)


def init(devices_per_node=None):
    """Start the core: read the placement from the environment, connect to the
    other ranks, start the background thread. Idempotent.

    `devices_per_node` is the original Tarantella's (its GPUs per host); it is
    accepted so that its scripts run, and ignored with a warning: tntrun gives
    each rank of a host its own GPU."""
    _init()
    if devices_per_node is not None:
        from tarantella.common.logging import get_logger

        get_logger().warning(
            f"tnt.init(devices_per_node={devices_per_node!r}) is ignored: tntrun gives each rank "
            "of a host its own GPU (CUDA_VISIBLE_DEVICES); choose the ranks per host with "
            "`tntrun --n-per-node N`, and `--no-gpu` to use none (docs/migration.md)")


def _init():
    global _state, _pid, _running, _initializing, _context_number
    with _lock:
        if _state == "up":
            _check_not_forked()
            return
        mark("tnt.init: begin")
        lib_, _ = _load()
        # From here on a shutdown() in another thread ends this init (its set-up fails at once): from
        # the start, not only once the core waits for the other ranks. Marked only there, a shutdown
        # while this thread built the mpi plugin (plugins.prepare: seconds at first use) missed it,
        # waited for _lock, and the init went on to wait for the others until TNT_TIMEOUT_S
        with _cancel_lock:
            lib_.tnt_setup_cancel(0)  # a shutdown() from before this init does not end it
            _initializing = threading.current_thread()
        try:
            _check_not_started_by_a_rank()
            _note_joining()
            from tarantella.common import plugins

            plugins.prepare()  # TNT_TRANSPORT=mpi: find or build the plugin first (or say why there is none)
            # Ctrl-C ends the set-up's waits for the other ranks (setup_interrupt.h) when it would end the
            # program anyway (Python's default handler: KeyboardInterrupt). A handler of the program's own
            # decides alone: one that only notes the signal (a graceful stop at the next epoch) let the
            # set-up go on, where the core's made tnt.init fail every rank with a SystemError
            import signal

            handler = signal.getsignal(signal.SIGINT)
            lib_.tnt_setup_sigint(int(handler is None or handler is signal.default_int_handler))
            result = lib_.tnt_init()
        finally:
            with _cancel_lock:
                _initializing = None
        if result != codes.SUCCESS and lib_.tnt_worker_of() > 0 and not started_by_a_rank():
            # a worker its rank started before that rank's init (it inherited TNT_RANK, TNT_JOB_ID and
            # TNT_ERROR_FILE): the core found the rank above it. From here on it is known as what it is,
            # as if the rank had marked it: its uncaught error must not land in the rank's error file,
            # where tntrun's report took it for the rank's own failure (error_file._the_ranks_own)
            os.environ[RANK_PID] = str(lib_.tnt_worker_of())
        if result != codes.SUCCESS and lib_.tnt_setup_was_interrupted():
            # Ctrl-C ended the set-up's waits. In the main thread Python's handler has raised
            # KeyboardInterrupt by now; in another thread (tnt.init in a worker thread) the call
            # returns here, and the failure is the same KeyboardInterrupt, not a SystemError that
            # blamed "an operating-system call"
            raise KeyboardInterrupt(_load()[1].string(lib_.tnt_last_error()).decode("utf-8", "replace"))
        check(result)
        if _state == "down":
            # a new context after tnt.shutdown(): its unnamed calls are numbered from 0 on every rank
            # alike, before another thread sees it up and makes one (collectives came with the first init)
            from tarantella.common import collectives

            collectives.new_context()
        _context_number += 1
        _state = "up"
        _pid = os.getpid()
        _running = True
        if lib_.tnt_size() > 1:
            # inherited by every process this rank starts (spawn workers, subprocesses): they
            # see its TNT_RANK and TNT_JOB_ID too, and must not claim its rank a second time
            os.environ[RANK_PID] = str(_pid)
        mark("tnt.init: connected")
    from tarantella.common import logging as tnt_logging
    from tarantella.common import error_file

    tnt_logging.configure(lib_.tnt_rank(), MASTER_RANK)
    error_file.install()
    _warn_unknown_settings()
    _warn_ranks_seeing_several_gpus(lib_.tnt_local_size())
    # The collectives now, in the thread that starts the core, not lazily at a first tnt.allreduce: a
    # thread in the middle of that import when another thread fork()ed left its import lock held in the
    # child, whose first tnt.* call then waited on it forever instead of failing as a forked child's does.
    # (Every rank that uses collectives imports the module anyway: no cost to start-up.)
    from tarantella.common import collectives  # noqa: F401


def _note_joining():
    """Tell the rank wrapper of tntrun (across hosts) that this rank begins tnt.init(): one
    line in its named pipe, TNT_JOIN_NOTES. tntrun then knows that this rank waits for every
    other, and ends the job at once, naming the rank, where one of them ended without
    joining (without it, this rank waited until TNT_TIMEOUT_S). Never blocks, never fails:
    without a reader, or without the pipe, nothing is noted."""
    path = os.environ.get("TNT_JOIN_NOTES")
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):  # never append to a file given by mistake
            os.write(fd, b"init\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def _warn_unknown_settings():
    from tarantella.common import config
    from tarantella.common.logging import get_logger

    for name, hint in config.unknown_names():
        get_logger().warning(f"environment variable {name} is not one Tarantella reads ({hint}): it has no effect")


def _warn_ranks_seeing_several_gpus(local_size):
    """Several ranks on a host that each see several GPUs: started without tntrun (a bare mpirun or
    srun), so nothing gave each its own, and TensorFlow puts every rank's work on the first GPU,
    where the ranks share it (the second often fails out of memory) without a word."""
    if local_size < 2:
        return
    from tarantella.common.logging import get_logger

    try:
        from tarantella.runner import gpus  # reads no driver and imports nothing heavy
    except ImportError:  # a source tree on PYTHONPATH, not installed: runner/ is not tarantella.runner
        return
    seen = gpus.detect()
    if len(seen) > 1:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        get_logger().warning(
            f"each of the {local_size} ranks of this host sees {len(seen)} GPUs (CUDA_VISIBLE_DEVICES "
            f"{'unset' if visible is None else repr(visible)}): TensorFlow puts a rank's work on the first it sees, "
            "so they share one unless your program picks one per rank (tf.config.set_visible_devices). Start the "
            "job with tntrun, which gives each rank its own GPU, or give each rank its own CUDA_VISIBLE_DEVICES")


def shutdown():
    """Stop the background thread and release the transport. Other ranks are not
    waited for; pending requests of this rank fail."""
    global _state, _running
    with _cancel_lock:
        initializing = _initializing
        if initializing is not None and initializing is not threading.current_thread():
            # another thread is in init(), or waits there for the other ranks: it gives up now (the
            # core's set-up fails it, and tells the others), where this call waited for it until
            # TNT_TIMEOUT_S (300 s by default), and then shut down the job that init() had just joined
            _load()[0].tnt_setup_cancel(1)
    with _lock:
        if _state != "up":
            return
        from tarantella.common import error_file

        error_file.note(job_error())  # still the job's failure at exit, once the core is gone
        _state = "down"
        _running = False
        check(_lib.tnt_finalize())


def is_initialized():
    return _state == "up" and _pid == os.getpid()


def context_number():
    """Which of this process's contexts runs (1 for the first init's, 2 after a shutdown and an
    init, ...); 0 before the first. State tied to one job (busy.py's open sections) checks it."""
    return _context_number


def never_started():
    """Nothing has started the core in this process yet (no init(), no collective)."""
    return _state == "new"


_forked = False  # set in a fork() child: only then is the pid worth a system call on every collective


def _note_fork():
    global _forked, _running, _lock, _cancel_lock
    _forked = True
    _running = False
    _cancel_lock = threading.Lock()  # held for a moment by a thread of the parent, maybe: not here
    if _lock.locked():
        # held by a thread of the parent inside tnt.init() (a thread starting the core while
        # another forks): that thread does not exist here, and the child's first tnt.* call waited
        # for it forever. A fresh lock lets the child reach the core, which refuses it as the child
        # of a rank (context.c's on_fork_child)
        _lock = threading.Lock()


os.register_at_fork(after_in_child=_note_fork)


def _check_not_forked():
    if _forked and _pid is not None and _pid != os.getpid():
        raise errors.InvalidUsageError(
            f"Tarantella cannot be used in a forked child process (pid {os.getpid()}; this rank lives in "
            f"pid {_pid}): the child shares its parent's rank. Call collectives from the parent, or start "
            "workers with the 'spawn' method (multiprocessing.set_start_method('spawn'))")


RANK_PID = "TNT_RANK_PID"  # set by a rank of several once initialized (see init); tntrun drops it


def started_by_a_rank():
    """The pid of the initialized rank that started this process (directly or not), or None."""
    owner = os.environ.get(RANK_PID)
    return owner if owner and owner != str(os.getpid()) else None


def _check_not_started_by_a_rank():
    owner = started_by_a_rank()
    if owner:
        raise errors.InvalidUsageError(
            f"this process (pid {os.getpid()}) was started by rank {os.environ.get('TNT_RANK', '?')} of the job "
            f"(pid {owner}, {RANK_PID}), which has initialized Tarantella: it is not a rank, and cannot use "
            "collectives or the rank API (it would claim that rank a second time). Call them in the rank "
            "itself, and give a worker what it needs (e.g. tnt.get_rank()) as an argument")


def ensure_initialized():
    """The lib object of a running core: starts it on first use, refuses after
    shutdown() and in a fork() child."""
    if _state == "up":
        _check_not_forked()
        return _lib
    if _state == "down":
        raise errors.InvalidUsageError(
            "Tarantella was shut down (tnt.shutdown() was called): call tnt.init() again before "
            "using collectives or the rank API"
        )
    init()
    return _lib


def job_error():
    """The TarantellaError of the job's failure (a lost peer, a timeout, a stall
    the ranks cannot leave) once a collective of this rank failed with it, or
    None (also when the core is not running). A collective's failure inside a
    TensorFlow op reaches the program as a TensorFlow error, which nothing
    converts when the program catches it (a custom training loop); and a
    MismatchError is the failure of one call, or of the job (threads named
    otherwise on another rank): only the core knows which."""
    if not is_initialized():
        return None
    result = _lib.tnt_job_error()
    return None if result == codes.SUCCESS else _error(result)


def abort(reason):
    """Mark this rank failed so that every peer fails fast with `reason`
    (a no-op in a fork() child: its failure is not its parent's)."""
    if is_initialized():
        _lib.tnt_abort(reason.encode("utf-8", "replace")[:1000])


def get_rank():
    return ensure_initialized().tnt_rank()


def get_size():
    return ensure_initialized().tnt_size()


def get_local_rank():
    return ensure_initialized().tnt_local_rank()


def get_local_size():
    return ensure_initialized().tnt_local_size()


def stats():
    """What this rank's engine has done so far, as a dict: negotiation `cycles`,
    requests served from the response `cache_hits` (one bit each), requests
    `announcements` in full, collectives `executed`, and allreduces,
    broadcasts and allgathers done in `one_round` (their payload rode with the
    negotiation); cycles that were
    `bit_rounds` (one AND of readiness bits: every name cached) and
    `full_rounds` (every rank's whole message), and `bytes_reduced`, the
    payload of the allreduces completed (count x element size of this rank's
    input: gradient compression halves it). `waits_spun`, `waits_yielded` and
    `waits_slept` count this rank's waits on its host (shared memory) that
    found a peer not there yet, by how they ended: within the spin, polling
    while yielding the core (ranks outnumber the cores), or asleep.
    `pair_sums`: allreduces whose sum between two hosts went in direct MPI
    messages (TNT_MPI_PAIR_SUM); `pair_swaps`: allreduces of two ranks that
    swapped whole buffers (on one host at 48-128 KiB, across the network up
    to 256 KiB where direct MPI messages are not used). `bytes_streamed_far`:
    bytes written into peers' shared memory with streaming stores because the
    cores were found (or TNT_SHM_PLACEMENT set them) far apart. Zeros on one
    rank."""
    lib_ = ensure_initialized()
    out = ffi().new("tnt_stats_t *")
    check(lib_.tnt_get_stats(out))
    return {k: getattr(out, k) for k in ("cycles", "cache_hits", "announcements", "executed", "one_round",
                                         "bit_rounds", "full_rounds", "bytes_reduced", "waits_spun",
                                         "waits_yielded", "waits_slept", "pair_sums", "pair_swaps",
                                         "bytes_streamed_far")}


def clock():
    """The core's clock, in seconds (tnt_clock): time.monotonic() less the time this process was
    stopped (SIGSTOP, Ctrl+Z) once a job of several ranks has started. A bound of the frontend's
    on a wait for the other ranks counts on it, as the core's own (TNT_TIMEOUT_S) do: measured on
    time.monotonic(), it passed while the ranks were stopped together, and failed once they were
    continued."""
    return _load()[0].tnt_clock()


def get_master_rank():
    return MASTER_RANK


def is_master_rank():
    return get_rank() == MASTER_RANK


def _shutdown_at_exit():
    # Called at exit (tarantella.common's exit handler, registered at import).
    # An unhandled exception has already aborted the core through the excepthook;
    # a normal exit finalizes so that the thread is joined and shm released.
    from tarantella.common import error_file

    error_file.write_if_caught()  # a collective's error the program went on after
    if _state == "up":
        try:
            shutdown()
        except errors.TarantellaError as exc:  # pragma: no cover
            print(f"tarantella: shutdown at exit failed: {exc}", file=sys.stderr)
