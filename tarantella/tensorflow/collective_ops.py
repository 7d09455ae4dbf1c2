"""TensorFlow ops over the core's NumPy collectives.

Every op here is one `tf.numpy_function` per *group* of tensors: per-call
overhead (about 30-55 us, GIL included) dominates for many small tensors, so
gradients are flattened and concatenated in TF (cheap, multithreaded) and
reduced in one request per dtype. The functions are stateful so that automatic
control dependencies keep them in program order: every rank then submits its
requests in the same order, and nothing is pruned.

These ops cannot be XLA-compiled (`PyFunc` has no XLA kernel); see Model.compile.
"""
import numpy as np
import tensorflow as tf

from tarantella.common import collectives, core

# Gradients up to this many elements are packed into one buffer per dtype
# (one Python-level request instead of dozens: the per-request cost dominates
# for small tensors); larger ones travel as they are, as zero-copy views,
# because copying megabytes into a packed buffer and back costs more than the
# request. The core fuses consecutive small requests again on the wire.
_PACK_MAX_ELEMENTS = 1 << 16


def _as_dense(tensor):
    # Embedding gradients arrive as IndexedSlices; the dense form keeps every
    # rank's request the same size (as Horovod's sparse_as_dense).
    if isinstance(tensor, tf.IndexedSlices):
        return tf.convert_to_tensor(tensor)
    return tensor


def _check_float(tensor):
    if not tensor.dtype.is_floating:
        raise TypeError(
            f"Tarantella averages floating-point gradients only. Received: a gradient of dtype "
            f"{tensor.dtype.name}")


def weighted_average(tensors, weight=None, name="tnt.grads"):
    """Σ_r w_r·t_r / Σ_r w_r over all ranks, for each tensor of `tensors`.

    `weight` is this rank's scalar weight (e.g. its micro-batch size, so that
    the result is exactly the serial mean gradient; 0 for a rank with an empty
    micro-batch); None weights every rank equally. The weights are summed
    first (one 8-byte allreduce), so that each rank can prescale its data by
    w_r / Σ w: the data then needs a single pass, with no division afterwards.
    `None` entries are passed through.
    """
    tensors = [None if t is None else _as_dense(t) for t in tensors]
    present = [i for i, t in enumerate(tensors) if t is not None]
    if core.get_size() == 1 or not present:
        return list(tensors)
    for i in present:
        _check_float(tensors[i])
    weight = tf.constant(-1.0, tf.float64) if weight is None else tf.cast(weight, tf.float64)

    packed, single = {}, []  # dtype -> indices packed together; indices sent alone
    for i in present:
        if tensors[i].shape.num_elements() is not None and \
                tensors[i].shape.num_elements() <= _PACK_MAX_ELEMENTS:
            packed.setdefault(tensors[i].dtype, []).append(i)
        else:
            single.append(i)
    inputs = [tf.concat([tf.reshape(tensors[i], [-1]) for i in idx], 0) for idx in packed.values()]
    inputs += [tensors[i] for i in single]
    names = [f"{name}.{k}" for k in range(len(inputs))]
    size = core.get_size()

    def reduce(w, *arrays):
        w = float(w)
        if w < 0:  # equal weights
            scale = 1.0 / size
        else:
            total = float(collectives.allreduce(np.array([w]), op="sum", name=f"{name}.w")[0])
            scale = w / total if total > 0 else 0.0
        handles = [collectives.allreduce_async(a, op="sum", name=n, prescale=scale)
                   for a, n in zip(arrays, names)]
        return [h.wait() for h in handles]

    reduced = tf.numpy_function(reduce, [weight] + inputs, [t.dtype for t in inputs],
                                stateful=True, name="TntWeightedAverage")
    out = list(tensors)
    for flat, idx in zip(reduced[:len(packed)], packed.values()):
        offset = 0
        for i in idx:
            n = tensors[i].shape.num_elements()
            out[i] = tf.reshape(flat[offset:offset + n], tensors[i].shape)
            offset += n
    for result, i in zip(reduced[len(packed):], single):
        result.set_shape(tensors[i].shape)
        out[i] = result
    return out


def sum_across_ranks(tensors, name="tnt.sum"):
    """Σ_r t_r for each tensor (any real dtype), computed in float64: metric
    states hold counts and sums whose exact totals matter."""
    if core.get_size() == 1 or not tensors:
        return list(tensors)
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tensors], axis=0)

    def reduce(a):
        return collectives.allreduce(a, op="sum", name=name)

    summed = tf.numpy_function(reduce, [flat], tf.float64, stateful=True, name="TntSum")
    summed.set_shape(flat.shape)
    out, offset = [], 0
    for t in tensors:
        n = tf.size(t)
        out.append(tf.cast(tf.reshape(summed[offset:offset + n], tf.shape(t)), t.dtype))
        offset += n
    return out


def broadcast_variables(variables, root_rank=0):
    """Assign `root_rank`'s values to `variables` on every rank (eagerly).

    Call it after the variables exist (the model is built) and on every rank,
    e.g. at the start of a custom training loop:

        tnt.broadcast_variables(model.variables)
        tnt.broadcast_variables(optimizer.variables)   # once the optimizer is built
    """
    variables = list(variables)
    if core.get_size() == 1 or not variables:
        return
    groups = {}
    for v in variables:
        groups.setdefault(np.dtype(_numpy_dtype(v)), []).append(v)
    for dtype, vs in groups.items():
        flat = np.concatenate([np.asarray(_value(v), dtype=dtype).reshape(-1) for v in vs])
        flat = collectives.broadcast(flat, root=root_rank, name=f"tnt.bcast.{dtype.name}")
        offset = 0
        for v in vs:
            n = int(np.prod(v.shape, dtype=np.int64))
            value = flat[offset:offset + n].reshape(tuple(v.shape))
            v.assign(value.astype(tf.as_dtype(v.dtype).as_numpy_dtype))
            offset += n


def _value(variable):
    return variable.numpy() if hasattr(variable, "numpy") else np.asarray(variable)


def _numpy_dtype(variable):
    dtype = tf.as_dtype(variable.dtype)
    if dtype == tf.bool:
        return np.int32  # no boolean collectives: travel as int32, assign() casts back
    return dtype.as_numpy_dtype


def allgather_array(array, name):
    """The rank-ordered concatenation of every rank's NumPy array along axis 0."""
    if core.get_size() == 1:
        return array
    return collectives.allgather(np.ascontiguousarray(array), name=name)
