"""TensorFlow ops over the core's NumPy collectives.

Every op here is a `tf.numpy_function` over a *group* of tensors: per-call
overhead (about 30-55 us, GIL included) dominates for many small tensors, so
small gradients are flattened and concatenated in TF (cheap, multithreaded)
into packs of at most TNT_FUSION_THRESHOLD_KB, the core's fusion threshold,
and each pack is one request (see _layout). Gradients go in a few buckets
in backprop order, each started by its own op as soon as its tensors exist, so
that communication overlaps the rest of backprop (see weighted_average). The
functions are stateful so that automatic control dependencies keep them in
program order: every rank then submits its requests in the same order, and
nothing is pruned.

With the compiled ops (tarantella/tensorflow/ops, the default when they can
be built) the same requests go through TntCollectiveStart/Wait instead of
Python calls; TNT_TF_OPS=numpy keeps the numpy_function ops below.

Neither kind can be XLA-compiled (no XLA kernel); see Model.compile.
"""
import contextlib
import functools
import itertools
import threading

import numpy as np
import tensorflow as tf

from tarantella.common import collectives, config, core, errors, request_names
from tarantella.tensorflow import compression as compression_lib
from tarantella.tensorflow import ops as tf_ops


_last_error = [None]  # the latest TarantellaError raised inside a collective op


def reporting(function):
    """Wrap the body of a tf.numpy_function: TensorFlow re-raises what it
    raises as an OpError ("Graph execution error ... PeerLostError: ..."), so
    remember the TarantellaError itself for collective_errors()."""

    @functools.wraps(function)
    def wrapper(*args):
        try:
            return function(*args)
        except errors.TarantellaError as exc:
            _last_error[0] = exc
            raise

    return wrapper


@contextlib.contextmanager
def collective_errors(timeout_hint=None):
    """Raise a TarantellaError that a collective op raised inside a TensorFlow
    function (PeerLostError naming the rank that failed, TimeoutError, ...) as
    itself, instead of the OpError TensorFlow wraps it in; a TimeoutError
    with `timeout_hint` (a sentence on its likely cause) after its message."""
    _last_error[0] = None
    try:
        yield
    except tf.errors.OpError as exc:
        error, _last_error[0] = _last_error[0], None
        if error is None or type(error).__name__ not in str(exc):
            error = tf_ops.tarantella_error(exc)  # a compiled op's failure
            if error is None:
                raise
        if timeout_hint and isinstance(error, errors.TimeoutError):
            error = errors.TimeoutError(f"{error} {timeout_hint}", rank=error.rank)
        raise error.with_traceback(None) from exc


def _fusion_threshold_bytes():
    """TNT_FUSION_THRESHOLD_KB in bytes: the core fuses consecutive allreduces
    up to it, and weighted_average packs small gradients up to it (0: neither)."""
    return config.get("TNT_FUSION_THRESHOLD_KB") * 1024


def _gathered_slices(slices, scale, name):
    """The IndexedSlices of every rank, concatenated in rank order, each rank's
    values multiplied by its `scale` (w_r / Σ w): an embedding's gradient as
    serial training computes it. Its slices are one per looked-up token, with
    an index repeated for every occurrence, and rank r's tokens are the r-th
    contiguous part of the global batch's, so the concatenation is the serial
    gradient's slices, in the serial order. Summing the dense forms instead
    gives the same dense gradient, but Keras' optimizers apply an
    IndexedSlices gradient slice by slice: Adam, RMSprop, Adagrad, ... add the
    *squares of the slices* (a repeated index counts the sum of its squares,
    not the square of its sum) and clipnorm takes the norm of the slices, so a
    dense gradient trains differently from serial Keras (measured: an
    Embedding with Adam, weights 0.15 apart after one step on 2 ranks)."""
    values = slices.values * tf.cast(scale, slices.values.dtype)
    indices = tf.cast(slices.indices, tf.int64)
    values, indices = allgather_tensors([values, indices], [f"{name}.values", f"{name}.indices"])
    return tf.IndexedSlices(values, tf.cast(indices, slices.indices.dtype), slices.dense_shape)


def _check_float(tensor):
    if not tensor.dtype.is_floating:
        raise TypeError(
            f"Tarantella averages floating-point gradients only. Received: a gradient of dtype "
            f"{tensor.dtype.name}")


