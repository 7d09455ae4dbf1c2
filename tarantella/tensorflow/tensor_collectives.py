"""allreduce, broadcast and allgather that give TensorFlow tensors back for tensors.

The NumPy collectives of tarantella.common take tensors (and nested lists,
tuples and dicts of tensors, arrays and scalars) but return NumPy arrays;
these return the same structure with a `tf.Tensor` wherever the input had a
`tf.Tensor` or `tf.Variable` (of the same dtype), and NumPy values elsewhere.
Inside a `tf.function` (every leaf becomes a tensor, every call an op) they make the
requests they make eagerly, so that a traced call pairs with an eager one: a
call of one tensor or of a structure, named or not, as the compiled ops
(tarantella/tensorflow/ops; a structure of leaves of unknown shape, or without the
compiled ops, as one `tf.numpy_function`, see _run); eagerly they run at once.
"""
import hashlib
import sys
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.ops.control_flow_v2_func_graphs import ControlFlowFuncGraph

from tarantella.common import collectives, core, dtypes, errors, master_only, request_names
from tarantella.common.thread_setting import set_in_thread
from tarantella.tensorflow import collective_ops
from tarantella.tensorflow import ops as tf_ops

# The entry points run as plain Python while a tf.function traces them, as Keras'
# own code does: autograph, left to convert them (and everything they call)
# afresh in every thread that traces, converted them wrongly when threads traced
# at once (measured: "tf___thread_window() missing 1 required positional
# argument: 'thread'" in one of three threads). They call no user code.
plain_python = tf.autograph.experimental.do_not_convert
_tf_data_lock = threading.Lock()

@plain_python
def allreduce(x, op="sum", name=None, prescale=1.0, out=None):
    """`tnt.allreduce` (see tarantella.common.collectives) with tensors back for
    tensors; `out=` (a NumPy array) as there."""
    if out is not None:
        return collectives.allreduce(x, op=op, name=name, prescale=prescale, out=out)
    return _run(x, lambda v, n, scale=prescale: collectives.allreduce(v, op=op, name=n, prescale=scale),
                kind="allreduce", name=name, op=op, scale=prescale)


@plain_python
def broadcast(x, root=0, name=None, out=None):
    """`tnt.broadcast` with tensors back for tensors; `out=` as there."""
    if out is not None:
        return collectives.broadcast(x, root=root, name=name, out=out)
    return _run(x, lambda v, n: collectives.broadcast(v, root=root, name=n),
                kind="broadcast", name=name, root=root)


@plain_python
def allgather(x, name=None):
    """`tnt.allgather` with tensors back for tensors."""
    return _run(x, lambda v, n: collectives.allgather(v, name=n), kind="allgather", name=name)


def _is_tensor(leaf):
    return isinstance(leaf, (tf.Tensor, tf.Variable))


_stand_in = threading.local()  # active: the model runs on a stand-in sample (contributing_nothing)


def contributing_nothing():
    """Calls made inside (traced or eager) contribute nothing: zeros to an allreduce or to a
    broadcast of another root, no rows to an allgather. tnt.Model.predict runs the model of a
    rank whose slice of the last batch is empty on one sample of zeros, for the structure of the
    outputs, and drops its rows; a layer's own collective sent that stand-in sample's values (a
    layer centring on the global batch mean counted one sample more than there were: the other
    ranks' predictions off, without a word)."""
    return set_in_thread(_stand_in, "active", True, default=False)


_predicting = threading.local()  # samples: this rank's slice size in tnt.Model.predict's step


def predicting(local_batch):
    """tnt.Model.predict's step is traced inside: `local_batch` (a scalar tensor) is this rank's
    slice of the batch, 0 where predict runs the model on a stand-in sample (see
    _root_has_samples)."""
    return set_in_thread(_predicting, "samples", local_batch)


def stand_in_active():
    """Whether the model runs on predict's stand-in sample (contributing_nothing): what it adds
    to a sum over ranks must be nothing."""
    return getattr(_stand_in, "active", False)


