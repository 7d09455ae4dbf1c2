"""The callbacks tnt.Model passes to Keras: the user's, wrapped per type."""
import os
import zlib

import keras
import numpy as np

from tarantella.common import collectives, config, core
from tarantella.tensorflow.data import step_counts
from tarantella.tensorflow.keras.callbacks import backup_and_restore
from tarantella.tensorflow.keras.callbacks.callback import (WRITERS, Callback,
                                                           runs_on_all_ranks_by_default)


def _tensorboard_on_all_ranks(callback):
    """Each rank writes its own event files, under log_dir/rank_<r>: in one
    folder, TensorBoard would show the ranks' events as one run. Once per
    callback object (it may be passed to several fit calls)."""
    if not getattr(callback, "_tnt_rank_log_dir", False):
        callback.log_dir = os.path.join(os.fspath(callback.log_dir), f"rank_{core.get_rank()}")
        callback._log_write_dir = callback.log_dir
        callback._train_dir = os.path.join(callback.log_dir, "train")
        callback._val_dir = os.path.join(callback.log_dir, "validation")
        callback._tnt_rank_log_dir = True
    return callback if isinstance(callback, Callback) else Callback(callback)


def prepare_callbacks(callbacks):
    """A new list of the user's callbacks, each wrapped as it must run.

    Only callbacks that write to files or the console need a wrapper: every
    other callback can run unchanged on every rank because tnt.Model already
    gives every rank the same global logs.
    """
    prepared = []
    for cb in callbacks or []:
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            cb = backup_and_restore.distributed(cb)  # the master keeps the backup
        if isinstance(cb, (Callback, *WRITERS)):
            if not isinstance(cb, Callback):  # where callback.py says
                # TNT_TENSORBOARD_ON_ALL_DEVICES asks, as in the original Tarantella, for every
                # rank's own (device-local) metrics, each rank in its folder: with the global
                # logs, every folder held the same curves and the variable showed nothing more
                local = isinstance(cb, keras.callbacks.TensorBoard) and core.get_size() > 1 \
                    and runs_on_all_ranks_by_default(cb)
                cb = Callback(cb, aggregate_logs=not local)
            if isinstance(cb, keras.callbacks.TensorBoard) and cb.run_on_all_ranks and core.get_size() > 1:
                cb = _tensorboard_on_all_ranks(cb)  # every rank's events, each in its folder
            prepared.append(cb)
        else:
            if type(cb).__module__.startswith("keras.") and getattr(cb, "verbose", 0) and not _shows_output():
                # Keras' EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, ... (a user's class may
                # use `verbose` for more than printing, and is left alone): it runs on every rank (it
                # acts on the model), but says what it did once, as serial training does: the
                # logs it decides on are the same on every rank (under mpirun or srun, which
                # show every rank's output, each rank printed it)
                cb.verbose = 0
            prepared.append(cb)
    return prepared


def _shows_output():
    """Whether this rank's console messages are shown: the master's, or every rank's with
    TNT_OUTPUT_ON_ALL_DEVICES (tntrun --output-on-all-devices)."""
    return core.is_master_rank() or config.get("TNT_OUTPUT_ON_ALL_DEVICES")


def _on_every_rank(callbacks, kind):
    """The callbacks of type `kind` among `callbacks` that run on every rank."""
    return [cb for cb in callbacks or [] if isinstance(cb, kind)
            and not (isinstance(cb, Callback) and not cb.run_on_all_ranks)]


def _counts(every):
    return ", ".join(f"rank {r}: {int(c)}" for r, c in enumerate(every[:, 0]))


def same_restoring_stops(callbacks):
    """The Group (for call_agreement.check in fit) that fails unless every rank
    passes as many EarlyStopping callbacks with restore_best_weights=True. The
    restore is tnt.Model.set_weights, collective: one given on the master only
    left it waiting there for the others, which had left fit, until
    TNT_TIMEOUT_S."""
    count = sum(1 for cb in _on_every_rank(callbacks, keras.callbacks.EarlyStopping)
                if cb.restore_best_weights)

    def message(every):
        return (
            f"fit was given EarlyStopping callbacks with restore_best_weights=True on some ranks "
            f"only ({_counts(every)}): restoring the best weights sets them on every rank, so the "
            "ranks would wait for each other until TNT_TIMEOUT_S (or hold different weights). "
            "Pass the same callbacks on every rank: every rank stops and restores alike.")
    return step_counts.Group({"the EarlyStoppings that restore the best weights": count},
                             message=message)


