"""Checks that need one process only: dataset slicing for simulated rank
counts, clear errors for bad input, and the wrappers' rules."""
import copy
import json
import logging
import os
import re
import subprocess
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from tarantella.tensorflow.atomic_save import atomic_save  # noqa: E402
from tarantella.tensorflow.data import distribute_dataset, seed_unseeded_shuffles  # noqa: E402


def _batches(ds):
    return [np.asarray(b) for b in ds]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n,batch", [(40, 8), (43, 8), (41, 10), (2, 10), (23, 7)])
def test_rank_slices_concatenate_to_the_global_batch(size, n, batch):
    def pipeline():
        return tf.data.Dataset.range(n).map(lambda i: i * 3).batch(batch).prefetch(2)

    per_rank = [_batches(distribute_dataset(pipeline(), rank=r, size=size).dataset)
                for r in range(size)]
    reference = _batches(pipeline())
    assert all(len(p) == len(reference) for p in per_rank)  # same step count everywhere
    for step, global_batch in enumerate(reference):
        parts = [p[step] for p in per_rank]
        np.testing.assert_array_equal(np.concatenate(parts), global_batch)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("n,batch", [(43, 8), (7, 9), (12, 4)])
def test_maps_before_the_batch_run_on_the_rank_slice_only(size, n, batch):
    """`map(f) -> batch(B)` is rebuilt as `batch(B) -> slice -> f per sample`:
    the same tensors as slicing after the map, empty slices included."""
    from tarantella.tensorflow.data import slice_before_map

    x = np.arange(n * 6, dtype=np.int32).reshape(n, 2, 3)
    def pipeline():
        return (tf.data.Dataset.from_tensor_slices(({"x": x}, np.arange(n)))
                .map(lambda d, y: ({"x": tf.sqrt(tf.cast(d["x"], tf.float32) + 1.0)}, y + 1),
                     num_parallel_calls=2)
                .map(lambda d, y: (d, tf.cast(y, tf.float32) * 0.5)).batch(batch).prefetch(1))

    assert slice_before_map.rebuild(pipeline(), 0, size) is not None
    for r in range(size):
        early = list(distribute_dataset(pipeline(), rank=r, size=size).dataset)
        late = list(distribute_dataset(pipeline(), rank=r, size=size, slice_early=False).dataset)
        assert len(early) == len(late)
        for (de, ye), (dl, yl) in zip(early, late):
            assert de["x"].shape == dl["x"].shape and ye.shape == yl.shape
            np.testing.assert_array_equal(de["x"], dl["x"])
            np.testing.assert_array_equal(ye, yl)


def test_stateful_or_reshaping_maps_are_sliced_after_the_batch():
    from tarantella.tensorflow.data import slice_before_map

    base = tf.data.Dataset.from_tensor_slices(np.zeros((8, 2), np.float32))
    random = base.map(lambda v: v + tf.random.uniform([2])).batch(4)
    assert slice_before_map.rebuild(random, 0, 2) is None  # a random stream would shift
    ragged = base.map(lambda v: v[: tf.cast(v[0], tf.int32)]).batch(4)
    assert slice_before_map.rebuild(ragged, 0, 2) is None  # unknown shapes
    no_map = base.batch(4)
    assert slice_before_map.rebuild(no_map, 0, 2) is None


def test_unbatched_dataset_with_micro_batch_size():
    ds = tf.data.Dataset.range(10)
    parts = [_batches(distribute_dataset(ds, micro_batch_size=2, rank=r, size=2).dataset)
             for r in range(2)]
    assert [b.tolist() for b in parts[0]] == [[0, 1], [4, 5], [8]]
    assert [b.tolist() for b in parts[1]] == [[2, 3], [6, 7], [9]]



@pytest.mark.parametrize("unbatch", ["flat_map", "interleave", "from_tensors"])
def test_samples_flattened_out_of_batches_are_not_taken_for_batches(unbatch):
    """A batch op before a flat_map/interleave says nothing about their
    elements: `batch(4).flat_map(from_tensor_slices)` yields single samples,
    which were taken for batches of 4 (each rank got some of every sample's
    features)."""
    pairs = tf.data.Dataset.range(8).map(lambda v: tf.stack([v, v + 100]))
    ds = {"flat_map": pairs.batch(4).flat_map(tf.data.Dataset.from_tensor_slices),
          "interleave": pairs.batch(4).interleave(tf.data.Dataset.from_tensor_slices),
          "from_tensors": tf.data.Dataset.from_tensors(tf.stack([tf.range(8, dtype=tf.int64)] * 2, 1))
          .flat_map(tf.data.Dataset.from_tensor_slices)}[unbatch]
    parts = [_batches(distribute_dataset(ds, micro_batch_size=2, rank=r, size=2).dataset)
             for r in range(2)]
    for step, global_batch in enumerate(_batches(ds.batch(4))):
        np.testing.assert_array_equal(np.concatenate([p[step] for p in parts]), global_batch)


@pytest.mark.parametrize("where", ["map", "batch", "options", "interleave"])
def test_out_of_order_pipelines_are_read_in_order(where):
    """deterministic=False let each rank's pipeline yield the samples in its
    own order (a costlier sample finishing later): the ranks sliced different
    global batches, some samples used twice and others never. An interleave's
    (tf.data's guide reads files so) was not seen at all: tf.data keeps it
    only in the graph."""
    from tarantella.tensorflow.data import dataset_inspection

    def work(v):  # a cost that differs per sample, so that the order can change
        n = (v * 7919) % 13 * 3000
        return tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a + 1),
                             (tf.constant(0, tf.int64), v))[1] - n

    loose = where != "options"
    ds = tf.data.Dataset.range(24).map(work, num_parallel_calls=4,
                                       deterministic=False if where == "map" else None)
    if where == "interleave":  # 4 "files" of 6 records, read 4 at a time as they come
        ds = tf.data.Dataset.range(4).interleave(
            lambda f: tf.data.Dataset.range(f * 6, f * 6 + 6).map(work), cycle_length=4,
            num_parallel_calls=4, deterministic=False)
    ds = ds.filter(lambda v: True).batch(6, num_parallel_calls=2 if where == "batch" else None,
                                         deterministic=False if where == "batch" else None)
    if not loose:
        options = tf.data.Options()
        options.deterministic = False
        ds = ds.with_options(options)
    parts = [distribute_dataset(ds, rank=r, size=2).dataset for r in range(2)]
    if where == "interleave":  # in the order of the serial, deterministic pipeline
        ordered = tf.data.Dataset.range(4).interleave(
            lambda f: tf.data.Dataset.range(f * 6, f * 6 + 6), cycle_length=4).batch(6)
        for step, batch in enumerate(_batches(ordered)):
            assert np.concatenate([_batches(p)[step] for p in parts]).tolist() == batch.tolist()
    for part in parts:
        assert part.options().deterministic is not False
        assert all(dataset_inspection.deterministic(op) != "false"
                   for op in dataset_inspection._datasets(part))
    samples = [v for part in parts for batch in _batches(part) for v in batch.tolist()]
    assert sorted(samples) == list(range(24))

def test_a_rebuilt_seeded_shuffle_keeps_its_seed_pair():
    """A seeded shuffle rebuilt after the pipeline was built (here: in order,
    for a map with deterministic=False before it) took its seed pair anew
    from the global seed of then: with `keras.utils.set_random_seed` called
    after the dataset was built (for the model), the ranks trained on
    another order than serial Keras with the same seeds."""
    import keras

    def make():
        return tf.data.Dataset.range(20).map(lambda v: v, num_parallel_calls=2,
                                             deterministic=False).shuffle(20, seed=1).batch(5)

    datasets = [make() for _ in range(3)]  # one per "process"
    keras.utils.set_random_seed(0)
    try:
        parts = [_batches(distribute_dataset(datasets[r + 1], rank=r, size=2).dataset)
                 for r in range(2)]
        for step, batch in enumerate(_batches(datasets[0])):
            assert np.concatenate([p[step] for p in parts]).tolist() == batch.tolist()
    finally:
        tf.random.set_seed(None)


def test_structures_are_sliced_alike():
    x = np.arange(12, dtype="float32").reshape(6, 2)
    ds = tf.data.Dataset.from_tensor_slices(({"a": x, "b": x[:, 0]}, np.arange(6))).batch(6)
    (features, labels), = distribute_dataset(ds, rank=1, size=2).dataset
    np.testing.assert_array_equal(features["a"], x[3:])
    np.testing.assert_array_equal(labels, [3, 4, 5])
    # ragged and sparse components: the same rows (a SparseTensor is not subscriptable)
    ragged = tf.ragged.constant([[1], [2, 3], [4], [5, 6, 7], [8], []])
    ds = tf.data.Dataset.from_tensor_slices((ragged, tf.sparse.from_dense(x))).batch(6)
    (r, sp), = distribute_dataset(ds, rank=1, size=2).dataset
    assert r.to_list() == [[5, 6, 7], [8], []]
    np.testing.assert_array_equal(tf.sparse.to_dense(sp), x[3:])


def test_unseeded_shuffle_is_seeded_alike():
    def pipeline():
        tf.random.set_seed(None)
        return tf.data.Dataset.range(50).shuffle(50).map(lambda i: i + 1).batch(5)

    a = _batches(seed_unseeded_shuffles(pipeline()))
    b = _batches(seed_unseeded_shuffles(pipeline()))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_unseeded_shuffle_under_padded_batch_interleave_flat_map_or_cache_is_seeded():
    """The original Tarantella seeded an unseeded shuffle followed by padded_batch,
    interleave, flat_map or unbatch (its docs' Transformer pipeline pads its batches),
    and promised to distribute any dataset; these were refused here, asking for a seed
    (unbatch too: the internal ops tf.data puts before it stopped the rebuild).
    Two pipelines stand for two processes: each draws its own order unless seeded."""
    def pipeline(kind):
        tf.random.set_seed(None)
        ds = tf.data.Dataset.range(40).shuffle(40)
        one = lambda i: tf.data.Dataset.from_tensors(i)  # noqa: E731
        return {"padded_batch": lambda: ds.map(lambda i: tf.fill([i % 3 + 1], i)).padded_batch(6),
                "flat_map": lambda: ds.flat_map(one).batch(6),
                "interleave": lambda: ds.interleave(one, cycle_length=2, block_length=2).batch(6),
                "parallel_interleave": lambda: ds.interleave(one, cycle_length=2, num_parallel_calls=2,
                                                             deterministic=False).batch(6),
                "cache": lambda: ds.cache().batch(6),
                "unbatch": lambda: ds.batch(4).unbatch().batch(6)}[kind]()

    for kind in ("padded_batch", "flat_map", "interleave", "parallel_interleave", "cache", "unbatch"):
        parts = [_batches(distribute_dataset(pipeline(kind), rank=r, size=2).dataset) for r in range(2)]
        # every sample once in the epoch (a padded row's sample is its largest value)
        samples = sorted(int(np.max(row, initial=0)) for part in parts for batch in part for row in batch)
        assert samples == list(range(40)), (kind, samples)


