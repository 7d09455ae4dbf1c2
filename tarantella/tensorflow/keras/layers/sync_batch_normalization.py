"""Batch normalisation over the global batch: the statistics of all ranks' samples."""
import keras
import tensorflow as tf

from tarantella.common import core
from tarantella.tensorflow import class_swap, step_context, tensor_collectives


def _gradient_weight(context):
    """The weight w_r this rank's gradients get when they are combined across
    ranks (Σ_r w_r g_r): b_r / B in a tnt.Model step, 1 when the step
    backpropagates shares of the global loss (loss scaling), 1/N elsewhere
    (DistributedOptimizer's equal weights)."""
    if context is None:
        return tf.constant(1.0 / core.get_size(), tf.float64)
    if context.values.get("gradients_are_shares"):
        return tf.constant(1.0, tf.float64)
    return tf.math.divide_no_nan(context.local_batch, context.global_batch())


def _moments_from_sums(summed, channels):
    """(count, mean, variance) in float64 from the summed [n, n m, n (v + m^2)]."""
    total = summed[:channels]
    mean = tf.math.divide_no_nan(summed[channels:2 * channels], total)
    var = tf.maximum(tf.math.divide_no_nan(summed[2 * channels:], total) - tf.square(mean), 0.0)
    return total, mean, var


def global_moments(inputs, axes, mask=None, on_replay=None):
    """Mean and variance of `inputs` over `axes` and over every rank's samples
    (float32 in, float32 out), differentiable.

    Each rank computes its count n_r, mean m_r and variance v_r in float32 (as
    tf.nn.moments), then one float64 allreduce sums [n_r, n_r m_r,
    n_r (v_r + m_r^2)]: mean = Σ n_r m_r / n, variance = Σ n_r (v_r + m_r^2) / n
    - mean^2, without the cancellation a float32 E[x^2] - E[x]^2 would have.
    The backward pass sums the ranks' gradients with respect to the (shared)
    mean and variance, weighted as the parameter gradients are, so that each
    sample's gradient is the one serial training gives it. A rank whose
    slice is empty does not run the layer: `on_replay(mean, variance)` is
    then called with the global moments (float32), for the moving statistics.
    """
    context = step_context.current()
    channels = inputs.shape[-1]
    if mask is None:
        weights = tf.ones_like(inputs)
    else:
        weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), inputs.dtype), tf.shape(inputs))
    if tensor_collectives.stand_in_active():
        # predict's stand-in sample of an empty slice (training=True in predict): it counted as
        # one sample of zeros, and the other ranks normalised the last batch with its moments
        weights = tf.zeros_like(weights)

    def replayed(summed):  # the empty branch: the same global moments
        if on_replay is not None:
            _, mean, var = _moments_from_sums(summed, channels)
            on_replay(tf.cast(mean, inputs.dtype), tf.cast(var, inputs.dtype))

    @tf.custom_gradient
    def moments(x):
        count = tf.reduce_sum(weights, axis=axes)
        local_mean = tf.math.divide_no_nan(tf.reduce_sum(weights * x, axis=axes), count)
        centred = weights * tf.square(x - local_mean)
        local_var = tf.math.divide_no_nan(tf.reduce_sum(centred, axis=axes), count)
        n, m, v = (tf.cast(t, tf.float64) for t in (count, local_mean, local_var))
        stats = tf.concat([n, n * m, n * (v + tf.square(m))], 0)
        summed = _sum(context, stats, "batch_norm", replayed)
        total, mean, var = _moments_from_sums(summed, channels)
        mean32, var32 = tf.cast(mean, x.dtype), tf.cast(var, x.dtype)

        def grad(grad_mean, grad_var):
            weight = _gradient_weight(step_context.current())
            upstream = tf.concat([tf.cast(grad_mean, tf.float64), tf.cast(grad_var, tf.float64)], 0)
            upstream = tf.math.divide_no_nan(_sum(step_context.current(), weight * upstream,
                                                  "batch_norm_grad"), weight)
            per_count = tf.math.divide_no_nan(upstream, tf.concat([total, total], 0))
            d_mean, d_var = tf.cast(per_count[:channels], x.dtype), tf.cast(per_count[channels:],
                                                                           x.dtype)
            return weights * (d_mean + 2.0 * d_var * (x - mean32))

        return (mean32, var32), grad

    # one count per channel keeps the request's layout the same for any mask
    return moments(inputs)


