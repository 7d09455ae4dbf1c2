"""tnt.keras.callbacks.Callback: choose where a Keras callback runs and which logs it sees."""
import contextlib

import keras

from tarantella.common import config, core, gone_arguments
from tarantella.common import master_only
from tarantella.tensorflow import class_swap
from tarantella.tensorflow.parallel_strategy import ParallelStrategy

# Callbacks whose decisions change training (the learning rate, stopping):
# they must decide the same on every rank, or ranks would diverge or deadlock.
_DECIDING = (keras.callbacks.EarlyStopping, keras.callbacks.ReduceLROnPlateau,
             keras.callbacks.LearningRateScheduler, keras.callbacks.TerminateOnNaN,
             keras.callbacks.BackupAndRestore)  # restores the weights and the epoch


def _decides_from_logs(callback):
    """Whether what the callback does on a rank depends on the logs' values:
    each rank must then see the same (global) logs. A ModelCheckpoint with
    save_best_only saves (a save every rank joins) when its monitor improves."""
    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        return bool(getattr(callback, "save_best_only", False))
    return isinstance(callback, (keras.callbacks.EarlyStopping, keras.callbacks.ReduceLROnPlateau,
                                 keras.callbacks.TerminateOnNaN))


# the original Tarantella's arguments of Callback that are gone: what to do instead
_GONE = {
    **gone_arguments.GROUP,
    "parallel_strategy": "the strategy is tnt.Model's (data parallelism): say where the callback "
                         "runs and which logs it sees with run_on_all_ranks= and aggregate_logs= "
                         "(the original's ParallelStrategy.DATA: aggregate_logs=True, "
                         "run_on_all_ranks=True; None: aggregate_logs=False, "
                         "run_on_all_ranks=False)",
}

# Callbacks that write the job's one file, stream of events or progress bar
WRITERS = (keras.callbacks.CSVLogger, keras.callbacks.RemoteMonitor, keras.callbacks.TensorBoard,
           keras.callbacks.ProgbarLogger)


def runs_on_all_ranks_by_default(callback):
    """Where a callback runs when nobody said: the WRITERS on the master only,
    as serial training writes them (TensorBoard on every rank, each in its own
    folder, with TNT_TENSORBOARD_ON_ALL_DEVICES; the progress bar everywhere
    with TNT_OUTPUT_ON_ALL_DEVICES); every other callback on every rank."""
    if isinstance(callback, keras.callbacks.ProgbarLogger):
        return bool(config.get("TNT_OUTPUT_ON_ALL_DEVICES"))
    if isinstance(callback, keras.callbacks.TensorBoard):
        return bool(config.get("TNT_TENSORBOARD_ON_ALL_DEVICES"))
    return not isinstance(callback, WRITERS)


_HOOKS = ("on_train_begin", "on_train_end", "on_test_begin", "on_test_end", "on_predict_begin",
          "on_predict_end", "on_epoch_begin", "on_epoch_end", "on_train_batch_begin",
          "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end",
          "on_predict_batch_begin", "on_predict_batch_end")


class Callback(keras.callbacks.Callback):
    """Wrap a Keras callback to choose where it runs and which logs it sees.

    The callback object is returned itself, with its class swapped in place
    for a subclass of its own class (class_swap: `isinstance` checks, and
    Keras' search for a History or ProgbarLogger, still see what it is).

    Callbacks passed to `tnt.Model.fit/evaluate/predict` are wrapped
    automatically: ProgbarLogger, CSVLogger, RemoteMonitor and TensorBoard run
    on the master rank only (TensorBoard on every rank, each in `log_dir/rank_<r>`, when
    TNT_TENSORBOARD_ON_ALL_DEVICES is true, with its own rank's metrics, or when this
    wrapper runs it on every rank); every other callback runs on
    every rank with global logs. ModelCheckpoint runs on every rank, so that
    its decisions match, and `tnt.Model.save` writes on the master only.

    Args:
        callback: A `keras.callbacks.Callback` instance.
        aggregate_logs: Boolean, default True. True: the callback sees the
            global logs (every metric computed over all ranks' samples, equal
            to serial training). False: it sees this rank's local metrics
            (refused for a callback that decides from them on every rank:
            EarlyStopping, ReduceLROnPlateau, TerminateOnNaN, a
            ModelCheckpoint with save_best_only).
        run_on_all_ranks: Boolean. False: the callback runs on the master
            rank only. Unset: where tnt.Model would run it unwrapped (the
            writers above on the master only, every other callback on every
            rank). Callbacks that decide (EarlyStopping, ReduceLROnPlateau,
            LearningRateScheduler, TerminateOnNaN) must run on every rank. A
            CSVLogger run on every rank needs a file name per rank (fit
            refuses one file for several ranks).

    Example:

    ```python
    printer = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: print(logs))
    model.fit(ds, callbacks=[tnt.keras.callbacks.Callback(printer, run_on_all_ranks=False)])
    ```
    """

    def __new__(cls, callback, aggregate_logs=True, run_on_all_ranks=None, **original):
        if isinstance(aggregate_logs, ParallelStrategy):  # the original's second argument
            original = {"parallel_strategy": aggregate_logs, **original}
        gone_arguments.refuse("tnt.keras.callbacks.Callback", original, _GONE)
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(
                "tnt.keras.callbacks.Callback expects a keras.callbacks.Callback instance. "
                f"Received: callback={callback!r} (of type {type(callback).__name__})")
        if run_on_all_ranks is None:
            # e.g. a CSVLogger on the master only: on every rank, each would write the same file
            run_on_all_ranks = runs_on_all_ranks_by_default(callback)
        if not run_on_all_ranks and isinstance(callback, _DECIDING):
            raise ValueError(
                f"{type(callback).__name__} must run on every rank: it changes training, so ranks "
                f"running it differently would diverge. Received: run_on_all_ranks=False")
        if run_on_all_ranks and not aggregate_logs and _decides_from_logs(callback):
            # each rank would decide from its own slice's metrics: a learning rate or a stop
            # on some ranks only, or a save the other ranks never join (until TNT_TIMEOUT_S)
            raise ValueError(
                f"{type(callback).__name__} decides from the logs it sees, on every rank: with "
                "aggregate_logs=False each rank would decide from its own slice's metrics, and the "
                "ranks would act apart. Keep aggregate_logs=True (the global logs, as in serial "
                "training), or run it on the master only (run_on_all_ranks=False), where a "
                "ModelCheckpoint may decide alone. Received: aggregate_logs=False, "
                "run_on_all_ranks=True")
        if isinstance(callback, Callback):
            callback._tnt_aggregate_logs = bool(aggregate_logs)
            callback._tnt_run_on_all_ranks = bool(run_on_all_ranks)
            _capture_instance_hooks(callback)
            return callback
        callback.__class__ = _wrapper_class(type(callback))
        callback._tnt_aggregate_logs = bool(aggregate_logs)
        callback._tnt_run_on_all_ranks = bool(run_on_all_ranks)
        callback._tnt_local = {}
        _capture_instance_hooks(callback)
        return callback

    def __init__(self, *args, **kwargs):
        # __new__ returned the (already initialized) user callback: nothing to do.
        pass

    def set_model(self, model):
        # Keras calls set_model on every rank. A master-only callback's own set_model may
        # already write: TensorBoard's writes the model's summary into an event file of
        # log_dir, so rank 1 added an event file of its own to the master's run. Elsewhere
        # than on the master, only remember the model (what keras.callbacks.Callback does).
        if not self._tnt_run_on_all_ranks and not core.is_master_rank():
            return keras.callbacks.Callback.set_model(self, model)
        return super().set_model(model)

    @property
    def aggregate_logs(self):
        return self._tnt_aggregate_logs

    @property
    def run_on_all_ranks(self):
        return self._tnt_run_on_all_ranks