def test_unbatched_dataset_without_micro_batch_size_is_refused():
    with pytest.raises(ValueError, match="not batched.*tnt_micro_batch_size"):
        distribute_dataset(tf.data.Dataset.range(10), rank=0, size=2)
    # elements that may be whole batches (every component's first dimension 6): the error
    # said only to batch them, which made batches of batches; it says how to declare them
    x, y = np.zeros((4, 6, 3), "float32"), np.zeros((4, 6), "int32")
    with pytest.raises(ValueError, match=r"If each element is a global batch of 6 samples "
                                         r"already.*as None.*unbatch\(\).batch\(6\)"):
        distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)), rank=0, size=2)
    with pytest.raises(ValueError) as refused:  # scalars: plainly samples, no such hint
        distribute_dataset(tf.data.Dataset.range(10), rank=0, size=2)
    assert "already" not in str(refused.value)


def test_micro_batch_size_with_samples_of_unknown_length_is_refused():
    """Token sequences with per-token labels, unbatched: every component's
    first dimension is unknown, which is taken for a generator's batches.
    tnt_micro_batch_size was ignored without a word and each sequence cut
    along its time axis between the ranks; it is now refused, saying how to
    batch them (padded_batch / ragged_batch with the global batch)."""
    seqs = [np.arange(n, dtype="int64") for n in (3, 5, 2, 4)]
    spec = tf.TensorSpec([None], tf.int64)
    ds = tf.data.Dataset.from_generator(lambda: ((s, s % 2) for s in seqs),
                                        output_signature=(spec, spec))
    with pytest.raises(ValueError, match=r"tnt_micro_batch_size=2 says that the dataset is not "
                                         r"batched.*padded_batch\(4\)"):
        distribute_dataset(ds, micro_batch_size=2, rank=0, size=2)
    batched = [_batches(distribute_dataset(ds.padded_batch(4), micro_batch_size=2, rank=r,
                                           size=2).dataset) for r in range(2)]
    assert [len(b[0][0]) for b in batched] == [2, 2]  # one global batch of 4 sequences
    distribute_dataset(ds, rank=0, size=2)  # without it: taken for a generator's batches


def test_micro_batch_size_inconsistent_with_global_batch_is_refused():
    with pytest.raises(ValueError, match=r"Received: tnt_micro_batch_size=3, batch_size=8 \(ranks=2\)"):
        distribute_dataset(tf.data.Dataset.range(16).batch(8), micro_batch_size=3, rank=0, size=2)
    distribute_dataset(tf.data.Dataset.range(16).batch(9), micro_batch_size=5, rank=0, size=2)


def test_micro_batch_size_is_checked_against_a_batch_size_read_only_when_running():
    """A batch op whose size was not read (rebatch: its sizes are a list)
    skipped the check of tnt_micro_batch_size without a word: the ranks trained
    on global batches of another size than it said. rebatch(n)'s size is now
    read; sizes that differ (or one computed in a graph) refuse it, saying to
    leave it out."""
    rebatched = tf.data.Dataset.range(20).batch(8).rebatch(4)  # global batches of 4
    with pytest.raises(ValueError, match=r"tnt_micro_batch_size=4, batch_size=4 \(ranks=2\)"):
        distribute_dataset(rebatched, micro_batch_size=4, rank=0, size=2)
    d = distribute_dataset(rebatched, micro_batch_size=2, rank=1, size=2)
    assert (d.global_batch_size, d.micro_batch_size) == (4, 2)
    assert [list(b) for b in _batches(d.dataset)][:2] == [[2, 3], [6, 7]]
    cycled = tf.data.Dataset.range(20).batch(8).rebatch([4, 6])
    with pytest.raises(ValueError, match=r"tnt_micro_batch_size=2 cannot be checked.*not known "
                                         r"before it runs.*Leave out tnt_micro_batch_size"):
        distribute_dataset(cycled, micro_batch_size=2, rank=0, size=2)
    # without it, the dataset's own batches are the global batches, of whatever size
    parts = [_batches(distribute_dataset(cycled, rank=r, size=2).dataset) for r in range(2)]
    assert [len(np.concatenate(pair)) for pair in zip(*parts)] \
        == [len(b) for b in _batches(cycled)] == [4, 6, 4, 6]
    # concatenated datasets: the sizes of both parts (the first alone was read: 4 passed here)
    mixed = tf.data.Dataset.range(8).batch(4).concatenate(tf.data.Dataset.range(16).batch(8))
    with pytest.raises(ValueError, match=r"tnt_micro_batch_size=2 cannot be checked"):
        distribute_dataset(mixed, micro_batch_size=2, rank=0, size=2)
    alike = tf.data.Dataset.range(8).batch(4).concatenate(tf.data.Dataset.range(8).batch(4))
    assert distribute_dataset(alike, micro_batch_size=2, rank=0, size=2).global_batch_size == 4
    # sparse_batch is a batch op (it was refused as samples of unknown length)
    sparse = tf.data.Dataset.range(10).map(lambda x: tf.fill([x % 3 + 1], x)).sparse_batch(4, [5])
    parts = [distribute_dataset(sparse, micro_batch_size=2, rank=r, size=2).dataset for r in range(2)]
    assert [tf.sparse.to_dense(b)[:, 0].numpy().tolist() for b in parts[1]] == [[2, 3], [6, 7], [9]]


def _model():
    keras.utils.set_random_seed(0)
    model = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_generators_are_refused_with_a_clear_error():
    def gen():
        yield np.zeros((2, 4)), np.zeros((2, 2))

    with pytest.raises(TypeError, match="generators.*tf.data.Dataset"):
        _model().fit(gen(), epochs=1, verbose=0)


def test_a_compiled_model_wrapped_uncompiled_says_to_compile_the_wrapper(tmp_path):
    """keras.models.load_model returns a compiled model; wrapped, it is not
    compiled for data parallelism, and the error says so and what to do
    (Keras' own message said to call compile(), which the user had done)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.save(tmp_path / "m.keras")
    wrapped = tnt.Model(keras.models.load_model(tmp_path / "m.keras"))
    with pytest.raises(ValueError, match=r"Call compile\(\) on the tnt.Model before fit\(\).*"
                                         r"tnt.models.load_model"):
        wrapped.fit(np.zeros((4, 3)), np.zeros((4, 2)), verbose=0)
    with pytest.raises(ValueError, match="You must call `compile"):  # a model never compiled
        tnt.Model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])).evaluate(
            np.zeros((4, 3)), np.zeros((4, 2)), verbose=0)


def test_batch_size_with_a_dataset_is_refused():
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 4)), np.zeros((8, 2)))).batch(4)
    with pytest.raises(ValueError, match="batch_size"):
        _model().fit(ds, batch_size=4, verbose=0)


def test_micro_batch_size_without_distribution_is_refused():
    """tnt_distribute_dataset=False uses each rank's data as given: a
    tnt_micro_batch_size beside it was ignored without a word (an unbatched
    dataset then failed in Keras on "shape with unknown rank")."""
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 4)), np.zeros((8, 2))))
    model = _model()
    calls = {
        "fit": lambda: model.fit(ds, tnt_micro_batch_size=2, tnt_distribute_dataset=False,
                                 verbose=0),
        "evaluate": lambda: model.evaluate(ds, tnt_micro_batch_size=2, tnt_distribute_dataset=False,
                                           verbose=0),
        "predict": lambda: model.predict(ds.map(lambda a, b: a), tnt_micro_batch_size=2,
                                         tnt_distribute_dataset=False, verbose=0)}
    for what, call in calls.items():
        with pytest.raises(ValueError, match=rf"tnt.Model.{what}: tnt_micro_batch_size has no "
                                             r"effect with tnt_distribute_dataset=False.*"
                                             r"dataset.batch\(2\)"):
            call()
    with pytest.raises(ValueError, match=r"tnt_validation_micro_batch_size has no effect with "
                                         r"tnt_distribute_validation_dataset=False"):
        model.fit(ds.batch(4), validation_data=ds, tnt_validation_micro_batch_size=2,
                  tnt_distribute_validation_dataset=False, verbose=0)


def test_validation_sizes_are_honoured_and_named():
    """Validation arrays with tnt_validation_micro_batch_size alone were batched
    like x all the same (a ValueError that the micro-batch did not match a
    validation batch size the user never gave); the errors about validation
    sizes said `batch_size` where the user gave `validation_batch_size`."""
    x, y = np.zeros((12, 4), "float32"), np.zeros((12, 2), "float32")
    steps = []

    class Count(keras.callbacks.Callback):
        def on_test_batch_end(self, batch, logs=None):
            steps.append(batch)

    model = _model()
    model.fit(x, y, batch_size=8, validation_data=(x, y), tnt_validation_micro_batch_size=3,
              callbacks=[Count()], verbose=0)
    assert len(steps) == 4  # 12 samples in validation batches of 3 (1 rank)
    with pytest.raises(ValueError, match=r"Do not pass `validation_batch_size` with a "
                                         r"tf.data.Dataset.*Received: validation_batch_size=4"):
        model.fit(x, y, batch_size=8, validation_batch_size=4, verbose=0,
                  validation_data=tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    with pytest.raises(ValueError, match=r"must equal validation_batch_size.*"
                                         r"tnt_validation_micro_batch_size=3, validation_batch_size=4"):
        model.fit(x, y, batch_size=8, validation_data=(x, y), validation_batch_size=4,
                  tnt_validation_micro_batch_size=3, verbose=0)


def test_ftrl_is_accepted():
    """Keras 3's Ftrl updates from the gradient it is given (the averaged one):
    exact on N ranks (scenarios.py, mlp_ftrl); it used to be refused."""
    assert isinstance(tnt.DistributedOptimizer(keras.optimizers.Ftrl()), keras.optimizers.Ftrl)
    model = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    model.compile(optimizer="ftrl", loss="mse")
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), verbose=0)


def test_distributed_optimizer_keeps_its_type_and_saves_as_keras():
    opt = tnt.DistributedOptimizer(keras.optimizers.Adam(0.01))
    assert isinstance(opt, keras.optimizers.Adam) and type(opt).__name__ == "Adam"
    assert keras.saving.serialize_keras_object(opt)["class_name"] == "Adam"


def test_a_registered_class_is_saved_under_its_registered_name_once_swapped(tmp_path):
    """Tarantella swaps the class of an optimizer (of layers, metrics, the
    compiled loss: class_swap) for a subclass named alike. A class registered
    with register_keras_serializable was then saved under its bare name
    ("RegisteredAdam", not "tnt_test>RegisteredAdam"), and
    keras.saving.load_model failed: Could not locate class 'RegisteredAdam'."""
    from tarantella.tensorflow import class_swap

    @keras.saving.register_keras_serializable(package="tnt_test")
    class RegisteredAdam(keras.optimizers.Adam):
        pass

    @keras.saving.register_keras_serializable(package="tnt_test")
    class RegisteredDropout(keras.layers.Dropout):
        pass

    layer = RegisteredDropout(0.5)
    expected = keras.saving.serialize_keras_object(layer)
    layer.__class__ = class_swap.subclass(RegisteredDropout, {})
    assert keras.saving.serialize_keras_object(layer) == expected
    assert type(keras.saving.deserialize_keras_object(expected)) is RegisteredDropout
    model = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)]))
    model.compile(optimizer=RegisteredAdam(0.1), loss="mse")
    model.fit(np.ones((8, 4), "float32"), np.zeros((8, 5), "float32"), batch_size=4, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    plain = keras.saving.load_model(path)
    assert type(plain.optimizer) is RegisteredAdam and int(plain.optimizer.iterations) == 2


def _log_messages(level=logging.INFO):
    """Tarantella's messages of `level`, read from its logger's records (its own handler writes
    to the sys.stderr of its configuration: an earlier test's capture, in a full run), the
    logger set to `level` (an earlier test may have set another); the second value restores it."""
    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno == level:
                records.append(record.getMessage())

    from tarantella.common.logging import get_logger

    handler = Catch(level=level)
    logger = get_logger()  # configured (from TNT_LOG_LEVEL) before the level is set
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(level)
    return records, lambda: (logger.removeHandler(handler), logger.setLevel(previous))


def test_parallel_strategy_values():
    """The original's flags: DATA and ALL (without pipeline partitions, said
    at INFO) train data-parallel; anything asking for pipeline stages is a
    clear error."""
    S = tnt.ParallelStrategy

    def plain():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

    def split():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                 tnt.keras.layers.SplitLayer(), keras.layers.Dense(2)])

    assert S.ALL == S.DATA | S.PIPELINING and S.NONE.value == 0
    records, restore = _log_messages()
    try:
        for strategy, said in ((S.DATA, False), ("data", False), (S.ALL, True), ("ALL", True),
                               (S.DATA | S.PIPELINING, True)):
            records.clear()
            model = tnt.Model(plain(), parallel_strategy=strategy)
            assert model.parallel_strategy == S.DATA
            assert any("no pipeline partitions" in m and "data-parallel" in m
                       for m in records) == said, (strategy, records)
        model = tnt.Model(split(), parallel_strategy=S.DATA)  # a SplitLayer only passes through
        model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((4, 4)), np.ones((4, 2)), verbose=0)
    finally:
        restore()
    for strategy, kwargs in ((S.PIPELINING, {}), ("pipelining", {}), (S.ALL, {"split": True}),
                             (S.PIPELINING, {"split": True}), (S.DATA, {"num_pipeline_stages": 2}),
                             (S.ALL, {"num_pipeline_stages": 2})):
        model = split() if kwargs.pop("split", False) else plain()
        with pytest.raises(NotImplementedError, match="[Pp]ipelining is not available yet"):
            tnt.Model(model, parallel_strategy=strategy, **kwargs)
    with pytest.raises(ValueError, match="NONE"):
        tnt.Model(plain(), parallel_strategy=S.NONE)
    with pytest.raises(ValueError, match="DATA, PIPELINING, ALL"):
        tnt.Model(plain(), parallel_strategy="model")


def _functional():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 1), name="image")
    h = keras.layers.Conv2D(2, 3, name="conv1")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(inputs, keras.layers.Dense(3, activity_regularizer="l2")(h), name="net")


@keras.saving.register_keras_serializable(package="tnt_test")
class Subclassed(keras.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)

    def call(self, inputs):
        return self.dense(inputs)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_subclassed_model_without_build_or_mask_is_built_by_keras():
    """call(self, inputs) alone, no build(): Keras builds it by a symbolic call
    (no "build() was called ... unbuilt state" warning, as for the plain model)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = tnt.Model(Subclassed(units=2))
        model(np.ones((1, 3), "float32"))  # built by its first call, as a plain model is
        model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2)), batch_size=2, verbose=0)
    assert model.model.dense.built and len(model.weights) == 2
    assert not [w for w in caught if "build()" in str(w.message)], [str(w.message) for w in caught]


