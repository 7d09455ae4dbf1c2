"""A setting of the calling thread that holds for the length of a block.

The frontend marks what a thread is doing (tracing predict's step, running
the model on a stand-in sample, applying reduced gradients) in a
`threading.local`, read by code deeper down the same call. `set_in_thread`
is the one way to set such a mark: the old value comes back when the block
ends, raised or not, so that blocks nest and a failed call leaves no mark
behind for the thread's next one. Framework-neutral: no TensorFlow here."""
import contextlib


@contextlib.contextmanager
def set_in_thread(local, attr, value, default=None):
    """`local.<attr>` (`local` a threading.local) is `value` inside the block,
    in this thread only; after it, what it was before (`default` where it was
    never set). Yields `value`."""
    before = getattr(local, attr, default)
    setattr(local, attr, value)
    try:
        yield value
    finally:
        setattr(local, attr, before)
