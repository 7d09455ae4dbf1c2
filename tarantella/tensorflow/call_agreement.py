"""Whether every rank enters the same fit, evaluate or predict, on a model
compiled alike.

Those calls are collective, and so is every step they take. A branch on the
rank in a user's script breaks that without any collective noticing at
once: `if tnt.is_master_rank(): model.evaluate(...)`, a layer frozen
(`trainable = False`) or a model recompiled on some ranks only, a loss or
optimizer chosen per rank. The ranks then made requests the others never
made (the call's own checks are named after the call, the weights are
broadcast by the ranks that compiled since their last call only, the
gradients' requests are named after the trainable variables' shapes) and
waited for each other until TNT_TIMEOUT_S (300 s by default), with a message
about a tensor one rank never submitted.

So every such call begins with one small allgather, under one name for all
three calls, of what must be the same: which call it is, whether the model
broadcasts the master's weights first (after compile, set_weights or
load_weights), the trainable variables (count, shapes, dtypes), the layers'
settings (taken once after each compile: _layers_digest) and what
`compile` was given (loss, metrics, optimizer and its settings,
steps_per_execution). A difference is the same tnt.MismatchError on every
rank, naming it.

The `*_on_batch` calls are collective too, and make the same allgather in
every call (check_on_batch): about a millisecond of Python and one small round a
batch. Compared on their first call of each kind after each compile only,
the calls of two models of the same shapes and compile, one on each rank,
paired up and averaged the two models' gradients without a word once both
had agreed; so did a learning rate set on some ranks only; and a compile on
some ranks only between them waited until TNT_TIMEOUT_S. The global batch,
whose digest costs a pass over its bytes, is still compared on the first
call of each kind after each compile only.

Saves, loads and set_weights meet in the same allgather, after the master's
write (it is their closing barrier too) or every rank's read and before the
broadcast of the master's weights. `if tnt.is_master_rank(): model.save(path)`
then pairs with the other ranks' next call, an error on every rank at once,
instead of a wait until TNT_TIMEOUT_S (the file is written). The allgather
also carries whether each rank's own part failed (the master's write: a
missing directory, a full disk; a rank's read of the file), so that every rank
raises instead of the others waiting for it.
"""
import functools
import numbers
import threading
import zlib

import keras
import numpy as np
import tensorflow as tf

from tarantella.common import core, errors, replicas, request_names
from tarantella.common.errors import MismatchError, TarantellaError
from tarantella.tensorflow.data import step_counts

_ADVICE = (
    "fit, evaluate, predict, the *_on_batch calls, save, save_weights, load_weights, set_weights "
    "and tnt.models.load_model are collective: every rank must make the same calls, on a model "
    "built, compiled and frozen (trainable) alike (a save writes on the master only anyway). A "
    "branch on the rank (`if tnt.get_rank() == 0:`) that calls one of them, compiles, or sets "
    "`trainable` on some ranks only would leave the ranks waiting for each other until "
    "TNT_TIMEOUT_S, or training different models")
_CHECKED_CONFIG = ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics")
_BATCH_ADVICE = (
    "Every rank passes the same global batch to the *_on_batch calls and works on its slice of it "
    "(the batch is compared on the first call of each kind after compile only). Give every rank "
    "the same data, or use fit/evaluate/predict with tnt_distribute_dataset=False to feed each "
    "rank its own part")
PER_BATCH_HINT = (
    "The *_on_batch calls compare the call and the model with the other ranks' calls of a "
    "tnt.Model when they begin, but not with other collectives: if a rank made another collective "
    "call here instead (tnt.allreduce, a custom training loop's step), this is how they stop. "
    "Make the same calls, in the same order, on every rank.")


_numbered = [0]  # how many tnt.Models have a number (State.ordinal): the next one's


class State:
    """What a tnt.Model's calls agree on that is the model's own (a plain
    object, so that Keras does not track it): its number among the process's
    tnt.Models in the order their first calls agreed, and the per-batch calls
    agreed on since its last compile.

    The number tells apart two models of the same shapes and compile (rank 0
    in model_a.fit, rank 1 in model_b.fit: their requests have the same names,
    so the ranks paired up and averaged the two models' gradients without a
    word). It is taken once the model's first call has agreed on every rank
    (a refused call numbers nothing, so the later models' numbers stay alike),
    not when the model is made: a rank may make models of its own (the master loading a checkpoint to inspect
    it) as long as it makes no collective call on them. Two models that both
    begin their first call then still pair up (each is number n on its rank),
    for good: every later call of either compares the number again.

    `shapes`: the trainable variables and their digest, taken again only when
    they are other variables (a ResNet50's take a millisecond, in every
    *_on_batch call)."""

    def __init__(self):
        self.ordinal = None
        self.agreed = set()
        self.layers = None  # _layers_digest, taken once after each compile
        self.shapes = ([], _crc(""))

    def reset(self):
        self.agreed.clear()
        self.layers = None