def test_model_surface_is_the_wrapped_models(capsys):
    inner = _functional()
    model = tnt.Model(inner)
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x = np.ones((4, 6, 6, 1), "float32")
    model.fit(x, np.zeros((4, 3)), verbose=0)
    model(x)  # the activity regularizer's loss
    assert model.input is inner.input and model.output is inner.output
    same_objects = ["layers", "inputs", "outputs", "weights",
                    "trainable_weights", "non_trainable_weights", "variables",
                    "trainable_variables", "non_trainable_variables", "metrics"]
    for name in same_objects:
        mine, theirs = getattr(model, name), getattr(inner, name)
        assert len(mine) == len(theirs) > 0 and all(a is b for a, b in zip(mine, theirs)), name
    for name in ["metrics_names", "name", "trainable", "dtype", "input_shape", "output_shape"]:
        assert getattr(model, name) == getattr(inner, name), name
    assert model.metrics_names == ["loss", "compile_metrics"]
    assert len(model.losses) == len(inner.losses) == 1
    np.testing.assert_allclose(model.losses[0], inner.losses[0])
    assert repr(model.input_spec) == repr(inner.input_spec) != "None"
    assert model.get_layer("conv1") is inner.get_layer("conv1") is model.get_layer(index=1)
    assert model.compute_output_shape((None, 6, 6, 1)) == inner.compute_output_shape((None, 6, 6, 1))
    assert model.count_params() == inner.count_params()
    masked = keras.Sequential([keras.Input((3,)), keras.layers.Masking(0.0)])
    x_masked = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], "float32")
    np.testing.assert_array_equal(tnt.Model(masked).compute_mask(x_masked, None),
                                  masked.compute_mask(x_masked, None))
    capsys.readouterr()
    model.summary()
    mine = capsys.readouterr().out
    inner.summary()
    assert mine == capsys.readouterr().out and "conv1" in mine


def test_config_and_json_are_the_wrapped_models():
    """Config in, config out, as in Keras: tnt.Model.from_config and
    tnt.models.model_from_config(model.get_config()) (the seed docs' example)."""
    for build in (_functional, lambda: keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)], name="seq")):
        inner = build()
        model = tnt.Model(inner)
        config = model.get_config()
        assert config == inner.get_config() and model.to_json() == inner.to_json()
        serialized = keras.saving.serialize_keras_object(inner)
        for rebuilt, keras_rebuilt in (
                (tnt.Model.from_config(config), type(inner).from_config(copy.deepcopy(config))),
                (tnt.models.model_from_config(config), type(inner).from_config(copy.deepcopy(config))),
                (tnt.models.model_from_json(model.to_json()),
                 keras.models.model_from_json(inner.to_json())),
                (tnt.models.model_from_config(serialized),
                 keras.saving.deserialize_keras_object(serialized))):
            assert isinstance(rebuilt, tnt.Model) and type(rebuilt.model) is type(inner)
            assert rebuilt.get_config() == keras_rebuilt.get_config()
            assert rebuilt.to_json() == keras_rebuilt.to_json() == inner.to_json()
        clone = keras.models.clone_model(model)
        assert isinstance(clone, tnt.Model) and clone.get_config() == config
    inner = Subclassed(units=5, name="sub")
    model = tnt.Model(inner)
    assert model.get_config() == inner.get_config()
    rebuilt = tnt.models.model_from_config(keras.saving.serialize_keras_object(inner))
    assert isinstance(rebuilt.model, Subclassed) and rebuilt.get_config() == inner.get_config()
    with pytest.raises(ValueError, match=r"Subclassed.from_config|MyModel.from_config"):
        tnt.Model.from_config(model.get_config())  # names no class: a clear error


def test_sequential_is_a_tnt_model_over_keras_sequential():
    model = tnt.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="seq")
    assert isinstance(model, tnt.Model) and isinstance(model.model, keras.Sequential)
    model.add(keras.layers.Dense(2))
    assert [type(l).__name__ for l in model.layers] == ["Dense", "Dense"]
    config = model.get_config()
    assert config == model.model.get_config()
    rebuilt = tnt.Sequential.from_config(config)
    assert type(rebuilt) is tnt.Sequential and rebuilt.get_config() == config
    assert keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(model)).get_config() == config
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(np.ones((8, 4)), np.zeros((8, 2)), batch_size=4, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    popped = model.pop()
    assert isinstance(popped, keras.layers.Dense) and len(model.layers) == 1
    with pytest.raises(ValueError, match="Sequential"):
        tnt.Sequential.from_config(_functional().get_config())


def test_a_checkpoint_folder_another_rank_made_meanwhile_is_taken_as_made(tmp_path, monkeypatch):
    """ModelCheckpoint runs on every rank and makes its missing folder with
    `if not exists: makedirs`: the other rank may make it between the two
    (stood in for by an exists that answers before the other rank's makedirs).
    That rank's fit failed with FileExistsError; it goes on. A file where the
    folder should be still fails, as in Keras."""
    from keras.src.utils import file_utils

    folder = tmp_path / "checkpoints"
    folder.mkdir()  # the other rank's makedirs
    monkeypatch.setattr(file_utils, "exists", lambda path: os.fspath(path) != os.fspath(folder)
                        and os.path.exists(path))
    model = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
    model.fit(x, y, epochs=1, verbose=0,
              callbacks=[keras.callbacks.ModelCheckpoint(str(folder / "m.keras"))])
    assert os.listdir(folder) == ["m.keras"]
    (tmp_path / "a_file").write_text("")
    with pytest.raises(FileExistsError):
        file_utils.makedirs(str(tmp_path / "a_file"))


def test_a_checkpoint_folder_whose_file_system_has_no_locks_is_written_with_a_warning(tmp_path, monkeypatch):
    """Ranks of several hosts lock a file in a tf.train.Checkpoint's folder
    (checkpoint_writes.py; test_keras_multihost.py shows the order). On a file
    system without locks (an NFS without lockd, Lustre without flock) flock
    fails: the save goes on, ordered per host only, with one warning per
    folder that says so. A lock held meanwhile is waited for, not warned."""
    import errno
    import fcntl

    from tarantella.tensorflow import checkpoint_writes

    prefix = str(tmp_path / "ckpt")
    fd = checkpoint_writes._folder_lock(fcntl.LOCK_EX, prefix)  # a file system with locks
    assert fd is not None and os.path.exists(tmp_path / checkpoint_writes.FOLDER_LOCK)
    os.close(fd)
    flock = fcntl.flock

    def no_locks(fd, kind):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    records, restore = _log_messages(logging.WARNING)
    try:
        assert checkpoint_writes._folder_lock(fcntl.LOCK_EX, prefix) is None
        assert checkpoint_writes._folder_lock(fcntl.LOCK_SH, prefix) is None
    finally:
        restore()
    said = "\n".join(records)
    assert said.count("has no locks (No locks available)") == 1, said
    assert "Save on the master only" in said
    monkeypatch.setattr(fcntl, "flock", flock)
    held = os.open(tmp_path / checkpoint_writes.FOLDER_LOCK, os.O_RDWR)
    flock(held, fcntl.LOCK_EX)
    monkeypatch.setenv("TNT_BUSY_TIMEOUT_S", "0.3")
    with pytest.raises(TimeoutError, match="a rank of another host has held"):
        checkpoint_writes._folder_lock(fcntl.LOCK_SH, prefix)
    os.close(held)


def test_saved_files_are_plain_keras_files(tmp_path):
    """A tnt.Model saves the wrapped model, compiled, with its optimizer state:
    plain Keras loads it; tnt.models.load_model wraps it again."""
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 5), "float32")
    for inner in (keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)]), Subclassed(units=5)):
        model = tnt.Model(inner)
        model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse")
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        path = str(tmp_path / "m.keras")
        model.save(path)
        plain = keras.saving.load_model(path)
        assert type(plain) is type(inner) and type(plain.optimizer).__name__ == "Adam"
        assert int(plain.optimizer.iterations) == 4
        loaded = tnt.models.load_model(path)
        assert isinstance(loaded, tnt.Model) and type(loaded.model) is type(inner)
        for a, b in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
        model.fit(x, y, batch_size=4, verbose=0)
        loaded.fit(x, y, batch_size=4, verbose=0)  # the optimizer state came back too
        for a, b in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
        weights = str(tmp_path / "m.weights.h5")
        model.save_weights(weights)
        fresh = keras.models.clone_model(inner)
        fresh(x)
        fresh.load_weights(weights)  # a plain model reads the weights file
        for a, b in zip(fresh.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)


