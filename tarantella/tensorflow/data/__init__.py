"""Dataset distribution: rank r gets a contiguous slice of every global batch.

`distribute_dataset(dataset)` is what `tnt.Model.fit/evaluate/predict` apply
to a `tf.data.Dataset`; use it directly when feeding a custom training loop.
"""
from tarantella.tensorflow.data.array_dataset import array_dataset
from tarantella.tensorflow.data.batch_slicing import micro_batch_offset, micro_batch_size
from tarantella.tensorflow.data.distribute_dataset import distribute_dataset
from tarantella.tensorflow.data.shuffle_seeding import DEFAULT_SEED, seed_unseeded_shuffles

__all__ = ["array_dataset", "distribute_dataset", "micro_batch_offset", "micro_batch_size",
           "seed_unseeded_shuffles", "DEFAULT_SEED"]


def __getattr__(name):
    if name == "Dataset":  # the original Tarantella's class (docs/migration.md)
        raise AttributeError(
            "tarantella.data.Dataset of the original Tarantella is renamed: "
            "tnt.data.distribute_dataset(dataset, micro_batch_size=None, rank=None, size=None, "
            "shuffle_seed=42).dataset is this rank's part (docs/migration.md)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