def check(what, model, state, broadcasts_first, *groups, error=None):
    """Collective: the same MismatchError on every rank unless every rank is
    in the call `what` (one of step_counts.CALLS) of the same tnt.Model
    `model` (`state` its State), with the same `broadcasts_first` and the
    same trainable variables and compile arguments; then unless the `groups`
    (step_counts.Group: what else the call compares before it begins, e.g.
    its arguments) agree, in the same allgather (one round, not one each).

    `error`: what this rank's own part of the call raised before (a save's
    write on the master, a load's read), or None. A rank's failure is raised
    on every rank instead: itself where it happened, a TarantellaError that
    names those ranks on the others (they would otherwise go on to the
    call's next collective, a broadcast, and wait there until TNT_TIMEOUT_S).
    `model` and `state` may be None (a load whose read failed; a plain Keras
    model given to tnt.models.save_model): what they say is not compared."""
    if core.get_size() == 1:
        if error is not None:
            raise error
        return
    # a model's number is taken once its first call agreed: a call refused (made on one rank
    # only) numbers nothing, so the ranks' next models still have the same numbers
    ordinal = None if state is None else (
        _numbered[0] if state.ordinal is None else state.ordinal)
    keras_model = None if model is None else getattr(model, "model", model)
    # A model whose weights are made at its first call (a subclassed one, a Sequential without
    # an Input) may be built on some ranks only (the master called it to have a look): the
    # others build it from their first batch and take the master's weights (_sync_weights),
    # so an unbuilt model's variables and layers (a Sequential adds its InputLayer when
    # built) are not compared (UNKNOWN: skipped), nor refused
    built = keras_model is not None and keras_model.built
    trainable = model.trainable_variables if built else []
    if state is not None and state.layers is None and built:  # ~30 ms for a ResNet50: once after each compile
        state.layers = _layers_digest(keras_model)
    unknown = step_counts.UNKNOWN
    call = step_counts.Group({
        "the call": what,
        "which tnt.Model it is (each rank numbers its models in the order of their first fit, "
        "evaluate, predict or *_on_batch call)": unknown if ordinal is None else ordinal,
        "whether the model broadcasts the master's weights first, as after compile, set_weights "
        "or load_weights": bool(broadcasts_first),
        "the number of trainable variables": len(trainable) if built else unknown,
        "the trainable variables' shapes and dtypes": _shapes_digest(trainable, state)
        if built else unknown,
        "what compile was given (loss, metrics, optimizer and its settings)": _crc(
            _describe(None if model is None else _compile_arguments(model))),
        "the layers' settings (each layer's class and config; a lookup layer's vocabulary)":
            state.layers if built and state is not None else unknown,
        # a call in a thread pairs with the other ranks' calls whatever thread makes them: rank
        # 0's thread "a" in model_a.fit and rank 1's thread "b" in model_b's agreed as the first
        # calls of the two (their gradients' requests, named after the thread, then waited for
        # each other until the stall warning)
        "the thread that makes the call (its name)": request_names.in_thread("thread"),
        # Keras runs the callbacks after every steps_per_execution steps, and tnt's own
        # (StopAgreement) are collective: 1 on one rank and 2 on another waited until
        # TNT_TIMEOUT_S
        "compile's steps_per_execution": getattr(model, "steps_per_execution", None),
    }, "the ranks are not in the same call on one model", _ADVICE, skip_unknown=True)
    failed_part = step_counts.Group({"whether this rank's part of the call failed": _failure(error)})
    rows = step_counts.gather_groups("tnt.call", [call, *groups, failed_part])
    failed = [r for r, row in enumerate(rows) if row[-1]]
    if failed and all(row[0] == rows[0][0] for row in rows):  # every rank in this call
        if error is not None:
            raise error
        message = (f"The {what} call failed on rank(s) {failed} (the error is raised there: see "
                   "that rank's output), so it fails on every rank: no rank goes on alone to wait "
                   "for the others")
        if all(rows[r][-1] == _FILE_EXISTS for r in failed):
            # a save with overwrite=False of an existing file: the same error on every rank
            raise FileExistsError(f"{message}. There, the file to save exists and "
                                  "overwrite=False. Received: overwrite=False")
        raise TarantellaError(message)
    try:
        step_counts.check_groups("tnt.call", [call, *groups], [row[:-1] for row in rows])
    except MismatchError as mismatch:
        raise mismatch from error
    if state is not None and state.ordinal is None:
        state.ordinal = ordinal
        _numbered[0] += 1