def test_load_model_compiles_with_the_custom_objects_it_is_given(tmp_path):
    """tnt.models.load_model(path, custom_objects=...) of a model compiled with
    a loss function of the user's: Keras loaded it, then tnt compiled the
    wrapper from the compile config without the custom objects ("Could not
    locate function 'squared'"), where keras.saving.load_model loads it."""

    def squared(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

    model = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(5)]))
    model.compile(optimizer=keras.optimizers.Adam(0.1), loss=squared)
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 5), "float32")
    model.fit(x, y, batch_size=4, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = tnt.models.load_model(path, custom_objects={"squared": squared})
    assert loaded.loss is squared and int(loaded.optimizer.iterations) == 2
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(model.evaluate(x, y, verbose=0))


def test_a_job_stopped_between_a_backups_two_renames_resumes_as_a_run_never_stopped(
        tmp_path, monkeypatch):
    """BackupAndRestore renames the new weights into place, then the new
    training_metadata.json: a job stopped between the two left the weights of
    epoch 3 under the metadata of epoch 2, and the resumed run trained the
    third epoch again, ending with other weights than a run never stopped.
    The weights file now holds its own epoch."""
    from tarantella.tensorflow.keras.callbacks import backup_and_restore

    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x @ np.ones((4, 2), "float32")
    fit = dict(batch_size=8, epochs=4, shuffle=False, verbose=0)
    never_stopped = _model()
    never_stopped.fit(x, y, **fit)
    folder = str(tmp_path / "backup")
    write_text = backup_and_restore._write_text_atomically

    def stopped_at_the_third(path, text):
        if json.loads(text)["epoch"] == 3:
            raise KeyboardInterrupt("stopped between the renames")
        write_text(path, text)

    monkeypatch.setattr(backup_and_restore, "_write_text_atomically", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        _model().fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(folder)])
    monkeypatch.setattr(backup_and_restore, "_write_text_atomically", write_text)
    resumed = _model()
    history = resumed.fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(folder)])
    assert history.epoch == [3]
    for a, b in zip(resumed.get_weights(), never_stopped.get_weights()):
        np.testing.assert_array_equal(a, b)
    # the marked file is still a plain Keras weights file
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    stopped = str(tmp_path / "again")
    monkeypatch.setattr(backup_and_restore, "_write_text_atomically", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        _model().fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(stopped)])
    plain.load_weights(os.path.join(stopped, "latest.weights.h5"))


def test_callback_rules():
    with pytest.raises(ValueError, match="every rank"):
        tnt.keras.callbacks.Callback(keras.callbacks.EarlyStopping(), run_on_all_ranks=False)
    # it restores the weights and the epoch: on the master only, the ranks would train apart
    with pytest.raises(ValueError, match="BackupAndRestore must run on every rank"):
        tnt.keras.callbacks.Callback(keras.callbacks.BackupAndRestore("/tmp/x"), run_on_all_ranks=False)
    # callbacks that decide from their logs, on every rank, with each rank's own logs: they
    # acted apart (a save_best_only checkpoint saved on one rank, whose save waited for the
    # others until TNT_TIMEOUT_S; a learning rate reduced on some ranks)
    for decides in (keras.callbacks.EarlyStopping(), keras.callbacks.ReduceLROnPlateau(),
                    keras.callbacks.TerminateOnNaN(),
                    keras.callbacks.ModelCheckpoint("/tmp/x.keras", save_best_only=True)):
        with pytest.raises(ValueError, match="aggregate_logs=False each rank would decide"):
            tnt.keras.callbacks.Callback(decides, aggregate_logs=False)
    alone = keras.callbacks.ModelCheckpoint("/tmp/x.keras", save_best_only=True)
    assert not tnt.keras.callbacks.Callback(alone, aggregate_logs=False,
                                            run_on_all_ranks=False).aggregate_logs
    assert not tnt.keras.callbacks.Callback(keras.callbacks.ModelCheckpoint("/tmp/x.keras"),
                                            aggregate_logs=False).aggregate_logs
    history = keras.callbacks.History()
    wrapped = tnt.keras.callbacks.Callback(history, aggregate_logs=False)
    assert wrapped is history and isinstance(wrapped, keras.callbacks.History)
    assert isinstance(wrapped, tnt.keras.callbacks.Callback) and not wrapped.aggregate_logs
    # run_on_all_ranks unset: where tnt.Model runs the callback unwrapped. The writers of the
    # job's one file, stream or progress bar on the master only: wrapped with the default,
    # CSVLogger ran on every rank, each writing the same file (lines of both ranks mixed with
    # aggregate_logs=False); the original Tarantella ran them on one rank
    wrap = tnt.keras.callbacks.Callback
    assert [wrap(cb).run_on_all_ranks for cb in (
        keras.callbacks.CSVLogger("/tmp/x.csv"), keras.callbacks.RemoteMonitor(),
        keras.callbacks.TensorBoard("/tmp/x"), keras.callbacks.ProgbarLogger())] == [False] * 4
    assert [wrap(cb).run_on_all_ranks for cb in (
        keras.callbacks.History(), keras.callbacks.ModelCheckpoint("/tmp/x.keras"),
        keras.callbacks.EarlyStopping())] == [True] * 3
    assert wrap(keras.callbacks.CSVLogger("/tmp/x.csv"), run_on_all_ranks=True).run_on_all_ranks


def test_wrapper_behaves_like_the_model(tmp_path):
    model = _model()
    assert [l.name for l in model.layers] == [l.name for l in model.model.layers]
    assert model.outputs[0].shape == (None, 2) and model.get_layer(index=0) is model.layers[0]
    x = np.ones((3, 4), "float32")
    np.testing.assert_allclose(model(x), model.model(x))
    history = model.fit(x, np.zeros((3, 2)), batch_size=2, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def test_one_rank_matches_keras_exactly():
    x = np.random.default_rng(0).normal(size=(50, 4)).astype("float32")
    y = x @ np.ones((4, 2), "float32")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    plain.compile(optimizer="adam", loss="mse")
    plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    model = _model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)  # one rank: bitwise what Keras computes


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "m.keras"
    path.write_text("good")

    def failing(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_save(str(path), failing)
    assert path.read_text() == "good" and os.listdir(tmp_path) == ["m.keras"]



def test_a_save_writes_through_a_link_and_keeps_the_files_permissions(tmp_path, monkeypatch):
    """Keras' own save rewrites its file in place: through a symbolic link
    (to its target), with the file's mode and group kept, and refused for a
    read-only file. tnt's rename replaced the link with a new file in the
    link's folder (the target kept the old model), made the file 0644 where
    it was 0640, and replaced a read-only file without a word."""
    store = tmp_path / "store"
    store.mkdir()
    model = _model()
    for name, save, load in (
            ("m.keras", model.save, lambda p: keras.saving.load_model(p).get_weights()),
            ("m.weights.h5", model.save_weights, None)):
        target, link = store / name, tmp_path / name
        save(str(target))
        link.symlink_to(target)
        model.set_weights([w + 1 for w in model.get_weights()])
        save(str(link))
        assert link.is_symlink() and os.path.samefile(link, target), name
        if load is not None:
            np.testing.assert_array_equal(load(str(target))[0], model.get_weights()[0])
        os.chmod(target, 0o640)
        save(str(link))
        assert oct(os.stat(target).st_mode & 0o777) == oct(0o640), name
    assert sorted(os.listdir(store)) == ["m.keras", "m.weights.h5"]
    assert sorted(os.listdir(tmp_path)) == ["m.keras", "m.weights.h5", "store"]
    # read-only for this process (root may write anything: pretend it is not root)
    path = store / "m.keras"
    before = path.read_bytes()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if os.fspath(p) == str(path) and mode == os.W_OK else real_access(p, mode, **kw)))
    with pytest.raises(PermissionError, match="read-only"):
        model.save(str(path))
    assert path.read_bytes() == before and sorted(os.listdir(store)) == ["m.keras", "m.weights.h5"]


def _directory_saves(*names):
    """(name, save) of Keras' three directory saves of a trained tnt.Model: export,
    save(zipped=False) and tf.saved_model.save, each under the name given for it."""
    model = _model()
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 2), "float32"), verbose=0)
    return zip(names, (lambda p: model.export(p, verbose=False), lambda p: model.save(p, zipped=False),
                       lambda p: tf.saved_model.save(model, p)))


def test_a_directory_save_over_a_file_fails_and_keeps_the_file(tmp_path):
    """Keras' own directory saves (export, zipped=False) fail where a file is in
    the directory's place. tnt's exchange swapped the directory in and removed
    the file: `model.export("model.keras")` deleted the user's saved model."""
    for name, save in _directory_saves("m.keras", "m", "s"):
        path = tmp_path / name
        path.write_text("the user's file")
        with pytest.raises(NotADirectoryError, match="a file of this name is in its place"):
            save(str(path))
        assert path.read_text() == "the user's file", name
    assert sorted(os.listdir(tmp_path)) == ["m", "m.keras", "s"]


def test_a_directory_save_into_a_folder_of_other_files_fails_and_keeps_them(tmp_path):
    """Keras' own directory saves (export, zipped=False, tf.saved_model.save)
    write into an existing directory and leave the files they do not write.
    tnt's exchanged the whole directory and removed the old one:
    `model.export(output_dir)` deleted the job's logs in it. Now refused;
    a directory of the save's own entries (a save before) is replaced."""
    for name, save in _directory_saves("export", "zipped", "saved"):
        path = tmp_path / name
        path.mkdir()
        save(str(path))  # into an empty directory
        saved = sorted(os.listdir(path))
        save(str(path))  # over the save before
        assert sorted(os.listdir(path)) == saved
        (path / "train_log.csv").write_text("epoch,loss")
        with pytest.raises(OSError, match="it holds train_log.csv, which this save does not write"):
            save(str(path))
        assert sorted(os.listdir(path)) == sorted(saved + ["train_log.csv"]), name
        assert (path / "train_log.csv").read_text() == "epoch,loss"
    assert sorted(os.listdir(tmp_path)) == ["export", "saved", "zipped"]


