"""allreduce, broadcast and allgather that give TensorFlow tensors back for tensors.

The NumPy collectives of tarantella.common take tensors (and nested lists,
tuples and dicts of tensors, arrays and scalars) but return NumPy arrays;
these return the same structure with a `tf.Tensor` wherever the input had a
`tf.Tensor` or `tf.Variable` (of the same dtype), and NumPy values elsewhere.
Inside a `tf.function` (every leaf must then be a tensor) they run as the
compiled ops, one request per leaf (tarantella/tensorflow/ops), or, on the
numpy_function path (TNT_TF_OPS), as one `tf.numpy_function`; eagerly they
run at once.
"""
import hashlib
import threading
import weakref

import tensorflow as tf
from tensorflow.python.ops.control_flow_v2_func_graphs import ControlFlowFuncGraph

from tarantella.common import collectives, dtypes, master_only, request_names
from tarantella.tensorflow import ops as tf_ops

# The entry points run as plain Python while a tf.function traces them, as Keras'
# own code does: autograph, left to convert them (and everything they call)
# afresh in every thread that traces, converted them wrongly when threads traced
# at once (measured: "tf___thread_window() missing 1 required positional
# argument: 'thread'" in one of three threads). They call no user code.
plain_python = tf.autograph.experimental.do_not_convert

_graph_counts = weakref.WeakKeyDictionary()  # a traced function's graph -> its unnamed collectives so far
_graph_lock = threading.Lock()


def _graph_name(kind):
    """The name of an unnamed collective traced into a tf.function: the
    function's name and the collective's place in it, "tf.<kind>.<function>.<k>".

    Every trace of a function names its collectives alike, so ranks pair them
    whichever trace each runs. A count over all traces of the process (as
    before) differed between ranks as soon as one retraced and another did
    not (an allgather of rows that differ between ranks, an uneven last
    micro-batch), and the ranks then waited for names the others never
    submitted. A cond or while branch counts in the function that holds it.
    Traced in a thread other than the main one, the names end in
    "@<thread name>", as the NumPy collectives' unnamed calls do: threads that
    each trace a function of one name do not submit one name twice at once."""
    graph = tf.compat.v1.get_default_graph()
    while isinstance(graph, ControlFlowFuncGraph):
        graph = graph.outer_graph
    with _graph_lock:
        k = _graph_counts.get(graph, 0)
        _graph_counts[graph] = k + 1
    function = getattr(graph, "name", "graph")
    thread = request_names.thread_sequence()
    if thread is not None:
        function = f"{function}@{thread}"
    if len(function.encode()) > 64:  # leave room in the core's 255 bytes
        function = hashlib.sha1(function.encode()).hexdigest()[:16]
    return f"tf.{kind}.{function}.{k}"


@plain_python
def allreduce(x, op="sum", name=None, prescale=1.0, out=None):
    """`tnt.allreduce` (see tarantella.common.collectives) with tensors back for
    tensors; `out=` (a NumPy array) as there."""
    if out is not None:
        return collectives.allreduce(x, op=op, name=name, prescale=prescale, out=out)
    return _run(x, lambda v, scale=prescale: collectives.allreduce(v, op=op, name=name, prescale=scale),
                kind="allreduce", name=name, op=op, scale=prescale)


@plain_python
def broadcast(x, root=0, name=None, out=None):
    """`tnt.broadcast` with tensors back for tensors; `out=` as there."""
    if out is not None:
        return collectives.broadcast(x, root=root, name=name, out=out)
    return _run(x, lambda v: collectives.broadcast(v, root=root, name=name),
                kind="broadcast", name=name, root=root)


@plain_python
def allgather(x, name=None):
    """`tnt.allgather` with tensors back for tensors."""
    return _run(x, lambda v: collectives.allgather(v, name=name), kind="allgather", name=name)


def _is_tensor(leaf):
    return isinstance(leaf, (tf.Tensor, tf.Variable))


def _run(x, collective, kind, name=None, **options):
    master_only.refuse(f"tnt.{kind}")  # eagerly, and when a tf.function is traced
    leaves, rebuild = collectives.flatten(x)
    if any(_is_tensor(leaf) for leaf in leaves) and not tf.executing_eagerly():
        compiled = tf_ops.get()
        tensors = [tf.convert_to_tensor(leaf) for leaf in leaves]
        if compiled is not None and all(t.dtype.name in dtypes.SUPPORTED for t in tensors):
            return rebuild(_run_compiled(compiled, tensors, kind, name, options))
        scale = options.get("scale")
        return _run_in_graph(leaves, rebuild, collective, kind == "allgather",
                             scale if _is_tensor(scale) else None)
    values, rebuild_result = collectives.flatten(collective(x))
    return rebuild_result([tf.convert_to_tensor(v, dtype=leaf.dtype) if _is_tensor(leaf) else v
                           for leaf, v in zip(leaves, values)])


def _run_compiled(compiled, tensors, kind, name, options):
    """One request per leaf (a 0-d leaf of an allgather travels as one row)."""
    base = name if name is not None else _graph_name(kind)
    if kind == "allgather":
        tensors = [tf.reshape(t, [1]) if t.shape.rank == 0 else t for t in tensors]
    return compiled.run(kind, tensors, [f"{base}.{i}" for i in range(len(tensors))], **options)


def _run_in_graph(leaves, rebuild, collective, gather, scale=None):
    """One tf.numpy_function over the NumPy API; `scale`: an allreduce's prescale given as a
    tensor, which travels as one more input (captured, the NumPy API got the symbolic tensor
    and refused it at run time, where the compiled ops take it)."""
    tensors = [tf.convert_to_tensor(leaf) for leaf in leaves]
    extra = [] if scale is None else [tf.convert_to_tensor(scale)]

    def run(*arrays):
        args = arrays[len(tensors):]  # the prescale's value, if it is a tensor
        out = collectives.flatten(collective(rebuild(list(arrays[:len(tensors)])), *args))[0]
        return [a.astype(t.dtype.as_numpy_dtype, copy=False) for a, t in zip(out, tensors)]

    out = tf.numpy_function(run, tensors + extra, [t.dtype for t in tensors], stateful=True,
                            name="TntCollective")
    out = out if isinstance(out, (list, tuple)) else [out]  # eagerly, one output comes bare
    for o, t in zip(out, tensors):
        o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]) if gather and t.shape.rank
                    else ([None] if gather else t.shape))
    return rebuild(list(out))


class TensorAllreducer(collectives.TensorAllreducer):
    """The original Tarantella's `TensorAllreducer(inputs).allreduce(x)`: a sum
    over ranks of `x` (a tensor, array, scalar or nested structure), with
    tensors back for tensors."""

    _allreduce = staticmethod(allreduce)


class TensorBroadcaster(collectives.TensorBroadcaster):
    """The original Tarantella's `TensorBroadcaster(inputs, root_rank).broadcast(x=None)`:
    the root's `x` on every rank (others may pass nothing: `inputs` gives the
    structure to receive), with tensors back for tensors."""

    _broadcast = staticmethod(broadcast)


class TensorAllgatherer(collectives.TensorAllgatherer):
    """The original Tarantella's `TensorAllgatherer(inputs).allgather(x)`: every
    leaf concatenated along its first axis in rank order, tensors back for tensors."""

    _allgather = staticmethod(allgather)