@class_swap.once_per_class
def _wrapper_class(base):
    """`base` with Callback's methods first (its name: class_swap)."""
    return class_swap.subclass(base, {}, mixins=(Callback,))


def _capture_instance_hooks(callback):
    """Hooks set on the object itself (LambdaCallback(on_epoch_end=f) stores f
    as `callback.on_epoch_end`) would shadow the wrapper's methods, so that
    run_on_all_ranks and aggregate_logs did nothing for them: move them where
    the wrapper's methods call them."""
    hooks = callback.__dict__.setdefault("_tnt_instance_hooks", {})
    for hook in _HOOKS:
        if hook in callback.__dict__:
            hooks[hook] = callback.__dict__.pop(hook)


def _local_logs(callback, hook, logs):
    """Replace global metric values in `logs` by this rank's."""
    local_result = getattr(callback.model, "_tnt_local_metrics_result", None)
    if local_result is None or logs is None:
        return logs
    state = callback._tnt_local
    if hook in ("on_train_batch_end", "on_test_batch_end", "on_test_end"):
        local = local_result()
        state["train" if hook == "on_train_batch_end" else "val"] = local
        return {k: local.get(k, v) for k, v in logs.items()}
    if hook in ("on_epoch_end", "on_train_end"):  # fit ends with the last epoch's logs
        train, val = state.get("train", {}), state.get("val", {})
        return {k: val.get(k[4:], v) if k.startswith("val_") else train.get(k, v)
                for k, v in logs.items()}
    return logs


def _abort(callback, hook, exc):
    """A callback that runs on the master only failed: the other ranks are
    already in the next collective and would wait for the master until
    TNT_TIMEOUT_S (or forever, if the user catches the error). Abort the core
    now: every other rank fails at once with a PeerLostError that names the
    master and this error."""
    core.abort(f"{type(exc).__name__} in {type(callback).__name__}.{hook}, a callback that runs "
               f"on the master rank only: {exc}")


def _make_hook(hook):
    takes_step = "batch" in hook or "epoch" in hook  # (batch or epoch, logs) vs (logs)

    def method(self, *args, **kwargs):
        if not self._tnt_run_on_all_ranks and not core.is_master_rank():
            return None
        args = list(args)
        if not self._tnt_aggregate_logs and hook.endswith("end"):
            if "logs" in kwargs:
                kwargs["logs"] = _local_logs(self, hook, kwargs["logs"])
            elif len(args) > int(takes_step):
                args[int(takes_step)] = _local_logs(self, hook, args[int(takes_step)])
        # saves made here skip their barrier: the other ranks are not saving
        section = master_only.section() if not self._tnt_run_on_all_ranks else contextlib.nullcontext()
        try:
            with section:
                own = self.__dict__.get("_tnt_instance_hooks", {}).get(hook)
                return (own or getattr(super(Callback, self), hook))(*args, **kwargs)
        except Exception as exc:
            if not self._tnt_run_on_all_ranks:
                _abort(self, hook, exc)
            raise

    method.__name__ = hook
    return method


for _hook in _HOOKS:
    setattr(Callback, _hook, _make_hook(_hook))
