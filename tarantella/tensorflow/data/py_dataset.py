"""A keras.utils.PyDataset given to tnt.Model: each rank feeds its slice of every global batch.

A PyDataset (Keras 3's Python data source, `keras.utils.Sequence` before it)
yields global batches by index, possibly from worker threads or processes
(`workers`, `use_multiprocessing`). tnt.Model gives Keras, on each rank, a
`RankSlices` in its place: a PyDataset of the same batches, in the same
order, whose batch i is this rank's rows of the user's batch i (the split
of batch_slicing.py, as for arrays and tf.data). Keras then runs it as it
runs the user's (its workers, its class_weight, its epoch hooks, which are
passed on to the user's dataset), and the gradients, losses and metrics
are those of the global batch. Every rank loads every whole batch: a
PyDataset cannot be asked for part of one.

The order of the batches: serial Keras' fit shuffles a PyDataset of known
length by default (`shuffle=True`), with Python's `random.shuffle` of the
batch indices at the start of each epoch. Left to Keras on every rank, each
rank would draw its own order from its own Python random state, and the
ranks would slice different batches in the same step: samples lost and
others taken twice, without a word. Here the master draws the order as
Keras does (so a seeded master draws serial Keras' order) at the start of
each epoch, after the user's own callbacks as in Keras, and every rank takes
it: `ShuffleEachEpoch` is the callback that does it, and Keras is told not
to shuffle.
"""
import random

import keras
import numpy as np

from tarantella.common import collectives, core
from tarantella.tensorflow.data import batch_slicing


def is_py_dataset(x):
    return isinstance(x, keras.utils.PyDataset)


class RankSlices(keras.utils.PyDataset):
    """This rank's rows of every batch of `dataset`, batch i being the
    user's batch order[i] (see the module's docstring)."""

    def __init__(self, dataset, rank, size, shuffles):
        super().__init__(workers=dataset.workers, use_multiprocessing=dataset.use_multiprocessing,
                         max_queue_size=dataset.max_queue_size)
        self.dataset, self.rank, self.size, self.shuffles = dataset, rank, size, shuffles
        self.order = None  # in order, until ShuffleEachEpoch draws one

    @property
    def num_batches(self):
        return self.dataset.num_batches

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        batch = self.dataset[index if self.order is None else int(self.order[index])]
        # what Keras' adapter takes (_standardize_batch): a tuple, a list or an array as x
        # alone, a dict; anything else reaches it unchanged, to be refused in its words
        if isinstance(batch, np.ndarray):
            batch = (batch,)
        elif isinstance(batch, list):
            batch = tuple(batch)
        elif not isinstance(batch, (tuple, dict)):
            return batch
        return batch_slicing.rank_slice(batch, self.rank, self.size)

    def on_epoch_begin(self):
        self.dataset.on_epoch_begin()

    def on_epoch_end(self):
        self.dataset.on_epoch_end()


class ShuffleEachEpoch(keras.callbacks.Callback):
    """At the start of each epoch, the master's `random.shuffle` of the batch
    indices (serial Keras' draw), taken by every rank's RankSlices."""

    def __init__(self, slices):
        super().__init__()
        self.slices = slices

    def on_epoch_begin(self, epoch, logs=None):
        indices = list(range(self.slices.num_batches))
        if core.is_master_rank():
            random.shuffle(indices)
        self.slices.order = collectives.broadcast(
            np.array(indices, np.int64), root=core.get_master_rank(), name="tnt.py_dataset.order")


def rank_slices(dataset, shuffle):
    """This rank's RankSlices of `dataset`; `shuffle`, fit's, says whether
    its batches are to be shuffled each epoch (Keras: where their number is
    known)."""
    return RankSlices(dataset, core.get_rank(), core.get_size(),
                      shuffles=bool(shuffle) and dataset.num_batches is not None)


def epoch_callbacks(x):
    """The callbacks fit must run for its input `x`: a ShuffleEachEpoch for
    RankSlices to be shuffled."""
    return [ShuffleEachEpoch(x)] if isinstance(x, RankSlices) and x.shuffles else []
