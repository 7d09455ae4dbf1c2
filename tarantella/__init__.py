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
from tarantella.common.gone_arguments import NO_GROUPS as _NO_GROUPS  # noqa: E402
from tarantella._original_paths import OriginalPaths as _OriginalPaths  # noqa: E402
import sys as _sys  # noqa: E402

if not any(isinstance(f, _OriginalPaths) for f in _sys.meta_path):
    # first: under the alias of a package, the path finder would load a second copy of its modules
    _sys.meta_path.insert(0, _OriginalPaths())  # `import tarantella.keras`, as in the original

__version__ = "0.1.0"

# names served by the TensorFlow frontend, imported lazily (PEP 562)
_FRONTEND = (
    "Model", "Sequential", "ParallelStrategy", "DistributedOptimizer", "DistributedGradientTape", "Compression",
    "optimizers",
    "models", "keras", "data", "broadcast_variables",
    # the original Tarantella's collectives classes (tensors back for tensors)
    "TensorAllreducer", "TensorBroadcaster", "TensorAllgatherer",
)


# the original Tarantella's public names that are gone: what to use instead (docs/migration.md)
_GONE = {
    **dict.fromkeys(("Group", "get_group_master_rank", "is_group_master_rank"), _NO_GROUPS),
    "Allreduce": "use tnt.allreduce(x, op=\"sum\"|\"average\") or tnt.TensorAllreducer(x).allreduce(x)",
    "Allgatherv": "use tnt.allgather(x) or tnt.TensorAllgatherer(x).allgather(x)",
    "Broadcast": "use tnt.broadcast(x, root=r) or tnt.TensorBroadcaster(x, r).broadcast(x)",
    "Barrier": "use tnt.barrier()",
    "ReductionOp": "tnt.allreduce takes op=\"sum\" or \"average\"",
    **dict.fromkeys(("SynchCommunicator", "PipelineCommunicator"),
                    "gradients are averaged by tnt.Model, or tnt.DistributedOptimizer in a custom "
                    "loop; pipelining is not available yet"),
    "distributed_optimizers": "use tnt.DistributedOptimizer (or tnt.optimizers.Optimizer)",
    "global_tnt_config": "settings are the TNT_* environment variables (docs/environment.md)",
    "logger": "use logging.getLogger(\"tarantella\")",
}


def __getattr__(name):
    if name in _GONE:
        raise AttributeError(f"tarantella.{name} of the original Tarantella is not available: "
                             f"{_GONE[name]} (docs/migration.md)")
    if name in _FRONTEND or name == "Optimizer":  # Optimizer: Tarantella 0.8's, not in __all__
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
