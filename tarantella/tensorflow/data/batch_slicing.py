"""Which part of a global batch a rank gets.

Rank r of N gets the contiguous slice [offset_r, offset_r + size_r) of every
global batch of b samples, with size_r = b // N + (r < b % N): sizes differ by
at most one, concatenating the slices in rank order gives the global batch
back, and a batch smaller than N leaves some ranks an empty slice (they
contribute zero weight to the gradient). This is the only split measured to be
exact for every batch size, including the last, partial batch of an epoch
(notes/keras3-integration.md, section 5).
"""
import numpy as np
import tensorflow as tf

# For the functions Tarantella gives tf.data's map(): plain TensorFlow, without
# Python control flow over tensors, so AutoGraph need not convert them (tf.data
# converts every map function by default: 0.1-0.4 s of a job's start, measured
# by bench/startup.py).
plain_tf = tf.autograph.experimental.do_not_convert


def micro_batch_size(global_batch_size, rank, size):
    return global_batch_size // size + (1 if rank < global_batch_size % size else 0)


def micro_batch_offset(global_batch_size, rank, size):
    return rank * (global_batch_size // size) + min(rank, global_batch_size % size)


def slice_element(element, rank, size):
    """This rank's slice of a batched dataset element (any nest of tensors
    whose first dimension is the batch); computed from the element's actual
    batch size at run time, so partial batches are split the same way."""
    leaves = tf.nest.flatten(element)
    batch = tf.shape(leaves[0], out_type=tf.int64)[0]
    base, extra = batch // size, batch % size
    begin = rank * base + tf.minimum(tf.constant(rank, tf.int64), extra)
    end = begin + base + tf.cast(rank < extra, tf.int64)
    return tf.nest.map_structure(lambda t: rows(t, begin, end), element)


def rank_slice(batch, rank, size):
    """Rank `rank`'s slice of a global batch at hand (a nest of arrays or
    tensors whose first dimension is the sample; None entries stay None):
    the *_on_batch calls' batches, a PyDataset's."""
    leaves = [t for t in tf.nest.flatten(batch) if t is not None]
    if size == 1 or not leaves:
        return batch
    n = int(np.shape(leaves[0])[0])
    begin = micro_batch_offset(n, rank, size)
    end = begin + micro_batch_size(n, rank, size)
    return tf.nest.map_structure(lambda t: None if t is None else rows(t, begin, end), batch)


def rows(t, begin, end):
    """Rows [begin, end) of a dense, ragged or sparse batch (also a NumPy
    array, or a pandas DataFrame or Series: by position)."""
    if hasattr(t, "iloc"):
        # pandas before 3.0 takes t[i:j] for labels where the index holds floats (timestamps,
        # say): the *_on_batch calls trained on other rows than serial Keras', and
        # predict_on_batch returned 2 predictions of 7, without a word
        return t.iloc[begin:end]
    if isinstance(t, tf.SparseTensor):  # not subscriptable
        shape = t.dense_shape
        begin, end = tf.cast(begin, tf.int64), tf.cast(end, tf.int64)
        return tf.sparse.slice(t, tf.concat([[begin], tf.zeros_like(shape[1:])], 0),
                               tf.concat([[end - begin], shape[1:]], 0))
    return t[begin:end]
