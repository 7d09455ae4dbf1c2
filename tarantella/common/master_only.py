"""Whether this thread runs code on the master rank only (a callback wrapped
with `tnt.keras.callbacks.Callback(cb, run_on_all_ranks=False)`).

A save made there (`tnt.Model.save`, `save_weights`, `tnt.models.save_model`
of a tnt.Model or of a plain Keras model) skips its closing barrier: the other
ranks are not saving and would never join it. A collective made there is
refused at once (`refuse`): the other ranks never call it, so it would wait
for them until TNT_TIMEOUT_S, or, unnamed, take the name of the next
collective they do call. A thread of its own: Keras may run batch callbacks
in a worker thread."""
import contextlib
import threading

from tarantella.common import busy, core
from tarantella.common.errors import InvalidUsageError

_here = threading.local()
_lock = threading.Lock()
# Sections open in any thread: the collectives' check is one read of this
# global while none is (the plain call is the fast call).
open_sections = 0


@contextlib.contextmanager
def section():
    """The body of one master-only callback hook (they may nest): a section
    of the master's own (busy.py), which the other ranks wait for."""
    global open_sections
    depth = getattr(_here, "depth", 0)
    _here.depth = depth + 1
    with _lock:
        open_sections += 1
    try:
        with busy.section():
            yield
    finally:
        _here.depth = depth
        with _lock:
            open_sections -= 1


def active():
    return open_sections > 0 and getattr(_here, "depth", 0) > 0


def refuse(what):
    """Raise InvalidUsageError where this thread runs on the master only and
    the job has other ranks: `what`, a collective, would wait for them."""
    if active() and core.get_size() > 1:
        raise InvalidUsageError(
            f"{what} is a collective, called in a callback that runs on the master rank only "
            "(run_on_all_ranks=False): the other ranks never call it, so it would wait for them "
            "until TNT_TIMEOUT_S. Run the callback on every rank (run_on_all_ranks=True), where "
            "the collective gives every rank the same result, or keep the collective out of it")
