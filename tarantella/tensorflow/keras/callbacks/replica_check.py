"""The check at the end of every epoch of a data-parallel `fit` that the ranks
still train one model (tarantella.common.replicas).

Every rank must hold the same trainable weights and optimizer state after
each step. A callback that acts on some ranks only (a master-only callback,
or one that reads `tnt.get_rank()`, a file, the clock or random numbers) can
change one rank's copy, and training then goes on with different models,
summing gradients of each, without an error. tnt.Model.fit appends this
callback after the user's, so that it sees what their `on_epoch_end` did;
it costs one read of the weights and optimizer variables per epoch and two
small allgathers.

Not compared: non-trainable weights (unsynchronised BatchNormalization's
moving statistics are each rank's own until the end of `fit`), random
generator states (they draw per rank on purpose).
"""
import keras

from tarantella.common import replicas

_ADVICE = ("Something changed the model or its optimizer on some ranks only, so training "
           "would no longer match serial Keras: a callback that acts on one rank "
           "(`if tnt.get_rank() == 0`, `tnt.keras.callbacks.Callback(..., run_on_all_ranks=False)`) "
           "or on what differs between ranks (files, the clock, unseeded random numbers). "
           "Make every rank apply the same change, or let a callback that runs on every rank "
           "decide it from the global logs (docs/keras.md, \"Callbacks\").")


def _optimizer_variables(optimizer):
    if optimizer is None or not getattr(optimizer, "built", False):
        return []
    return list(optimizer.variables)


class ReplicaCheck(keras.callbacks.Callback):
    """Raises tnt.MismatchError on every rank, at the end of the epoch in
    which the ranks' weights or optimizer variables came apart. (Their
    decisions to stop are agreed on instead: stop_agreement.py.)"""

    def on_epoch_end(self, epoch, logs=None):
        model = self.model
        variables = list(model.trainable_variables) + _optimizer_variables(
            getattr(model, "optimizer", None))
        items = [(getattr(v, "path", v.name), keras.ops.convert_to_numpy(v)) for v in variables]
        # The variables' paths name them in the message but are not compared: they come
        # from per-process counters, which a rank that built another model (to load a
        # checkpoint on the master only, say) has advanced further than the others.
        replicas.check(items, f"the ranks' replicas differ after epoch {epoch + 1} of fit", _ADVICE,
                       name="tnt.replicas.fit", compare_labels=False)