def same_rate_setters(callbacks):
    """The Group (for call_agreement.check in fit) that fails unless every rank
    passes as many callbacks that set the learning rate (LearningRateScheduler,
    ReduceLROnPlateau). Given on some ranks only, the ranks applied the summed
    gradients at different rates: their models came apart, seen only at the
    end of the epoch (keras/callbacks/replica_check.py); refused before the
    first step instead, naming the cause."""
    count = len(_on_every_rank(callbacks, (keras.callbacks.LearningRateScheduler,
                                           keras.callbacks.ReduceLROnPlateau)))

    def message(every):
        return (
            f"fit was given callbacks that set the learning rate (LearningRateScheduler, "
            f"ReduceLROnPlateau) on some ranks only ({_counts(every)}): the ranks would apply the "
            "summed gradients at different rates and train different models. Pass the same "
            "callbacks on every rank: they decide alike, from the global logs.")
    return step_counts.Group({"the callbacks that set the learning rate": count}, message=message)


def same_checkpoints(callbacks):
    """The Group (for call_agreement.check in fit) that fails unless every rank
    passes as many ModelCheckpoints that run on every rank. Their saves end in
    a barrier (every rank can read the file after), so one given on the master
    only (Horovod's `if hvd.rank() == 0: callbacks.append(...)`) waited there
    for the others until TNT_TIMEOUT_S."""
    count = len(_on_every_rank(callbacks, keras.callbacks.ModelCheckpoint))

    def message(every):
        return (
            f"fit was given ModelCheckpoint callbacks on some ranks only ({_counts(every)}): their saves "
            "wait for every rank, so the ranks would wait for each other until TNT_TIMEOUT_S. "
            "Pass the same callbacks on every rank (drop an `if tnt.is_master_rank()` or "
            "`hvd.rank() == 0` guard): the master alone writes the files. To run one on the "
            "master only, wrap it: tnt.keras.callbacks.Callback(checkpoint, run_on_all_ranks=False)")
    return step_counts.Group({"the ModelCheckpoints that run on every rank": count}, message=message)


def _one_or_all(values):
    """`values` (one per callback) as compared: the one value of a single
    callback (shown in the message as it is), else all of them."""
    return values[0] if len(values) == 1 else tuple(values)


def same_checkpoint_settings(callbacks):
    """The Group (for call_agreement.check in fit, after same_checkpoints)
    that fails unless the ModelCheckpoints that run on every rank decide
    alike when to save: their save_freq, save_best_only, monitor and mode, and
    the best value so far (initial_value_threshold). Their saves are
    collective: with save_freq 2 on one rank and 3 on another, or mode "min"
    against "max", one rank saved while the other went on to its next step,
    and the two waited for each other until TNT_TIMEOUT_S, with a message
    about `tnt.call` and `tnt.stop_training`. The file names may differ (the
    master's is written)."""
    checkpoints = _on_every_rank(callbacks, keras.callbacks.ModelCheckpoint)
    best = [None if getattr(cb, "best", None) is None else float(cb.best) for cb in checkpoints]
    return step_counts.Group({
        "the ModelCheckpoints' save_freq": _one_or_all([cb.save_freq for cb in checkpoints]),
        "the ModelCheckpoints' save_best_only": _one_or_all(
            [bool(cb.save_best_only) for cb in checkpoints]),
        "the ModelCheckpoints' monitor and mode": tuple(
            (cb.monitor, cb.mode) for cb in checkpoints),
        "the ModelCheckpoints' best value so far (initial_value_threshold)": tuple(best),
    }, "fit was given ModelCheckpoint callbacks that save at different times on the ranks",
        "Their saves are collective (the master writes, every rank waits for the file), so the "
        "ranks would wait for each other until TNT_TIMEOUT_S. Pass every rank the same "
        "ModelCheckpoint (the file name may differ: the master's is written); to decide on the "
        "master alone, wrap it: tnt.keras.callbacks.Callback(checkpoint, run_on_all_ranks=False)")


