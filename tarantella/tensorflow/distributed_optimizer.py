"""DistributedOptimizer: averages gradients across ranks inside `apply`.

`apply` is the single funnel of Keras 3 optimizers: `apply_gradients`, the
default `train_step`, custom `train_step`s and custom loops all go through it.
Reducing at its start means gradient clipping, weight decay and loss scaling
see the averaged gradient, exactly as in serial training.

The optimizer is not copied: its class is swapped in place to a dynamic
subclass with the same `__name__` and `__module__` (class_swap), so its state (slots,
iterations) stays where it is, `isinstance` checks still hold, and saved files
still say "Adam" (loading them needs no Tarantella).
"""
import hashlib
import sys
import threading

import keras
import tensorflow as tf

from tarantella.common import gone_arguments, request_names
from tarantella.common.thread_setting import set_in_thread
from tarantella.tensorflow import class_swap, collective_ops, step_context
from tarantella.tensorflow import compression as compression_lib

_recording = threading.local()  # see record_applies()
_reduced = threading.local()  # see _applying_reduced()


def _applying_reduced():
    """Mark the gradients handed on by a distributed optimizer's `apply` as
    reduced: a distributed optimizer it wraps (the inner optimizer of a
    LossScaleOptimizer, each distributed) applies them as they are, instead
    of averaging them a second time (twice the traffic, and not bitwise the
    serial gradient on 3 ranks)."""
    return set_in_thread(_reduced, "active", True, default=False)


def _caller_wrapping(optimizer):
    """The LossScaleOptimizer whose __init__ (our caller's caller) is making
    `optimizer` its inner optimizer, or None.

    Keras' LossScaleOptimizer skips a step when its *own* gradients are not
    finite, and calls the inner optimizer's `apply` only when they are: with
    a distributed inner optimizer, a rank whose local gradients overflowed
    skipped the allreduce the others made (a hang, or its next step's
    gradients summed with their previous ones). Keras' compile makes such a
    wrapper itself under mixed_float16, around the optimizer it is given."""
    wrapper = sys._getframe(2).f_locals.get("self")
    if isinstance(wrapper, keras.optimizers.LossScaleOptimizer) and \
            getattr(wrapper, "inner_optimizer", None) is optimizer:
        return wrapper
    return None


def _distribute_wrapper(optimizer, wrapper):
    """The loss scale must decide on the reduced gradients, alike on every
    rank (as when the LossScaleOptimizer itself is wrapped): distribute the
    wrapper too, with `optimizer`'s settings; `optimizer` then applies what
    the wrapper reduced as it is (_applying_reduced)."""
    if not is_distributed(wrapper):
        DistributedOptimizer(wrapper, name=optimizer._tnt_name, compression=optimizer._tnt_compression)
        set_gradient_weight(wrapper, optimizer._tnt_weight_fn)


@class_swap.once_per_class
def _distributed_class(base):
    @tf.autograph.experimental.do_not_convert  # as tensor_collectives.plain_python (no user code)
    def apply(self, grads, trainable_variables=None):
        if getattr(_reduced, "active", False):  # inside a distributed wrapper's apply
            return super(cls, self).apply(grads, trainable_variables)
        grads = list(grads)
        if trainable_variables is not None:
            grads = [_with_static_shape(g, v) for g, v in zip(grads, trainable_variables)]
        self._tnt_missing = [g is None for g in grads]
        calls = getattr(_recording, "calls", None)
        if calls is not None:  # the dense shape (an embedding's gradient is sparse)
            shapes = [g.shape if trainable_variables is None else v.shape
                      for g, v in zip(grads, trainable_variables or grads)]
            calls.append((self, trainable_variables, [
                None if g is None else (shape, g.dtype, isinstance(g, tf.IndexedSlices))
                for g, shape in zip(grads, shapes)]))
        weight, total = _weight_and_total(self)
        grads = collective_ops.weighted_average(
            list(grads), weight=weight, total=total,
            name=self._tnt_name or _default_name(trainable_variables, grads),
            compression=self._tnt_compression)
        self._tnt_float16 = _float16_flags(self, trainable_variables)
        try:
            with _applying_reduced():
                return super(cls, self).apply(grads, trainable_variables)
        finally:
            self._tnt_float16 = None

    def scale_loss(self, loss):
        return _fold_batch_share(self, super(cls, self).scale_loss(loss))

    def check_finite(self, grads):
        return _serial_finite(self, grads, super(cls, self).check_finite(grads))

    members = {"apply": apply, "scale_loss": scale_loss, "_tnt_distributed": True}
    if issubclass(base, keras.optimizers.LossScaleOptimizer):
        members["check_finite"] = check_finite
    else:
        def __setattr__(self, name, value):  # noqa: N807
            # LossScaleOptimizer.__init__ sets its inner optimizer's
            # loss_scale_factor: that is how it is told apart
            if name == "loss_scale_factor":
                wrapper = _caller_wrapping(self)
                if wrapper is not None:
                    _distribute_wrapper(self, wrapper)
            super(cls, self).__setattr__(name, value)

        members["__setattr__"] = __setattr__
    cls = class_swap.subclass(base, members)
    return cls