def _nothing_to_send(root, where, batches):
    """The error of a broadcast whose root is a rank with an empty slice of the batch."""
    return (f"tnt.broadcast from root {root} in {where}, where rank {root}'s slice of the batch is empty (a "
            "last batch with fewer samples than ranks): it has nothing to send. Broadcast from a rank that "
            f"gets samples (rank 0), or {batches} that give every rank a sample")


def _samples_here():
    """(this rank's samples in the batch, where, what to do) inside a tnt.Model step or
    predict step, whose last batch can leave a rank an empty slice; None elsewhere."""
    from tarantella.tensorflow import step_context

    predict = ("tnt.Model.predict", "predict in batches")
    if getattr(_stand_in, "active", False):
        return (0,) + predict
    samples = getattr(_predicting, "samples", None)  # (predict's step has a step context too)
    if samples is not None:
        return (samples,) + predict
    context = step_context.current()
    if context is not None:
        # the empty branch (StepContext.replay) makes the real branch's calls: no samples
        return (0 if context._in_replay else context.local_batch, "a tnt.Model step", "use batches")
    return None


_noting = threading.local()  # active: _root_has_samples' own broadcast is being made


def _root_has_samples(root, name, samples, where, batches):
    """Before a broadcast in a step whose slice may be empty, the root broadcasts whether it has
    samples, and every rank fails (an InvalidUsageError) where it has none: a rank whose slice
    is empty has nothing right to send. Without it the empty root alone failed, and the other
    ranks waited in the broadcast until TNT_TIMEOUT_S (a TimeoutError naming no cause). Returns
    the check (traced: an op the broadcast must wait for), or None."""
    flag = tf.reshape(tf.cast(tf.convert_to_tensor(samples) > 0, tf.float32), [1])
    flag_name = None
    if name is not None:  # a named call stays named (unnamed ones shift the sequence's numbers)
        flag_name = f"{name}.root_has_samples"
        if len(flag_name.encode()) > 255:
            flag_name = f"tnt.root_has_samples.{hashlib.sha1(name.encode()).hexdigest()}"
    with set_in_thread(_noting, "active", True, default=False):
        noted = broadcast(flag, root=root, name=flag_name)
    message = _nothing_to_send(root, where, batches)
    if tf.executing_eagerly():
        if not float(noted[0]) > 0:
            raise errors.InvalidUsageError(message)
        return None

    @collective_ops.reporting  # fit / predict raise it as itself (collective_errors)
    def check(value):
        if not float(value[0]) > 0:
            raise errors.InvalidUsageError(message)
        return value

    return tf.numpy_function(check, [noted], tf.float32, stateful=True, name="TntRootHasSamples")


def _nothing_of(leaf, kind):
    """What a stand-in `leaf` contributes: nothing (contributing_nothing). A number or an array
    too (it goes into the graph like a tensor, _run): zeros, or no rows to an allgather. A
    broadcast from the stand-in's rank fails on every rank before it is made (_root_has_samples)."""
    if not _is_tensor(leaf):
        try:
            array = collectives._leaf_array(leaf, kind)[0]
        except Exception:  # noqa: BLE001 - not a leaf the collectives take: refused as it is (_run)
            return leaf
        if tf.executing_eagerly():
            return array.reshape((-1,) + array.shape[1:])[:0] if kind == "allgather" else np.zeros_like(array)
        leaf = tf.convert_to_tensor(array)
    if kind == "allgather":
        # no rows, also for a scalar (gathered as one row of each rank: the stand-in's zero was a
        # row, and a mean of the gathered per-rank values of the last batch was off, without a word)
        return (leaf[:0] if leaf.shape.rank else tf.zeros([0], leaf.dtype))
    return tf.zeros_like(leaf)


