"""Global metric results from per-rank metric states.

Keras' accumulating metrics (Mean, accuracies, AUC, Precision/Recall, F1,
MeanIoU, RMSE, the loss tracker) keep sums and counts in their variables, so
summing the variables over ranks and computing the result from the sums gives
exactly the serial value; averaging per-rank *results* would not when ranks
see different numbers of samples. The loss tracker is updated with the local
batch size as sample weight, so its summed (total, count) is the global mean
loss. Metrics whose state is not a sum (e.g. PearsonCorrelation, a mean of
per-batch values) are only approximately global.

The metric variables keep their local values; only the returned results are
global (`stateless_result`), so the per-rank state never double-counts.
"""
from tarantella.tensorflow import collective_ops


def global_metrics_result(metrics, name="tnt.metrics"):
    """The dict `Model.get_metrics_result()` would return if all ranks'
    samples had been seen by one process (one allreduce for all metrics)."""
    variables = [v for m in metrics for v in m.variables]
    summed = collective_ops.sum_across_ranks([v.value for v in variables], name=name)
    results, offset = {}, 0
    for metric in metrics:
        count = len(metric.variables)
        result = metric.stateless_result(summed[offset:offset + count])
        offset += count
        if isinstance(result, dict):
            results.update(result)
        else:
            results[metric.name] = result
    return results