# Gradients are reduced in a few *buckets*, in the order backprop produces them
# (the reverse of the variables' order: the last layers' gradients come first).
# Each bucket has its own "start" op, which depends only on that bucket's
# gradients, so its allreduce runs while backprop is still computing the
# earlier layers' gradients; one "wait" op at the end collects every result.
# Every op costs a Python call (about 30-55 us), so the buckets are few: about
# total / _MAX_BUCKETS bytes each, never less than _MIN_BUCKET_BYTES.
_MAX_BUCKETS = 4
_MIN_BUCKET_BYTES = 1 << 20

_steps = {}  # key -> _Step: the requests in flight of one execution of the ops
_step_keys = itertools.count(1)
_steps_lock = threading.Lock()


class _Step:
    def __init__(self, weight_handle, scale, name=None):
        self.weight_handle = weight_handle
        self.scale = scale
        self.handles = []
        self.name = name

    def prescale(self, weight):
        if self.scale is None:
            total = float(self.weight_handle.wait()[0])
            self.weight_handle = None
            self.scale = weight / total if total > 0 else 0.0
        return self.scale


def _register(step):
    """Register `step` under a new key, and let go of the earlier steps of its name: a step whose
    wait never ran (an op between its starts and its wait failed, and TensorFlow dropped the rest
    of it) stayed here for good, with its requests' handles and gradient-sized buffers. The
    steps of one name run one after the other (each step's wait comes before the next one's
    begin; threads have names of their own, request_names.in_thread), so an earlier one still
    here is such a step. Its dropped handles become orphans, released once the core is done
    with their buffers (collectives.Handle.__del__)."""
    with _steps_lock:
        for key in [k for k, s in _steps.items() if s.name == step.name]:
            del _steps[key]
        key = next(_step_keys)
        _steps[key] = step
    return key


