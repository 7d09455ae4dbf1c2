"""Compiled losses whose normaliser is global: the serial loss on N ranks.

A Keras loss is a sum over the batch divided by a normaliser: the number of
elements (`"sum_over_batch_size"`, the default), the number of unmasked
elements when the prediction carries a mask, the sum of the sample weights
(`"mean_with_sample_weight"`), or nothing (`"sum"`). On a rank the loss is
computed over the rank's micro-batch, so a normaliser that is not
proportional to the micro-batch size gives a biased gradient when the ranks'
results are averaged (a masked sequence loss, reduction="sum", ...).

tnt.Model keeps one invariant for the value a rank's `compute_loss` returns:
**the mean of the ranks' losses weighted by their micro-batch sizes b_r is the
serial loss of the global batch.** The gradient hook (b_r-weighted average),
the loss tracker (updated with sample weight b_r) and the per-output loss
metrics all rely on it. A plain batch mean satisfies it as it is. For any other
normaliser, the rank computes the weighted sum S_r of its elements and its
normaliser D_r the way Keras does, the normalisers are summed across ranks (one
small allreduce per step, with the global batch size B), and the rank returns

    loss_r = S_r / D * B / b_r        (D = Σ D_r;  "sum": loss_r = S_r * B / b_r)

so that Σ_r (b_r / B) loss_r = Σ_r S_r / D, the serial loss.

Per-output losses of a multi-output model (`cls_loss`, `val_reg_loss`) are
Mean metrics that Keras updates with each step's loss, one count per step
(so the epoch value is the mean of the steps' losses). Each rank updates them
with sample weight b_r / B: their global state is then the serial one.

This is done by swapping the class of the model's CompileLoss for a subclass
that computes each output's loss itself (from the loss object's `call`, like
`keras.losses.Loss.__call__`) and combines them; the structure handling of
CompileLoss (nested outputs, dicts, loss weights) stays Keras'.
"""
import keras
import tensorflow as tf
from keras.src.backend.common.masking import get_keras_mask
from keras.src.losses.loss import squeeze_or_expand_to_same_rank

from tarantella.common import core
from tarantella.common.logging import get_logger
from tarantella.tensorflow import class_swap, step_context

_MEANS = ("sum_over_batch_size", "mean")


class _Part:
    """One output's loss on this rank: `kind` "mean" (a local batch mean,
    `value`), "sum" (`total`, no normaliser) or "ratio" (`total` / global Σ `normaliser`)."""

    def __init__(self, kind, value=None, total=None, normaliser=None):
        self.kind, self.value, self.total, self.normaliser = kind, value, total, normaliser


def _plain_call(loss):
    return isinstance(loss, keras.losses.Loss) and type(loss).__call__ is keras.losses.Loss.__call__


