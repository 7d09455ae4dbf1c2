"""Keras-facing helpers of tarantella.tensorflow (`tnt.keras.callbacks`)."""
from tarantella.tensorflow.keras import callbacks

__all__ = ["callbacks"]
