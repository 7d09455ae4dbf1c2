"""Whether every rank reads the same batches from a tf.data pipeline.

Every rank iterates the whole dataset and keeps its slice of each global batch
(batch_slicing), so the ranks' pipelines must yield the same batches in the
same order. One that differs between ranks (a file per rank, a
`shuffle(seed=rank)`, augmentation drawn per rank before the batch) makes the
ranks take slices of different global batches: some samples are trained on
twice and others never, and the model trains differently from serial Keras
without an error.

Arrays are compared before `fit` (tarantella.common.replicas); a dataset is
not read ahead. Instead the first global batch of every pass over a
distributed dataset is fingerprinted as the pipeline yields it, before the
rank takes its slice, and the ranks compare the fingerprints once that batch
has been used (tnt.Model: after the first step of `fit`, at the end of every
epoch and of `evaluate` / `predict`): the same MismatchError on every rank.

A fingerprint hashes each component's shape, dtype and a strided sample of at
most SAMPLES of its entries (batches of different samples differ almost
everywhere; a difference in a single unsampled entry is not seen), computed in
the graph and only for the first batch of a pass: the other batches pay one
comparison of their index. The first batch of a pass is used before the check
runs, and the next pass starts only after it, so every rank has recorded the
same passes when it compares, whatever tf.data prefetched.
"""
import contextlib
import hashlib
import threading

import numpy as np
import tensorflow as tf

from tarantella.common import replicas
from tarantella.tensorflow.data import batch_slicing

SAMPLES = 4096  # entries of a component hashed at most

_ADVICE = (
    "Every rank reads the whole dataset and keeps its slice of each global batch, so every "
    "rank's dataset must yield the same batches in the same order: build it from the same "
    "files, with the same seeds on every rank (`shuffle(..., seed=s)` with s the same "
    "everywhere; a shuffle without seed= is seeded alike by tnt, unless a global seed gives it "
    "one, `tf.random.set_seed` or `keras.utils.set_random_seed`, which must then be the same "
    "on every rank too), and keep tf.data's order "
    "deterministic (no `deterministic=False`). To give each rank data of its "
    "own on purpose, pass tnt_distribute_dataset=False (each rank then feeds its part of "
    "every global batch)")


def _component_hash(t):
    if t.dtype == tf.variant or t.dtype == tf.resource:
        return tf.constant(0, tf.int64)
    flat = tf.reshape(t, [-1])
    stride = tf.maximum(tf.size(flat, out_type=tf.int64) // SAMPLES, 1)
    sample = tf.io.serialize_tensor(flat[::stride])  # dtype and entries
    shape = tf.io.serialize_tensor(tf.shape(t, out_type=tf.int64))
    return tf.strings.to_hash_bucket_fast(tf.strings.join([shape, sample]), (1 << 63) - 1)


@batch_slicing.plain_tf
def fingerprint(element):
    """An int64 fingerprint of a (nested) batch, in the graph."""
    leaves = tf.nest.flatten(element, expand_composites=True)
    h = tf.constant(len(leaves), tf.int64)
    for t in leaves:  # order-dependent combination (FNV-style)
        h = tf.bitwise.bitwise_xor(h * 1099511628211, _component_hash(t))
    return h


class FirstBatches:
    """The fingerprints of the first global batch of each pass over one
    distributed dataset, in the order of the passes. `compared=False`: a
    pipeline whose batches may differ between ranks by design, recorded as
    such (every rank still takes part in the comparison, so that ranks whose
    pipelines differ in that respect fail alike instead of waiting)."""

    def __init__(self, label, compared=True):
        self.label = label
        self.compared = compared
        self._fingerprints = []
        self._lock = threading.Lock()
        self._unrecorded = 0  # > 0 inside unrecorded(): a pass of this rank alone

    def _add(self, value):
        with self._lock:
            if not self._unrecorded:
                self._fingerprints.append(int(value.numpy()))
        return np.int64(0)

    def noted(self, index, element):
        """`element` (the `index`-th global batch of a pass), once its
        fingerprint is recorded when it is the first."""
        done = tf.cond(tf.equal(index, 0),
                       lambda: tf.py_function(self._add, [fingerprint(element)], tf.int64),
                       lambda: tf.constant(0, tf.int64))
        with tf.control_dependencies([done]):
            return tf.nest.map_structure(tf.identity, element, expand_composites=True)

    def summary(self):
        """[passes recorded, a digest of their fingerprints in order] (int64);
        [-1, -1] where not compared."""
        if not self.compared:
            return np.array([-1, -1], np.int64)
        with self._lock:
            values = np.array(self._fingerprints, np.int64)
        digest = hashlib.blake2b(values.tobytes(), digest_size=8).digest()
        return np.array([len(values), int.from_bytes(digest, "little", signed=True)], np.int64)


@contextlib.contextmanager
def unrecorded(stores):
    """Passes begun inside are not recorded in `stores` (FirstBatches or None):
    a rank that reads a first batch on its own (tnt.Model building a model
    that makes its weights at its first call, unbuilt on this rank only) must
    not count a pass the other ranks did not make, which read as different
    data."""
    stores = [s for s in stores if s is not None]
    for s in stores:
        with s._lock:
            s._unrecorded += 1
    try:
        yield
    finally:
        for s in stores:
            with s._lock:
                s._unrecorded -= 1


def map_global_batches(dataset, store, fn):
    """`dataset.map(fn)` over its global batches (in order, in parallel), each
    first noted in `store` (FirstBatches, or None) when it is compared. Only
    then are the batches numbered: a pipeline nothing compares (one rank, or
    batches drawn at random) pays nothing for the check."""
    if store is None or not store.compared:
        unpacked = type(dataset.element_spec) is tuple  # tf.data passes a plain tuple's parts as arguments

        @batch_slicing.plain_tf
        def whole_fn(*parts):
            return fn(parts if unpacked else parts[0])

        return dataset.map(whole_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    @batch_slicing.plain_tf
    def noted_fn(index, element):
        return fn(store.noted(index, element))

    return dataset.enumerate().map(noted_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def check(lead, stores):
    """Collective: raise MismatchError on every rank unless every rank
    recorded the same first batches in each of `stores` (FirstBatches or
    None, in the same order on every rank)."""
    items = [(f"the first batch of {s.label} in each pass", s.summary())
             for s in stores if s is not None]
    if items:
        replicas.check(items, lead, _ADVICE, name="tnt.first_batches")
