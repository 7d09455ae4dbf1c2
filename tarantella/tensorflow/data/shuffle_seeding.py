"""Give unseeded `shuffle`s a fixed seed, so that every rank shuffles alike.

A `shuffle()` without a seed draws a fresh random seed in every process, so
the ranks would slice different permutations: some samples would be seen
twice per epoch, others never. The pipeline is rebuilt from the first
unseeded shuffle on, re-applying each later op with its recorded arguments.
This reads private tf.data attributes; an op it does not know stops the
rebuild with an error that says how to avoid it (pass `seed=` to shuffle).
"""
import threading
import warnings
import weakref

import tensorflow as tf
from tensorflow.python.data.ops import shuffle_op  # a shuffle with a given seed pair

from tarantella.tensorflow.data import dataset_inspection

DEFAULT_SEED = 42

# dataset -> {(seed, deterministic): its rebuilt pipeline}. A dataset passed
# again (fit in a loop of one epoch each, validation_data, evaluate after fit)
# gets the same rebuilt pipeline, whose shuffles keep their state and so draw
# a new order for every pass, as the user's own shuffle does in serial Keras.
# Rebuilt anew each time, a shuffle started again from its seed: every call of
# fit(ds, epochs=e + 1, initial_epoch=e) trained on the same order.
_rebuilt = weakref.WeakKeyDictionary()


def _arg(ds, name, default=None):
    value = getattr(ds, name, default)
    static = dataset_inspection._static(value)
    return value if static is None else static


def _deterministic(ds):
    value = getattr(ds, "_deterministic", "default")
    return None if value == "default" else value == "true" or value is True


class _SeedPair:
    """Stands for tf.data's shuffle module's `random_seed` while a shuffle is
    rebuilt: its get_seed returns the pair the user's shuffle was made with."""

    def __init__(self, pair):
        self.pair = pair

    def get_seed(self, _):
        return self.pair


_seed_pair_lock = threading.Lock()


def _shuffle_with_seed_pair(upstream, op):
    """`op` (a seeded shuffle) on `upstream`, with its own seed pair. Its
    seed alone (`shuffle(n, seed=s)`) makes the pair anew from the global seed
    of now: a global seed set after the dataset was built
    (`keras.utils.set_random_seed` before the model, the common order) gave
    the rebuilt shuffle another pair, so the ranks trained on another order
    than serial Keras with the same seeds."""
    pair = (_arg(op, "_seed"), _arg(op, "_seed2"))
    reshuffle = bool(_arg(op, "_reshuffle_each_iteration"))
    with _seed_pair_lock:
        saved = shuffle_op.random_seed
        shuffle_op.random_seed = _SeedPair(pair)  # shuffle_op's own name only
        try:
            return shuffle_op._ShuffleDataset(upstream, _arg(op, "_buffer_size"), seed=pair[1],
                                              reshuffle_each_iteration=reshuffle)
        finally:
            shuffle_op.random_seed = saved


def _replay(op, upstream, seed, deterministic=False):
    """`op` re-applied on top of `upstream` (`deterministic`: its parallel
    map or batch in order, whatever it asked)."""
    name = type(op).__name__
    if name == "_ShuffleDataset":
        seeded = dataset_inspection._static(op._seed) != 0 or dataset_inspection._static(op._seed2) != 0
        if seeded:  # keep the user's seed pair exactly
            return _shuffle_with_seed_pair(upstream, op)
        return upstream.shuffle(_arg(op, "_buffer_size"), seed=seed,
                                reshuffle_each_iteration=bool(_arg(op, "_reshuffle_each_iteration")))
    if name == "_MapDataset":
        return upstream.map(op._map_func._func)
    if name == "_ParallelMapDataset":
        return upstream.map(op._map_func._func, num_parallel_calls=_arg(op, "_num_parallel_calls"),
                            deterministic=True if deterministic else _deterministic(op))
    if name == "_FilterDataset":
        return upstream.filter(op._predicate._func)
    if name == "_BatchDataset":
        return upstream.batch(_arg(op, "_batch_size"), drop_remainder=bool(_arg(op, "_drop_remainder")))
    if name == "_ParallelBatchDataset":
        return upstream.batch(_arg(op, "_batch_size"), drop_remainder=bool(_arg(op, "_drop_remainder")),
                              num_parallel_calls=_arg(op, "_num_parallel_calls"),
                              deterministic=True if deterministic else _deterministic(op))
    if name == "_UnbatchDataset":
        return upstream.unbatch()
    if name == "_PrefetchDataset":
        return upstream.prefetch(_arg(op, "_buffer_size"))
    if name == "_RepeatDataset":
        return upstream.repeat(_arg(op, "_count"))
    if name == "_TakeDataset":
        return upstream.take(_arg(op, "_count"))
    if name == "_SkipDataset":
        return upstream.skip(_arg(op, "_count"))
    if name in ("_CacheDataset", "CacheDataset") and _arg(op, "_filename", "") in ("", b""):
        return upstream.cache()  # (TensorFlow 2.21 names the class CacheDataset)
    # the ops the original Tarantella re-applied on its seeded shuffles too (its docs'
    # Transformer pipeline pads its batches): refused, `shuffle()` then `padded_batch()`
    # needed a seed the original did not ask for
    if name == "_PaddedBatchDataset":
        return upstream.padded_batch(_arg(op, "_batch_size"), padded_shapes=op._padded_shapes,
                                     padding_values=op._padding_values,
                                     drop_remainder=bool(_arg(op, "_drop_remainder")))
    if name == "_FlatMapDataset":
        return upstream.flat_map(op._map_func._func)
    if name == "_InterleaveDataset":
        return upstream.interleave(op._map_func._func, cycle_length=_arg(op, "_cycle_length"),
                                   block_length=_arg(op, "_block_length"))
    if name == "_ParallelInterleaveDataset":
        return upstream.interleave(op._map_func._func, cycle_length=_arg(op, "_cycle_length"),
                                   block_length=_arg(op, "_block_length"),
                                   num_parallel_calls=_arg(op, "_num_parallel_calls"),
                                   deterministic=True if deterministic else _deterministic(op))
    if name == "_OptionsDataset":
        return upstream.with_options(op._options_attr)
    raise ValueError(
        f"Tarantella cannot add a seed to this dataset's shuffle() because a later `{name}` op "
        "cannot be rebuilt. Every rank must shuffle alike: pass a seed, e.g. "
        f"`dataset.shuffle(buffer_size, seed=42)`. Received: a pipeline with {name}")