_FAILED, _FILE_EXISTS = 1, 2


def _failure(error):
    """What check() tells the other ranks about this rank's `error`: nothing
    (0), that it failed, or that it is a FileExistsError (a save with
    overwrite=False of an existing file), which they raise alike."""
    if error is None:
        return 0
    return _FILE_EXISTS if isinstance(error, FileExistsError) else _FAILED


_inside = threading.local()  # depth: how deep this thread is in tnt.Model calls (one_thread_at_a_time)
_owner = [None]  # the thread in a tnt.Model call, or None
_owner_lock = threading.Lock()


def one_thread_at_a_time(what):
    """A decorator: the calls that check() compares (`what`, one of
    step_counts.CALLS) run in one thread of the process at a time; a call made
    in another thread meanwhile is refused at once, the same InvalidUsageError
    on every rank where the threads overlap. Their requests are named after
    the call, not after the thread ("tnt.call", "tnt.step.0.sizes",
    "tnt.metrics"): two threads that each fit a model of their own at once
    found the name in flight ("a collective named 'tnt.call' is already in
    flight") or paired with each other's across ranks, and waited until
    TNT_TIMEOUT_S. A call made inside another (fit's validation, a
    ModelCheckpoint's save) is the same thread's."""

    def decorate(method):
        @functools.wraps(method)
        def wrapper(*args, **kwargs):
            if core.get_size() == 1:
                return method(*args, **kwargs)
            me = threading.current_thread()
            with _owner_lock:
                if _owner[0] is not None and _owner[0] is not me:
                    raise errors.InvalidUsageError(
                        f"{what} was called in thread {me.name!r} while thread "
                        f"{_owner[0].name!r} is in a call of a tnt.Model: fit, evaluate, predict, "
                        "the *_on_batch calls, save, save_weights, load_weights and set_weights "
                        "run in one thread of a rank at a time (their requests are named after "
                        "the call, so the two threads' would pair with each other across ranks). "
                        "Make the calls one after the other, or train the models of threads "
                        "that run at once in custom training loops (docs/troubleshooting.md, "
                        "\"Collectives from several threads\")")
                _owner[0] = me
            _inside.depth = getattr(_inside, "depth", 0) + 1
            try:
                return method(*args, **kwargs)
            finally:
                _inside.depth -= 1
                if _inside.depth == 0:
                    with _owner_lock:
                        _owner[0] = None
        return wrapper

    return decorate


def check_on_batch(what, model, state, broadcasts_first, batch):
    """check() for a `*_on_batch` call, on every call: which call of which
    model, compiled alike. Agreed once, the calls of two models of the same
    shapes and compile (rank 0 in model_a.train_on_batch, rank 1 in
    model_b's) paired up and averaged the two models' gradients without a
    word, and a compile on some ranks only between the calls waited until
    TNT_TIMEOUT_S. Its first call of each kind since the last `state.reset()`
    (compile) also compares the global `batch` (a nest of arrays: x, y,
    sample_weight), which every rank must pass alike: each rank trains on its
    slice of its own copy, so ranks that loaded their own data mixed their
    samples without a word (a first batch of each kind that differs shows such
    a script); later calls leave it out (a digest of every batch would cost a
    pass over its bytes), and so does a rank whose first call it is not."""
    if core.get_size() == 1:
        return
    first = what not in state.agreed
    same_batch = step_counts.Group(
        {"the batch's arrays (their shapes, dtypes and values)":
             _batch_digest(batch) if first else step_counts.UNKNOWN},
        f"the ranks passed different batches to {what}", _BATCH_ADVICE, skip_unknown=True)
    try:
        check(what, model, state, broadcasts_first, same_batch)
    except errors.TimeoutError as exc:  # the others are in a step of another call
        raise errors.TimeoutError(f"{exc} {PER_BATCH_HINT}", rank=exc.rank) from None
    state.agreed.add(what)


