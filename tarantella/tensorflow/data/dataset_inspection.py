"""Read what a tf.data pipeline does, to distribute it correctly.

tf.data keeps no public description of a pipeline, so this walks the private
`_input_dataset` chain (read only; every attribute access has a fall-back).
"""
import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry  # is an op stateful (registry lookup)

_BATCH_OPS = ("_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset",
              "_DenseToRaggedDataset", "_RebatchDataset", "_DenseToSparseBatchDataset")
_UNBATCH_OPS = ("_UnbatchDataset",)
# Ops whose elements come from a user function's datasets (or windows): a batch op
# before them says nothing about what they yield (`batch(4).flat_map(from_tensor_slices)`
# yields single samples; taking it for batches of 4 sliced each sample's features).
_RESTRUCTURE_OPS = ("_FlatMapDataset", "_InterleaveDataset", "_ParallelInterleaveDataset",
                    "_GroupByWindowDataset", "_WindowDataset")


@dataclasses.dataclass
class Batching:
    batched: object  # True, False, or None when it cannot be told
    batch_size: object = None  # the last batch op's static size, if known
    drop_remainder: bool = False


def chain(dataset):
    """The datasets from `dataset` back to its source, newest first."""
    out = []
    while dataset is not None and len(out) < 10000:
        out.append(dataset)
        dataset = getattr(dataset, "_input_dataset", None)
    return out


def _static(value):
    try:
        value = tf.get_static_value(value)
    except (TypeError, ValueError):
        return None
    return None if value is None else value.item() if hasattr(value, "item") else value


def _rebatch_size(ds):
    """The size of the batches `rebatch(n)` or `rebatch([n, m, ...])` makes:
    the sizes are cycled through, so one size only if they are all equal
    (None: sizes that differ, or a size not known before running)."""
    try:
        sizes = tf.get_static_value(getattr(ds, "_batch_sizes", None))
    except (TypeError, ValueError):
        return None
    sizes = set(np.ravel(sizes).tolist()) if sizes is not None else set()
    return sizes.pop() if len(sizes) == 1 else None


def batching(dataset):
    """Whether `dataset` yields batches, and of which global size."""
    for ds in chain(dataset):
        name = type(ds).__name__
        if name in _UNBATCH_OPS or name in _RESTRUCTURE_OPS:
            break
        if name == "_ConcatenateDataset":
            # two chains, and the one above (_input_dataset) only the first: batch(8) then
            # batch(16) read as batches of 8, and tnt_micro_batch_size=4 on 2 ranks passed its
            # check while the second part trained on global batches of 16
            first, second = batching(ds._input_dataset), batching(ds._dataset_to_concatenate)
            if first == second:
                return first
            return Batching(first.batched if first.batched == second.batched else None, None,
                            first.drop_remainder and second.drop_remainder)
        if name in _BATCH_OPS:
            size = _rebatch_size(ds) if name == "_RebatchDataset" else _static(
                getattr(ds, "_batch_size", None))
            drop = bool(_static(getattr(ds, "_drop_remainder", False)) or False)
            return Batching(True, size if size and size > 0 else None, drop)
    # No batch op found (or an unbatch after it): decide from the element shapes.
    shapes = [getattr(s, "shape", None) for s in tf.nest.flatten(dataset.element_spec)]
    source = chain(dataset)[-1]
    firsts = {s[0] for s in shapes if s is not None and s.rank}
    if type(source).__name__ == "_TensorDataset" and len(firsts) == 1 and None not in firsts \
            and all(s is not None and s.rank for s in shapes) and not any(
                type(d).__name__ in _UNBATCH_OPS + _RESTRUCTURE_OPS for d in chain(dataset)):
        # Dataset.from_tensors(batch): each element is a whole (global) batch
        return Batching(True, firsts.pop())
    ranks = [s.rank for s in shapes if s is not None]
    if ranks and all(r == 0 or r is None for r in ranks):
        return Batching(False)
    if shapes and all(s is not None and s.rank and s[0] is None for s in shapes):
        return Batching(None)  # e.g. a generator yielding batches: treated as batched
    return Batching(False)


def deterministic(ds):
    """A parallel op's `deterministic` as tf.data records it: "true", "false"
    or "default" (None: not a parallel op, or not readable). A parallel
    interleave keeps it only in its graph node, read from the serialized
    pipeline (its inputs' constants too: only done for that op)."""
    value = getattr(ds, "_deterministic", None)
    if value is not None or type(ds).__name__ != "_ParallelInterleaveDataset":
        return value
    try:
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(ds._as_serialized_graph().numpy())
        nodes = {n.name: n for n in graph.node}
        out = [n for n in graph.node if n.op == "_Retval"]
        node = nodes[out[0].input[0].split(":")[0]] if len(out) == 1 else None
        if node is None or "deterministic" not in node.attr:
            return None
        return node.attr["deterministic"].s.decode()
    except Exception:  # a pipeline that cannot be serialized: unknown # noqa: BLE001
        return None


