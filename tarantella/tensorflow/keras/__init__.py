"""Keras-facing helpers of tarantella.tensorflow (`tnt.keras.callbacks`, `tnt.keras.layers`)."""
from tarantella.tensorflow.keras import callbacks, layers

__all__ = ["callbacks", "layers"]

# the original Tarantella's pipelining internals (ZeroLoss, ZeroMetric): named, not Python's bare
# "has no attribute", which said nothing of why
_PIPELINING = "internals of the original's pipelining, which is not available yet (docs/migration.md)"


def __getattr__(name):
    if name in ("losses", "metrics"):
        raise AttributeError(f"tnt.keras.{name} of the original Tarantella is not available: {_PIPELINING}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