def seed_unseeded_shuffles(dataset, seed=DEFAULT_SEED):
    """`dataset` with every unseeded shuffle seeded by `seed` (the dataset
    itself when there is none)."""
    hidden = dataset_inspection.hidden_unseeded_shuffles(dataset)
    if hidden:
        # each rank would draw its own order there: the ranks' global batches would hold
        # different samples (some trained on twice, others never), and a pipeline with a
        # function (a stateful one, as such a shuffle is) is not compared by first_batches
        raise ValueError(
            f"The dataset has {' and '.join(sorted(set(hidden)))}, where Tarantella cannot add "
            "one: every rank would shuffle differently and their global batches would mix other "
            "samples. Pass it a seed (`shuffle(buffer_size, seed=42)`, `sample_from_datasets(..., "
            "seed=42)`), or set a global seed, the same on every rank "
            "(`keras.utils.set_random_seed(42)`), before building the dataset")
    ops = dataset_inspection.chain(dataset)
    unseeded = dataset_inspection.unseeded_shuffles(dataset)
    if not unseeded:
        return dataset
    return _rebuild_from(ops, max(ops.index(s) for s in unseeded), seed)  # the oldest one


def _rebuild_from(ops, first, seed, deterministic=False):
    """The chain `ops` (newest first) with ops[first] and every later op
    re-applied on ops[first]'s input (_replay's `seed` and `deterministic`);
    the same object for the same chain and arguments (see _rebuilt)."""
    known = _rebuilt.setdefault(ops[0], {})
    key = (first, seed, deterministic)
    if key not in known:
        rebuilt = ops[first]._input_dataset
        for op in _without_unbatch_internals(list(reversed(ops[:first + 1]))):
            rebuilt = _replay(op, rebuilt, seed, deterministic)
        known[key] = rebuilt
    return known[key]


def _without_unbatch_internals(ops):
    """`ops` (oldest first) without the two ops `unbatch()` puts before its own
    (tf.data's normalize_to_dense: a map to dense tensors and a
    _RestructuredDataset), which `upstream.unbatch()` adds again: met first,
    the _RestructuredDataset stopped every rebuild of a pipeline with an
    unbatch() after the shuffle."""
    out = []
    for i, op in enumerate(ops):
        if type(op).__name__ == "_RestructuredDataset" and i + 1 < len(ops) \
                and type(ops[i + 1]).__name__ == "_UnbatchDataset" and out \
                and type(out[-1]).__name__ == "_MapDataset" and out[-1] is op._input_dataset:
            out.pop()
            continue
        out.append(op)
    return out


def keep_order(dataset):
    """`dataset` with its parallel maps and batches made deterministic
    (`deterministic=False`, or `Options.deterministic = False`), as far as
    it can be rebuilt; a warning where it cannot.

    Out of order, each rank's pipeline yields the samples in an order of its
    own, so the ranks slice different global batches: some samples were used
    twice in an epoch and others never, without an error (the first batch,
    which first_batches compares, is usually still the same). Serial Keras
    uses each sample once, in whatever order."""
    ops = dataset_inspection.chain(dataset)
    # (an interleave's deterministic=False, as in tf.data's guide for reading files in
    # parallel, is not kept as an attribute: it went unseen, and each rank read the files'
    # records in its own order)
    loose = [i for i, op in enumerate(ops) if dataset_inspection.deterministic(op) == "false"]
    if loose:
        try:
            dataset = _rebuild_from(ops, max(loose), DEFAULT_SEED, deterministic=True)  # the oldest one
        except ValueError:
            warnings.warn(
                "The dataset has a map or batch with deterministic=False that Tarantella cannot "
                "rebuild in order: each rank may then read the samples in another order and "
                "slice other global batches (some samples used twice, others never). Pass "
                "deterministic=True (or leave it out).", stacklevel=3)
    if dataset.options().deterministic is False:
        options = tf.data.Options()
        options.deterministic = True  # a later option wins
        dataset = dataset.with_options(options)
    return dataset
