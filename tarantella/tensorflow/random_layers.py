"""Random layers in tnt.Model: the serial draws of the global batch, sliced.

Keras' Dropout, SpatialDropout1D/2D/3D, AlphaDropout, GaussianNoise and
GaussianDropout draw their noise with a stateless random op, seeded by the
layer's SeedGenerator, for the shape of the batch they see. On a rank that is
the micro-batch, so each rank would draw noise unrelated to what serial
training draws for the global batch (measured: 2 epochs of an MLP with
Dropout(0.3), 2 ranks, weights 10-40 % apart). In a tnt.Model step such a
layer instead draws the noise for the *global* batch (shape [B, ...], the same
seed, the same op) and keeps the rows of this rank's slice: the noise is
exactly serial training's. The seed generators' states are broadcast from the
master with the weights, and a rank with an empty micro-batch still advances
them. The cost: every rank generates the noise of the whole global batch.

Each kind of layer is one row of `_KINDS`: the Keras class, the Keras `call`s
whose draws it reproduces (a subclass with its own `call` is left alone: what
it draws is unknown), and the exact version of that call. The layer's class is
swapped in place (class_swap) for a subclass whose `call` runs the exact
version inside a tnt.Model step while training, and Keras' own `call`
everywhere else.
"""
import math
from typing import Callable, NamedTuple

import keras
import tensorflow as tf
from keras.src import ops
from keras.src.backend.tensorflow.random import _cast_seed, _get_concrete_noise_shape
from keras.src.layers.regularization.spatial_dropout import BaseSpatialDropout
from keras.src.random.seed_generator import draw_seed
from tensorflow.python.ops import nn_ops

from tarantella.common import core
from tarantella.tensorflow import class_swap, step_context


def _seed(layer, context):
    """The seed Keras' call would draw from the layer's generator; the empty
    branch (a rank without samples) advances the generator alike."""
    generator = layer.seed_generator
    context.on_replay(generator.next)
    return _cast_seed(draw_seed(generator))


def _global_rows(context, draw, shape, shared=False):
    """`draw(shape)` as serial Keras draws it for the global batch: `shape`
    (a 1-D int32 tensor whose first entry is this rank's micro-batch) with its
    first dimension B, cut to this rank's rows. `shared`: the noise has one
    row for every sample (a noise_shape whose first entry is 1), drawn as is."""
    if shared:
        return draw(shape)
    total = tf.cast(context.global_batch(), tf.int32)
    offset = tf.cast(context.offset(), tf.int32)
    mine = tf.cast(context.sizes()[core.get_rank()], tf.int32)

    def global_rows():
        full = draw(tf.concat([[total], shape[1:]], 0))
        return full[offset:offset + shape[0]]

    # A first dimension that is not this rank's micro-batch is not the batch (the layer
    # follows a transpose to time-major, say): rows cut from the global batch's noise along
    # it would overlap between ranks, or run past the end on some ranks only (a shape error
    # there, the others waiting). Such a layer draws per rank, as Keras' own call does.
    return tf.cond(tf.equal(shape[0], mine), global_rows, lambda: draw(shape))


def _noise_shape(layer, inputs):
    """The layer's noise_shape (None entries: the inputs'), as Keras' call
    takes it, and whether the user's noise_shape shares one row of noise
    between all samples (its first entry is 1). Only the user's noise_shape
    says so: the SpatialDropout layers' shape starts with the inputs' batch
    dimension, which is a static 1 on a rank whose micro-batch is 1 (eagerly,
    or a step traced for that shape), where serial Keras draws B rows."""
    declared = layer.noise_shape  # the SpatialDropout layers: None
    shared = declared is not None and declared[0] == 1
    get = getattr(layer, "_get_noise_shape", None)  # the SpatialDropout layers
    noise_shape = get(inputs) if get is not None else declared
    if noise_shape is not None and not shared:
        noise_shape = (None, *noise_shape[1:])  # the batch's: this rank's micro-batch
    return tf.cast(tf.stack(_get_concrete_noise_shape(inputs, noise_shape)), tf.int32), shared


def _uniform(seed, dtype):
    """keras.random.uniform(shape, seed=...) on the TensorFlow backend."""
    return lambda shape: tf.random.stateless_uniform(
        shape, minval=tf.cast(0.0, dtype), maxval=tf.cast(1.0, dtype), dtype=dtype, seed=seed)


def _normal(seed, mean, stddev, dtype):
    """keras.random.normal(shape, mean, stddev, dtype, seed) on the TensorFlow backend."""
    return lambda shape: tf.random.stateless_normal(
        shape=shape, mean=mean, stddev=stddev, dtype=dtype, seed=seed)