def _buckets(tensors, present):
    """Indices of `present` grouped into buckets, in backprop order."""
    order = list(reversed(present))
    nbytes = {i: (tensors[i].shape.num_elements() or 0) * tensors[i].dtype.size for i in order}
    target = max(_MIN_BUCKET_BYTES, -(-sum(nbytes.values()) // _MAX_BUCKETS))
    buckets, current, size = [], [], 0
    for i in order:
        if current and size + nbytes[i] > target:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes[i]
    buckets.append(current)
    return buckets


def _layout(tensors, bucket, threshold):
    """A bucket's requests: its gradients of at most `threshold` bytes packed,
    per dtype and in order, into flat buffers of at most `threshold` bytes
    ((indices, dtype)), then the others alone, as zero-copy views ([index],
    None). This is the core's fusion rule, applied in TF before the request:
    one numpy_function input and one request per pack instead of one per
    gradient (see docs/keras.md, "Fusion"). threshold 0: every gradient alone."""
    packs, open_packs, single = [], {}, []
    for i in bucket:
        n = tensors[i].shape.num_elements()
        nbytes = None if n is None else n * tensors[i].dtype.size
        if nbytes is None or threshold <= 0 or nbytes > threshold:
            single.append(i)
            continue
        dtype = tensors[i].dtype
        pack = open_packs.get(dtype)
        if pack is None or pack[1] + nbytes > threshold:
            pack = open_packs[dtype] = [[], 0]
            packs.append((pack[0], dtype))
        pack[0].append(i)
        pack[1] += nbytes
    return [(idx, dtype if len(idx) > 1 else None) for idx, dtype in packs] + \
        [([i], None) for i in single]


def weighted_average(tensors, weight=None, name="tnt.grads", total=None, compression=None):
    """Σ_r w_r·t_r / Σ_r w_r over all ranks, for each tensor of `tensors`.

    `weight` is this rank's scalar weight (e.g. its micro-batch size, so that
    the result is exactly the serial mean gradient; 0 for a rank with an empty
    micro-batch); None weights every rank equally. The weights are summed
    first (one 8-byte allreduce, started as soon as the weight is known, i.e.
    before backprop), so that each rank can prescale its data by w_r / Σ w:
    the data then needs a single pass, with no division afterwards. When the
    caller already knows Σ_r w_r, it passes it as `total` (a scalar tensor,
    the same on every rank) and no weight allreduce is made; weight=1 with
    total=1 is the plain sum. `None` entries are passed through.

    The tensors are sent in buckets, in reverse order (backprop order): each
    bucket starts as soon as its own tensors exist, and the result waits for
    all of them.

    `compression` (tnt.Compression.fp16 / bf16; None or none: exact) casts
    float32 tensors to 16 bits for the allreduce and the results back.

    A `tf.IndexedSlices` (an embedding's gradient) is not summed but gathered:
    the result is the IndexedSlices of every rank, each scaled by w_r / Σ w,
    which is what serial training's optimizer gets (see _gathered_slices).
    It travels uncompressed.
    """
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    present = [i for i, t in enumerate(tensors) if t is not None and i not in sparse]
    if core.get_size() == 1 or not (present or sparse):
        return tensors
    for i in present + sparse:
        _check_float(tensors[i])
    size = core.get_size()
    equal_weights = weight is None
    weight = tf.constant(-1.0, tf.float64) if weight is None else tf.cast(weight, tf.float64)
    known_total = total is not None
    total = tf.constant(-1.0, tf.float64) if total is None else tf.cast(total, tf.float64)
    if sparse:
        if not equal_weights and not known_total:  # one sum of the weights for both kinds
            total, known_total = sum_across_ranks([weight], name=f"{name}.w")[0], True
        scale = tf.constant(1.0 / size, tf.float64) if equal_weights else tf.where(
            total > 0, weight / total, tf.constant(0.0, tf.float64))
        for k, i in enumerate(sparse):
            tensors[i] = _gathered_slices(tensors[i], scale, f"{name}.s{k}")
        if not present:
            return tensors
    compressor = compression_lib.resolve(compression)
    originals, contexts = tensors, {}
    tensors = list(tensors)
    for i in present:
        tensors[i], contexts[i] = compressor.compress(originals[i])

    @reporting
    def begin(w, t):
        w, t = float(w), float(t)
        if w < 0:  # equal weights
            step = _Step(None, 1.0 / size, name)
        elif t >= 0:  # the caller knows the total
            step = _Step(None, w / t if t > 0 else 0.0, name)
        else:
            step = _Step(collectives.allreduce_async(np.array([w]), op="sum", name=f"{name}.w"),
                         None, name)
        return np.int64(_register(step))

    # Stateful ops are chained by automatic control dependencies in program
    # order: begin, then the buckets in backprop order, then the wait.
    compiled = tf_ops.get()
    if compiled is None:
        key = tf.numpy_function(begin, [weight, total], tf.int64, stateful=True, name="TntGradsBegin")
    else:  # the compiled ops take this rank's prescale as a tensor
        key = _compiled_scale(compiled, None if equal_weights else weight, total if known_total else None,
                              size, name)
    layouts, tokens, arrays_in = [], [], []
    threshold = _fusion_threshold_bytes()
    for b, bucket in enumerate(_buckets(tensors, present)):
        layout = _layout(tensors, bucket, threshold)
        inputs = [tf.concat([tf.reshape(tensors[i], [-1]) for i in idx], 0) if dtype is not None
                  else tensors[idx[0]] for idx, dtype in layout]
        names = [f"{name}.b{b}.{k}" for k in range(len(inputs))]

        @reporting
        def start(k, w, *arrays, names=names):
            step = _steps[int(k)]
            scale = step.prescale(float(w))
            step.handles += [collectives.allreduce_async(a, op="sum", name=n, prescale=scale)
                             for a, n in zip(arrays, names)]
            return k

        if compiled is None:
            tokens.append(tf.numpy_function(start, [key, weight] + inputs, tf.int64, stateful=True,
                                            name="TntGradsStart"))
        else:
            tokens.append(compiled.start("allreduce", inputs, names, scale=key))
        layouts += layout
        arrays_in += inputs

    @reporting
    def finish(k, *tokens):
        with _steps_lock:
            step = _steps.pop(int(k))
        return [h.wait() for h in step.handles]

    if compiled is None:
        reduced = tf.numpy_function(finish, [key] + tokens, [a.dtype for a in arrays_in],
                                    stateful=True, name="TntGradsWait")
    else:
        reduced = compiled.wait(tokens, arrays_in, block=True)  # the step's end: see tnt_ops.cc
    if not isinstance(reduced, (list, tuple)):  # eagerly, one output comes back bare
        reduced = [reduced]
    out = list(tensors)
    for flat, (idx, dtype) in zip(reduced, layouts):
        if dtype is None:
            flat.set_shape(tensors[idx[0]].shape)
            out[idx[0]] = flat
            continue
        offset = 0
        for i in idx:
            n = tensors[i].shape.num_elements()
            out[i] = tf.reshape(flat[offset:offset + n], tensors[i].shape)
            offset += n
    return [t if i not in contexts else compressor.decompress(t, contexts[i]) for i, t in enumerate(out)]


def _compiled_scale(compiled, weight, total, size, name):
    """This rank's prescale w / Σ w (0 if Σ w is 0), as `begin` computes it:
    from the caller's `total` when it knows Σ w, else summed by a compiled
    allreduce of its own."""
    if weight is None:  # equal weights
        return tf.constant(1.0 / size, tf.float64)
    if total is None:
        total = compiled.run("allreduce", [tf.reshape(weight, [1])], [f"{name}.w"])[0][0]
    # a scalar, as the op takes it: a weight of shape (1,) (tf.shape(x)[:1]) is one number, as
    # the numpy_function path's float(w) takes it
    return tf.reshape(tf.where(total > 0, weight / total, tf.constant(0.0, tf.float64)), [])


def sum_across_ranks(tensors, name="tnt.sum"):
    """Σ_r t_r for each tensor (any real dtype), computed in float64: metric
    states hold counts and sums whose exact totals matter."""
    if core.get_size() == 1 or not tensors:
        return list(tensors)
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors], axis=0)

    @reporting
    def reduce(a):
        return collectives.allreduce(a, op="sum", name=name)

    compiled = tf_ops.get()
    if compiled is None:
        summed = tf.numpy_function(reduce, [flat], tf.float64, stateful=True, name="TntSum")
    else:
        summed = compiled.run("allreduce", [flat], [name])[0]
    summed.set_shape(flat.shape)
    out, offset = [], 0
    for t in tensors:
        n = tf.size(t)
        out.append(tf.cast(tf.reshape(summed[offset:offset + n], tf.shape(t)), t.dtype))
        offset += n
    return out


