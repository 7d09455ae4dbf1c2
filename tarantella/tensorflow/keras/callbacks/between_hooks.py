"""Keras's own work between the callback hooks of a data-parallel fit,
evaluate or predict counts as the rank's own work (tarantella.common.busy):
while a rank is there, the others waiting for it in a collective wait as for a
save, and TNT_TIMEOUT_S counts from when it leaves.

Why: between the hooks Keras makes and drops tf.data iterators (a new one at
every epoch, the validation one before `on_train_end`, the training one as
`fit` returns), and in TensorFlow 2.21 dropping one can take up to the
autotune period (it doubles with the iterator's age, up to 60 s): the
iterator's destructor joins the autotune thread, which sleeps out its timed
wait. Measured without Tarantella, `del iterator` after 30 s of use took 0.001
to 10.9 s. A rank stuck there while its peer waited in `tnt.barrier()` after
`fit` failed the job at TNT_TIMEOUT_S=10 s, with nothing wrong.

The steps (the collectives inside them) and the hooks themselves (the user's
callbacks, which may hang) are outside the section: one callback first in the
list ends it as every hook begins, one last in the list starts it again as
hooks end, except those a step follows (`on_*_batch_begin`). `between()`
ends it after Keras returns, when the last iterator is gone. The History and
progress bar that Keras appends after the list run inside it (they never
wait). A batch pays one section opened and closed: 1.6 us on 2 ranks here.

A loop that a callback ended early (`model.stop_training`) leaves Keras's
epoch iterator in a reference cycle (its suspended generator holds it), which
Python's garbage collector dropped later, wherever it ran next: in a step
while the others waited, where the drop was no work of the rank's own.
`between()` collects it while the section is still open.
"""
import contextlib
import gc

import keras

from tarantella.common import busy, core


class _Span:
    """The section between hooks, open or not."""

    def __init__(self):
        self._section = None

    def open(self):
        if self._section is None:
            self._section = busy.section()
            self._section.__enter__()

    def close(self):
        section, self._section = self._section, None
        if section is not None:
            section.__exit__(None, None, None)


class _AtHooks(keras.callbacks.Callback):
    """Opens or closes the span (`_act`) at the hooks a subclass names."""

    def __init__(self, span):
        super().__init__()
        self._span = span

    def _at_hook(self, *_, **__):
        self._act(self._span)


class _EndsAtEveryHook(_AtHooks):
    _act = staticmethod(_Span.close)
    on_train_begin = on_train_end = on_epoch_begin = on_epoch_end = _AtHooks._at_hook
    on_train_batch_begin = on_train_batch_end = _AtHooks._at_hook
    on_test_begin = on_test_end = on_test_batch_begin = on_test_batch_end = _AtHooks._at_hook
    on_predict_begin = on_predict_end = on_predict_batch_begin = on_predict_batch_end = _AtHooks._at_hook


class _StartsAfterHooks(_AtHooks):
    _act = staticmethod(_Span.open)
    # not after on_*_batch_begin: the step (and its collectives) follows
    on_train_begin = on_train_end = on_epoch_begin = on_epoch_end = _AtHooks._at_hook
    on_train_batch_end = on_test_begin = on_test_end = on_test_batch_end = _AtHooks._at_hook
    on_predict_begin = on_predict_end = on_predict_batch_end = _AtHooks._at_hook


@contextlib.contextmanager
def between(callbacks, model, stop_flags, distributed=True):
    """`with between(callbacks, self, ("stop_training",)) as callbacks: super().fit(...,
    callbacks=callbacks)`: the list with the two callbacks around it; the section ends
    on leaving, after the iterators of loops that `stop_flags` ended early are dropped."""
    if not distributed or core.get_size() == 1:
        yield callbacks  # nobody waits for this rank: no hooks to add
        return
    span = _Span()
    try:
        yield [_EndsAtEveryHook(span), *callbacks, _StartsAfterHooks(span)]
        if any(getattr(model, flag, False) for flag in stop_flags):
            gc.collect()  # in the section, which the last hook (on_*_end) opened
    finally:
        span.close()
