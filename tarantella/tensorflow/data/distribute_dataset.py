"""Turn what a user passes to fit/evaluate/predict into this rank's dataset."""
import dataclasses

import tensorflow as tf

from tarantella.common import core
from tarantella.tensorflow.data import (batch_slicing, dataset_inspection, first_batches,
                                        shuffle_seeding, slice_before_map)


@dataclasses.dataclass
class Distributed:
    dataset: tf.data.Dataset
    global_batch_size: object  # int, or None when it cannot be known before running
    micro_batch_size: object  # this rank's (largest) micro-batch size, or None
    # first_batches.FirstBatches of the global batches (None: 1 rank; not compared: a
    # pipeline that draws at random, dataset_inspection.has_stateful_functions)
    first_batches: object = None


def _check_micro_batch_size(micro_batch_size, global_batch_size, size, what):
    lo, hi = global_batch_size // size, -(-global_batch_size // size)
    if not lo <= micro_batch_size <= hi:
        raise ValueError(
            f"{what} must be the global batch size divided by the number of ranks ("
            f"{lo if lo == hi else f'{lo} or {hi}'}), since the dataset is batched with the global "
            f"batch size. Received: {what}={micro_batch_size}, batch_size={global_batch_size} "
            f"(ranks={size})")


def _already_batches(dataset):
    """What to do if the elements of a dataset taken for unbatched are batches
    already: every component's first dimension the same known size, as in a
    generator that yields batches with a static output_signature or slices of
    arrays shaped (steps, batch, ...). Batching it again (what the error
    otherwise suggests) would make batches of batches."""
    shapes = [getattr(s, "shape", None) for s in tf.nest.flatten(dataset.element_spec)]
    firsts = {s[0] for s in shapes if s is not None and s.rank}
    if len(firsts) != 1 or None in firsts or not all(s is not None and s.rank for s in shapes):
        return ""
    n = firsts.pop()
    return (f" If each element is a global batch of {n} samples already (a generator yielding "
            f"batches, slices of arrays shaped (steps, {n}, ...)), say so: give the batch "
            "dimension as None (from_generator's output_signature), or "
            f"`dataset.unbatch().batch({n})`.")


def _refuse_unknown_batching(dataset, micro_batch_size, size, what, label):
    """Elements whose every component has an unknown first dimension are taken
    for batches (a generator yielding global batches), but they are as well
    samples of variable length (token sequences with per-token labels). Given
    `what` (the per-rank batch size, which says the dataset is unbatched),
    such samples were taken for global batches all the same, each sequence cut
    along its time axis between the ranks, and `what` ignored without a word."""
    global_batch = micro_batch_size * size
    raise ValueError(
        f"{what}={micro_batch_size} says that {label} is not batched, but every component of its "
        "elements has an unknown first dimension, so they may as well be global batches (a "
        "generator yielding batches): Tarantella cannot tell which. Samples of variable length: "
        f"batch them yourself with the global batch size ({what} * {size} ranks = "
        f"{global_batch}), e.g. `dataset.padded_batch({global_batch})` or "
        f"`dataset.ragged_batch({global_batch})`. Global batches: leave out {what}. Received: "
        f"{what}={micro_batch_size} and a dataset with element_spec={dataset.element_spec}")


def _refuse_unread_batch_size(dataset, micro_batch_size, size, what, label):
    """A batch op whose size is not known before running (a `rebatch` with
    sizes that differ, a size computed in a graph): `what` cannot be checked
    against it, and the check was skipped without a word, so a user whose
    numbers disagreed trained on global batches of another size than `what`
    said. No run-time check can take its place: a first batch smaller than
    `what` * ranks may as well be the whole of a small dataset, and batches
    of cycled sizes match no single micro-batch size."""
    raise ValueError(
        f"{what}={micro_batch_size} cannot be checked against the batches of {label}: it is "
        "batched with a size that is not known before it runs (a rebatch() with sizes that "
        "differ, or a batch size computed in a graph), so its global batches may be of another "
        f"size than {what} * {size} ranks = {micro_batch_size * size}. Leave out {what} (a "
        "batched dataset's own batches are the global batches; each rank takes its slice of "
        "each), or batch it with a size known when the dataset is built. Received: "
        f"{what}={micro_batch_size} and a dataset with element_spec={dataset.element_spec}")


def distribute_dataset(dataset, micro_batch_size=None, rank=None, size=None,
                       shuffle_seed=shuffle_seeding.DEFAULT_SEED, what="tnt_micro_batch_size",
                       slice_early=True, label="the dataset"):
    """This rank's part of `dataset`.

    Args:
        dataset: A `tf.data.Dataset` batched with the global batch size, or
            unbatched (then `micro_batch_size` is required and the global
            batch is `micro_batch_size * size`).
        micro_batch_size: Integer or None; for a batched dataset only checked
            against the global batch size.
        rank, size: Default to this process's rank and the number of ranks.
        shuffle_seed: Seed given to `shuffle()` ops that have none.
        slice_early: Where the pipeline is `... -> map(f) -> batch(B)`, slice
            before the maps so that this rank maps only its own samples
            (see slice_before_map); False always slices after the batch.
        label: What the dataset is called in errors (first_batches).

    Returns:
        A `Distributed` record: the rank's dataset, whose i-th element is this
        rank's contiguous slice of the i-th global batch, and the batch sizes.
    """
    rank = core.get_rank() if rank is None else rank
    size = core.get_size() if size is None else size
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"Expected a tf.data.Dataset. Received: {type(dataset).__name__}")
    if micro_batch_size is not None and (not isinstance(micro_batch_size, int)
                                         or micro_batch_size <= 0):
        raise ValueError(f"{what} must be a positive integer. Received: {what}={micro_batch_size!r}")
    dataset = shuffle_seeding.seed_unseeded_shuffles(dataset, shuffle_seed)
    if size > 1:  # every rank must read the samples in the same order
        dataset = shuffle_seeding.keep_order(dataset)
    info = dataset_inspection.batching(dataset)
    if info.batched is False:
        if micro_batch_size is None:
            raise ValueError(
                f"The dataset is not batched: batch it with the global batch size "
                f"(`dataset.batch(global_batch_size)`), or pass {what} (the per-rank batch size; "
                f"the global batch is then {what} * {size} ranks).{_already_batches(dataset)} "
                f"Received: an unbatched dataset with element_spec={dataset.element_spec}")
        global_batch = micro_batch_size * size
        dataset = dataset.batch(global_batch)
        info = dataset_inspection.Batching(True, global_batch)
    elif micro_batch_size is not None and info.batched is None:
        _refuse_unknown_batching(dataset, micro_batch_size, size, what, label)
    elif micro_batch_size is not None and info.batch_size is None:
        _refuse_unread_batch_size(dataset, micro_batch_size, size, what, label)
    elif micro_batch_size is not None:
        _check_micro_batch_size(micro_batch_size, info.batch_size, size, what)
    # batches drawn at random per process (augmentation) may differ: not compared
    seen = None if size == 1 else first_batches.FirstBatches(
        label, compared=not dataset_inspection.has_stateful_functions(dataset))
    rebuilt = slice_before_map.rebuild(dataset, rank, size, seen) if size > 1 and slice_early else None
    if rebuilt is not None:
        dataset = rebuilt
    elif size > 1:
        dataset = first_batches.map_global_batches(
            dataset, seen, lambda element: batch_slicing.slice_element(element, rank, size))
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    micro = None
    if info.batch_size is not None:
        micro = batch_slicing.micro_batch_size(info.batch_size, 0, size)
    return Distributed(dataset, info.batch_size, micro, seen)
