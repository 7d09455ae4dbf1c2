"""NumPy arrays / tensors as a per-rank dataset, without paying for the other
ranks' samples: the index pipeline is global (so every rank agrees on the
order and the batch boundaries), but each rank gathers only its own slice."""
import numpy as np
import tensorflow as tf

from tarantella.tensorflow.data import batch_slicing


def _num_samples(structure):
    sizes = {int(np.shape(t)[0]) for t in tf.nest.flatten(structure)}
    if len(sizes) != 1:
        raise ValueError(
            "All arrays passed to fit/evaluate/predict must have the same number of samples. "
            f"Received: first dimensions {sorted(sizes)}")
    return sizes.pop()


def array_dataset(data, batch_size, rank, size, shuffle=False, seed=42):
    """A dataset of this rank's micro-batches of `data` (a nest of arrays
    whose first dimension is the sample), cut from global batches of
    `batch_size` samples; with `shuffle`, the sample order is reshuffled every
    epoch with the same seed on every rank."""
    data = tf.nest.map_structure(
        lambda t: t if isinstance(t, (tf.Tensor, tf.RaggedTensor)) else tf.convert_to_tensor(t), data)
    n = _num_samples(data)
    indices = tf.data.Dataset.range(n)
    if shuffle:
        indices = indices.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    indices = indices.batch(batch_size)

    def gather(batch_indices):
        mine = batch_slicing.slice_element(batch_indices, rank, size)
        return tf.nest.map_structure(lambda t: tf.gather(t, mine), data)

    return indices.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True) \
        .prefetch(tf.data.AUTOTUNE)
