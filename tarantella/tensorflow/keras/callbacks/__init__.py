"""Callbacks for tnt.Model: `Callback` chooses where a Keras callback runs and
which logs it sees."""
from tarantella.tensorflow.keras.callbacks.callback import Callback

__all__ = ["Callback"]