def _run(x, collective, kind, name=None, **options):
    master_only.refuse(f"tnt.{kind}")  # eagerly, and when a tf.function is traced
    leaves, rebuild = collectives.flatten(x)
    _refuse_composite(leaves, kind)
    noting = getattr(_noting, "active", False)
    if getattr(_stand_in, "active", False):
        leaves = [_nothing_of(leaf, kind) for leaf in leaves]
        x = rebuild(leaves)
    traced = not tf.executing_eagerly()
    # Traced, every call goes into the graph, also one without a tensor (numbers, arrays, an empty
    # structure): made where the function was traced, such a call ran once, at its trace, and
    # never when the function ran; a rank that ran the same step eagerly made it at every step,
    # and the ranks waited for each other until TNT_TIMEOUT_S (or paired later unnamed calls
    # wrongly).
    tensors_in = traced or any(_is_tensor(leaf) for leaf in leaves)
    here = _samples_here() if kind == "broadcast" and not noting else None
    check = None  # traced: the root's note, which the broadcast's inputs wait for
    if here is not None:
        check = _root_has_samples(options["root"], name, *here)
    if tensors_in:
        # The choice of path (tf_ops.get) is agreed by every rank in a collective of its own
        # ("tnt.tf_ops.agree"), made at the first call with tensors, eager or traced: made only
        # where a call was traced, a rank that traced its loop waited there for a rank that ran
        # the same loop eagerly, which was in the call's own collective, until TNT_TIMEOUT_S.
        compiled = tf_ops.get()
    if traced:
        # Traced, a call makes the very requests it makes eagerly (names, sizes, layouts), so that a
        # rank that runs the step eagerly (run_eagerly=True on one rank, a custom loop traced on
        # some ranks only) pairs each call with the same call on a rank that traced it. The
        # compiled ops take a call of one tensor, which is one request on both paths: under its
        # name, or, unnamed, under the next name of the tracing thread's sequence (or the tf.data
        # function's, _traced_sequence) taken when the op *runs*, from the core's counter of that
        # sequence, which the eager calls of that sequence count on too ("allreduce.<k>",
        # request_names.unnamed_counter). A structure goes as the NumPy API sends it (one request
        # per dtype, with the structure's digest, see collectives._structure_collective), on the
        # compiled ops too (_run_structure), or, where its leaves' shapes are not known at trace
        # time (the digest is made of them), on the numpy_function path, named alike when it
        # runs. (Before, the compiled ops named a call
        # "<name>.0", one request per leaf, and an unnamed one "tf.allreduce.<function>.0" at trace
        # time: a traced rank and an eager one waited for each other until TNT_TIMEOUT_S; then an
        # unnamed call went through tf.numpy_function for its name, ~15 times the op's cost.)
        _refuse_as_eagerly(x, leaves, kind, name, options)
        # a number leaf as the NumPy API takes it (np.asarray: 1.5 is float64, 3 int64), not as
        # tf.convert_to_tensor does (float32, int32): else the traced call's dtypes, and its
        # structure's digest, differ from the eager call's, which then fail against each other
        tensors = [tf.convert_to_tensor(leaf if _is_tensor(leaf) else collectives._leaf_array(leaf, kind)[0])
                   for leaf in leaves]
        if check is not None:  # the broadcast waits for the root's note (every rank fails before it)
            with tf.control_dependencies([check]):
                tensors = [tf.identity(t) for t in tensors]
        scale = options.get("scale")
        if kind == "allreduce":  # refused at trace time, on every path, as eagerly (an empty
            # structure's too: it was refused only when the function ran, as a TensorFlow error)
            tf_ops.check_scale(scale, [t for t in tensors if t.dtype.name in dtypes.SUPPORTED])
        if not tensors:  # an empty structure: one request of no values, as eagerly
            result = _run_in_graph(tensors, rebuild, collective, kind, name)
        elif compiled is not None and not collectives._is_structure(x) and \
                tensors[0].dtype.name in dtypes.SUPPORTED and (kind != "allgather" or tensors[0].shape.rank):
            if name is not None:
                result = compiled.run(kind, tensors, [name], **options)[0]
            else:
                result = compiled.run(kind, tensors, None, sequence=_traced_sequence(kind), **options)[0]
        elif compiled is not None and collectives._is_structure(x) and _compiled_structure(tensors, kind):
            result = rebuild(_run_structure(compiled, x, tensors, kind, name, options))
        else:
            result = _run_in_graph(tensors, rebuild, collective, kind, name, scale if _is_tensor(scale) else None)
        if not noting:  # _root_has_samples' broadcast: made again by the broadcast it precedes
            _log_for_empty_slice(tensors, rebuild, kind, name, options)
        return result
    values, rebuild_result = collectives.flatten(collective(x, name))
    return rebuild_result([tf.convert_to_tensor(v, dtype=leaf.dtype) if _is_tensor(leaf) else v
                           for leaf, v in zip(leaves, values)])


