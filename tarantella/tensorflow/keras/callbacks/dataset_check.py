"""The check, during a data-parallel `fit`, that every rank reads the same
batches from its datasets (tarantella.tensorflow.data.first_batches).

It compares the first global batch of each pass over the training and
validation datasets: once the first step has used the training dataset's
(at the second step's start, before a mixture of the ranks' samples goes
further), and at the end of every epoch, after validation. Two small
allgathers each time. tnt.Model.fit appends it after the user's callbacks.
Only `on_train_batch_begin` and `on_epoch_end`: a batch-end hook would keep
Keras from dispatching the batch callbacks asynchronously.
"""
import keras

from tarantella.tensorflow.data import first_batches


class DatasetCheck(keras.callbacks.Callback):
    """Raises tnt.MismatchError on every rank once the ranks' datasets are
    seen to yield different batches."""

    def __init__(self, stores):
        super().__init__()
        self._stores = stores  # FirstBatches (or None) of x and validation_data
        self._batches_begun = 0

    def _check(self, when):
        first_batches.check(f"the ranks read different data {when} of fit", self._stores)

    def on_train_batch_begin(self, batch, logs=None):
        self._batches_begun += 1
        if self._batches_begun == 2:  # the first step has used the first batch
            self._check("in the first step")

    def on_epoch_end(self, epoch, logs=None):
        self._check(f"in epoch {epoch + 1}")
