"""The exception hierarchy: every failure of the core is a TarantellaError.

The split follows the question a user asks first, "is it my call, or the job?":
InvalidArgumentError / InvalidUsageError are fixed by changing the call;
MismatchError by making every rank submit the same tensor; PeerLostError and
TimeoutError mean the job is broken and should be restarted.
"""


class TarantellaError(RuntimeError):
    """Base class of every error raised by Tarantella."""

    code = None


class InvalidArgumentError(TarantellaError, ValueError):
    """A call received an argument it cannot use (dtype, layout, root...)."""

    code = 1


class InvalidUsageError(TarantellaError):
    """A call at the wrong time: before init, after shutdown, a duplicate name."""

    code = 2


class MismatchError(TarantellaError):
    """Ranks submitted the same tensor name with a different dtype, size or op."""

    code = 3


class PeerLostError(TarantellaError):
    """Another rank died or aborted; `rank` names it (None if unknown)."""

    code = 4

    def __init__(self, message, rank=None):
        super().__init__(message)
        self.rank = rank


class TimeoutError(TarantellaError):  # noqa: A001 - deliberately shadows the builtin in this namespace
    """A wait or a stalled negotiation exceeded its bound (TNT_TIMEOUT_S)."""

    code = 5


class SystemError(TarantellaError):  # noqa: A001
    """An operating-system call failed (shared memory, threads...)."""

    code = 6


class InternalError(TarantellaError):
    """A bug in Tarantella: please report it with the TNT_LOG_LEVEL=DEBUG output."""

    code = 7


_BY_CODE = {cls.code: cls for cls in (InvalidArgumentError, InvalidUsageError, MismatchError,
                                      PeerLostError, TimeoutError, SystemError, InternalError)}


def error_for_code(code, message, rank=None):
    """The exception instance for a core result code and its message."""
    cls = _BY_CODE.get(code, InternalError)
    if cls is PeerLostError:
        return PeerLostError(message, rank=rank)
    return cls(message)
