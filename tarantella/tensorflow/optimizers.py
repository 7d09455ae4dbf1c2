"""tnt.optimizers: `DistributedOptimizer` (and `Optimizer`, the original Tarantella's name)."""
from tarantella.tensorflow.distributed_optimizer import DistributedOptimizer

Optimizer = DistributedOptimizer

__all__ = ["DistributedOptimizer", "Optimizer"]