def test_a_save_to_a_long_name_succeeds_as_in_keras(tmp_path):
    """Keras saves to a name of up to 255 bytes; the temporary twin, longer by
    its mark, host and pid, failed with "File name too long" for a name of
    230 bytes. A long name's twin is shortened (a digest of the name keeps it
    apart from other targets' twins)."""
    model = _model()
    for name, save in (("m" * 240 + ".keras", model.save),
                       ("w" * 235 + ".weights.h5", model.save_weights),
                       ("d" * 240, lambda p: model.export(p, verbose=False))):
        for _ in range(2):  # a new file, then over it
            save(str(tmp_path / name))
    assert sorted(os.listdir(tmp_path)) == sorted(["m" * 240 + ".keras", "w" * 235 + ".weights.h5",
                                                   "d" * 240])
    keras.saving.load_model(str(tmp_path / ("m" * 240 + ".keras")))


def test_keras_save_model_of_a_tnt_model_refuses_overwrite_false_instead_of_asking(tmp_path):
    """keras.saving.save_model(tnt_model, path, overwrite=False) (and
    save_weights) of an existing file asked on the terminal, on every rank (under tntrun only rank 0 has a
    stdin: the others failed with an EOFError while rank 0 waited for an
    answer). It is tnt.Model.save's FileExistsError now, as for
    model.save(path, overwrite=False); a plain model is Keras' as before."""
    model = _model()
    path = str(tmp_path / "m.keras")
    model.save(path)
    before = open(path, "rb").read()
    model.set_weights([w + 1 for w in model.get_weights()])
    for save_model in (keras.saving.save_model, keras.models.save_model,
                       tf.keras.models.save_model):
        with pytest.raises(FileExistsError, match="overwrite=False"):
            save_model(model, path, overwrite=False)
    assert open(path, "rb").read() == before and os.listdir(tmp_path) == ["m.keras"]
    keras.saving.save_model(model, path)  # overwrite=True: replaced
    np.testing.assert_array_equal(keras.saving.load_model(path).get_weights()[0],
                                  model.get_weights()[0])
    plain = str(tmp_path / "plain.keras")
    keras.saving.save_model(model.model, plain)
    keras.saving.save_model(model.model, plain, overwrite=True)
    weights = str(tmp_path / "m.weights.h5")
    keras.saving.save_weights(model, weights)
    before = open(weights, "rb").read()
    with pytest.raises(FileExistsError, match="overwrite=False"):
        keras.saving.save_weights(model, weights, overwrite=False)
    assert open(weights, "rb").read() == before


def test_keras_load_weights_of_a_tnt_model_restores_the_optimizer_as_in_keras(tmp_path):
    """keras.saving.load_weights(tnt_model, path) walked the wrapper: the
    weights loaded, the optimizer's state did not ("the saved optimizer has 0
    variables"), where keras.saving.load_weights of the plain model (and
    tnt.Model.load_weights) restores it."""
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    model = _model()
    model.fit(x, x[:, :2], epochs=3, verbose=0)
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    other = _model()
    other.fit(x, x[:, :2], verbose=0)  # its optimizer built
    keras.saving.load_weights(other, path)
    assert int(other.optimizer.iterations) == int(model.optimizer.iterations)
    for a, b in zip(other.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(other.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_save_model_of_a_plain_model_keeps_a_file_when_overwrite_is_false(tmp_path):
    """tnt.models.save_model(keras_model, path, overwrite=False) wrote to a fresh
    temporary, where Keras' overwrite check never fires, and renamed it over
    the user's file."""
    path = str(tmp_path / "m.keras")
    plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    tnt.models.save_model(plain, path)
    before = open(path, "rb").read()
    plain.set_weights([w + 1 for w in plain.get_weights()])
    with pytest.raises(FileExistsError, match="overwrite=False"):
        tnt.models.save_model(plain, path, overwrite=False)
    assert open(path, "rb").read() == before and os.listdir(tmp_path) == ["m.keras"]
    tnt.models.save_model(plain, path)  # overwrite=True (the default) still replaces it
    np.testing.assert_array_equal(keras.saving.load_model(path).get_weights()[1],
                                  plain.get_weights()[1])

def test_sharded_weights_keep_the_names_of_their_shards(tmp_path):
    """save_weights(max_shard_size=...) writes NAME.weights.json and shards
    named after it, listed by name in it: written beside a temporary name, the
    shards were named after the temporary (hidden, left behind by every save)
    and the file did not load."""
    model = tnt.Model(keras.Sequential([keras.Input((100,)), keras.layers.Dense(1000),
                                        keras.layers.Dense(1000)]))
    path = str(tmp_path / "w.weights.json")
    for _ in range(2):
        model.save_weights(path, max_shard_size=0.004)  # 2 shards
        assert sorted(os.listdir(tmp_path)) == [
            "w.weights.json", "w_00000.weights.h5", "w_00001.weights.h5"]
    fresh = keras.Sequential([keras.Input((100,)), keras.layers.Dense(1000),
                              keras.layers.Dense(1000)])
    fresh.load_weights(path)  # plain Keras reads it
    for a, b in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_load_weights_restores_an_optimizer_state_saved_before_or_after_training(tmp_path):
    """load_weights builds an unbuilt optimizer first, so that a file saved
    after training restores its state (plain Keras skips it). A file saved
    before training holds the unbuilt optimizer's iterations and learning
    rate only: Keras then skipped those for the built optimizer ("it has 6
    variables whereas the saved optimizer has 2"), and the saved learning
    rate was lost, where plain Keras' load_weights restores it."""
    def model(lr=0.1):
        keras.utils.set_random_seed(1)
        m = tnt.Model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
        m.compile(optimizer=keras.optimizers.Adam(lr), loss="mse")
        return m

    saved = model()
    saved.optimizer.learning_rate.assign(0.05)
    path = str(tmp_path / "w.weights.h5")
    saved.save_weights(path)  # its optimizer not built
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = model()
        loaded.load_weights(path)
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.05)  # was 0.1
    saved.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), epochs=1, verbose=0)
    saved.save_weights(path)  # built: its whole state
    loaded = model()
    loaded.load_weights(path)
    for a, b in zip(loaded.optimizer.variables, saved.optimizer.variables):
        np.testing.assert_array_equal(a, b)
    assert int(loaded.optimizer.iterations) == 1
    assert "load_own_variables" not in vars(loaded.optimizer)  # Keras' own again


def test_an_interrupted_sharded_save_never_loads_a_mix_of_old_and_new_shards(tmp_path, monkeypatch):
    """The shards keep Keras' names, so a new sharded save replaced them one
    by one under the old NAME.weights.json: killed between two of those moves,
    the file loaded the new first shard with the old second one, without a
    word. The old file and its shards are now moved aside together first: a
    kill leaves no NAME, its load says where the old set is, and the next save
    puts it back whole."""
    from tarantella.tensorflow import atomic_save as module

    def model():
        return tnt.Model(keras.Sequential([keras.Input((100,)), keras.layers.Dense(1000),
                                           keras.layers.Dense(1000)]))

    saved = model()
    path = str(tmp_path / "w.weights.json")
    saved.save_weights(path, max_shard_size=0.004)  # 2 shards
    old = saved.get_weights()
    saved.set_weights([w + 1 for w in old])
    real_replace = os.replace

    def replace_then_die(src, dst):  # killed as the second new shard moves in
        if ".tnt-tmp-" in src and os.path.basename(dst) == "w_00001.weights.h5":
            raise _Killed()
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(_Killed):
        saved.save_weights(path, max_shard_size=0.004)
    monkeypatch.setattr(os, "replace", real_replace)
    gone = _gone_pid()  # that save's process is gone
    for name in os.listdir(tmp_path):
        if ".tnt-oldset-" in name:
            os.rename(tmp_path / name, tmp_path / f".w.tnt-oldset-{gone}.weights.json")
    with pytest.raises(FileNotFoundError, match=f"last good save is .*tnt-oldset-{gone}"):
        model().load_weights(path)  # loaded the new first shard and the old second one

    def failing(tmp):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        module.atomic_save(path, failing, siblings=True)  # puts the old set back first
    assert sorted(os.listdir(tmp_path)) == [
        "w.weights.json", "w_00000.weights.h5", "w_00001.weights.h5"]
    loaded = model()
    loaded.load_weights(path)
    for a, b in zip(loaded.get_weights(), old):
        np.testing.assert_array_equal(a, b)
    saved.save_weights(path, max_shard_size=0.004)  # and a whole save replaces it whole
    loaded.load_weights(path)
    for a, b in zip(loaded.get_weights(), saved.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert sorted(os.listdir(tmp_path)) == [
        "w.weights.json", "w_00000.weights.h5", "w_00001.weights.h5"]


def _gone_pid():
    """The pid of a process that has exited and been reaped."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def test_a_save_removes_stale_temporaries_of_its_target(tmp_path):
    """A save killed before its rename leaves `.NAME.tnt-tmp-<pid>.keras`: the
    next save of NAME removes those whose process is gone, and nothing else."""
    gone, gone_too = _gone_pid(), _gone_pid()
    stale = tmp_path / f".m.tnt-tmp-{gone}.keras"
    stale_dir = tmp_path / f".m.tnt-tmp-{gone_too}.keras"  # a directory: removed as a whole
    concurrent = tmp_path / f".m.tnt-tmp-{os.getppid()}.keras"  # a live process: a save in flight
    other_target = tmp_path / f".other.tnt-tmp-{gone}.keras"
    longer_name = tmp_path / f".m.tnt-tmp-{gone}.v2.keras"  # the temporary of m.v2.keras
    stale_dir.mkdir()
    for path in (stale, stale_dir / "model.weights.h5", concurrent, other_target, longer_name):
        path.write_text("half")
    _model().save(str(tmp_path / "m.keras"))
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["m.keras", concurrent.name, other_target.name, longer_name.name])


def test_a_save_leaves_the_temporaries_of_other_hosts_alone(tmp_path, monkeypatch):
    """Ranks on several hosts saving one target into a shared directory
    (tnt_save_all_devices=True): a temporary named by its pid alone was
    judged by every host, so another host removed a save in flight (its pid
    exists there only). Temporaries name their host; a save judges its own
    host's only (and the unnamed ones of earlier versions)."""
    import socket

    from tarantella.tensorflow.atomic_save import temporary_twin

    path = str(tmp_path / "m.keras")
    gone = _gone_pid()
    monkeypatch.setattr(socket, "gethostname", lambda: "other-host")
    in_flight = temporary_twin(path, pid=gone)  # alive there: its pid means nothing here
    aside = temporary_twin(str(tmp_path / "d"), pid=gone, mark=".tnt-old-")  # zipped=False's
    monkeypatch.undo()
    stale = temporary_twin(path, pid=gone)  # this host's, dead
    for name in (in_flight, stale):
        open(name, "w").write("half")
    os.mkdir(aside)
    _model().save(path)
    _model().save(str(tmp_path / "d"), zipped=False)
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["m.keras", "d", os.path.basename(in_flight), os.path.basename(aside)])


def _directory_writer(text):
    """A save_fn that writes a directory holding `text`, and records its inode."""
    written = {}

    def write(tmp):
        os.mkdir(tmp)
        with open(os.path.join(tmp, "content.txt"), "w") as f:
            f.write(text)
        written["inode"] = os.stat(tmp).st_ino

    return write, written


def _content(path):
    return open(os.path.join(path, "content.txt")).read()


