"""Keras-facing helpers of tarantella.tensorflow (`tnt.keras.callbacks`, `tnt.keras.layers`)."""
from tarantella.tensorflow.keras import callbacks, layers

__all__ = ["callbacks", "layers"]