def same_backups(callbacks):
    """The Group (for call_agreement.check in fit) that fails unless every rank
    passes the same BackupAndRestore callbacks: as many, with the same folders,
    save_freq and delete_checkpoint. The master decides whether and from which epoch to resume
    (backup_and_restore.py) and every rank loads from its own callback's
    folder: one of another folder would load other weights or none."""
    backups = _on_every_rank(callbacks, keras.callbacks.BackupAndRestore)
    return step_counts.Group({
        "the BackupAndRestore callbacks' folders (backup_dir)":
            tuple(os.path.abspath(os.fspath(cb.backup_dir)) for cb in backups),
        "the BackupAndRestore callbacks' save_freq": tuple(cb.save_freq for cb in backups),
        # the removal at the end of training is a save's meeting of the ranks: on the master
        # only, it waited there for the others, which had left fit, and met their next call
        "the BackupAndRestore callbacks' delete_checkpoint": tuple(
            bool(cb.delete_checkpoint) for cb in backups),
    }, "fit was given different BackupAndRestore callbacks on the ranks",
        "Pass the same BackupAndRestore on every rank, with one backup_dir that every rank can "
        "read (a shared file system): the master writes the backup, every rank resumes from it")


def _csv_loggers_on_every_rank(callbacks):
    """The CSVLoggers wrapped to run on every rank (unwrapped, one runs on the master only)."""
    return [cb for cb in callbacks or [] if isinstance(cb, keras.callbacks.CSVLogger)
            and isinstance(cb, Callback) and cb.run_on_all_ranks]


def same_csv_loggers(callbacks):
    """The Group (for call_agreement.check in fit) that fails unless every rank
    passes as many CSVLoggers that run on every rank: own_csv_files compares
    their files in one allgather, which every rank must then make."""
    count = len(_csv_loggers_on_every_rank(callbacks))

    def message(every):
        return (
            f"fit was given CSVLoggers wrapped to run on every rank on some ranks only "
            f"({_counts(every)}). Pass the same callbacks on every rank, each rank's CSVLogger "
            "with a file of its own (or leave it unwrapped: it then writes on the master only)")
    return step_counts.Group({"the CSVLoggers that run on every rank": count}, message=message)


def own_csv_files(callbacks):
    """Collective where CSVLoggers run on every rank (as many on every rank:
    same_csv_loggers): a ValueError on every rank alike where ranks would
    write one file. Wrapped with run_on_all_ranks=True, a CSVLogger of one file
    name was opened by every rank, each truncating and writing it: the file
    held one rank's lines and a stray tail of another's (aggregate_logs=False),
    without a word. A name per rank (the docs' advice) is left as it is, so
    the names are compared, not made per rank as TensorBoard's folders are."""
    loggers = _csv_loggers_on_every_rank(callbacks)
    if not loggers or core.get_size() == 1:
        return
    paths = [os.path.abspath(os.fspath(cb.filename)) for cb in loggers]
    mine = np.array([[zlib.crc32(p.encode("utf-8", "surrogateescape")) for p in paths]], np.int64)
    every = collectives.allgather(mine, name="tnt.csv_files")  # one row a rank
    for path, column in zip(paths, every.T.tolist()):
        shared = [r for r, c in enumerate(column) if column.count(c) > 1]
        if shared:  # the same verdict on every rank
            raise ValueError(
                "A CSVLogger wrapped to run on every rank (run_on_all_ranks=True) must write a "
                f"file of its own on each rank: ranks {shared} would write one file together, "
                "each over the others' lines. Give each rank its own name "
                "(`keras.callbacks.CSVLogger(f\"log-{tnt.get_rank()}.csv\")`), or leave it "
                "unwrapped: it then writes on the master only. Received: "
                f"filename={path!r} on this rank")
