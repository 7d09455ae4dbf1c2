"""Global metric results from per-rank metric states, and a step's logs made global.

Keras' accumulating metrics (Mean, accuracies, AUC, Precision/Recall, F1,
MeanIoU, RMSE, the loss tracker) keep sums and counts in their variables, so
summing the variables over ranks and computing the result from the sums gives
exactly the serial value; averaging per-rank *results* would not when ranks
see different numbers of samples. The loss tracker is updated with the local
batch size as sample weight, so its summed (total, count) is the global mean
loss. Metrics that average one value per batch (PearsonCorrelation with
axis=0, a correlation over the batch's samples) are only approximately global;
with the default axis=-1 (one value per sample) they are exact.

The metric variables keep their local values; only the returned results are
global (`stateless_result`), so the per-rank state never double-counts.

A `keras.metrics.Mean` that a step updates with one value for its batch and
no sample weight (`loss_tracker.update_state(loss)`, as in Keras' guides)
counts one per update: serially one per step, on N ranks N per step, each
rank's value over its own slice. `weight_step_means` makes such an update
inside a tnt.Model step count b_r / B, this rank's share of the global batch:
the ranks' shares then add up to the serial step's count of one and value
(a batch mean's shares add up to the global batch's mean). tnt.Model applies
it at compile and again whenever it traces a step, so that a tracker added
to the model after compile counts alike. A `keras.metrics.Sum` is left as it
is: a scalar it adds is most often a total over the slice (a sample count, a
sum of losses), whose sum over the ranks is already the serial value.
"""
import functools

import keras
import tensorflow as tf

from tarantella.common import core, errors
from tarantella.tensorflow import class_swap, collective_ops, step_context


def global_metrics_result(metrics, name="tnt.metrics"):
    """The dict `Model.get_metrics_result()` would return if all ranks'
    samples had been seen by one process (one allreduce for all metrics)."""
    results = {}
    for metric, result in zip(metrics, _global_results(metrics, [], name)[0]):
        _add(results, metric, result, nested=False)
    return results


def global_logs(logs, metrics, local_batch, name="tnt.metrics"):
    """A step's `logs` as serial training shows them, from this rank's logs
    and `metrics` after a step on `local_batch` samples (one allreduce).

    An entry that is the result of one of `metrics` (its name and its value:
    `{m.name: m.result()}`, a metric that returns a dict, such as Keras'
    `compile_metrics`, under its own name or its entries' names) is that
    metric's global result. Whether it is is decided by value: an entry named
    "loss" that a custom train_step computed from its batch, while Keras'
    loss tracker (also "loss") was never updated, is not the tracker's
    result; the ranks decide together (a rank with an empty slice has no
    say), so they show the same logs. An entry that is not its namesake's
    result (or has none) but equals exactly one other metric's result on
    every rank is that metric's global result: Keras' VAE guide returns
    `{"loss": self.total_loss_tracker.result()}`. Any other scalar entry
    (several metrics equal to it: ambiguous) is the mean of the ranks' values
    weighted by their micro-batch sizes. An array that is no metric's result
    is combined by `_global_arrays`."""
    local = _by_name(metrics, [m.result() for m in metrics])
    flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(logs)]
    mask = _array_mask(logs, local)
    arrays = tf.nest.flatten(mask)
    scalars = [t for t, array in zip(flat, arrays) if not array]
    weight = tf.cast(local_batch, tf.float64)
    # log entry -> [(a metric result's name, scalar bool: this rank's value is that result)],
    # its namesake first
    candidates = {}
    for key, value in (logs.items() if isinstance(logs, dict) else []):
        if any(tf.nest.flatten(mask[key])):  # no metric's result
            continue
        for other in [key] * (key in local) + [n for n in local if n != key]:
            if _same_layout(value, local[other]):
                candidates.setdefault(key, []).append(
                    (other, tf.logical_or(local_batch <= 0, _equal(value, local[other]))))
    flags = [tf.cast(tf.logical_not(m), tf.float64) for c in candidates.values() for _, m in c]
    array_values = [t for t, array in zip(flat, arrays) if array]
    # each rank's batch and arrays' first dimensions, in its own row of a table
    # that the allreduce fills in (no extra round)
    table = _own_row([local_batch] + [tf.shape(t)[0] for t in array_values]) if array_values else []
    extra = [tf.cast(t, tf.float64) * weight for t in scalars] + [weight] + flags + table
    results, summed = _global_results(metrics, extra, name)
    n = len(scalars)
    total, mismatches = summed[n], summed[n + 1:n + 1 + len(flags)]
    combined = iter(_global_arrays(array_values, _array_keys(logs, arrays), summed[-1], name)
                    if array_values else [])
    scalar_means = iter(summed[:n])
    means = tf.nest.pack_sequence_as(logs, [
        next(combined) if array else tf.cast(tf.math.divide_no_nan(next(scalar_means), total),
                                             t.dtype)
        for t, array in zip(flat, arrays)])
    if not candidates:
        return means
    results = _by_name(metrics, results)
    out, offset = dict(means), 0
    for key, cands in candidates.items():
        matched = [mismatch == 0 for mismatch in mismatches[offset:offset + len(cands)]]
        offset += len(cands)
        out[key] = _pick(key, [n for n, _ in cands], matched, results, means[key])
    return {k: out[k] for k in logs}


