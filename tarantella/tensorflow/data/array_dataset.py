"""NumPy arrays / tensors as a per-rank dataset, without paying for the other
ranks' samples: the index pipeline is global (so every rank agrees on the
order and the batch boundaries), but each rank gathers only its own slice.

The order of the samples is serial Keras' (`fit(x, y, shuffle=...)`):
- no shuffle: in order;
- shuffle with a TensorFlow global seed (`keras.utils.set_random_seed`,
  `tf.random.set_seed`) on the master: Keras' own array adapter draws the
  order of an index array, with the master's seed, so every rank gets the
  order serial Keras gives with that seed (Keras 3 then repeats the same
  permutation every epoch, and so do we);
- shuffle without a global seed: a fresh order every run and every epoch, as
  in serial Keras, from a seed the master draws and broadcasts, so every rank
  shuffles alike.
"""
import os

import keras
import numpy as np
import tensorflow as tf

from tarantella.common import collectives, replicas
from tarantella.tensorflow.data import batch_slicing
from tarantella.tensorflow.data.batch_slicing import plain_tf as _plain_tf


def as_keras_arrays(data):
    """`data` (a nest) with the arrays Keras' array adapter takes besides
    NumPy arrays and tensors made into those, as the adapter makes them: a
    pandas DataFrame into its values, a Series into a column of its values
    (floats as floatx), a SciPy sparse matrix into a tf.SparseTensor. tnt
    refused them (a TypeError that said to build a dataset) where serial
    Keras trains on them."""
    from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils

    pandas = array_slicing.pandas  # None where pandas is not installed

    def convert(t):
        is_pandas = pandas is not None and isinstance(t, (pandas.DataFrame, pandas.Series))
        if not (is_pandas or data_adapter_utils.is_scipy_sparse(t)):
            return t
        t = array_slicing.convert_to_sliceable(t, target_backend="tensorflow")
        return t.sparse if isinstance(t, array_slicing.TensorflowSparseWrapper) else t

    return keras.tree.map_structure(convert, data)


def _named_leaves(data):
    """[(name, leaf)] of `data`, (x,), (x, y) or (x, y, sample_weight), each
    leaf named by its path (`x`, `y['cls']`, `x[0]`)."""
    named = dict(zip(("x", "y", "sample_weight"), data))
    return [(path[0] + "".join(f"[{p!r}]" for p in path[1:]), t)
            for path, t in keras.tree.flatten_with_path(named)]


def sample_count(data):
    """The number of samples of `data` ((x,), (x, y) or (x, y, sample_weight)).
    A None (y=None with sample weights, which Keras takes) has none; a number
    where an array belongs (a Python list of numbers, which Keras refuses too)
    is a ValueError that says so: both failed with 'IndexError: tuple index
    out of range'."""
    sizes = set()
    for name, t in _named_leaves(data):
        if t is None:
            continue
        if not np.shape(t):
            top = name.split("[")[0]
            raise ValueError(
                f"tnt.Model's fit, evaluate, predict and *_on_batch calls take arrays whose "
                f"first dimension is the sample (NumPy arrays, tensors, pandas or SciPy "
                f"arrays); {name} is a number, not an array (a "
                f"Python list of numbers is no array to Keras either): pass np.asarray({top}). "
                f"Received: {name}={t!r}")
        sizes.add(int(np.shape(t)[0]))
    if len(sizes) != 1:
        raise ValueError(
            "All arrays passed to fit/evaluate/predict must have the same number of samples. "
            f"Received: first dimensions {sorted(sizes)}")
    return sizes.pop()


_SAME_ARRAYS_ADVICE = (
    "Each rank takes its slice of every global batch from its own copy of the arrays, so every "
    "rank must pass the same ones: load them the same way on every rank (the same files, the "
    "same seeds), or feed each rank its own shard with tnt_distribute_dataset=False")


def check_same_on_every_rank(data, what):
    """Collective: the same MismatchError on every rank unless every rank
    passed the same arrays (`data`: (x,), (x, y) or (x, y, sample_weight)).
    Without it, a rank that loaded other data (another file, a seed of its
    own) trained on a mixture of the ranks' samples, unlike serial Keras, and
    arrays of other lengths made the ranks wait for each other until
    TNT_TIMEOUT_S."""
    # the leaves are NumPy arrays, lists, dense, ragged and sparse tensors (tnt.Model refuses
    # other inputs first); a composite tensor is compared by its components (values, row
    # splits; indices, values, shape)
    items = [(name + (f".{i}" if len(parts) > 1 else ""), _comparable(np.asarray(part)))
             for name, t in _named_leaves(data)
             for parts in [tf.nest.flatten(t, expand_composites=True)]
             for i, part in enumerate(parts)]
    replicas.check(items, f"the ranks passed different arrays to {what}", _SAME_ARRAYS_ADVICE,
                   name=f"tnt.replicas.{what}.arrays")