def _refuse_composite(leaves, kind):
    """A RaggedTensor, SparseTensor or IndexedSlices leaf is refused as the TypeError of any other
    leaf the collectives do not take, naming its type and what to pass instead, alike eagerly and
    traced, alone and in a structure (collectives.composite_leaf_error, the NumPy collectives'
    check). Before, a RaggedTensor was "dtype object is not supported" eagerly in a structure, and
    traced "a symbolic tensor ... cannot go through the NumPy collectives: ... use the framework
    frontend's collectives", which was what the user called; alone eagerly, a RaggedTensor or an
    IndexedSlices was "expects a NumPy array"."""
    for leaf in leaves:
        error = collectives.composite_leaf_error(leaf, kind)
        if error is not None:
            raise error


def _compiled_structure(tensors, kind):
    """Whether a structure of `tensors` (its leaves) goes on the compiled ops: leaves of dtypes they
    take, of shapes known when the function is traced (its digest is made of them; an allgather's
    but for the first dimension). Any other (a leaf of unknown shape, an empty structure) goes on
    one tf.numpy_function over the NumPy API, which makes the same requests (docs/api.md)."""
    if not tensors:
        return False
    for t in tensors:
        if t.dtype.name not in dtypes.SUPPORTED or t.shape.rank is None:
            return False
        if not (t.shape[1:] if kind == "allgather" else t.shape).is_fully_defined():
            return False
    return True


def _run_structure(compiled, x, tensors, kind, name, options):
    """A structure's call on the compiled ops, with the requests the NumPy API makes for it
    (collectives._structure_collective, _allgather_structure): one flat request per dtype, in the
    order the dtypes first appear among the leaves (an allgather's after one of the leaves' row
    counts, its first), the first named after the call (unnamed: the next name of the sequence,
    taken when the op runs) and the others "<name>.<dtype>", each carrying the structure's digest
    computed from the leaves' static shapes as the NumPy API computes it from the arrays'. The
    leaves (one per output) in flatten's order. Before, a structure went through one
    tf.numpy_function (~35 us a call, and the GIL)."""
    gather = kind == "allgather"
    specs, order, groups = [], [], []
    for t in tensors:
        shape = tuple(t.shape.as_list())
        specs.append((np.dtype(t.dtype.as_numpy_dtype).str, shape[1:] if gather else shape))
        if t.dtype not in order:
            order.append(t.dtype)
        groups.append(order.index(t.dtype))
    layout = collectives.structure_layout(x, specs)
    suffixes = [f".{d.name}" for d in (order if gather else order[1:])]
    if name is not None:
        return compiled.structure(kind, tensors, groups, [name] + [name + s for s in suffixes], layout, **options)
    return compiled.structure(kind, tensors, groups, suffixes, layout, sequence=_traced_sequence(kind), **options)


def _log_for_empty_slice(tensors, rebuild, kind, name, options):
    """In a tnt.Model step, have a rank whose slice of the last batch is empty make this call too,
    with zeros (no rows for an allgather): that rank skips the model (tnt.Model._unless_empty),
    so a layer's, a metric's or a custom train_step's own tnt.allreduce / broadcast / allgather
    was made on the other ranks only, and every rank waited until TNT_TIMEOUT_S. Its zeros add
    nothing to a sum and no rows to a gather, as an empty slice contributes nothing; only a
    broadcast from the empty rank itself has nothing right to send, and fails on every rank
    (_root_has_samples)."""
    from tarantella.tensorflow import step_context

    context = step_context.current()
    if context is None:  # outside a tnt.Model step
        return
    from tarantella.tensorflow import distributed_optimizer
    specs = [(t.shape, t.dtype) for t in tensors]

    def zeros(shape, dtype):
        if shape.rank is None or (kind == "allgather" and shape.rank == 0):  # a scalar: no row either
            return tf.zeros([0], dtype)
        return tf.zeros([0 if d is None or (kind == "allgather" and i == 0) else d
                         for i, d in enumerate(shape.as_list())], dtype)

    def replay():
        empty = rebuild([zeros(shape, dtype) for shape, dtype in specs])
        if kind == "allreduce":
            allreduce(empty, op=options["op"], name=name)
        elif kind == "allgather":
            allgather(empty, name=name)
        else:  # from this rank, it fails on every rank before it is made (_root_has_samples)
            broadcast(empty, root=options["root"], name=name)

    context.log_call(replay, distributed_optimizer.recorded_applies())