def _array_mask(logs, local):
    """`logs`' structure of bools: whether each entry is an array (not a
    scalar) that is not the result of the metric it is named after. Decided
    from the ranks of the shapes only, which every rank's step has alike
    (their sizes differ with the slices')."""
    def mask(value, namesake=None):
        if namesake is not None and _same_layout(value, namesake):
            return tf.nest.map_structure(lambda _: False, value)
        return tf.nest.map_structure(lambda t: tf.convert_to_tensor(t).shape.rank != 0, value)

    if isinstance(logs, dict):
        return {key: mask(value, local.get(key)) for key, value in logs.items()}
    return mask(logs)


def _array_keys(logs, arrays):
    """The name of each array entry's log key, for error messages."""
    keys = [key for key, value in logs.items() for _ in tf.nest.flatten(value)] \
        if isinstance(logs, dict) else ["logs"] * len(arrays)
    return [k for k, array in zip(keys, arrays) if array]


def _own_row(values):
    """`values` (int scalars) in this rank's row of a [size, len(values)]
    table of zeros, flat: summed over the ranks, every rank's row."""
    size, rank = core.get_size(), core.get_rank()
    row = tf.cast(tf.stack(values), tf.float64)
    width = len(values)
    return [tf.concat([tf.zeros([rank * width], tf.float64), row,
                       tf.zeros([(size - rank - 1) * width], tf.float64)], 0)]


