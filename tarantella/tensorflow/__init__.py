"""The TensorFlow / Keras 3 frontend of Tarantella.

    import tarantella as tnt            # or: import tarantella.tensorflow as tnt
    model = tnt.Model(keras_model)

Gradients reach the C core through compiled TensorFlow ops, built at first
use against the installed TensorFlow (tarantella/tensorflow/ops), or, where
they cannot be built, through `tf.numpy_function` ops over the NumPy
collectives of tarantella.common (TNT_TF_OPS chooses).
"""
from tarantella.common.startup_log import mark

mark("import tarantella.tensorflow: begin")
from tarantella.tensorflow import _version_check  # noqa: F401,E402 - fails early on an old TF

from tarantella.common import (barrier, get_local_rank, get_master_rank, get_rank,  # noqa: E402
                               get_size, init, is_master_rank, shutdown)
from tarantella.tensorflow import data, keras, models, optimizers  # noqa: E402
from tarantella.tensorflow.collective_ops import broadcast_variables  # noqa: E402
from tarantella.tensorflow.compression import Compression  # noqa: E402
from tarantella.tensorflow.distributed_gradient_tape import DistributedGradientTape  # noqa: E402
from tarantella.tensorflow.distributed_optimizer import DistributedOptimizer  # noqa: E402
from tarantella.tensorflow.model import Model, Sequential  # noqa: E402
from tarantella.tensorflow.optimizers import Optimizer  # noqa: E402,F401 - Tarantella 0.8's tnt.Optimizer
from tarantella.tensorflow.parallel_strategy import ParallelStrategy  # noqa: E402
from tarantella.tensorflow.tensor_collectives import (  # noqa: E402
    TensorAllgatherer, TensorAllreducer, TensorBroadcaster, allgather, allreduce, broadcast)

__all__ = [
    "Model", "Sequential", "ParallelStrategy", "DistributedOptimizer", "DistributedGradientTape",
    "Compression", "broadcast_variables", "data", "keras", "models", "optimizers", "allgather", "allreduce",
    "barrier", "broadcast", "get_local_rank", "get_master_rank", "get_rank", "get_size", "init",
    "is_master_rank", "shutdown", "TensorAllreducer", "TensorBroadcaster", "TensorAllgatherer",
]
mark("import tarantella.tensorflow: done")
