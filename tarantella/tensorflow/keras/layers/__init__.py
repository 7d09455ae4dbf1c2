"""Keras layers of tarantella.tensorflow (`tnt.keras.layers`)."""
from tarantella.tensorflow.keras.layers.split_layer import SplitLayer
from tarantella.tensorflow.keras.layers.sync_batch_normalization import (
    SyncBatchNormalization, synchronize_batch_normalization)

__all__ = ["SplitLayer", "SyncBatchNormalization", "synchronize_batch_normalization"]


def __getattr__(name):
    if name.startswith(("Send", "Recv")):  # the original's pipeline-stage layers
        raise AttributeError(f"tnt.keras.layers.{name} of the original Tarantella is not available: internals of "
                             "its pipelining, which is not available yet (docs/migration.md)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