def _global_arrays(arrays, keys, table, name):
    """The global value of each array entry of the logs (`keys` their names),
    from every rank's rows (one allgather each, at once) and `table`: each
    rank's [batch size, the arrays' first dimensions].

    An array of one row per sample of its rank's slice on every rank (a
    custom step's `{"per_sample": losses}`) is what serial Keras shows: the
    global batch's rows, the ranks' slices in rank order. An array of the
    same length on every rank (one value per class) is the ranks' mean
    weighted by their slice sizes. Both hold when every slice's size is the
    array's length: it is taken as per sample. Any other array (its length
    neither its slice's nor the same on every rank) has no global value: an
    InvalidArgumentError on every rank names it."""
    size = core.get_size()
    table = tf.reshape(tf.cast(table, tf.int64), [size, len(arrays) + 1])
    batches = table[:, 0]
    gathered = collective_ops.allgather_tensors(
        [_gatherable(t) for t in arrays], [f"{name}.array.{i}" for i in range(len(arrays))])
    out = []
    for i, (array, rows, key) in enumerate(zip(arrays, gathered, keys)):
        lengths = table[:, i + 1]
        per_sample = tf.reduce_all(tf.equal(lengths, batches))
        same_length = tf.reduce_all(tf.equal(lengths, lengths[0]))
        per_sample = tf.numpy_function(  # raises unless one of the two
            functools.partial(_refuse_lengths, key), [per_sample, same_length, lengths, batches],
            tf.bool, stateful=True, name="TntLogArrayCheck")
        per_sample.set_shape([])

        def weighted_mean(rows=rows, lengths=lengths):
            stacked = tf.reshape(tf.cast(rows, tf.float64),
                                 tf.concat([[size, lengths[0]], tf.shape(rows, out_type=tf.int64)[1:]], 0))
            weights = tf.cast(batches, tf.float64)
            weights = tf.reshape(tf.math.divide_no_nan(weights, tf.reduce_sum(weights)),
                                 [size] + [1] * (rows.shape.rank))
            return tf.cast(tf.reduce_sum(stacked * weights, 0), array.dtype)

        out.append(tf.cond(per_sample, lambda rows=rows: tf.cast(rows, array.dtype),
                           weighted_mean))
    return out


@collective_ops.reporting
def _refuse_lengths(key, per_sample, same_length, lengths, batches):
    """`per_sample`; raise, the same on every rank (they all see the same
    table), unless the array entry `key` has one row per sample of each
    rank's slice, or the same length on every rank."""
    if not (per_sample or same_length):
        raise errors.InvalidArgumentError(
            f"The step's log entry {key!r} is an array whose length is neither the same on every "
            f"rank nor each rank's number of samples (the ranks' lengths: {lengths.tolist()}; "
            f"their slices' samples: {batches.tolist()}), so it has no global value. Return a "
            "scalar, a keras.metrics.Metric's result (exact over all ranks), or one value per "
            "sample (shown for the whole batch, as serial Keras shows it)")
    return per_sample


def _gatherable(t):
    """`t` in a dtype the allgather carries (bool and others: as float64)."""
    if t.dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64):
        return t
    return tf.cast(t, tf.float64)


def _pick(key, names, matched, results, mean):
    """The global result of the metric that entry `key` is, else `mean`: its
    namesake's (names[0] == key) where all ranks matched it, else the one
    other metric's that all ranks matched (none or several: `mean`)."""
    named = names[0] == key
    others = list(zip(names, matched))[1 if named else 0:]
    count = tf.add_n([tf.cast(m, tf.int32) for _, m in others]) if others else 0
    choices = [(tf.logical_and(m, count == 1), n) for n, m in others]
    if named:
        choices.append((matched[0], key))  # last: it wins
    picked = mean
    for chosen, name in choices:
        picked = tf.nest.map_structure(
            lambda result, current, chosen=chosen: tf.where(chosen, tf.cast(result, current.dtype),
                                                            current),
            results[name], picked)
    return picked


def _global_results(metrics, extra, name):
    """([each metric's global result], [Σ_r t_r for t in extra]): one allreduce.

    A metric variable's global value follows its `aggregation`, as Keras
    reads a metric's variables under a tf.distribute strategy: "sum" (the
    default of `Metric.add_variable`, and what every Keras metric declares)
    and "none" the sum over the ranks, "mean" their mean, "only_first_replica"
    the master's value. Every variable was summed: a custom metric's state
    declared `aggregation="mean"` (a running mean) or "only_first_replica"
    (a step counter every rank updates alike) showed N times the serial value
    on N ranks, without a word."""
    variables = [v for m in metrics for v in m.variables]
    aggregations = [_aggregation(v) for v in variables]
    master = core.get_rank() == core.get_master_rank()
    states = [tf.zeros_like(v.value) if how == "only_first_replica" and not master else v.value
              for v, how in zip(variables, aggregations)]
    summed = collective_ops.sum_across_ranks(states + list(extra), name=name)
    size = core.get_size()
    values = [s if how != "mean" else s / tf.cast(size, s.dtype) if s.dtype.is_floating else s // size
              for s, how in zip(summed, aggregations)]
    results, offset = [], 0
    for metric in metrics:
        count = len(metric.variables)
        results.append(_stateless_result(metric, values[offset:offset + count]))
        offset += count
    return results, summed[offset:]