def test_a_directory_save_swaps_the_directories_in_one_step(tmp_path, monkeypatch):
    """A directory (zipped=False, export) replaced the old one with two
    renames, the old one aside first: a save killed between them left no
    directory at the path. The directories are now exchanged in one step
    (renameat2 RENAME_EXCHANGE): after every rename the path holds a whole
    directory, the old one until the new one is there."""
    from tarantella.tensorflow import atomic_save as module

    path = str(tmp_path / "exported")
    os.mkdir(path)
    open(os.path.join(path, "content.txt"), "w").write("old")
    seen = []  # the path's content after each rename

    def watched(rename):
        def call(*args):
            result = rename(*args)
            seen.append(_content(path) if os.path.isdir(path) else None)
            return result
        return call

    monkeypatch.setattr(os, "replace", watched(os.replace))
    monkeypatch.setattr(os, "rename", watched(os.rename))
    if hasattr(module, "_exchange"):
        monkeypatch.setattr(module, "_exchange", watched(module._exchange))
    write, written = _directory_writer("new")
    atomic_save(path, write)
    assert seen == ["new"]  # one step, from the old directory to the new one
    assert os.stat(path).st_ino == written["inode"]  # moved in, not copied
    assert os.listdir(tmp_path) == ["exported"]  # the old one removed


class _Killed(BaseException):
    """A kill between two renames (no cleanup but the finally clauses)."""


def test_an_interrupted_directory_save_loses_nothing(tmp_path, monkeypatch):
    """Where the file system refuses the exchange, the old directory is moved
    aside as `.NAME.tnt-old-<pid>`, then the new one in: a save killed between
    the two leaves that directory and no target. The next save of the target
    puts it back before writing (a save that then fails leaves it at the
    path), and a load of the missing target says where it is; with the target
    there it is removed as stale. It was named `.NAME.tnt-tmp-<pid>.old`,
    never put back nor removed, and the load said "File format not
    supported"."""
    from tarantella.tensorflow import atomic_save as module

    path = str(tmp_path / "exported")
    os.mkdir(path)
    open(os.path.join(path, "content.txt"), "w").write("old")
    monkeypatch.setattr(module, "_exchange", lambda new, target: False, raising=False)
    real_replace, calls = os.replace, []

    def replace_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise _Killed()
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(_Killed):
        atomic_save(path, _directory_writer("new")[0])
    monkeypatch.setattr(os, "replace", real_replace)
    assert not os.path.exists(path)
    aside = [os.path.join(tmp_path, name) for name in os.listdir(tmp_path)]
    assert len(aside) == 1 and _content(aside[0]) == "old", aside
    gone = _gone_pid()  # that save's process is gone
    os.rename(aside[0], str(tmp_path / f".exported.tnt-old-{gone}"))
    with pytest.raises(FileNotFoundError, match=f"last good save is .*tnt-old-{gone}"):
        tnt.models.load_model(path)  # says where it is, instead of "File format not supported"

    def failing(tmp):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_save(path, failing)
    assert os.listdir(tmp_path) == ["exported"] and _content(path) == "old"  # put back
    # with the target in place, a dead save's old directory is stale: removed
    os.mkdir(tmp_path / f".exported.tnt-old-{gone}")
    live = tmp_path / f".exported.tnt-old-{os.getppid()}"  # a save in flight: left alone
    os.mkdir(live)
    atomic_save(path, _directory_writer("newer")[0])
    assert sorted(os.listdir(tmp_path)) == sorted(["exported", live.name])
    assert _content(path) == "newer"


def test_from_tensors_of_a_batch_counts_as_batched():
    ds = tf.data.Dataset.from_tensors((np.zeros((6, 3), "float32"), np.arange(6))).repeat(2)
    parts = [list(distribute_dataset(ds, rank=r, size=4).dataset)[0][1].numpy().tolist()
             for r in range(4)]
    assert parts == [[0, 1], [2, 3], [4], [5]]


def test_tarantellas_dataset_functions_are_not_converted_by_autograph(monkeypatch):
    """tf.data converts every map function with AutoGraph unless told not to;
    Tarantella's own (the rank's slice, the seeded order) are plain TensorFlow
    and skip it (a measurable part of a job's start, bench/startup.py). The
    user's map functions are still converted."""
    from tensorflow.python.autograph.impl import api

    from tarantella.tensorflow.data.array_dataset import array_dataset

    converted = []
    real = api._convert_actual

    def recording(entity, program_ctx):
        converted.append(getattr(entity, "__module__", "") or "")
        return real(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", recording)

    def user_map(i):
        return i * 2 if i > 0 else i  # Python control flow over a tensor: needs AutoGraph

    def pipeline():
        return tf.data.Dataset.range(10).map(user_map).batch(4)

    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    outputs = [list(distribute_dataset(pipeline(), rank=1, size=2).dataset),
               list(distribute_dataset(pipeline(), rank=1, size=2, slice_early=False).dataset),
               list(array_dataset((x,), 4, 1, 2)), list(array_dataset((x,), 4, 0, 1, shuffle=True))]
    assert [len(o) for o in outputs] == [3, 3, 3, 3]
    np.testing.assert_array_equal(outputs[0][0], [4, 6])  # rank 1's half of [0, 2, 4, 6]
    assert __name__ in converted, converted  # the user's function was converted
    assert not [m for m in converted if m.startswith("tarantella")], converted


def test_step_counts_are_counted_where_tf_data_can_count_them():
    from tarantella.tensorflow.data import step_counts

    ds = tf.data.Dataset.range(95).batch(10)
    assert step_counts.batches(ds) == 10
    assert step_counts.batches(ds.filter(lambda t: True)) == step_counts.UNKNOWN
    assert step_counts.batches(ds.repeat()) == step_counts.INFINITE
    assert step_counts.batches((np.zeros((95, 3)), np.zeros(95)), 10) == 10
    assert step_counts.batches(np.zeros((95, 3))) == 3  # Keras' default batch size, 32
    assert step_counts.batches(None) == 0
    assert step_counts.batches(iter([1, 2])) == step_counts.UNKNOWN
    assert [step_counts.input_kind(v) for v in (None, ds, [np.zeros(3)], iter([]))] == list(step_counts.KINDS)
    # one rank: nothing to compare, nothing uncounted
    assert step_counts.check_same_batches("fit", {"the batches of x": step_counts.UNKNOWN}) == []


def test_a_timeout_in_fit_says_what_could_not_be_compared():
    """collective_errors(hint) adds the sentence of step_counts.timeout_hint to
    a TimeoutError raised inside a TensorFlow function, keeping its rank."""
    from tarantella.common import errors
    from tarantella.tensorflow import collective_ops
    from tarantella.tensorflow.data import step_counts

    hint = step_counts.timeout_hint(["the batches of x"])
    assert "tf.data could not count the batches of x (a filter, a generator)" in hint
    assert step_counts.timeout_hint([]) is None
    with pytest.raises(errors.TimeoutError) as caught:
        with collective_ops.collective_errors(hint):
            collective_ops._last_error[0] = errors.TimeoutError("allreduce 'g' timed out", rank=1)
            raise tf.errors.DeadlineExceededError(None, None, "TimeoutError: allreduce 'g' timed out")
    assert str(caught.value) == f"allreduce 'g' timed out {hint}" and caught.value.rank == 1
    with pytest.raises(errors.PeerLostError, match="^rank 1 died$"):  # other errors as they are
        with collective_ops.collective_errors(hint):
            collective_ops._last_error[0] = errors.PeerLostError("rank 1 died", rank=1)
            raise tf.errors.InternalError(None, None, "PeerLostError: rank 1 died")


def test_first_batch_fingerprints_tell_batches_apart():
    """data/first_batches.py: the fingerprint of a global batch, and one
    fingerprint recorded per pass over a distributed dataset."""
    from tarantella.tensorflow.data import first_batches

    def fp(element):
        return int(first_batches.fingerprint(element).numpy())

    x, y = np.arange(40, dtype=np.float32).reshape(20, 2), np.arange(20)
    assert fp((x, y)) == fp((x.copy(), y.copy()))
    assert fp((x, y)) != fp((x, y[::-1].copy())) != fp((x[:10], y[:10]))
    assert fp((x, y)) != fp((y, x))  # the order of the components counts
    assert fp(tf.constant(["a", "b"])) != fp(tf.constant(["a", "c"]))
    assert fp(tf.ragged.constant([[1], [2, 3]])) != fp(tf.ragged.constant([[1, 2], [3]]))
    images = np.zeros((64, 28, 28), np.float32)  # sampled: every 12th entry of 50176
    changed = images.copy()
    changed[0, 0, 0] = 1
    assert fp(images) != fp(changed)
    seen = []
    for early in (True, False):  # slice_before_map's rebuilt pipeline and slicing after the batch
        ds = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2, b)).batch(8)
        d = distribute_dataset(ds, rank=1, size=2, slice_early=early)
        for _ in range(2):
            assert [b[1].numpy().tolist() for b in d.dataset] == [[4, 5, 6, 7], [12, 13, 14, 15],
                                                                   [18, 19]]
        passes = d.first_batches._fingerprints
        assert len(passes) == 2 and passes[0] == passes[1], passes  # the same first batch
        assert d.first_batches.summary()[0] == 2
        seen.append(passes[0])
    assert len(set(seen)) == 2  # raw samples before the maps, or the mapped batch
    assert distribute_dataset(ds, rank=0, size=1).first_batches is None  # one rank: none


def test_pipelines_that_draw_at_random_are_not_compared():
    from tarantella.tensorflow.data import dataset_inspection

    base = tf.data.Dataset.from_tensor_slices((np.zeros((10, 4), np.float32), np.arange(10)))
    stateful = dataset_inspection.has_stateful_functions
    assert not stateful(base.shuffle(10).map(lambda a, b: (a * 2, b)).batch(2))
    assert not stateful(base.map(lambda a, b: (a + tf.random.stateless_uniform([4], [1, 2]), b)))
    assert not stateful(base.filter(lambda a, b: b > 2).batch(2))
    assert stateful(base.map(lambda a, b: (a + tf.random.uniform([4]), b)).batch(2))
    assert stateful(base.map(lambda a, b: (tf.cond(b > 3, lambda: a + tf.random.uniform([4]),
                                                   lambda: a), b)))  # inside a branch
    assert stateful(tf.data.Dataset.zip((base, base.map(lambda a, b: tf.random.uniform([4])))))
    assert stateful(base.map(lambda a, b: (tf.numpy_function(lambda v: v, [a], tf.float32), b)))
    d = distribute_dataset(base.map(lambda a, b: (a + tf.random.uniform([4]), b)).batch(2),
                           rank=0, size=2)
    assert not d.first_batches.compared and d.first_batches.summary().tolist() == [-1, -1]


