"""Whether this thread runs a callback on the master rank only
(`tnt.keras.callbacks.Callback(cb, run_on_all_ranks=False)`).

A save made there (`tnt.Model.save`, `save_weights`, `tnt.models.save_model`
of a tnt.Model or of a plain Keras model) skips its closing barrier: the other
ranks are not saving and would never join it. A thread of its own: Keras may
run batch callbacks in a worker thread."""
import contextlib
import threading

_here = threading.local()


@contextlib.contextmanager
def section():
    """The body of one master-only callback hook (they may nest)."""
    depth = getattr(_here, "depth", 0)
    _here.depth = depth + 1
    try:
        yield
    finally:
        _here.depth = depth


def active():
    return getattr(_here, "depth", 0) > 0