def _scales_loss(optimizer):
    """Whether `scale_loss` multiplies the loss (a LossScaleOptimizer under
    mixed precision, or a static `loss_scale_factor`)."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or \
        getattr(optimizer, "loss_scale_factor", None) is not None


def _fold_batch_share(optimizer, scaled_loss):
    """Under loss scaling, a tnt.Model step backpropagates this rank's *share*
    of the global loss, (b_r / B) · loss_r, and the gradients are then summed.

    With the local mean loss_r (and b_r-weighted averaging afterwards) every
    intermediate float16 gradient of the backward pass would be B / b_r times
    its serial value, and overflow where serial training's does not: the loss
    scale would skip steps that serial training takes. With the share, each
    sample's backward pass carries the same values as in serial training, and
    the dynamic loss scale decides on the global gradient, on every rank alike.
    """
    context = step_context.current()
    if context is None or optimizer._tnt_weight_fn is None or not _scales_loss(optimizer):
        return scaled_loss
    share = context.local_batch / context.global_batch()
    context.values["gradients_are_shares"] = True
    return scaled_loss * tf.cast(share, scaled_loss.dtype)


def _float16_flags(optimizer, variables):
    """For each variable, whether serial training computes its gradient in
    float16 (read through a float16 autocast), or None when unknown."""
    float16_variables = getattr(optimizer, "_tnt_float16_variables", None)
    if float16_variables is None or variables is None:
        return None
    ids = {id(v) for v in float16_variables()}
    return [id(v) in ids for v in variables]


def _serial_finite(optimizer, grads, finite):
    """The loss scale's decision as serial training takes it, on the global
    gradient: besides a non-finite value, a gradient that serial training
    computes in float16 (the kernel of a mixed_float16 Dense, summed over the
    whole batch in one float16 matmul) overflows there when its global value
    exceeds float16's range, even though every rank's partial sum fits."""
    flags = getattr(optimizer, "_tnt_float16", None)
    if not flags:
        return finite
    # An IndexedSlices gradient (a lookup) has no sum over the batch: its
    # slices are serial training's own, and the inherited check sees them.
    in_range = [tf.reduce_all(tf.math.is_finite(tf.cast(g, tf.float16)))
                for g, flag in zip(grads, flags)
                if flag and g is not None and not isinstance(g, tf.IndexedSlices)]
    if not in_range:
        return finite
    return tf.logical_and(tf.cast(finite, tf.bool), tf.reduce_all(tf.stack(in_range)))


def set_float16_variables(optimizer, variables_fn):
    """Tell the loss scale which variables' gradients serial training
    computes in float16 (`variables_fn()` lists them, when apply is traced)."""
    optimizer._tnt_float16_variables = variables_fn


def _weight_and_total(optimizer):
    """(this rank's weight, Σ_r weights or None) for the gradient reduction."""
    weight = optimizer._tnt_weight_fn() if optimizer._tnt_weight_fn else None
    context = step_context.current()
    if context is None or weight is None:
        return weight, None
    if context.values.get("gradients_are_shares"):
        return 1.0, 1.0  # the gradients are shares of the global one: their sum
    if context.knows_sizes():
        return weight, context.global_batch()  # no need to sum the weights again
    return weight, None


def _with_static_shape(grad, variable):
    """A dense gradient whose static shape is less known than its variable's
    (after a custom gradient or a dynamic reshape, e.g. with a synchronised
    BatchNormalization) with the variable's: the request names, buckets and
    packs are derived from static shapes, and the empty-slice branch of a
    tnt.Model step, which applies zeros of the variables' shapes, must derive
    the same ones, or the ranks wait for requests the others never make."""
    if isinstance(grad, tf.IndexedSlices):  # its dense shape names the request
        if grad.shape.is_fully_defined():
            return grad
        return tf.IndexedSlices(grad.values, grad.indices,
                                tf.constant(tf.TensorShape(variable.shape).as_list(),
                                            grad.dense_shape.dtype))
    if not isinstance(grad, tf.Tensor) or grad.shape.is_fully_defined():
        return grad
    return tf.ensure_shape(grad, variable.shape)


def zero_gradient(shape, dtype, sparse=False):
    """What a rank whose slice of the batch is empty applies in place of a
    gradient of `shape` and `dtype`: zeros, or, for an IndexedSlices gradient
    (an embedding's), no slices, so that it takes part in the same gather."""
    if not sparse:
        return tf.zeros(shape, dtype)
    shape = tf.TensorShape(shape).as_list()
    return tf.IndexedSlices(tf.zeros([0] + shape[1:], dtype), tf.zeros([0], tf.int64),
                            tf.constant(shape, tf.int64))


def _default_name(variables, grads):
    """A request name that every rank derives alike from what is reduced (the
    shapes and dtypes of the gradients), never from a per-process counter: a
    rank that created or loaded an optimizer the others did not (loading a
    checkpoint on the master only) still names its requests like the rest."""
    described = ";".join(f"{g.dtype.name}{g.shape}" for g in grads if g is not None)
    return request_names.in_thread(f"tnt.grads.{hashlib.sha1(described.encode()).hexdigest()[:10]}")


def _check_supported(optimizer):
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "DistributedOptimizer expects a Keras 3 optimizer instance (e.g. "
            f"keras.optimizers.Adam()). Received: optimizer={optimizer!r} (of type "
            f"{type(optimizer).__name__})")
    # Every Keras 3 optimizer's update is a function of the gradient it is given
    # (Ftrl's accumulators too: n += g*g of that gradient), so the averaged
    # gradient gives the serial update; none is refused. (The original
    # Tarantella refused Ftrl; Keras 3's Ftrl trains as in serial Keras.)


