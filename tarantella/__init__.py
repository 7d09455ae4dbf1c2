"""Tarantella: data-parallel training for TensorFlow/Keras by changing one or two lines.

    import tarantella as tnt
    model = tnt.Model(keras_model)

`import tarantella` is cheap: it exposes the rank API and the NumPy collectives
of tarantella.common, and the Keras frontend (Model, optimizers, models, keras,
data, ParallelStrategy, ...) of tarantella.tensorflow, each imported on first
access (PEP 562): the launcher `tntrun` is in this package too and must start
the ranks without importing NumPy, the compiled core or TensorFlow.
"""
from tarantella.common.startup_log import mark as _mark

_mark("import tarantella")
from tarantella import common as _common  # noqa: E402 - installs the error file hook (see there)
from tarantella.common import __all__ as _common_all  # noqa: E402

__version__ = "0.1.0"

# names served by the TensorFlow frontend, imported lazily (PEP 562)
_FRONTEND = (
    "Model", "Sequential", "ParallelStrategy", "DistributedOptimizer", "DistributedGradientTape", "Compression",
    "optimizers",
    "models", "keras", "data", "broadcast_variables",
    # the original Tarantella's collectives classes (tensors back for tensors)
    "TensorAllreducer", "TensorBroadcaster", "TensorAllgatherer",
)


def __getattr__(name):
    if name in _FRONTEND:
        import tarantella.tensorflow as frontend

        return getattr(frontend, name)
    if name in _common_all:
        value = getattr(_common, name)
        globals()[name] = value  # later accesses are plain attribute reads
        return value
    raise AttributeError(f"module 'tarantella' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_common_all) | set(_FRONTEND))


__all__ = list(_common_all) + list(_FRONTEND)