def _refuse_as_eagerly(x, leaves, kind, name, options):
    """Refuse, while a tf.function traces the call, what the NumPy API refuses when the call runs
    eagerly, with the same errors: a bad name, op or root, a leaf that is no tensor, array or
    number, a dtype the core lacks. Left to the ops, root="0" or 0.9 was rank 0 on the compiled
    ops (int(root)), name=5 and a None leaf were TensorFlow's TypeError and ValueError, and a
    bool tensor or a bad name failed only when the function ran, as a TensorFlow error."""
    if name is not None:
        request_names.auto_name(kind, name, request_names.STRUCTURE_SUFFIX_BYTES
                                if collectives._is_structure(x) else 0)
    if kind == "allreduce":
        collectives._op_code(options["op"])
    if kind == "broadcast":
        collectives.check_root(options["root"], core.get_size())
    for leaf in leaves:
        if _is_tensor(leaf):
            dtype = leaf.dtype.as_numpy_dtype if leaf.dtype != tf.string else object
        else:
            dtype = collectives._leaf_array(leaf, kind)[0].dtype  # a TypeError naming another leaf's type
        dtypes.core_dtype(dtype)


def _traced_sequence(kind):
    """The sequence that numbers, when they run, the unnamed calls traced here: that of the place
    where they are traced (_place_sequence). A tf.function traced in two places is refused at
    its trace in the second: a trace runs wherever the function is called, so a rank that ran the
    first trace in the second place (the same shape there) counted those calls in the first
    place's sequence, while a rank that traced again there (another shape: an uneven last batch)
    counted them in the second's, 'allreduce.18' against 'allreduce.0@worker', and both waited
    until TNT_TIMEOUT_S. Keeping the first place's sequence for every trace instead would number
    the calls of threads that each trace one shared function (each with a model of its own) in
    one sequence, in an order that differs between ranks: paired wrongly, without a word."""
    place = _place_sequence()
    function = _tracing_function()
    first = getattr(function, "_tnt_sequence", None)
    if first is None:
        try:
            function._tnt_sequence = (place,)  # lives as long as the function's traces
        except AttributeError:  # none found (None), or one without attributes: nothing is refused
            pass
    elif first[0] != place:
        raise errors.InvalidUsageError(
            f"an unnamed tnt.{kind} in a tf.function traced in {_place(place)}, which was first traced in "
            f"{_place(first[0])}: the function's traces run wherever it is called, so a rank that runs the "
            f"first trace in {_place(place)} numbers these calls in the sequence of {_place(first[0])}, and a "
            "rank that traces the function again there (another shape) in its own: the ranks would wait for "
            "each other until TNT_TIMEOUT_S. Name the calls (name=...), or make one tf.function per thread "
            "(per tf.data function)")
    return place


def _place(sequence):
    """A place of _place_sequence() in words."""
    if sequence is None:
        return "the main thread"
    if sequence.startswith("tf.data."):
        return f"the tf.data function {sequence[len('tf.data.'):]}"
    return f"thread {sequence!r}"


