"""Uncaught exceptions: abort the core (peers fail fast instead of waiting for
TNT_TIMEOUT_S) and, when tntrun set TNT_ERROR_FILE, write the exception as JSON
so the launcher can show the root cause of a failed job.

A collective that broke the job (PeerLostError, TimeoutError, the MismatchError of
threads named otherwise on another rank) may never become an uncaught exception: the
program caught it, or it was raised in an atexit handler, whose exceptions Python
prints and ignores (the process exits 0), or it failed a TensorFlow op and reached a
custom training loop as a TensorFlow error that the loop caught. Such an error is
written at exit all the same, marked "caught", so that tntrun counts the job as
failed (docs/cli.md): its ranks did not all make the same collective calls. The core
says which errors broke the job (core.job_error)."""
import json
import os
import sys
import threading
import time
import traceback

from tarantella.common import config

_installed_pid = None  # install()'s process, whose exceptions are the rank's (not a fork()ed child's)
_written = False  # write() ran: the rank's uncaught exception is on record
_job_error = None  # the first error of a collective that broke the job (note())


def write(exc_type, exc, tb, path=None, caught=False, thread=None, final=True):
    global _written
    if thread is None and final:
        _written = True
    path = path or config.get("TNT_ERROR_FILE")
    if not path:
        return
    record = {
        "message": f"{exc_type.__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc_type, exc, tb)),
        "timestamp": time.time(),
        "pid": os.getpid(),
        "rank": _own_rank(),
        # the rank a PeerLostError or TimeoutError blames (a lost or stuck peer): the
        # launcher then looks for the root cause there, not here
        "caused_by_rank": _blamed_rank(exc),
        # the program went on after it (caught, or ignored in an atexit handler): tntrun
        # counts the rank as failed even if it exits 0
        "caught": caught,
        # raised and not caught in this thread (not the main one), which ended; the program
        # went on: the rank failed only if another rank's failure blames it (tntrun's report)
        "thread": thread,
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _own_rank():
    """TNT_RANK, or its text when it is no number: the error being written may be the one about
    it (tnt.init's "bad placement ... TNT_RANK=abc"), and the record must not fail on it in turn
    (the hooks ignore their own failures: the rank's error was lost, and tntrun named none)."""
    try:
        return config.get("TNT_RANK")
    except ValueError:  # InvalidArgumentError
        return os.environ.get("TNT_RANK")


def _blamed_rank(exc):
    blamed = getattr(exc, "rank", None)
    if not isinstance(blamed, int) or blamed < 0 or blamed == _own_rank():
        return None
    return blamed


def note(exc):
    """Remember `exc`, an error of a collective that broke the job (errors.error_for_code
    calls this for PeerLostError, TimeoutError and a MismatchError that failed the job:
    every later collective fails too), for
    write_if_caught. The first one is kept, with its traceback (frames and all): the job is
    over by then. None: nothing to remember."""
    global _job_error
    if _job_error is None and exc is not None:
        _job_error = exc
        # on record at once, marked caught: a program that catches it and ends without
        # Python's exit (os._exit(0), which skips write_if_caught) left no record, and
        # tntrun exited 0 for a broken job. An uncaught exception, or the exit, writes over it.
        if not _written and _the_ranks_own():
            try:
                write(type(exc), exc, exc.__traceback__, caught=True, final=False)
            except Exception:  # noqa: BLE001 - never hide the collective's error behind ours
                pass


def _the_ranks_own():
    """Whether this process is the rank that installed the hooks. A fork()ed child's
    exception is its own: it neither aborts the rank's job (the core ignores a child anyway)
    nor becomes the rank's error in tntrun's report, where it would stand for the rank's own
    failure; nor is that of a process the rank started otherwise (spawn, subprocess), which
    inherited its TNT_ERROR_FILE."""
    from tarantella.common import core

    return os.getpid() == _installed_pid and not core.started_by_a_rank()


def write_if_caught():
    """At exit (tarantella.common's exit handler, which runs after every handler the program
    registered once it had imported tarantella): write the noted error, or the job's failure
    that a collective of this rank met (core.job_error: one that the program never saw as a
    TarantellaError, such as a TensorFlow op's error it caught), if no uncaught exception was
    written, marked "caught"."""
    from tarantella.common import core

    if _written or not _the_ranks_own():
        return
    exc = _job_error or core.job_error()
    if exc is None:
        return
    try:
        write(type(exc), exc, exc.__traceback__, caught=True)
    except Exception:  # noqa: BLE001 - at exit, with nothing left to tell it to
        pass


def install():
    """Chain our hook in front of the current sys.excepthook (once)."""
    global _installed_pid
    if _installed_pid is not None:
        return
    _installed_pid = os.getpid()
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        from tarantella.common import core

        if _the_ranks_own():
            try:
                core.abort(f"uncaught {exc_type.__name__}: {exc}")
                write(exc_type, exc, tb)
            except Exception:  # never hide the user's exception behind ours
                pass
        previous(exc_type, exc, tb)

    sys.excepthook = hook

    previous_thread_hook = threading.excepthook

    def thread_hook(args):
        # a thread's uncaught exception ends the thread alone, and the program may go on (it
        # is not aborted here); but when the rank then leaves its peers waiting (a collective
        # that thread never made), their failure blames this rank, which exits 0: the record
        # lets tntrun's report name this exception as the root cause, not their PeerLostError
        if not _written and args.exc_type is not SystemExit and _the_ranks_own():
            try:
                write(args.exc_type, args.exc_value, args.exc_traceback,
                      thread=args.thread.name if args.thread is not None else "?")
            except Exception:  # never hide the user's exception behind ours
                pass
        previous_thread_hook(args)

    threading.excepthook = thread_hook
