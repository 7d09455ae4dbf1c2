"""Dropout in tnt.Model: the serial mask of the global batch, sliced.

Keras' Dropout draws its mask with a stateless random op, seeded by the
layer's SeedGenerator, for the shape of the batch it sees. On a rank that is
the micro-batch, so each rank would draw a mask unrelated to the one serial
training draws for the global batch (measured: 2 epochs of an MLP with
Dropout(0.3), 2 ranks, weights 10-40 % apart). In a tnt.Model step, a Dropout
layer instead draws the uniform noise for the *global* batch (shape [B, ...],
the same seed) and keeps the rows of this rank's slice: the masks are exactly
serial training's. The seed generators' states are broadcast from the master
with the weights, and a rank with an empty micro-batch still advances them.
The cost: every rank generates the noise of the whole global batch.
"""
import threading

import keras
import tensorflow as tf
from keras.src.backend.tensorflow.random import _cast_seed, _get_concrete_noise_shape
from keras.src.random.seed_generator import draw_seed
from tensorflow.python.ops import nn_ops, stateless_random_ops

from tarantella.common import core
from tarantella.tensorflow import step_context

_classes = {}
_lock = threading.Lock()


def _noise_shape(layer, inputs):
    get = getattr(layer, "_get_noise_shape", None)  # the SpatialDropout layers
    return get(inputs) if get is not None else layer.noise_shape


def exact_dropout(layer, inputs, context):
    """`keras.backend.random.dropout(inputs, layer.rate, noise_shape, seed)`
    whose noise is the global batch's, sliced to this rank's samples."""
    rate = layer.rate
    if rate == 1.0:
        return tf.zeros_like(inputs)
    generator = layer.seed_generator
    seed = _cast_seed(draw_seed(generator))
    context.on_replay(generator.next)
    noise_shape = _noise_shape(layer, inputs)
    first = None if noise_shape is None else noise_shape[0]
    local = tf.cast(tf.stack(_get_concrete_noise_shape(inputs, noise_shape)), tf.int32)
    if isinstance(first, int) and first == 1:  # one mask for every sample
        sampler = stateless_random_ops.stateless_random_uniform
    else:
        total = tf.cast(context.global_batch(), tf.int32)
        offset = tf.cast(context.offset(), tf.int32)
        size = tf.shape(inputs)[0]

        def sampler(shape, dtype, seed):
            full = stateless_random_ops.stateless_random_uniform(
                tf.concat([[total], local[1:]], 0), seed=seed, dtype=dtype)
            return full[offset:offset + size]

    return nn_ops._dropout(x=inputs, rate=rate, noise_shape=local,
                           uniform_sampler=lambda shape, dtype: sampler(shape, dtype, seed=seed),
                           dummy_rng_step=lambda: None, name=None,
                           default_name="stateless_dropout")


def _exact_class(base):
    with _lock:
        if base not in _classes:
            def call(self, inputs, training=False):
                context = step_context.current()
                if context is None or not training or self.rate <= 0:
                    return super(cls, self).call(inputs, training=training)
                return exact_dropout(self, inputs, context)

            cls = type(base.__name__, (base,), {
                "call": call, "__module__": base.__module__, "__qualname__": base.__qualname__,
                "_tnt_exact": True})
            _classes[base] = cls
        return _classes[base]


def _dropout_layers(model):
    """The model's Dropout layers (and SpatialDropout) that draw their mask
    the way Keras' Dropout does (a subclass with its own call() is left alone)."""
    from keras.src.layers.regularization.spatial_dropout import BaseSpatialDropout

    calls = (keras.layers.Dropout.call, BaseSpatialDropout.call)
    out = []
    for layer in model._flatten_layers(include_self=True):
        # Dropout(0) makes no seed generator: it never draws a mask
        if isinstance(layer, keras.layers.Dropout) and hasattr(layer, "seed_generator"):
            base = type(layer).__mro__[1] if getattr(type(layer), "_tnt_exact", False) else \
                type(layer)
            if base.call in calls:
                out.append(layer)
    return out


def prepare(model):
    """Make the model's Dropout layers draw the serial masks (in place)."""
    if core.get_size() == 1:
        return
    for layer in _dropout_layers(model):
        if not getattr(type(layer), "_tnt_exact", False):
            layer.__class__ = _exact_class(type(layer))


def seed_states(model):
    """The state variables of the Dropout layers' seed generators."""
    return [layer.seed_generator.state for layer in _dropout_layers(model)]