def test_losses_whose_normaliser_is_unknown_are_warned_about():
    """Keras divides a loss function's value by its number of elements: one
    value per batch is whatever the function made of the batch (a mean or a
    sum), which Tarantella cannot tell apart, so it says so, once per loss; as
    for reduction=None (the gradient of the sum, the logs' mean)."""
    from tarantella.common.logging import get_logger
    from tarantella.tensorflow import global_loss

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    get_logger().addHandler(handler)
    try:
        y_true, y_pred = tf.zeros([4, 1]), tf.ones([4, 1])
        for fn in (lambda t, p: tf.reduce_sum(tf.square(t - p)),  # one value per batch: warned
                   lambda t, p: tf.reduce_mean(tf.square(t - p), axis=-1)):  # one per sample: not
            compiled = keras.src.losses.LossFunctionWrapper(fn, name=f"fn{len(records)}")  # what compile makes of fn
            global_loss._parts(compiled, y_true, y_pred, None)
            global_loss._parts(compiled, y_true, y_pred, None)  # once per loss
        global_loss._parts(keras.losses.MeanSquaredError(reduction=None), y_true, y_pred, None)
    finally:
        get_logger().removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert len(messages) == 2 and "one value for the whole batch" in messages[0], messages
    assert "reduction=None" in messages[1], messages


def test_the_original_tarantellas_names_work_or_say_what_replaces_them():
    """Tarantella 0.8's top-level `tnt.Optimizer` is the distributed optimizer;
    its names that are gone raise an AttributeError that says what to use
    (docs/migration.md), instead of only "has no attribute"."""
    assert tnt.Optimizer is tnt.optimizers.Optimizer is tnt.DistributedOptimizer
    # tnt.init(devices_per_node=N) of its first releases: runs, and says the GPUs are tntrun's
    from tarantella.common.logging import get_logger

    warned = []
    catch = logging.Handler(level=logging.WARNING)
    catch.emit = lambda record: warned.append(record.getMessage())
    get_logger().addHandler(catch)
    try:
        tnt.init(devices_per_node=2)
    finally:
        get_logger().removeHandler(catch)
    assert tnt.is_initialized() and len(warned) == 1, warned
    assert "devices_per_node=2) is ignored" in warned[0] and "--n-per-node" in warned[0], warned
    gone = {"Barrier": "tnt.barrier()", "Allreduce": "tnt.allreduce", "Group": "no rank groups",
            "ReductionOp": "op=", "get_group_master_rank": "no rank groups",
            "SynchCommunicator": "tnt.DistributedOptimizer", "global_tnt_config": "TNT_*",
            "logger": 'logging.getLogger("tarantella")',
            "distributed_optimizers": "tnt.DistributedOptimizer"}
    for name, hint in gone.items():
        with pytest.raises(AttributeError, match="migration.md") as error:
            getattr(tnt, name)
        assert hint in str(error.value), name
        assert not hasattr(tnt, name)
    with pytest.raises(AttributeError, match=r"tnt\.data\.distribute_dataset\(dataset"):
        tnt.data.Dataset  # noqa: B018
    with pytest.raises(AttributeError, match="model_from_json"):
        tnt.models.model_from_yaml  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        tnt.no_such_name  # noqa: B018
    # the original's pipelining internals: Python's bare "has no attribute" said nothing of why
    for gone in ("tnt.keras.losses", "tnt.keras.metrics", "tnt.keras.layers.SendLayer", "tnt.keras.layers.RecvLayer"):
        with pytest.raises(AttributeError, match="pipelining, which is not available yet"):
            eval(gone)  # noqa: S307 - a fixed expression
    with pytest.raises(AttributeError, match="has no attribute 'no_such_layer'"):
        tnt.keras.layers.no_such_layer  # noqa: B018
    # its tnt.Model attributes that are gone say what replaces them (not "'Sequential' object has
    # no attribute", naming the wrapped model); those the wrapped model has are still its own
    model = tnt.Model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    for name, hint in (("dist_optimizer", "model.optimizer"), ("to_yaml", "to_json()"),
                       ("reset_states", "Keras 3 removed it"), ("group", "no rank groups"),
                       ("close", "nothing to release")):
        with pytest.raises(AttributeError, match=r"tnt\.Model\." + name + " of the original") as error:
            getattr(model, name)
        assert hint in str(error.value) and "migration.md" in str(error.value), name
    # its compile() arguments that Keras 3 removed: the TypeError named the internal
    # _compile_keras and said nothing more
    for name, value, hint in (("sample_weight_mode", None, "sample weights shaped like"),
                              ("experimental_run_tf_function", False, "leave it out")):
        with pytest.raises(TypeError, match=r"tnt\.Model\.compile: " + name + " of the original") as error:
            model.compile(optimizer="sgd", loss="mse", **{name: value})
        assert hint in str(error.value) and "migration.md" in str(error.value), name
    with pytest.raises(AttributeError, match="no_such_name"):
        model.no_such_name  # noqa: B018
    # its group= arguments (and a Callback's parallel_strategy=, by keyword or as its second
    # argument) said only "unexpected keyword argument" (Keras' "Unrecognized keyword
    # arguments" for tnt.Model), or were taken for aggregate_logs without a word
    keras_model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    takers = {"tnt.Model": lambda **kw: tnt.Model(keras_model, **kw),
              "tnt.DistributedOptimizer": lambda **kw: tnt.DistributedOptimizer(
                  keras.optimizers.SGD(), **kw),
              "tnt.TensorAllreducer": lambda **kw: tnt.TensorAllreducer(1.0, **kw),
              "tnt.TensorBroadcaster": lambda **kw: tnt.TensorBroadcaster(1.0, 0, **kw),
              "tnt.TensorAllgatherer": lambda **kw: tnt.TensorAllgatherer([1.0], **kw),
              "tnt.keras.callbacks.Callback": lambda **kw: tnt.keras.callbacks.Callback(
                  keras.callbacks.History(), **kw)}
    for where, call in takers.items():
        with pytest.raises(TypeError, match=re.escape(where) + ": group of the original") as error:
            call(group=None)
        assert "no rank groups" in str(error.value) and "migration.md" in str(error.value), where
        if where != "tnt.Model":  # its other keyword arguments are keras.Model's, which says so
            with pytest.raises(TypeError, match="unexpected keyword argument 'no_such'"):
                call(no_such=1)
    assert tnt.optimizers.Optimizer is tnt.DistributedOptimizer  # the original's name: the same
    for wrap in (lambda cb: tnt.keras.callbacks.Callback(cb, parallel_strategy=tnt.ParallelStrategy.DATA),
                 lambda cb: tnt.keras.callbacks.Callback(cb, tnt.ParallelStrategy.DATA)):
        with pytest.raises(TypeError, match=r"Callback: parallel_strategy of the original.*"
                                            r"run_on_all_ranks= and aggregate_logs="):
            wrap(keras.callbacks.History())


def test_the_original_tarantellas_module_paths_are_tarantella_tensorflows_modules():
    """`import tarantella.keras.callbacks`, `from tarantella.optimizers import
    ...`: the original's module paths (tarantella/_original_paths.py), each the
    very module behind tnt.keras, ..., never a second copy of it (its classes
    would fail isinstance checks against the first's)."""
    import importlib

    import tarantella.data
    import tarantella.keras.callbacks
    import tarantella.models
    from tarantella.keras.callbacks import Callback
    from tarantella.optimizers import Optimizer

    assert tarantella.keras is tnt.keras is sys.modules["tarantella.tensorflow.keras"]
    assert tarantella.keras.callbacks is sys.modules["tarantella.tensorflow.keras.callbacks"]
    assert sys.modules["tarantella.keras.callbacks"] is tarantella.keras.callbacks
    assert Callback is tnt.keras.callbacks.Callback and Optimizer is tnt.DistributedOptimizer
    assert tarantella.data is tnt.data and tarantella.models is tnt.models
    # the original's tarantella.keras.models / .model / .sequential, reached through tnt.keras
    # too: a script's tnt.keras.models.load_model was an AttributeError
    import tarantella.keras.model
    import tarantella.keras.models
    from tarantella.keras.sequential import Sequential

    assert tnt.keras.models is tarantella.keras.models is tnt.models
    assert tnt.keras.model.Model is tarantella.keras.model.Model is tnt.Model
    assert tnt.keras.sequential.Sequential is Sequential is tnt.Sequential
    # its own spec, which reload() and find_spec() read, not the alias's
    assert importlib.util.find_spec("tarantella.tensorflow.models").name == "tarantella.tensorflow.models"
    with pytest.raises(ImportError):
        importlib.import_module("tarantella.keras.no_such_module")


def test_callbacks_say_what_they_did_on_the_master_only(monkeypatch):
    """EarlyStopping(verbose=1) and the like run on every rank but print once,
    as serial training does (under mpirun every rank's output is shown);
    TNT_OUTPUT_ON_ALL_DEVICES keeps them talking everywhere."""
    from tarantella.common import core
    from tarantella.tensorflow.keras.callbacks.callback_preparation import prepare_callbacks

    def prepared_verbosity(rank, everywhere=""):
        monkeypatch.setattr(core, "is_master_rank", lambda: rank == 0)
        monkeypatch.setenv("TNT_OUTPUT_ON_ALL_DEVICES", everywhere)
        stop, plateau = keras.callbacks.EarlyStopping(verbose=1), keras.callbacks.ReduceLROnPlateau(verbose=1)
        out = prepare_callbacks([stop, plateau])
        assert out == [stop, plateau]  # the same objects, still run on every rank
        return [stop.verbose, plateau.verbose]

    assert prepared_verbosity(0) == [1, 1]
    assert prepared_verbosity(1) == [0, 0]
    assert prepared_verbosity(1, everywhere="1") == [1, 1]


def test_a_csv_logger_on_every_rank_must_write_a_file_of_its_own(monkeypatch):
    """Wrapped with run_on_all_ranks=True, a CSVLogger of one name was written
    by every rank at once (one rank's lines and a stray tail of another's),
    without a word: fit compares the ranks' files (an allgather, here as two
    ranks would answer it) and refuses one file for several ranks on every
    rank alike; a name per rank is left as it is."""
    from tarantella.common import collectives, core
    from tarantella.tensorflow.keras.callbacks.callback_preparation import (own_csv_files,
                                                                           same_csv_loggers)

    monkeypatch.setattr(core, "get_size", lambda: 2)
    gathered = []

    def ranks_give(other):  # rank 1's row from this rank's: the same, or another file's
        def allgather(mine, name=None):
            gathered.append(name)
            return np.concatenate([mine, other(mine)])
        monkeypatch.setattr(collectives, "allgather", allgather)

    wrap = tnt.keras.callbacks.Callback
    everywhere = [wrap(keras.callbacks.CSVLogger("log.csv"), aggregate_logs=False,
                       run_on_all_ranks=True)]
    ranks_give(lambda mine: mine)
    with pytest.raises(ValueError, match=r"ranks \[0, 1\] would write one file together.*"
                                         r"log-\{tnt.get_rank\(\)\}.csv.*log.csv"):
        own_csv_files(everywhere)
    ranks_give(lambda mine: mine + 1)
    own_csv_files(everywhere)  # a file of its own on each rank
    assert gathered == ["tnt.csv_files"] * 2
    # on the master only (unwrapped, or wrapped unset): nothing to compare, no collective
    master_only = [keras.callbacks.CSVLogger("log.csv"), wrap(keras.callbacks.CSVLogger("b.csv"))]
    own_csv_files(master_only)
    assert len(gathered) == 2
    assert [list(same_csv_loggers(c).values.values()) for c in (everywhere, master_only)] \
        == [[1], [0]]


