"""Keras-facing helpers of tarantella.tensorflow (`tnt.keras.callbacks`, `tnt.keras.layers`)."""
from tarantella.tensorflow.keras import callbacks, layers

__all__ = ["callbacks", "layers"]

# the original Tarantella's pipelining internals (ZeroLoss, ZeroMetric): named, not Python's bare
# "has no attribute", which said nothing of why
_PIPELINING = "internals of the original's pipelining, which is not available yet (docs/migration.md)"


# the original's tnt.keras.models (the module of tnt.models), tnt.keras.model (of tnt.Model) and
# tnt.keras.sequential (of tnt.Sequential): its tarantella/__init__ imported them, so scripts
# could reach them here
_ORIGINAL_MODULES = {"models": "tarantella.tensorflow.models",
                     "model": "tarantella.tensorflow.model",
                     "sequential": "tarantella.tensorflow.model"}


def __getattr__(name):
    if name in _ORIGINAL_MODULES:
        import importlib

        return importlib.import_module(_ORIGINAL_MODULES[name])
    if name in ("losses", "metrics"):
        raise AttributeError(f"tnt.keras.{name} of the original Tarantella is not available: {_PIPELINING}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