@tf.autograph.experimental.do_not_convert  # as tensor_collectives.plain_python (no user code)
def broadcast_variables(variables, root_rank=0):
    """Assign `root_rank`'s values to `variables` on every rank (eagerly).

    Call it after the variables exist (the model is built) and on every rank,
    e.g. at the start of a custom training loop:

        tnt.broadcast_variables(model.variables)
        tnt.broadcast_variables(optimizer.variables)   # once the optimizer is built
    """
    variables = list(variables)
    if core.get_size() == 1:
        return
    # One structure (fused per dtype, its layout compared): ranks whose lists differ in length,
    # shapes or dtypes fail with tnt.MismatchError, even where each dtype's total count agrees,
    # and an empty list on one rank fails the others instead of leaving them waiting.
    values = collectives.broadcast([np.asarray(_value(v), dtype=_numpy_dtype(v)) for v in variables],
                                   root=root_rank, name=request_names.in_thread("tnt.bcast"))
    for v, value in zip(variables, values):
        v.assign(np.asarray(value).astype(tf.as_dtype(v.dtype).as_numpy_dtype))


def _value(variable):
    return variable.numpy() if hasattr(variable, "numpy") else np.asarray(variable)


def _numpy_dtype(variable):
    dtype = tf.as_dtype(variable.dtype)
    if dtype == tf.bool:
        return np.int32  # no boolean collectives: travel as int32, assign() casts back
    return dtype.as_numpy_dtype


def allgather_tensors(tensors, names):
    """The rank-ordered concatenation of every rank's rows of each tensor (the
    first dimension may differ between ranks), one request per tensor."""
    if core.get_size() == 1 or not tensors:
        return list(tensors)
    compiled = tf_ops.get()
    if compiled is not None:
        return compiled.run("allgather", list(tensors), list(names))

    @reporting
    def gather(*arrays):
        return [allgather_array(a, n) for a, n in zip(arrays, names)]

    gathered = tf.numpy_function(gather, list(tensors), [t.dtype for t in tensors], stateful=True,
                                 name="TntAllgather")
    if not isinstance(gathered, (list, tuple)):
        gathered = [gathered]
    for g, t in zip(gathered, tensors):
        g.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
    return list(gathered)


def allgather_array(array, name):
    """The rank-ordered concatenation of every rank's NumPy array along axis 0."""
    if core.get_size() == 1:
        return array
    return collectives.allgather(np.ascontiguousarray(array), name=name)
