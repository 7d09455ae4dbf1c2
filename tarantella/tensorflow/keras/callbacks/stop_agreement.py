"""The ranks leave a data-parallel loop together: a callback that sets
`model.stop_training` (or `stop_evaluating`, `stop_predicting`) on some ranks
only stops every rank after the same batch.

Keras breaks out of its loop right after the batch's callbacks. Alone, the
rank whose callback stopped would go on to the end of the epoch while the
others wait in the next step's gradient allreduce, until TNT_TIMEOUT_S.
Callbacks that decide from the global logs (TerminateOnNaN, EarlyStopping)
decide alike on every rank; one that reads `tnt.get_rank()`, a file, the
clock or random numbers may not. Every rank then stops with the first that
asked, as one job, and the master says which ranks asked.

tnt.Model appends it after the user's callbacks, so that it sees what they
did in the same batch (to predict only where predict is distributed: an
undistributed one has no steps to agree on). It costs one 4-byte allgather per batch (2-10 us on
one host); being a batch-end hook, it keeps Keras from running the batch
callbacks in a thread of their own, which only the ranks without a progress
bar did.
"""
import keras
import numpy as np

from tarantella.common import collectives
from tarantella.common.logging import get_logger

_WHAT = {"stop_training": "fit", "stop_evaluating": "evaluate", "stop_predicting": "predict"}


class StopAgreement(keras.callbacks.Callback):
    """After each batch (and each epoch of fit), every rank's flag becomes
    the OR of all ranks' flags."""

    def _agree(self, flag, when):
        mine = bool(getattr(self.model, flag, False))
        asked = collectives.allgather(np.array([mine], np.int32), name=f"tnt.{flag}")
        if asked.any() and not asked.all():
            ranks = np.flatnonzero(asked).tolist()
            get_logger().warning(
                f"{_WHAT[flag]} stops on every rank {when}: rank(s) {ranks} set "
                f"model.{flag} there and the others did not (a callback that decided on some "
                "ranks only). Every rank stops with them, as one job must.")
        if asked.any() and not mine:
            setattr(self.model, flag, True)

    def on_train_batch_end(self, batch, logs=None):
        self._agree("stop_training", f"after batch {batch}")

    def on_epoch_end(self, epoch, logs=None):
        self._agree("stop_training", f"after epoch {epoch + 1}")

    def on_test_batch_end(self, batch, logs=None):
        self._agree("stop_evaluating", f"after batch {batch}")

    def on_predict_batch_end(self, batch, logs=None):
        self._agree("stop_predicting", f"after batch {batch}")