def _parts(loss, y_true, y_pred, sample_weight):
    """This rank's part of `loss(y_true, y_pred, sample_weight)`: what
    `keras.losses.Loss.__call__` computes, stopped before the division by the
    (local) normaliser, unless the normaliser is proportional to the batch."""
    mask = get_keras_mask(y_pred)
    reduction = getattr(loss, "reduction", "sum_over_batch_size")
    plain = reduction in _MEANS + (None, "none") or (
        reduction == "mean_with_sample_weight" and sample_weight is None)
    if not _plain_call(loss):
        if reduction not in _MEANS or mask is not None:
            _warn_once(loss, f"its class overrides __call__, so its normaliser (reduction="
                       f"{reduction!r}, mask: {mask is not None}) is taken as proportional "
                       "to the batch")
        return _Part("mean", value=loss(y_true, y_pred, sample_weight))
    if plain and mask is None and reduction in _MEANS and _masks_its_values(loss, y_true, y_pred):
        plain = False  # e.g. ignore_class: the normaliser is the global count of unmasked values
    if plain and mask is None:
        if reduction in _MEANS:
            _check_per_sample(loss, y_true, y_pred)
        elif reduction in (None, "none"):
            _warn_once(loss, "reduction=None gives Keras one loss per sample, whose gradient is that of their "
                       "sum while the logs show their mean; Tarantella takes them for a batch mean, so the "
                       "gradients differ from serial Keras's by about a factor N on N ranks. Use "
                       "reduction=\"sum\" (or the default mean) for the serial result")
        return _Part("mean", value=loss(y_true, y_pred, sample_weight))
    dtype = loss.dtype
    with tf.name_scope(loss.name):
        convert = lambda x: keras.ops.convert_to_tensor(x, dtype=dtype)  # noqa: E731
        y_pred = tf.nest.map_structure(convert, y_pred)
        y_true = tf.nest.map_structure(convert, y_true)
        values = loss.call(y_true, y_pred)
        out_mask = get_keras_mask(values)
        if mask is not None and out_mask is not None:
            mask = mask & out_mask
        elif out_mask is not None:
            mask = out_mask
        values = keras.ops.convert_to_tensor(values, dtype=dtype)
        weight = None if sample_weight is None else convert(sample_weight)
        count = None
        if mask is not None:
            float_mask = tf.cast(mask, values.dtype)
            count = tf.reduce_sum(float_mask) * tf.cast(tf.size(values), values.dtype) / \
                tf.cast(tf.size(float_mask), values.dtype)
            if weight is not None:
                float_mask, weight = squeeze_or_expand_to_same_rank(float_mask, weight)
                weight = weight * float_mask
            else:
                weight = float_mask
        if weight is not None:
            weight = tf.cast(weight, values.dtype)
            values, weight = squeeze_or_expand_to_same_rank(values, weight)
            values = values * weight
        total = tf.reduce_sum(values)
        if reduction == "sum":
            return _Part("sum", total=total)
        if reduction == "mean_with_sample_weight":
            normaliser = tf.reduce_sum(weight) if weight is not None else tf.cast(
                tf.size(values), values.dtype)
        elif reduction in _MEANS:
            normaliser = count
        else:  # no reduction: Keras returns the unreduced values; so do we
            return _Part("mean", value=loss(y_true, y_pred, sample_weight))
        return _Part("ratio", total=total, normaliser=normaliser)


def _masks_its_values(loss, y_true, y_pred):
    """Whether `loss` puts a mask on its per-sample values itself (e.g.
    `SparseCategoricalCrossentropy(ignore_class=c)`, whose mask drops the
    entries of class c): Keras then divides by the number of unmasked values,
    which is not proportional to the batch. Traced for the mask only; the
    graph prunes the values."""
    convert = lambda x: keras.ops.convert_to_tensor(x, dtype=loss.dtype)  # noqa: E731
    values = loss.call(tf.nest.map_structure(convert, y_true), tf.nest.map_structure(convert, y_pred))
    return get_keras_mask(values) is not None


def _check_per_sample(loss, y_true, y_pred):
    """Warn (once per loss) where a loss function returns one value for the
    whole batch: Keras then divides by 1, and that value is whatever the
    function made of the batch. Tarantella takes it for the mean over the
    rank's slice, which is exact for a mean and N times too small for a sum,
    and cannot tell the two apart."""
    key = ("per-sample", type(loss).__name__, getattr(loss, "name", None))
    if key in _warned or not getattr(y_pred, "shape", None) or y_pred.shape.rank in (None, 0):
        return
    _warned.add(key)
    values = loss.call(y_true, y_pred)  # traced for its shape only; a graph prunes it
    if getattr(values, "shape", None) is not None and values.shape.rank == 0:
        get_logger().warning(
            f"tnt.Model: loss {getattr(loss, 'name', type(loss).__name__)} returns one value for the whole "
            "batch, not one per sample. Tarantella takes it for the mean over each rank's slice: exact if it "
            "is a mean, N times too small on N ranks if it is a sum. Return one value per sample (leave the "
            "reduction to Keras, or pass reduction=\"sum\" to a keras.losses.Loss) for the serial result.")


