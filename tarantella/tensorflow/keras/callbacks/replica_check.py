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

Non-trainable weights (a custom layer's counter, a running statistic) are
compared too, but differing ones only warn, once per fit: a layer that
updates them from its own rank's slice of each batch leaves each rank its
own value, which may be meant. BatchNormalization's moving statistics are
averaged over the ranks after every step, so they agree. Random generators'
states are not compared: they draw per rank on purpose.
"""
import keras

from tarantella.common import replicas
from tarantella.common.errors import MismatchError
from tarantella.common.logging import get_logger

_ADVICE = ("Something changed the model or its optimizer on some ranks only, so training "
           "would no longer match serial Keras: a callback that acts on one rank "
           "(`if tnt.get_rank() == 0`, `tnt.keras.callbacks.Callback(..., run_on_all_ranks=False)`) "
           "or on what differs between ranks (files, the clock, unseeded random numbers). "
           "Make every rank apply the same change, or let a callback that runs on every rank "
           "decide it from the global logs (docs/keras.md, \"Callbacks\").")


_STATE_ADVICE = ("A layer updates non-trainable state from its own rank's slice of each batch, "
                 "so each rank holds its own value (the master's is what tnt.Model.save writes), where "
                 "serial Keras would hold one value from every sample. If it should describe the "
                 "global batch, compute it from values summed over the ranks (tnt.allreduce); if it "
                 "is per rank on purpose, ignore this warning (docs/keras.md, \"Ranks that come apart\").")


def _non_trainable_state(model):
    """The model's non-trainable variables but its random generators' states."""
    seeds = {id(g.state) for layer in model._flatten_layers(include_self=True)
             for g in getattr(layer, "_seed_generators", []) or []}
    return [v for v in model.non_trainable_variables if id(v) not in seeds]


def _optimizer_variables(optimizer):
    if optimizer is None or not getattr(optimizer, "built", False):
        return []
    return list(optimizer.variables)


class ReplicaCheck(keras.callbacks.Callback):
    """Raises tnt.MismatchError on every rank, at the end of the epoch in
    which the ranks' weights or optimizer variables came apart. (Their
    decisions to stop are agreed on instead: stop_agreement.py.)"""

    def __init__(self):
        super().__init__()
        self._state_warned = False

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
        if self._state_warned:
            return
        state = [(getattr(v, "path", v.name), keras.ops.convert_to_numpy(v))
                 for v in _non_trainable_state(getattr(model, "model", model))]
        try:  # the same verdict on every rank, so every rank warns, or none
            replicas.check(state, f"the ranks' non-trainable state differs after epoch {epoch + 1} of fit",
                           _STATE_ADVICE, name="tnt.replicas.state", compare_labels=False)
        except MismatchError as apart:
            self._state_warned = True
            get_logger().warning(str(apart))
