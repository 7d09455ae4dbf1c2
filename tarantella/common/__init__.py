"""Framework-neutral Tarantella: the rank API and NumPy collectives over the C core.

Nothing here imports TensorFlow (a PyTorch or JAX frontend can sit beside
tarantella/tensorflow/ later).
"""
from tarantella.common.collectives import (Handle, TensorAllgatherer, TensorAllreducer,  # noqa: F401
                                           TensorBroadcaster, allgather, allgather_async,
                                           allreduce, allreduce_async, barrier, barrier_async,
                                           broadcast, broadcast_async)
from tarantella.common.core import (get_local_rank, get_local_size, get_master_rank, get_rank,
                                    get_size, init, is_initialized, is_master_rank, shutdown)
from tarantella.common import error_file as _error_file
from tarantella.common.errors import (InternalError, InvalidArgumentError, InvalidUsageError,
                                      MismatchError, PeerLostError, TarantellaError, TimeoutError)

# an uncaught exception aborts the core (peers fail fast) and, under tntrun,
# lands in TNT_ERROR_FILE for the failure report, even before init()
_error_file.install()

# The original Tarantella's TensorAllreducer, TensorBroadcaster and
# TensorAllgatherer are here too, but not in __all__: `tnt.TensorAllreducer`
# is tarantella.tensorflow's, which gives tensors back for tensors.
__all__ = [
    "Handle", "allgather", "allgather_async", "allreduce", "allreduce_async", "barrier",
    "barrier_async", "broadcast", "broadcast_async", "get_local_rank", "get_local_size",
    "get_master_rank", "get_rank", "get_size", "init", "is_initialized", "is_master_rank",
    "shutdown", "InternalError", "InvalidArgumentError", "InvalidUsageError", "MismatchError",
    "PeerLostError", "TarantellaError", "TimeoutError",
]
