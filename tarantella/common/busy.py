"""Sections of this rank's own: work the other ranks do not share and may
wait for (the master writing a save, a callback that runs on the master
only, Keras between the hooks of fit: tensorflow/keras/callbacks/between_hooks.py). While one is open the core tells the others, in the negotiation's
full rounds, that this rank is alive and busy: a peer waiting for its next
collective does not fail at TNT_TIMEOUT_S, which counts from the end of the
section instead, and TNT_BUSY_TIMEOUT_S bounds the whole wait (core:
tnt_set_busy). A process that dies or stops in one still fails the others
as before. Sections nest and may be open in several threads at once.

A section belongs to the job (core context) it was opened in, as a
communicator's state does in Horovod or torch.distributed: one still open
across tnt.shutdown() and a new tnt.init() ends with the first job, and
the new job's core hears only of the sections opened in it. (The count was
one for the whole process: a section left open across the shutdown hid the
new job's sections from its core, or left it told busy after they ended.)"""
import threading

from tarantella.common import core

_lock = threading.Lock()
_open = 0  # sections open in the job _context (core.context_number())
_context = None


def _tell(busy):
    core.lib().tnt_set_busy(busy)  # a no-op on one rank


def _enter():
    """Count a section into the running job; returns that job's number, for _leave."""
    global _open, _context
    with _lock:
        context = core.context_number()
        if context != _context:  # the first section of a new job: the last job's are its own
            _context, _open = context, 0
        _open += 1
        if _open == 1:
            _tell(1)
        return context


def _leave(context):
    global _open
    with _lock:
        if context != _context or context != core.context_number():
            return  # opened in a job that has ended: nothing to tell the one running now
        _open -= 1
        if _open == 0:
            _tell(0)


class section:  # noqa: N801 - used as `with busy.section():`
    """The body is this rank's own work. A class, not a generator: it wraps
    every hook of a master-only callback (the progress bar's, every batch)."""

    def __enter__(self):
        self._context = _enter() if core.is_initialized() else None

    def __exit__(self, *exc):
        if self._context is not None:
            _leave(self._context)


class _rank_only(section):  # noqa: N801
    """A section the user opens: where it is the script's first Tarantella call (`with
    tnt.rank_only(): if tnt.is_master_rank(): download()`), it starts the core first, as a
    collective would. It was no section then: the others, starting the core in their next
    collective, waited for this rank to start until TNT_TIMEOUT_S and failed. After tnt.shutdown(),
    and in a process a rank started (not a rank itself), it stays a no-op."""

    def __enter__(self):
        if core.never_started() and not core.started_by_a_rank():
            core.init()
        super().__enter__()


def rank_only():
    """`with tnt.rank_only(): ...` around work of this rank's own that the
    other ranks wait for in their next collective (rank 0 downloading a data
    set or evaluating while the others wait in `tnt.barrier()`): they wait
    however long it takes, up to TNT_BUSY_TIMEOUT_S (3600 s), where
    TNT_TIMEOUT_S would have ended the job; TNT_TIMEOUT_S counts from its end.
    A rank that dies in it still fails the others at once. tnt.Model's saves
    and callbacks that run on the master only are such sections already. It starts Tarantella
    if nothing did yet."""
    return _rank_only()