def unseeded_shuffles(dataset):
    """The shuffle ops of the chain that got no seed (they shuffle differently
    in every process)."""
    return [ds for ds in chain(dataset) if type(ds).__name__ == "_ShuffleDataset"
            and _static(getattr(ds, "_seed", 1)) == 0 and _static(getattr(ds, "_seed2", 1)) == 0]


# tf.data's shuffle ops whose inputs 2 and 3 are the seed pair (0, 0: no seed)
_SHUFFLE_OPS = ("ShuffleDataset", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
                "ShuffleAndRepeatDatasetV2")


def _zero_constant(nodes, name):
    node = nodes.get(name.lstrip("^").split(":")[0])
    if node is None or node.op != "Const":
        return False  # computed: from a global seed (tf.random.set_seed), never (0, 0)
    value = tf.make_ndarray(node.attr["value"].tensor)
    return value.size == 1 and int(value) == 0


def _unseeded_shuffle_in(graph_def):
    bodies = [graph_def.node] + [f.node_def for f in graph_def.library.function]
    for body in bodies:
        nodes = {n.name: n for n in body}
        for n in body:
            if n.op in _SHUFFLE_OPS and len(n.input) >= 4 and all(
                    _zero_constant(nodes, i) for i in n.input[2:4]):
                return True
    return False


def _unseeded_random(ds):
    return type(ds).__name__ == "_RandomDataset" and _static(getattr(ds, "_seed", 1)) == 0 \
        and _static(getattr(ds, "_seed2", 1)) == 0


def hidden_unseeded_shuffles(dataset):
    """What in the pipeline draws the order of the samples without a seed
    where no rebuild of the chain can reach it, each said as "a shuffle()
    without a seed in <where>": inside a function
    (`interleave(lambda f: TFRecordDataset(f).shuffle(n))`, `flat_map`), in
    an input of a zip (`enumerate()` is one), or the random choice of
    `sample_from_datasets(..., seed=None)`."""
    in_chain = {id(ds) for ds in chain(dataset)}
    hidden = []
    for ds in _datasets(dataset):
        name = type(ds).__name__
        if id(ds) not in in_chain and ds in unseeded_shuffles(ds):
            hidden.append("a shuffle() without a seed in an input of a zip (or enumerate)")
        if name == "_DirectedInterleaveDataset" and any(
                _unseeded_random(d) for d in _datasets(getattr(ds, "_selector_input", None))):
            hidden.append("a sample_from_datasets() without a seed")
        for value in vars(ds).values():
            graph = getattr(getattr(value, "function", None), "graph", None)
            try:
                if graph is not None and _unseeded_shuffle_in(graph.as_graph_def()):
                    hidden.append(f"a shuffle() without a seed in the function of {name}")
            except (AttributeError, ValueError, TypeError):
                pass
    return hidden


def is_infinite(dataset):
    return dataset.cardinality() == tf.data.INFINITE_CARDINALITY


def _datasets(dataset):
    """Every dataset of the pipeline: its chain and the inputs of zips and
    concatenations."""
    seen, todo, out = set(), [dataset], []
    while todo and len(out) < 10000:
        ds = todo.pop()
        if id(ds) in seen:
            continue
        seen.add(id(ds))
        out.append(ds)
        try:
            todo.extend(ds._inputs())
        except (AttributeError, TypeError, NotImplementedError):
            pass
    return out


def _stateful(graph_def):
    ops = {n.op for n in graph_def.node}
    for f in graph_def.library.function:
        ops.update(n.op for n in f.node_def)
    for op in ops:
        op_def = op_def_registry.get(op)
        if op_def is None or op_def.is_stateful:  # unknown: assume the worst
            return True
    return False


def has_stateful_functions(dataset):
    """Whether a function of the pipeline (a map's, a filter's, a generator's)
    has a stateful op: a random draw, a Python function, a lookup table. Its
    elements may then differ from process to process by design (random
    augmentation); None of the functions could be read is also True."""
    for ds in _datasets(dataset):
        for value in vars(ds).values():
            function = getattr(value, "function", None)
            graph = getattr(function, "graph", None)
            if graph is None:
                continue
            try:
                if _stateful(graph.as_graph_def()):
                    return True
            except (AttributeError, ValueError, TypeError):
                return True
    return False