def _sum(context, values, purpose, on_replay=None):
    if context is not None:
        return context.sum_with_sizes(values, purpose, on_replay)
    return step_context.allreduce_sum(values, purpose)


def _update_moving_statistics(layer, mean, variance):
    """What `BatchNormalization.call` does with the batch moments in training
    (renorm too), for a rank whose slice is empty: every rank's moving
    statistics then stay the same (the serial ones)."""
    if layer.renorm:
        layer._update_renorm_statistics(mean, variance)
        return
    moving_mean = tf.cast(layer.moving_mean, mean.dtype)
    moving_variance = tf.cast(layer.moving_variance, mean.dtype)
    layer.moving_mean.assign(moving_mean * layer.momentum + mean * (1.0 - layer.momentum))
    layer.moving_variance.assign(
        moving_variance * layer.momentum + variance * (1.0 - layer.momentum))


def sync_moments(layer, inputs, mask):
    """`BatchNormalization._moments` over the global batch (see global_moments)."""
    axes = [a for a in range(len(inputs.shape)) if a != layer.axis % len(inputs.shape)]
    if layer.axis % len(inputs.shape) != len(inputs.shape) - 1:
        perm = axes + [layer.axis % len(inputs.shape)]
        inputs = tf.transpose(inputs, perm)
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization with a mask needs axis=-1")
        axes = list(range(len(inputs.shape) - 1))
    return global_moments(inputs, axes, mask,
                          on_replay=lambda m, v: _update_moving_statistics(layer, m, v))


@keras.saving.register_keras_serializable(package="tarantella")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` whose training statistics are those of
    the global batch, over all ranks (Horovod's `SyncBatchNormalization`).

    It is `BatchNormalization(synchronized=True)`: in a `tnt.Model`, every
    `BatchNormalization` layer created with `synchronized=True` is synchronised
    across ranks the same way, and `synchronize_batch_normalization(model)`
    switches every BatchNormalization layer of an existing model. On one rank,
    or outside training, it is exactly BatchNormalization.

    Each training step then costs two small allreduces per layer (the
    statistics in the forward pass, their gradients in the backward pass); in
    exchange the model trains as serial Keras does with the global batch, and
    every rank keeps the same moving statistics.

    Example:

    ```python
    x = keras.layers.Conv2D(32, 3)(x)
    x = tnt.keras.layers.SyncBatchNormalization()(x)
    ```
    """

    def __init__(self, *args, synchronized=True, **kwargs):
        super().__init__(*args, synchronized=synchronized, **kwargs)

    def _moments(self, inputs, mask):
        if self.synchronized and core.get_size() > 1:
            return sync_moments(self, inputs, mask)
        return super()._moments(inputs, mask)


@class_swap.once_per_class
def synchronized_class(base):
    """A subclass of the BatchNormalization class `base` (same name and
    module, so saved files stay plain Keras: class_swap) whose statistics are
    global when the layer is `synchronized`."""
    def _moments(self, inputs, mask):
        if self.synchronized and core.get_size() > 1:
            return sync_moments(self, inputs, mask)
        return super(cls, self)._moments(inputs, mask)

    cls = class_swap.subclass(base, {"_moments": _moments, "_tnt_synchronized": True})
    return cls


def synchronize_batch_normalization(model):
    """Make every BatchNormalization layer of `model` synchronised across ranks
    (`synchronized=True`), in place; returns `model`. Call it before
    `tnt.Model(model)` or before `compile`.

    Example:

    ```python
    model = tnt.Model(tnt.keras.layers.synchronize_batch_normalization(
        keras.applications.ResNet50(weights=None)))
    ```
    """
    for layer in model._flatten_layers(include_self=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = True
    return model