def _tracing_function():
    """What stands for the tf.function being traced, the same for all its traces: its captures
    (TensorFlow's TracingOptions.function_captures, one object per tf.function, found in the
    frame that traces; its cache of traces has __slots__), or None where there is none to find
    (then nothing is refused)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_create_concrete_function" and \
                frame.f_globals.get("__name__", "").endswith("tracing_compilation"):
            return getattr(frame.f_locals.get("tracing_options"), "function_captures", None)
        frame = frame.f_back
    return None


def _place_sequence():
    """The sequence of the place where a call is traced: the tracing
    thread's (thread_sequence(), refused here as eagerly), or, in a tf.data function (a map's,
    a filter's: graphs tf.data names "Dataset_<transformation>_<function>"), a sequence of that
    function's own. tf.data runs those in threads of its own, ahead of the main thread
    (prefetch): in the main thread's sequence, their calls and the main thread's took the
    numbers in an order that differs between ranks, and paired one rank's map call with
    another's step call, without a word where the shapes agreed."""
    thread = request_names.thread_sequence()
    graph = tf.compat.v1.get_default_graph()
    # The graphs this one is traced inside: a cond or while branch's function, and a tf.function
    # called by a tf.data function (a helper the map calls), traced inside the map's graph: looked
    # at only as far as the branch's own function, such a helper's calls took the tracing
    # thread's sequence, and the map's calls and the main thread's paired across ranks by timing
    # (22 of 30 elements summed with other values, without a word).
    while graph is not None:
        function = getattr(graph, "name", "") or ""
        if not isinstance(graph, ControlFlowFuncGraph) and function.startswith(("Dataset_", "tf_data_")):
            return _tf_data_sequence(graph, function) + (f"@{thread}" if thread is not None else "")
        graph = getattr(graph, "outer_graph", None)
    return thread


_tf_data_functions = {}  # tf.data graph name -> how many graphs of that name have been traced


def _tf_data_sequence(graph, function):
    """The sequence of one tf.data function's graph: "tf.data.<graph name>", then ".1", ".2", ...
    for later graphs of the same name, in the order they are traced (program order: a dataset's
    map is traced as it is built, alike on every rank). By name alone, two datasets mapped with
    functions of one name (`ds.map(lambda x: ...)` for training and validation) shared one
    sequence, and their prefetching threads took its numbers in orders of their own on each rank:
    every element paired with another on the other rank, without a word."""
    sequence = getattr(graph, "_tnt_sequence", None)
    if sequence is None:
        with _tf_data_lock:
            k = _tf_data_functions.get(function, 0)
            _tf_data_functions[function] = k + 1
        sequence = graph._tnt_sequence = f"tf.data.{function}" + (f".{k}" if k else "")
    return sequence


def _run_in_graph(tensors, rebuild, collective, kind, name, scale=None):
    """One tf.numpy_function over the NumPy API on `tensors` (the leaves); `scale`: an allreduce's prescale given as a
    tensor, which travels as one more input (captured, the NumPy API got the symbolic tensor
    and refused it at run time, where the compiled ops take it). An unnamed call is named at run
    time, in the sequence of the thread that traced it: TensorFlow runs the function in threads
    of its own, whose unnamed calls would all share the main thread's sequence."""
    extra = [] if scale is None else [tf.convert_to_tensor(scale)]
    sequence = _traced_sequence(kind) if name is None else None
    gather = kind == "allgather"

    # reporting: fit / evaluate / predict raise a failure of the call (a MismatchError, a
    # PeerLostError) as itself (collective_ops.collective_errors), as they do the compiled ops';
    # it was TensorFlow's UnknownError "Graph execution error", the cause deep in its text
    @collective_ops.reporting
    def run(*arrays):
        args = arrays[len(tensors):]  # the prescale's value, if it is a tensor
        called = name if name is not None else collectives.next_unnamed(kind, sequence)
        out = collectives.flatten(collective(rebuild(list(arrays[:len(tensors)])), called, *args))[0]
        return [a.astype(t.dtype.as_numpy_dtype, copy=False) for a, t in zip(out, tensors)]

    out = tf.numpy_function(run, tensors + extra, [t.dtype for t in tensors], stateful=True,
                            name="TntCollective")
    if not tensors:  # an empty structure: an op of no outputs (an Operation), kept as stateful
        return rebuild([])
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
