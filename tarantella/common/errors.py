"""The exception hierarchy: every failure of the core is a TarantellaError.

The split follows the question a user asks first, "is it my call, or the job?":
InvalidArgumentError / InvalidUsageError are fixed by changing the call;
MismatchError by making every rank submit the same tensor; PeerLostError and
TimeoutError mean the job is broken and should be restarted.

Each class names the C core's result code it stands for; the values come from
the compiled extension (tarantella.common.codes) when the first error is made,
so importing this module stays cheap.
"""


class TarantellaError(RuntimeError):
    """Base class of every error raised by Tarantella."""

    code_name = None  # the tnt_result_t it stands for (core/include/tarantella.h)

    code = None


class InvalidArgumentError(TarantellaError, ValueError):
    """A call received an argument it cannot use (dtype, layout, root...)."""

    code_name = "ERR_INVALID_ARGUMENT"


class InvalidUsageError(TarantellaError):
    """A call at the wrong time: before init, after shutdown, a duplicate name."""

    code_name = "ERR_INVALID_USAGE"


class MismatchError(TarantellaError):
    """Ranks submitted the same tensor name with a different dtype, size or op."""

    code_name = "ERR_MISMATCH"


class PeerLostError(TarantellaError):
    """Another rank died or aborted; `rank` names it (None if unknown)."""

    code_name = "ERR_PEER_LOST"

    def __init__(self, message, rank=None):
        super().__init__(message)
        self.rank = rank


class TimeoutError(TarantellaError):  # noqa: A001 - deliberately shadows the builtin in this namespace
    """A wait or a stalled negotiation exceeded its bound (TNT_TIMEOUT_S);
    `rank` names the rank that did not answer, when one is known."""

    code_name = "ERR_TIMEOUT"

    def __init__(self, message, rank=None):
        super().__init__(message)
        self.rank = rank


class SystemError(TarantellaError):  # noqa: A001
    """An operating-system call failed (shared memory, threads...)."""

    code_name = "ERR_SYSTEM"


class InternalError(TarantellaError):
    """A bug in Tarantella: please report it with the TNT_LOG_LEVEL=DEBUG output."""

    code_name = "ERR_INTERNAL"


_CLASSES = (InvalidArgumentError, InvalidUsageError, MismatchError, PeerLostError, TimeoutError,
            SystemError, InternalError)


def error_for_code(code, message, rank=None):
    """The exception instance for a core result code and its message."""
    from tarantella.common import codes  # loads the extension: only once an error exists

    cls = next((c for c in _CLASSES if getattr(codes, c.code_name) == code), InternalError)
    if cls in (PeerLostError, TimeoutError):
        exc = cls(message, rank=rank if rank is not None and rank >= 0 else None)
        # the job is broken: tntrun must learn it even if the program catches this error
        from tarantella.common import error_file

        error_file.note(exc)
        return exc
    exc = cls(message)
    if cls is MismatchError and _job_broken():
        # a MismatchError that broke the job (threads named otherwise on another rank), not one
        # call's: on record at once too, for a program that catches it and ends with os._exit(0)
        from tarantella.common import error_file

        error_file.note(exc)
    return exc


def _job_broken():
    """Whether the core has failed the job (tnt_job_error), asked without making an error."""
    from tarantella.common import codes, core

    return core.is_initialized() and core.lib().tnt_job_error() != codes.SUCCESS