_warned = set()


def _warn_once(loss, why):
    key = type(loss).__name__
    if key not in _warned:
        _warned.add(key)
        get_logger().warning(f"tnt.Model: loss {key}: {why}.")


class _Recording:
    """Stands in for a loss function during CompileLoss.call: records this
    rank's part and returns a placeholder (the combined value is computed after)."""

    def __init__(self, index, loss, sink):
        self.index, self.loss, self.sink = index, loss, sink
        self.name = getattr(loss, "name", None)

    def __call__(self, y_true, y_pred, sample_weight=None):
        self.sink[self.index] = _parts(self.loss, y_true, y_pred, sample_weight)
        return tf.zeros([], getattr(self.loss, "dtype", None) or keras.backend.floatx())


class _Silent:
    """Stands in for a per-output loss metric during CompileLoss.call."""

    def update_state(self, *args, **kwargs):
        pass


def _combine(compile_loss, entries, metrics, sink, context):
    """The rank's total loss from the recorded parts (see the module docstring)."""
    b = context.local_batch
    kinds = [sink[i].kind for i in range(len(entries))]
    ratio = [i for i, kind in enumerate(kinds) if kind == "ratio"]
    normalisers = {}
    if ratio:
        summed = context.sum_with_sizes(
            tf.stack([tf.cast(sink[i].normaliser, tf.float64) for i in ratio]), "loss")
        normalisers = {i: summed[k] for k, i in enumerate(ratio)}
    batch = context.global_batch() if ratio or metrics or "sum" in kinds else None
    dtype = compile_loss.dtype
    values = []
    for i, entry in enumerate(entries):
        part = sink[i]
        if part.kind == "mean":
            value = part.value
        else:
            factor = batch / b if part.kind == "sum" else tf.math.divide_no_nan(
                batch, b * normalisers[i])
            value = part.total * tf.cast(factor, part.total.dtype)
        value = keras.ops.cast(value, dtype=dtype)
        if metrics:
            metrics[i].update_state(value, sample_weight=tf.cast(b / batch, metrics[i].dtype))
        if entry.loss_weights is not None:
            value = keras.ops.multiply(value, entry.loss_weights)
        values.append(value)
    return sum(values) if values else None


@class_swap.once_per_class
def _distributed_class(base):
    def call(self, y_true, y_pred, sample_weight=None):
        context = step_context.current()
        if context is None or core.get_size() == 1:
            return super(cls, self).call(y_true, y_pred, sample_weight)
        sink = {}
        self.__dict__["_tnt_sink"] = sink
        try:
            super(cls, self).call(y_true, y_pred, sample_weight)
        finally:
            del self.__dict__["_tnt_sink"]
        entries = self.__dict__["_flat_losses"]
        return _combine(self, entries, list(self.__dict__["_metrics"]), sink, context)

    def flat_losses(self):
        entries = self.__dict__.get("_flat_losses")
        sink = self.__dict__.get("_tnt_sink")
        if sink is None or entries is None or not self.built:  # build() appends to it
            return entries
        return [entry._replace(loss=_Recording(i, entry.loss, sink))
                for i, entry in enumerate(entries)]

    def set_flat_losses(self, value):
        self.__dict__["_flat_losses"] = value

    def metrics(self):
        real = self.__dict__["_metrics"]
        if self.__dict__.get("_tnt_sink") is not None:
            return [_Silent() for _ in real]
        return real

    cls = class_swap.subclass(base, {
        "call": call, "_flat_losses": property(flat_losses, set_flat_losses),
        "metrics": property(metrics), "_tnt_global": True})
    return cls


def distribute(compile_loss):
    """Make a model's compiled loss (`model._compile_loss`, a Keras CompileLoss)
    compute the serial loss on every rank, in place. No-op for None."""
    if compile_loss is None or getattr(type(compile_loss), "_tnt_global", False):
        return compile_loss
    compile_loss.__class__ = _distributed_class(type(compile_loss))
    return compile_loss