def _comparable(array):
    """`array` as bits the ranks can compare: strings held as objects (NumPy
    object arrays, tf.string tensors) as fixed-width bytes. Their references
    could not be read as bytes: fit on an object array of strings, which Keras
    takes, failed with 'Cannot change data-type for array of references'."""
    if array.dtype.kind != "O":
        return array
    flat = [e if isinstance(e, bytes) else str(e).encode() for e in array.reshape(-1)]
    return np.array(flat, dtype=bytes).reshape(array.shape)


def _global_seed():
    from tensorflow.python.eager import context  # no public getter of the global seed

    return context.global_seed()


def _keras_order(num_samples, batch_size, shuffle, seed):
    """The batches of sample indices that serial Keras' fit() draws for arrays
    of `num_samples` samples under the global seed `seed`."""
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    own = _global_seed()
    if own != seed:
        tf.random.set_seed(seed)  # the master's: its order is the one every rank must take
    try:
        adapter = ArrayDataAdapter(np.arange(num_samples, dtype=np.int64), batch_size=batch_size,
                                   shuffle=shuffle)
        order = adapter.get_tf_dataset()
    finally:
        if own != seed:
            tf.random.set_seed(own)
    batches = -(-num_samples // batch_size)  # known, as with Keras' own adapter
    return order.map(_plain_tf(lambda *e: e[0])).apply(tf.data.experimental.assert_cardinality(batches))


def sample_order(num_samples, batch_size, shuffle, size):
    """A dataset of global batches of sample indices, the same on every rank
    (collective on more than one rank when shuffling: the master's seed)."""
    if shuffle and size > 1:
        seed = _global_seed()
        fresh = int.from_bytes(os.urandom(8), "little") >> 1
        master = collectives.broadcast(
            np.array([seed is not None, seed or 0, fresh], dtype=np.int64),
            root=0, name="tnt.shuffle_seed")
        if master[0]:
            return _keras_order(num_samples, batch_size, shuffle, int(master[1]))
        seed = int(master[2])
    elif shuffle:
        return _keras_order(num_samples, batch_size, shuffle, _global_seed())
    indices = tf.data.Dataset.range(num_samples)
    if shuffle == "batch":  # the order of the batches is kept, each is shuffled
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        return tf.data.Dataset.zip((indices.batch(batch_size), seeds)).map(
            tf.random.experimental.stateless_shuffle)
    if shuffle:
        indices = indices.shuffle(num_samples, seed=seed, reshuffle_each_iteration=True)
    return indices.batch(batch_size)


def _as_keras_feeds_them(data):
    """`data` as Keras' array adapter hands it to the steps: floats of
    another precision than floatx (NumPy's default float64) as floatx, object
    arrays of strings as strings. Fed as given, a step that mixed the batch
    with the model's outputs (`y - y_pred` in a custom train_step) failed on
    every rank with a TypeError about float64 where serial Keras trains."""
    from keras.src.trainers.data_adapters import array_slicing

    return array_slicing.convert_to_sliceable(data, target_backend="tensorflow")


def array_dataset(data, batch_size, rank, size, shuffle=False):
    """A dataset of this rank's micro-batches of `data` (a nest of arrays
    whose first dimension is the sample), cut from global batches of
    `batch_size` samples in the order serial Keras' fit takes them (`shuffle`:
    False, True or "batch", as in Keras)."""
    n = sample_count(data)
    # Lists (y=[y1, y2] of a two-output model, x=[a, b]) become tuples, as in
    # Keras' own array adapter: tf.data refuses a list in a map's result.
    data = keras.tree.traverse(_as_tensor, _as_keras_feeds_them(keras.tree.lists_to_tuples(data)))
    indices = sample_order(n, batch_size, shuffle, size)

    @_plain_tf
    def gather(batch_indices):
        mine = batch_slicing.slice_element(batch_indices, rank, size)
        return keras.tree.traverse(lambda t: _take(t, mine), data)

    return indices.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True) \
        .prefetch(tf.data.AUTOTUNE)


def _is_sparse_wrapper(t):
    from keras.src.trainers.data_adapters.array_slicing import TensorflowSparseWrapper

    return isinstance(t, TensorflowSparseWrapper)


def _as_tensor(t):
    """For keras.tree.traverse of what _as_keras_feeds_them made: each array
    as a tensor; a sparse tensor stays Keras' sliceable wrapper of it (a
    namedtuple, one leaf here), a nest is entered (None)."""
    if t is None or _is_sparse_wrapper(t) or isinstance(t, (tf.Tensor, tf.RaggedTensor)):
        return t  # (None: y=None with sample weights, kept)
    if isinstance(t, (list, tuple, dict)):
        return None
    return tf.convert_to_tensor(t)


def _take(t, indices):
    """For keras.tree.traverse: the rows `indices` of each array (of a sparse
    one as Keras' array adapter takes them, a tf.SparseTensor)."""
    from keras.src.trainers.data_adapters.array_slicing import slice_tensorflow_sparse_wrapper

    if _is_sparse_wrapper(t):
        return slice_tensorflow_sparse_wrapper(t, indices)
    if t is None or isinstance(t, (list, tuple, dict)):
        return None  # a None stays None
    return tf.gather(t, indices)