def _aggregation(variable):
    """A variable's `aggregation` ("sum", "mean", "only_first_replica", "none"), as a string
    (a tf.Variable's is a tf.VariableAggregation)."""
    aggregation = getattr(variable, "aggregation", None)
    aggregation = getattr(aggregation, "name", aggregation)
    return str(aggregation).lower() if aggregation is not None else "sum"


def _stateless_result(metric, values):
    """`metric.stateless_result(values)`, its variables read inside the scope.

    A `result()` that returns a state variable itself (`return
    self.true_positives`, as in Keras' guide to writing metrics; a
    CompileMetrics' dict holding such a result) hands back the variable
    object, which is read after `stateless_result`'s scope has ended: this
    rank's own state, not the summed one. The logs then showed each rank its
    own value (ranks apart, so callbacks deciding from them decided apart),
    without a word."""
    with keras.StatelessScope(state_mapping=list(zip(metric.variables, values))):
        return tf.nest.map_structure(
            lambda r: tf.convert_to_tensor(r) if isinstance(r, (keras.Variable, tf.Variable)) else r,
            metric.result())


def _add(results, metric, result, nested):
    """As Model.get_metrics_result: a dict result's entries at the top level
    (and, with `nested`, the dict itself under the metric's name too)."""
    if isinstance(result, dict):
        results.update(result)
        if nested:
            results[metric.name] = result
    else:
        results[metric.name] = result


def _by_name(metrics, results):
    out = {}
    for metric, result in zip(metrics, results):
        _add(out, metric, result, nested=True)
    return out


def _same_layout(value, result):
    try:
        tf.nest.assert_same_structure(value, result)
    except (TypeError, ValueError):
        return False
    return all(tf.TensorShape(tf.convert_to_tensor(v).shape).is_compatible_with(r.shape)
               for v, r in zip(tf.nest.flatten(value), tf.nest.flatten(result)))


def _equal(value, result):
    """Whether `value` is bitwise `result` (NaN equal to NaN), as a scalar bool."""
    same = []
    for v, r in zip(tf.nest.flatten(value), tf.nest.flatten(result)):
        v = tf.cast(v, tf.float64)
        r = tf.cast(r, tf.float64)
        both_nan = tf.logical_and(tf.math.is_nan(v), tf.math.is_nan(r))
        same.append(tf.reduce_all(tf.logical_or(tf.equal(v, r), both_nan)))
    return tf.reduce_all(tf.stack(same)) if same else tf.constant(True)


def weight_step_means(metrics):
    """Make each plain `keras.metrics.Mean` among `metrics` (a user's tracker,
    not a wrapper of a per-sample function) count an update of one value
    without a sample weight, made inside a tnt.Model step, as this rank's
    share of the global batch, b_r / B (see the module's docstring). The
    class is swapped in place (class_swap), as for optimizers: the object,
    its state and `isinstance` checks stay. Outside a step (one rank, user code) nothing
    changes. Idempotent: a swapped metric's `update_state` is its own."""
    for metric in metrics:
        if isinstance(metric, keras.metrics.Mean) and \
                type(metric).update_state is keras.metrics.Mean.update_state:
            metric.__class__ = _step_mean_class(type(metric))


@class_swap.once_per_class
def _step_mean_class(base):
    def update_state(self, values, sample_weight=None):
        context = step_context.current()
        if context is not None and sample_weight is None and \
                tf.convert_to_tensor(values).shape.rank == 0:
            sample_weight = context.local_batch / context.global_batch()
        return super(cls, self).update_state(values, sample_weight=sample_weight)

    cls = class_swap.subclass(base, {"update_state": update_state})
    return cls
