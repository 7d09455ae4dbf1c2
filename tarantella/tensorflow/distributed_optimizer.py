"""DistributedOptimizer: averages gradients across ranks inside `apply`.

`apply` is the single funnel of Keras 3 optimizers: `apply_gradients`, the
default `train_step`, custom `train_step`s and custom loops all go through it.
Reducing at its start means gradient clipping, weight decay and loss scaling
see the averaged gradient, exactly as in serial training.

The optimizer is not copied: its class is swapped in place to a dynamic
subclass with the same `__name__` and `__module__`, so its state (slots,
iterations) stays where it is, `isinstance` checks still hold, and saved files
still say "Adam" (loading them needs no Tarantella).
"""
import contextlib
import itertools
import threading

import keras

from tarantella.tensorflow import collective_ops

_classes = {}  # base class -> distributed subclass
_lock = threading.Lock()
_ids = itertools.count()
_recording = threading.local()  # see record_applies()


def _distributed_class(base):
    with _lock:
        if base not in _classes:
            def apply(self, grads, trainable_variables=None):
                grads = list(grads)
                self._tnt_missing = [g is None for g in grads]
                calls = getattr(_recording, "calls", None)
                if calls is not None:  # the dense shape (an embedding's gradient is sparse)
                    shapes = [g.shape if trainable_variables is None else v.shape
                              for g, v in zip(grads, trainable_variables or grads)]
                    calls.append((self, trainable_variables, [
                        None if g is None else (shape, g.dtype)
                        for g, shape in zip(grads, shapes)]))
                grads = collective_ops.weighted_average(
                    list(grads), weight=self._tnt_weight_fn() if self._tnt_weight_fn else None,
                    name=self._tnt_name)
                return super(cls, self).apply(grads, trainable_variables)

            cls = type(base.__name__, (base,), {
                "apply": apply, "__module__": base.__module__, "__qualname__": base.__qualname__,
                "_tnt_distributed": True,
            })
            _classes[base] = cls
        return _classes[base]


def _check_supported(optimizer):
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "DistributedOptimizer expects a Keras 3 optimizer instance (e.g. "
            f"keras.optimizers.Adam()). Received: optimizer={optimizer!r} (of type "
            f"{type(optimizer).__name__})")
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    if isinstance(inner, keras.optimizers.Ftrl):
        raise ValueError(
            "Tarantella does not support the Ftrl optimizer: its per-coordinate accumulators are "
            "not a function of the batch-mean gradient, so data-parallel Ftrl cannot match serial "
            "training. Use another optimizer. Received: optimizer=Ftrl")


def DistributedOptimizer(optimizer, name=None):  # noqa: N802 - a class-like factory, as in Horovod
    """Make `optimizer` average its gradients across all ranks before applying them.

    The optimizer is modified in place and returned. Use it in a custom
    training loop (gradients from every rank are averaged with equal weight),
    or compile a plain `keras.Model` with it and feed each rank its own shard
    of the data. `tnt.Model.compile` does this for you, and also weights each
    rank by its micro-batch size so that uneven batches give exactly the
    serial mean gradient.

    Args:
        optimizer: A `keras.optimizers.Optimizer` instance (not Ftrl).
        name: Optional string naming this optimizer's requests across ranks;
            by default optimizers are numbered in creation order, which
            matches across ranks when every rank wraps them in the same order.

    Example:

    ```python
    optimizer = tnt.DistributedOptimizer(keras.optimizers.Adam(1e-3))
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    ```
    """
    _check_supported(optimizer)
    if getattr(type(optimizer), "_tnt_distributed", False):
        return optimizer
    optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._tnt_name = name or f"tnt.grads.{next(_ids)}"
    optimizer._tnt_weight_fn = None
    return optimizer


def set_gradient_weight(optimizer, weight_fn):
    """Weight this rank's gradients by `weight_fn()` (a scalar tensor, read
    inside `apply`), instead of equally."""
    optimizer._tnt_weight_fn = weight_fn


@contextlib.contextmanager
def record_applies():
    """A list that collects, for every apply() of a distributed optimizer
    called inside the block (on this thread), (optimizer, trainable_variables,
    [(shape, dtype) of each gradient, or None]): what a rank that skips the
    step must still submit, in the same order."""
    previous = getattr(_recording, "calls", None)
    _recording.calls = calls = []
    try:
        yield calls
    finally:
        _recording.calls = previous


def missing_gradients(optimizer):
    """For each variable of the last traced `apply`, whether its gradient was None."""
    return getattr(optimizer, "_tnt_missing", None)


def is_distributed(optimizer):
    return getattr(type(optimizer), "_tnt_distributed", False)
