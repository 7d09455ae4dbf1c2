"""Let a rank map only its own samples: `source -> map(f)... -> batch(B)`
becomes `source -> batch(B) -> this rank's slice -> f on each sample`.

Slicing after the batch (batch_slicing) is exact, but left alone every rank
would run the per-sample maps (decoding, augmentation) of the whole global
batch and then keep 1/N of it. When the maps sit right before the batch op,
the pipeline is rebuilt so that the raw samples are batched and sliced first,
and the maps run on the rank's slice only (`tf.map_fn`, one sample at a time,
as before). The elements are the same tensors as with slicing after the
maps, empty slices included; only pipelines where that is certain are rebuilt:

- the chain is `base -> map(...)+ -> batch(B)` with at most `prefetch` after
  the batch;
- every map keeps the cardinality (1:1) and its function has no stateful op
  (a random op's stream would be consumed differently);
- the maps' outputs are dense tensors of fully known shape (so a slice,
  however short, stacks to the shape the original batch would have).

Anything else keeps the slice-after-batch path (correct, not cheaper).
"""
import tensorflow as tf
from tensorflow.python.data.util import structure  # to_tensor_list / from_compatible_tensor_list

from tarantella.tensorflow.data import batch_slicing, dataset_inspection, first_batches

_MAP_OPS = ("_MapDataset", "_ParallelMapDataset")
_BATCH_OPS = ("_BatchDataset", "_ParallelBatchDataset")
_AFTER_BATCH_OPS = ("_PrefetchDataset",)


def _static(value):
    return dataset_inspection._static(value)


def _pure(map_dataset):
    wrapper = getattr(map_dataset, "_map_func", None)
    function = getattr(wrapper, "function", None)
    if function is None or not getattr(map_dataset, "_preserve_cardinality", False):
        return False
    try:
        return not any(op.op_def.is_stateful for op in function.graph.get_operations())
    except AttributeError:
        return False


def _dense_static(spec_structure):
    specs = tf.nest.flatten(spec_structure)
    return bool(specs) and all(type(s) is tf.TensorSpec and s.shape.is_fully_defined()
                               for s in specs)


def _apply(wrapper, element):
    """A map's function on one (nested) sample, as tf.data calls it."""
    flat = structure.to_tensor_list(wrapper._input_structure, element)
    outputs = wrapper.function(*flat)
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    return structure.from_compatible_tensor_list(wrapper._output_structure, list(outputs))


def rebuild(dataset, rank, size, seen=None):
    """`dataset` (batched with the global batch size) as this rank's slices,
    with the maps before the batch run on the slice only; None when the
    pipeline is not one of the shapes above. `seen`
    (first_batches.FirstBatches, or None) notes each pass's first global
    batch of raw samples, before the maps."""
    chain = dataset_inspection.chain(dataset)
    i = 0
    while i < len(chain) and type(chain[i]).__name__ in _AFTER_BATCH_OPS:
        i += 1
    if i >= len(chain) or type(chain[i]).__name__ not in _BATCH_OPS:
        return None
    batch_op = chain[i]
    batch_size = _static(getattr(batch_op, "_batch_size", None))
    drop = _static(getattr(batch_op, "_drop_remainder", False))
    if not batch_size or batch_size <= 0 or drop is None:
        return None
    maps = []
    i += 1
    while i < len(chain) and type(chain[i]).__name__ in _MAP_OPS:
        maps.append(chain[i])
        i += 1
    if not maps or i >= len(chain) or not all(_pure(m) for m in maps):
        return None
    if not _dense_static(maps[0].element_spec):
        return None
    base = chain[i]
    wrappers = [m._map_func for m in reversed(maps)]  # in the order they run
    output_spec = maps[0].element_spec

    def per_sample(sample):
        for wrapper in wrappers:
            sample = _apply(wrapper, sample)
        return sample

    def map_slice(element):  # not converted by autograph: the user's functions are traced (wrappers)
        mine = batch_slicing.slice_element(element, rank, size)
        return tf.map_fn(per_sample, mine, fn_output_signature=output_spec)

    out = base.batch(batch_size, drop_remainder=bool(drop))
    out = first_batches.map_global_batches(out, seen, map_slice)
    return out.prefetch(tf.data.AUTOTUNE)