def test_the_entry_points_a_tf_function_calls_are_not_converted_by_autograph():
    """tnt's collectives, the tape's gradient, the optimizer's apply and broadcast_variables run as
    plain Python while a tf.function traces them (as Keras' code does): autograph converting them
    afresh in threads that traced at once called a converted helper with an argument missing."""
    from tensorflow.python.autograph.impl.api import is_autograph_artifact

    from tarantella.tensorflow import collective_ops, tensor_collectives

    optimizer = tnt.DistributedOptimizer(keras.optimizers.SGD(0.1))
    tape = tnt.DistributedGradientTape(tf.GradientTape())
    entry_points = [tensor_collectives.allreduce, tensor_collectives.broadcast, tensor_collectives.allgather,
                    collective_ops.broadcast_variables, type(tape).gradient, type(optimizer).apply]
    assert all(is_autograph_artifact(f) for f in entry_points), \
        [getattr(f, "__qualname__", f) for f in entry_points if not is_autograph_artifact(f)]


def test_a_numpy_collective_given_a_traced_tensor_names_the_tensorflow_one():
    # `import tarantella as tnt` gives the NumPy collectives: in a tf.function, tnt.allreduce(t)
    # said only "allreduce expects a NumPy array. Received: SymbolicTensor"
    with pytest.raises(Exception) as info:  # autograph's StagingError, which says it
        tf.function(lambda t: tnt.allreduce(t))(tf.ones(3))
    said = str(info.value)
    assert "InvalidArgumentError: allreduce expects a NumPy array. Received: SymbolicTensor (a " \
        "tensor of a tf.function being traced" in " ".join(said.split()), said
    assert "tnt_tf.allreduce(t)" in said, said


def test_a_handle_dropped_unfinished_at_exit_says_nothing(tmp_path):
    """An async request left unwaited until the interpreter exits, held where Python's teardown
    frees it late (a module's list, a reference cycle) with TensorFlow imported: Handle.__del__
    ran after the collectives module's globals were cleared and printed "Exception ignored in:
    <function Handle.__del__> ... AttributeError: 'NoneType' object has no attribute
    'is_initialized'" at every exit."""
    from tf_helpers import clean_env

    (tmp_path / "keeper.py").write_text("kept = []\n")
    script = tmp_path / "dropped.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import numpy as np\n"
        "import tensorflow as tf\n"
        "import tarantella.tensorflow\n"
        "import tarantella\n"
        "import keeper\n"
        "keeper.kept.append(tarantella.allreduce_async(np.ones(3), name='kept'))\n"
        "handle = tarantella.allreduce_async(np.ones(3), name='main')\n"
        "cycle = [tarantella.allgather_async(np.ones(3), name='cycle')]\n"
        "cycle.append(cycle)\n"
        "print('done', flush=True)\n")
    result = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and result.stdout == "done\n", result.stdout + result.stderr[-3000:]
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]


def test_unnamed_collectives_in_a_tf_data_function_count_apart_from_the_main_thread():
    """An unnamed tnt.allreduce in a dataset's map runs in tf.data's threads, ahead of the main
    thread (prefetch), and is named when it runs: in the main thread's sequence, the ranks
    numbered its calls and the main thread's in orders of their own, and a map call on one rank
    paired with a step's call on another (same shapes: summed together without a word). It has
    a sequence of its own, and leaves the main thread's untouched."""
    import tarantella.tensorflow as ttf
    from tarantella.common import request_names

    counter = request_names.unnamed_window("allreduce")[0]
    before = repr(counter)
    ds = tf.data.Dataset.range(3).map(lambda x: ttf.allreduce(tf.cast(x, tf.float32))).prefetch(2)
    assert [float(v) for v in ds] == [0.0, 1.0, 2.0]
    assert repr(counter) == before  # "count(k)": no number of the main thread's taken
    assert float(ttf.allreduce(tf.constant(5.0))) == 5.0
    assert repr(counter) != before
    # A tf.function that the map calls (a helper) is traced in a graph of its own, inside the map's:
    # its calls took the main thread's sequence (on 2 ranks, 22 of 30 elements summed with a step's
    # value of the other rank, without a word).
    @tf.function
    def helper(x):
        return ttf.allreduce(x)

    before = repr(counter)
    ds = tf.data.Dataset.range(3).map(lambda x: helper(tf.cast(x, tf.float32))).prefetch(2)
    assert [float(v) for v in ds] == [0.0, 1.0, 2.0]
    assert repr(counter) == before
    # Two datasets mapped with functions of one name (lambdas: graphs "Dataset_map_<lambda>") have
    # a sequence each: sharing one, their prefetching threads numbered their calls in orders of
    # their own on each rank (2 ranks: 20 of 20 zipped pairs wrong, without a word).
    def sequences():
        return {k[1] for k in request_names._counters if isinstance(k, tuple) and k[1].startswith("tf.data.")}

    known = sequences()
    one = tf.data.Dataset.range(2).map(lambda x: ttf.allreduce(tf.cast(x, tf.float32))).prefetch(2)
    two = tf.data.Dataset.range(2).map(lambda x: ttf.allreduce(tf.cast(x, tf.float32) + 10)).prefetch(2)
    assert [(float(a), float(b)) for a, b in zip(one, two)] == [(0.0, 10.0), (1.0, 11.0)]
    assert len(sequences() - known) == 2, sequences()


def test_the_tf_level_collectives_have_no_gradient_on_any_path():
    """tape.gradient through tnt.allreduce is None, eagerly and traced, named (the compiled ops)
    or not (tf.numpy_function). Through the compiled ops it raised LookupError ("gradient
    registry has no entry for: TntCollectiveWait") where the other paths gave None."""
    import tarantella.tensorflow as ttf

    def grads(name):
        x = tf.constant(2.0)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = ttf.allreduce(x * 3.0, name=name)
        return tape.gradient(y, x)

    assert grads("grad-eager") is None
    assert tf.function(lambda: grads("grad-traced"))() is None
    assert tf.function(lambda: grads(None))() is None


def test_a_traced_collective_refuses_bad_arguments_as_an_eager_one_does():
    """Inside a tf.function, tnt.allreduce / broadcast / allgather refuse what they refuse
    eagerly, with the same error, while the function is traced. Before, root="0" (or 0.9) was
    taken as rank 0 by the compiled ops (int(root)), name=5 was a TypeError of TensorFlow's
    ("Expected string for argument 'names'"), a None leaf a ValueError ("None values not
    supported"), and a dtype the core lacks (bool, int8, complex) or a bad name failed only when
    the function ran, as a TensorFlow error with a Python traceback in the log."""
    import tarantella.tensorflow as ttf

    x = tf.constant([1.0, 2.0])
    cases = {
        "root str": lambda: ttf.broadcast(x, root="0", name="b"),
        "root float": lambda: ttf.broadcast(x, root=0.9, name="b"),
        "root bool": lambda: ttf.broadcast(x, root=True, name="b"),
        "root unnamed": lambda: ttf.broadcast([x], root=3),
        "name int": lambda: ttf.allreduce(x, name=5),
        "name empty": lambda: ttf.allreduce(x, name=""),
        "name long": lambda: ttf.allreduce([x], name="n" * 250),
        "op": lambda: ttf.allreduce(x, op="max"),
        "none leaf": lambda: ttf.allreduce([x, None], name="none"),
        "str leaf": lambda: ttf.allgather([x, "a"]),
        "bool": lambda: ttf.allreduce(tf.constant([True]), name="bool"),
        "int8 unnamed": lambda: ttf.allgather(tf.constant([1], tf.int8)),
        "complex nest": lambda: ttf.allreduce({"c": tf.constant([1j])}, name="c"),
    }
    for key, case in cases.items():
        with pytest.raises(Exception) as eager:
            case()
        with pytest.raises(Exception) as traced:
            tf.function(case, autograph=False).get_concrete_function()  # traced, never run
        assert (type(traced.value), str(traced.value)) == (type(eager.value), str(eager.value)), key


def test_a_stand_in_contributes_nothing_of_its_numbers_too():
    """Calls on tnt.Model.predict's stand-in sample (contributing_nothing) contribute nothing:
    zeros, no rows. A number or an array leaf, traced, now goes into the graph as a tensor
    does (tensor_collectives._run), and a stand-in sent its value there: a layer's
    tnt.allreduce({"s": sums, "n": 1.0}) counted the stand-in rank as one more contributor."""
    import tarantella.tensorflow as tnt_tf
    from tarantella.tensorflow.tensor_collectives import contributing_nothing

    def calls():
        return tnt_tf.allreduce({"n": 3.0, "t": tf.ones([2])}), tnt_tf.allreduce(np.int64(4)), \
            tnt_tf.allgather([np.ones((2, 2), np.float32), tf.ones([1, 3])])

    for run in (calls, tf.function(calls, autograph=False)):
        with contributing_nothing():
            summed, single, (rows, more) = run()
        assert float(summed["n"]) == 0.0 and np.asarray(summed["t"]).tolist() == [0.0, 0.0], summed
        assert int(single) == 0 and np.asarray(rows).shape == (0, 2) and np.asarray(more).shape == (0, 3), \
            (single, rows, more)


def test_a_stand_in_gathers_no_row_of_a_scalar():
    """An allgather of a scalar gathers one row of each rank; under contributing_nothing (the
    stand-in sample of tnt.Model.predict) the stand-in rank sent its zero as a row, so a layer's
    mean of the gathered per-rank means in the last batch was halved on 2 ranks, without a word
    (the replay of an empty slice in fit / evaluate alike, _log_for_empty_slice: evaluate's loss
    0.0740 where serial Keras gives 0.0715, seen on 2 ranks). Now no row: shape (0,)."""
    import tarantella.tensorflow as tnt_tf
    from tarantella.tensorflow.tensor_collectives import contributing_nothing

    def calls():
        return tnt_tf.allgather(tf.constant(2.0)), tnt_tf.allgather({"m": tf.constant(1.5), "k": 1.0, "a": np.int64(3)})

    for run in (calls, tf.function(calls, autograph=False)):
        with contributing_nothing():
            single, gathered = run()
        assert np.asarray(single).shape == (0,), single
        assert {k: np.asarray(v).shape for k, v in gathered.items()} == {"m": (0,), "k": (0,), "a": (0,)}, gathered
    single, gathered = calls()  # not a stand-in: one row each
    assert np.asarray(single).tolist() == [2.0] and np.asarray(gathered["k"]).tolist() == [1.0]


def test_ragged_and_sparse_leaves_of_the_numpy_collectives_are_refused_by_type():
    # tnt.allreduce([ragged]) read the ragged tensor's rows as NumPy objects and failed with
    # "dtype object is not supported ... cast with array.astype(...)", which no cast mends
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0]])
    sparse = tf.sparse.from_dense(tf.constant([[1.0, 0.0], [0.0, 2.0]]))
    slices = tf.IndexedSlices(tf.constant([[1.0]]), tf.constant([0]), tf.constant([2, 1]))
    for leaf in (ragged, sparse, slices):
        for call in (tnt.allreduce, tnt.allgather, lambda x: tnt.broadcast(x, root=0)):
            for structure in ([leaf], {"a": np.ones(2, np.float32), "b": leaf}):
                with pytest.raises(TypeError, match=rf"dense form .* Received: a leaf of type "
                                                    rf"{type(leaf).__name__}"):
                    call(structure)