# Config entries that may differ between ranks without changing what they train: the
# initial weights and the random layers' seeds are the master's (broadcast before the first
# step), and names are numbered per process; `trainable` is compared as the trainable
# variables, every call
_UNCOMPARED_KEYS = ("trainable", "seed", "kernel_initializer", "bias_initializer", "embeddings_initializer",
                    "recurrent_initializer", "beta_initializer", "gamma_initializer",
                    "moving_mean_initializer", "moving_variance_initializer",
                    "depthwise_initializer", "pointwise_initializer")


def _shapes_digest(variables, state):
    """A CRC of the shapes and dtypes of `variables`, kept in `state` (a State
    or None) for as long as they are the same variables (a variable's shape and
    dtype never change)."""
    known, digest = state.shapes if state is not None else ([], None)
    if digest is not None and len(known) == len(variables) and all(
            a is b for a, b in zip(known, variables)):
        return digest
    digest = _crc(";".join(f"{v.dtype}{tuple(v.shape)}" for v in variables))
    if state is not None:
        state.shapes = (list(variables), digest)
    return digest


def _layers_digest(model):
    """A CRC of what each layer of `model` computes with, beyond its weights
    (which the master broadcasts): its class and config (a Dropout's rate, an
    activation), and a lookup layer's vocabulary (a StringLookup or
    TextVectorization adapted on each rank's own data: not a weight, so never
    broadcast). Ranks that built such a model differently trained it with
    different settings and summed the gradients without a word. Nested models
    and Lambda layers are taken by class only: their configs name other layers
    (numbered per process) or hold marshalled code."""
    parts = []
    for layer in model._flatten_layers(include_self=False):
        parts.append(type(layer).__qualname__)
        if isinstance(layer, (keras.Model, keras.layers.Lambda)):
            continue
        try:
            config = layer.get_config()
        except Exception:  # noqa: BLE001 - a custom layer without a config: its class only
            config = None
        parts.append(_describe(_without_keys(config, ("name",) + _UNCOMPARED_KEYS)))
        if hasattr(layer, "get_vocabulary"):
            try:
                parts.append(repr([str(t) for t in layer.get_vocabulary()]))
            except Exception:  # noqa: BLE001 - not adapted yet
                pass
    return _crc(";".join(parts))


def _batch_digest(batch):
    """A CRC of the shapes, dtypes and bits of `batch`'s arrays (None kept as
    such), the same on every rank that passed the same batch."""
    parts = []
    # a ragged or sparse tensor by its components: as one leaf, its repr, whose values NumPy
    # elides past 1000 ("..."), so batches that differ there passed as the same
    for leaf in tf.nest.flatten(batch, expand_composites=True):
        array = None if leaf is None else np.asarray(leaf)
        if array is None or array.dtype == object:  # None, or ragged lists: by their repr
            parts.append(repr(None if array is None else array.tolist()))
        else:
            parts.append(f"{array.dtype}{array.shape}{replicas.fingerprint(array)}")
    return _crc(";".join(parts))


def _crc(text):
    # an int compared as it is; wrapped in a str, compare() shows which ranks differ instead
    return f"crc {zlib.crc32(text.encode())}"


def _compile_arguments(model):
    config = getattr(model, "_compile_config", None)
    if not getattr(model, "compiled", False) or config is None:
        return None
    return {k: v for k, v in config.config.items() if k in _CHECKED_CONFIG}


def _describe(value):
    """A text that is the same on every rank for the same compile argument:
    built from class names and plain values only (never an object's repr,
    which may hold an address)."""
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, numbers.Number) or isinstance(value, np.generic):
        return repr(np.asarray(value).item())
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in sorted(
            value.items(), key=lambda item: repr(item[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    name = type(value).__qualname__
    if isinstance(value, (keras.losses.Loss, keras.metrics.Metric, keras.optimizers.Optimizer,
                          keras.optimizers.schedules.LearningRateSchedule)):
        try:
            config = value.get_config()
        except Exception:  # noqa: BLE001 - a custom object without a config: its class only
            return name
        return name + _describe(_without_names(config))
    return getattr(value, "__qualname__", name)  # a function: its name


def _without_names(config):
    """A config without its "name" entries, nested ones too (a LossScaleOptimizer's inner
    optimizer): Keras numbers optimizers' names per process (sgd, sgd_1, ...), so a rank that
    built one more optimizer than the others names the same one apart."""
    return _without_keys(config, ("name",))


def _without_keys(config, keys):
    """`config` without its entries named one of `keys`, nested ones too."""
    if isinstance(config, dict):
        return {k: _without_keys(v, keys) for k, v in config.items() if k not in keys}
    if isinstance(config, (list, tuple)):
        return [_without_keys(v, keys) for v in config]
    return config
