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
