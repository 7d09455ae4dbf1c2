"""BatchNormalization in tnt.Model: synchronised layers, and identical ranks.

A BatchNormalization layer normalises with the statistics of the batch it
sees. On N ranks that is the rank's micro-batch unless the layer is
synchronised (`BatchNormalization(synchronized=True)`,
`tnt.keras.layers.SyncBatchNormalization`): then its statistics are those of
the global batch, as in serial training (keras/layers/sync_batch_normalization).

An unsynchronised layer trains on per-rank statistics (not the serial result:
tnt.Model says so once, at fit), and each rank would update its moving mean and
variance from its own micro-batches. So that every rank always holds the same
weights, those moving statistics are averaged over the ranks after every
training step, weighted by the micro-batch sizes: since they were identical
before the step, the result is the moving average of the global batch's mean
and of the mean of the ranks' variances.
"""
import keras
import tensorflow as tf

from tarantella.common import core
from tarantella.common.logging import get_logger
from tarantella.tensorflow import collective_ops
from tarantella.tensorflow.keras.layers import sync_batch_normalization


def _layers(model):
    return [layer for layer in model._flatten_layers(include_self=True)
            if isinstance(layer, keras.layers.BatchNormalization)]


def prepare(model):
    """Make the synchronised BatchNormalization layers of `model` compute
    global statistics (in place); True if any layer changed."""
    changed = False
    if core.get_size() == 1:
        return changed
    for layer in _layers(model):
        if layer.synchronized and not getattr(type(layer), "_tnt_synchronized", False) \
                and not isinstance(layer, sync_batch_normalization.SyncBatchNormalization):
            layer.__class__ = sync_batch_normalization.synchronized_class(type(layer))
            changed = True
    return changed


def unsynchronized(model):
    """The model's BatchNormalization layers whose statistics are per rank. Not
    a frozen one (`trainable = False`: transfer learning's pretrained base):
    Keras normalises with its moving statistics and never updates them, so it
    trains as in serial Keras, and averaging its identical statistics over the
    ranks would only round them anew every step."""
    return [layer for layer in _layers(model) if not layer.synchronized and layer.trainable]


def moving_statistics(layers):
    return [v for layer in layers for v in layer.non_trainable_variables
            if tf.as_dtype(v.dtype).is_floating]


def average_moving_statistics(variables, weight, step):
    """Assign to each variable its average over the ranks, weighted by
    `weight` (this rank's micro-batch size; 0 for an empty one), in the
    tnt.Model `step` (a StepContext). Collective."""
    if not variables:
        return
    total = step.global_batch() if step.knows_sizes() else None
    averaged = collective_ops.weighted_average([v.value for v in variables], weight=weight,
                                               name="tnt.batch_norm.moving", total=total)
    for variable, value in zip(variables, averaged):
        variable.assign(value)


def warn_unsynchronized(model, micro_batch_size):
    if core.get_size() == 1 or not unsynchronized(model):
        return
    size = "" if micro_batch_size is None else f" of {micro_batch_size} samples"
    get_logger().warning(
        f"The model has BatchNormalization layers that are not synchronised: each rank "
        f"normalises with the statistics of its own micro-batch{size}, so training differs "
        "from serial training (and depends on the number of ranks); their moving statistics "
        "are averaged over the ranks after every step. For the serial result, use "
        "BatchNormalization(synchronized=True), tnt.keras.layers.SyncBatchNormalization, or "
        "tnt.keras.layers.synchronize_batch_normalization(model).")
