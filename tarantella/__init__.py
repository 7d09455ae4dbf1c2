"""Tarantella: data-parallel training for TensorFlow/Keras by changing one or two lines.

    import tarantella as tnt
    model = tnt.Model(keras_model)

`import tarantella` is cheap: it exposes the rank API and the NumPy collectives
of tarantella.common. The Keras frontend (Model, optimizers, models, keras, data,
ParallelStrategy, ...) is imported from tarantella.tensorflow on first access.
"""
from tarantella.common import *  # noqa: F401,F403 - the framework-neutral API
from tarantella.common import __all__ as _common_all

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
    raise AttributeError(f"module 'tarantella' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_FRONTEND))


__all__ = list(_common_all) + list(_FRONTEND)