def DistributedOptimizer(optimizer, name=None, compression=compression_lib.Compression.none,  # noqa: N802 - as Horovod
                         **original):
    """Make `optimizer` average its gradients across all ranks before applying them.

    The optimizer is modified in place and returned. Use it in a custom
    training loop (gradients from every rank are averaged with equal weight),
    or compile a plain `keras.Model` with it and feed each rank its own shard
    of the data. `tnt.Model.compile` does this for you, and also weights each
    rank by its micro-batch size so that uneven batches give exactly the
    serial mean gradient.

    Args:
        optimizer: A `keras.optimizers.Optimizer` instance.
        name: Optional string naming this optimizer's requests across ranks;
            by default the name is derived from the shapes and dtypes of the
            gradients (the same on every rank, whatever else a rank created).
        compression: `tnt.Compression.none` (the default: exact),
            `tnt.Compression.fp16` or `tnt.Compression.bf16` (float32
            gradients travel as 16-bit floats: half the bytes, rounded; see
            docs/keras.md, "Gradient compression"). Every rank must choose
            the same.

    Example:

    ```python
    optimizer = tnt.DistributedOptimizer(keras.optimizers.Adam(1e-3))
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    ```
    """
    gone_arguments.refuse("tnt.DistributedOptimizer", original, gone_arguments.GROUP)  # its group=
    _check_supported(optimizer)
    compressor = compression_lib.resolve(compression)
    if getattr(type(optimizer), "_tnt_distributed", False):
        return optimizer
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._tnt_name = name
    optimizer._tnt_weight_fn = None
    optimizer._tnt_compression = compressor
    return optimizer


def set_compression(optimizer, compressor):
    """Send this distributed optimizer's gradients compressed by `compressor`
    (a class of tnt.Compression)."""
    optimizer._tnt_compression = compression_lib.resolve(compressor)


def set_gradient_weight(optimizer, weight_fn):
    """Weight this rank's gradients by `weight_fn()` (a scalar tensor, read
    inside `apply`), instead of equally."""
    optimizer._tnt_weight_fn = weight_fn


def record_applies():
    """A list that collects, for every apply() of a distributed optimizer
    called inside the block (on this thread), (optimizer, trainable_variables,
    [(shape, dtype) of each gradient, or None]): what a rank that skips the
    step must still submit, in the same order."""
    return set_in_thread(_recording, "calls", [])


def recorded_applies():
    """How many applies record_applies() has collected so far on this thread (0 outside it)."""
    return len(getattr(_recording, "calls", None) or ())


def missing_gradients(optimizer):
    """For each variable of the last traced `apply`, whether its gradient was None."""
    return getattr(optimizer, "_tnt_missing", None)


def is_distributed(optimizer):
    return getattr(type(optimizer), "_tnt_distributed", False)
