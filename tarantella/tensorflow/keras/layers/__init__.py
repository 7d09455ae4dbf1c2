"""Keras layers of tarantella.tensorflow (`tnt.keras.layers`)."""
from tarantella.tensorflow.keras.layers.split_layer import SplitLayer
from tarantella.tensorflow.keras.layers.sync_batch_normalization import (
    SyncBatchNormalization, synchronize_batch_normalization)

__all__ = ["SplitLayer", "SyncBatchNormalization", "synchronize_batch_normalization"]
