"""How a tnt.Model is parallelized."""
import enum

from tarantella.common.logging import get_logger


class ParallelStrategy(enum.Flag):
    """The original Tarantella's flags. `DATA`: every rank holds the whole
    model and a slice of each global batch (the strategy implemented).
    `PIPELINING`: the model split into stages across ranks, at its
    `tnt.keras.layers.SplitLayer`s (not available yet). `ALL = DATA | PIPELINING`:
    both; a model without pipeline partitions then trains data-parallel.
    Strings work too ("data", "all", ...)."""

    NONE = 0
    DATA = enum.auto()
    PIPELINING = enum.auto()
    ALL = DATA | PIPELINING


def resolve(strategy, model, num_pipeline_stages=1):
    """The strategy tnt.Model(model, strategy, num_pipeline_stages) runs:
    DATA, or an error saying why not."""
    if isinstance(strategy, str):
        try:
            strategy = ParallelStrategy[strategy.upper()]
        except KeyError:
            raise ValueError(
                "parallel_strategy must be one of DATA, PIPELINING, ALL. Received: "
                f"parallel_strategy={strategy!r}") from None
    if not isinstance(strategy, ParallelStrategy):
        raise TypeError("parallel_strategy must be a tnt.ParallelStrategy. Received: "
                        f"parallel_strategy={strategy!r} (of type {type(strategy).__name__})")
    if not isinstance(num_pipeline_stages, int) or num_pipeline_stages < 1:
        raise ValueError("num_pipeline_stages must be a positive integer. Received: "
                         f"num_pipeline_stages={num_pipeline_stages!r}")
    partitions = _split_layers(model)
    if ParallelStrategy.DATA not in strategy:
        if ParallelStrategy.PIPELINING in strategy:
            raise NotImplementedError(
                "Pipelining is not available yet in this Tarantella: use "
                "tnt.ParallelStrategy.DATA (or ALL, which trains data-parallel when the model "
                f"has no pipeline partitions). Received: parallel_strategy={strategy}")
        raise ValueError("parallel_strategy=NONE parallelizes nothing: use "
                         f"tnt.ParallelStrategy.DATA. Received: parallel_strategy={strategy}")
    if num_pipeline_stages > 1 or (ParallelStrategy.PIPELINING in strategy and partitions):
        raise NotImplementedError(
            "Pipelining is not available yet in this Tarantella, so a model cannot be split "
            "into pipeline stages: remove the SplitLayers (or num_pipeline_stages) and train "
            "data-parallel with tnt.ParallelStrategy.DATA. Received: "
            f"parallel_strategy={strategy}, num_pipeline_stages={num_pipeline_stages}, "
            f"{len(partitions)} SplitLayer(s)")
    if ParallelStrategy.PIPELINING in strategy:
        get_logger().info(
            f"tnt.Model: parallel_strategy={strategy}, but the model has no pipeline partitions "
            "(no SplitLayer): it trains data-parallel on every rank.")
    elif partitions:
        get_logger().info(
            f"tnt.Model: parallel_strategy={strategy}: the model's {len(partitions)} SplitLayer(s) "
            "only pass their inputs through.")
    return ParallelStrategy.DATA


def _split_layers(model):
    from tarantella.tensorflow.keras.layers import SplitLayer

    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, SplitLayer)]
