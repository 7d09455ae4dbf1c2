"""Framework-neutral Tarantella: the rank API and NumPy collectives over the C core.

Nothing here imports TensorFlow (a PyTorch or JAX frontend can sit beside
tarantella/tensorflow/ later). The names below are imported on first access
(PEP 562): the launcher `tntrun` imports tarantella.common's small modules
(config, errors) and must not pay for NumPy and the compiled core before it
starts the ranks.
"""
import atexit as _atexit
import sys as _sys

from tarantella.common import error_file as _error_file

# an uncaught exception aborts the core (peers fail fast) and, under tntrun,
# lands in TNT_ERROR_FILE for the failure report, even before init()
_error_file.install()


@_atexit.register
def _at_exit():
    # registered at `import tarantella`, not when the core is first used: Python runs exit
    # handlers last registered first, so Tarantella shuts down after every handler that the
    # program registered once it had imported tarantella. Registered at the core's first use,
    # it ran before a handler registered between the import and the first call, whose last
    # collective then failed with "tnt.shutdown() was called" (ignored by Python: exit 0)
    core = _sys.modules.get("tarantella.common.core")
    if core is not None:
        core._shutdown_at_exit()

# name -> the module of tarantella.common that defines it
_LAZY = {
    **dict.fromkeys(("Handle", "TensorAllgatherer", "TensorAllreducer", "TensorBroadcaster",
                     "allgather", "allgather_async", "allreduce", "allreduce_async", "barrier",
                     "barrier_async", "broadcast", "broadcast_async"), "collectives"),
    **dict.fromkeys(("get_local_rank", "get_local_size", "get_master_rank", "get_rank", "get_size",
                     "init", "is_initialized", "is_master_rank", "shutdown"), "core"),
    "rank_only": "busy",
    **dict.fromkeys(("InternalError", "InvalidArgumentError", "InvalidUsageError", "MismatchError",
                     "PeerLostError", "TarantellaError", "TimeoutError"), "errors"),
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tarantella.common' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"tarantella.common.{module}"), name)
    globals()[name] = value  # later accesses are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


# The original Tarantella's TensorAllreducer, TensorBroadcaster and
# TensorAllgatherer are here too, but not in __all__: `tnt.TensorAllreducer`
# is tarantella.tensorflow's, which gives tensors back for tensors.
__all__ = [
    "Handle", "allgather", "allgather_async", "allreduce", "allreduce_async", "barrier",
    "barrier_async", "broadcast", "broadcast_async", "get_local_rank", "get_local_size",
    "get_master_rank", "get_rank", "get_size", "init", "is_initialized", "is_master_rank",
    "rank_only", "shutdown", "InternalError", "InvalidArgumentError", "InvalidUsageError", "MismatchError",
    "PeerLostError", "TarantellaError", "TimeoutError",
]
