"""Fail early, and say what to do, when TensorFlow is missing or too old."""
try:
    import tensorflow as _tf
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tarantella.tensorflow needs TensorFlow 2.16 or later with Keras 3: "
        "`pip install tensorflow` (or tensorflow-cpu, or your cluster's build), or "
        "`pip install tarantella[tensorflow]`.") from exc

_major, _minor = (int(p) for p in _tf.__version__.split(".")[:2])
if (_major, _minor) < (2, 16):  # pragma: no cover
    raise ImportError(
        f"tarantella.tensorflow needs TensorFlow 2.16 or later (with Keras 3). "
        f"Received: TensorFlow {_tf.__version__}")