def _dropout(layer, inputs, context):
    """Dropout.call: `tf.nn.experimental.stateless_dropout(inputs, rate,
    noise_shape, seed)` (its uniform noise drawn for the global batch)."""
    if layer.rate == 1.0:  # Keras draws no seed then
        return tf.zeros_like(inputs)
    seed = _seed(layer, context)
    noise_shape, shared = _noise_shape(layer, inputs)

    def sampler(shape, dtype):  # called as uniform_sampler(shape=..., dtype=...)
        return _global_rows(context, _uniform(seed, dtype), shape, shared)

    return nn_ops._dropout(x=inputs, rate=layer.rate, noise_shape=noise_shape,
                           uniform_sampler=sampler, dummy_rng_step=lambda: None, name=None,
                           default_name="stateless_dropout")


def _alpha_dropout(layer, inputs, context):
    """AlphaDropout.call, its uniform noise drawn for the global batch."""
    seed = _seed(layer, context)
    shape, shared = _noise_shape(layer, inputs)
    noise = _global_rows(context, _uniform(seed, keras.config.floatx()), shape, shared)
    alpha = 1.6732632423543772848170429916717
    scale = 1.0507009873554804934193349852946
    alpha_p = -alpha * scale
    kept_idx = ops.cast(ops.greater_equal(noise, layer.rate), inputs.dtype)
    a = ((1 - layer.rate) * (1 + layer.rate * alpha_p**2)) ** -0.5
    b = -a * alpha_p * layer.rate
    x = inputs * kept_idx + alpha_p * (1 - kept_idx)
    return a * x + b


def _gaussian_noise(layer, inputs, context):
    """GaussianNoise.call: inputs + N(0, stddev) of the global batch, sliced."""
    draw = _normal(_seed(layer, context), 0.0, layer.stddev, layer.compute_dtype)
    return inputs + _global_rows(context, draw, tf.shape(inputs))


def _gaussian_dropout(layer, inputs, context):
    """GaussianDropout.call: inputs * N(1, sqrt(rate / (1 - rate))) of the
    global batch, sliced."""
    stddev = math.sqrt(layer.rate / (1.0 - layer.rate))
    draw = _normal(_seed(layer, context), 1.0, stddev, layer.compute_dtype)
    return inputs * _global_rows(context, draw, tf.shape(inputs))


class _Kind(NamedTuple):
    base: type  # the Keras layer class
    calls: tuple  # the Keras call()s that `exact` reproduces
    draws: Callable  # layer -> whether Keras' call draws noise when training
    exact: Callable  # (layer, inputs, context) -> the layer's output in a step


_KINDS = (
    _Kind(keras.layers.Dropout, (keras.layers.Dropout.call, BaseSpatialDropout.call),
          lambda layer: layer.rate > 0, _dropout),
    _Kind(keras.layers.AlphaDropout, (keras.layers.AlphaDropout.call,),
          lambda layer: layer.rate > 0, _alpha_dropout),
    _Kind(keras.layers.GaussianNoise, (keras.layers.GaussianNoise.call,),
          lambda layer: layer.stddev > 0, _gaussian_noise),
    _Kind(keras.layers.GaussianDropout, (keras.layers.GaussianDropout.call,),
          lambda layer: layer.rate > 0, _gaussian_dropout),
)


@class_swap.once_per_class
def _exact_class(base, kind):
    """`kind`: the one of _KINDS that `base` belongs to (_random_layers)."""
    def call(self, inputs, training=False):
        context = step_context.current()
        if context is None or not training or not kind.draws(self):
            return super(cls, self).call(inputs, training=training)
        return kind.exact(self, inputs, context)

    cls = class_swap.subclass(base, {"call": call, "_tnt_exact": True})
    return cls


def _original_class(layer):
    cls = type(layer)
    return cls.__mro__[1] if getattr(cls, "_tnt_exact", False) else cls


def _random_layers(model):
    """(layer, kind) for the model's layers whose draws a kind reproduces."""
    out = []
    for layer in model._flatten_layers(include_self=True):
        # a rate (stddev) of 0 makes no seed generator: the layer never draws
        if not hasattr(layer, "seed_generator"):
            continue
        base = _original_class(layer)
        for kind in _KINDS:
            if isinstance(layer, kind.base) and base.call in kind.calls:
                out.append((layer, kind))
                break
    return out


def prepare(model):
    """Make the model's random layers draw the serial noise (in place)."""
    if core.get_size() == 1:
        return
    for layer, kind in _random_layers(model):
        if not getattr(type(layer), "_tnt_exact", False):
            layer.__class__ = _exact_class(type(layer), kind)


def seed_states(model):
    """The state variables of the random layers' seed generators."""
    return [layer.seed_generator.state for layer, _ in _random_layers(model)]
