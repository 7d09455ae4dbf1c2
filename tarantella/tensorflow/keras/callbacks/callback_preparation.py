"""The callbacks tnt.Model passes to Keras: the user's, wrapped per type."""
import os

import keras

from tarantella.common import config, core
from tarantella.tensorflow.keras.callbacks.callback import Callback


def _tensorboard_on_all_ranks(callback):
    # Each rank writes its own event files, under log_dir/rank_<r>.
    callback.log_dir = os.path.join(os.fspath(callback.log_dir), f"rank_{core.get_rank()}")
    callback._log_write_dir = callback.log_dir
    callback._train_dir = os.path.join(callback.log_dir, "train")
    callback._val_dir = os.path.join(callback.log_dir, "validation")
    return Callback(callback)


def prepare_callbacks(callbacks):
    """A new list of the user's callbacks, each wrapped as it must run.

    Only callbacks that write to files or the console need a wrapper: every
    other callback can run unchanged on every rank because tnt.Model already
    gives every rank the same global logs.
    """
    prepared = []
    for cb in callbacks or []:
        if isinstance(cb, Callback):
            prepared.append(cb)
        elif isinstance(cb, keras.callbacks.ProgbarLogger):
            prepared.append(Callback(cb, run_on_all_ranks=config.get("TNT_OUTPUT_ON_ALL_DEVICES")))
        elif isinstance(cb, (keras.callbacks.CSVLogger, keras.callbacks.RemoteMonitor)):
            # one file, one stream of events to the server: as serial training writes them
            prepared.append(Callback(cb, run_on_all_ranks=False))
        elif isinstance(cb, keras.callbacks.TensorBoard):
            if config.get("TNT_TENSORBOARD_ON_ALL_DEVICES") and core.get_size() > 1:
                prepared.append(_tensorboard_on_all_ranks(cb))
            else:
                prepared.append(Callback(cb, run_on_all_ranks=False))
        elif isinstance(cb, keras.callbacks.BackupAndRestore):
            Callback(cb)  # raises the explanation
        else:
            prepared.append(cb)
    return prepared
