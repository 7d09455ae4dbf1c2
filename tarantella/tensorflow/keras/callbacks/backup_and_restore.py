"""Keras' BackupAndRestore on several ranks: the master keeps the backup, every rank resumes alike.

Unchanged, every rank ran Keras' callback on the one backup folder: each made
the folder and removed it at the end (the later rank's rmtree failed on
files the other had removed), each wrote `training_metadata.json` and, with
`double_checkpoint`, copied the files to their `.bkp` twins, all at once and
in place; and each rank decided alone, from what it found on its disk,
whether to restore and from which epoch to resume.

Here the class of the user's callback is swapped (class_swap) for one that
  * restores as the master decides: the master reads the backup (Keras'
    fallback to the `.bkp` files included) and tells every rank whether there
    are weights and the epoch to resume from; every rank then loads the
    weights with `tnt.Model.load_weights` (collective: every rank reads the
    file, as for any load, and takes the master's values); a read that fails
    on the master fails on every rank;
  * backs up on the master only, atomically: the `.bkp` copies, then the
    weights, then the metadata (Keras' order: the metadata never names an
    epoch whose weights are not written), each file written beside its
    target and renamed over it, so that a job stopped mid-save leaves the
    previous backup whole; the weights file also holds its epoch, so that a
    job stopped between the weights' rename and the metadata's resumes after
    the epoch of the weights it loads. The ranks meet after it, as after any save, and
    an error on the master is raised on every rank;
  * removes the folder at the end of training on the master only, the
    ranks meeting after it.
fit checks that every rank passes the same BackupAndRestore callbacks (their
folders included: callback_preparation.same_backups).
"""
import json
import shutil

import numpy as np
from keras.src.utils import file_utils

from tarantella.common import busy, collectives, core
from tarantella.common.errors import TarantellaError
from tarantella.tensorflow import class_swap
from tarantella.tensorflow.atomic_save import atomic_save


def distributed(callback):
    """`callback` (a keras.callbacks.BackupAndRestore) with its class swapped
    for the distributed one (once)."""
    if not getattr(callback, "_tnt_distributed_backup", False):
        callback.__class__ = _distributed_class(type(callback))
    return callback


def _copy_atomically(source, target):
    atomic_save(target, lambda path: shutil.copyfile(source, path))


def _write_text_atomically(target, text):
    def write(path):
        with open(path, "w") as f:
            f.write(text)
    atomic_save(target, write)


# The epoch a backup's weights file was written for, as an attribute of the file itself
# (Keras reads the weights by their groups and never looks at the file's attributes). The
# weights and training_metadata.json are two files, each renamed into place: a job stopped
# between the two renames left the new weights under the old metadata, so the resumed run
# trained the last epoch once more (on weights that had been trained on it already) and ended
# with other weights than a run never stopped. The mark is renamed into place with the weights.
_EPOCH_MARK = "tnt_backup_epoch"


def _read_backup(callback):
    """On the master: (whether the weights file exists, the epoch to resume
    from or -1), Keras' checks included: an unreadable weights file raises
    OSError, as Keras' load of it did. The epoch is the weights file's own
    (_EPOCH_MARK) where it has one, else the metadata's (a backup of plain
    Keras)."""
    weights = file_utils.exists(callback._weights_path)
    marked = None
    if weights:
        import h5py  # installed with Keras; its open is the read that fails on a damaged file
        with h5py.File(callback._weights_path, "r") as f:
            marked = f.attrs.get(_EPOCH_MARK)
    epoch = -1
    if file_utils.exists(callback._training_metadata_path):
        with file_utils.File(callback._training_metadata_path, "r") as f:
            epoch = int(json.loads(f.read())["epoch"])
    if marked is not None:
        epoch = int(marked)
    return weights, epoch


def _read_backup_or_previous(callback):
    """_read_backup, or after Keras' fallback: where the latest backup cannot
    be read and a previous one (`double_checkpoint`) exists, the previous
    files are put back in place of the latest first."""
    try:
        return _read_backup(callback)
    except OSError:
        if not file_utils.exists(callback._prev_weights_path):
            raise
        _copy_atomically(callback._prev_weights_path, callback._weights_path)
        if file_utils.exists(callback._prev_training_metadata_path):
            _copy_atomically(callback._prev_training_metadata_path, callback._training_metadata_path)
        elif file_utils.exists(callback._training_metadata_path):
            file_utils.remove(callback._training_metadata_path)
        return _read_backup(callback)


def _masters_reading(callback):
    """(weights, epoch) as the master read them, on every rank; the master's
    error is raised there, and a TarantellaError quoting it on the others."""
    error, weights, epoch = None, False, -1
    if core.is_master_rank():
        try:
            with busy.section():  # the others wait for the read, however long it takes
                weights, epoch = _read_backup_or_previous(callback)
        except Exception as exc:  # noqa: BLE001 - raised on every rank below
            error = exc
    if core.get_size() == 1:
        if error is not None:
            raise error
        return weights, epoch
    said = f"{type(error).__name__}: {error}".encode()[:4000] if error is not None else b""
    head = collectives.broadcast(np.array([int(weights), epoch, len(said)], np.int64),
                                 root=core.get_master_rank(), name="tnt.backup.state")
    if head[2]:
        text = collectives.broadcast(  # int32: the collectives' smallest integer
            np.frombuffer(said.ljust(int(head[2]), b" "), np.uint8).astype(np.int32),
            root=core.get_master_rank(), name="tnt.backup.error")
        if error is not None:
            raise error
        raise TarantellaError(
            f"BackupAndRestore could not read its backup in {callback.backup_dir!r} on the master "
            f"rank ({text.astype(np.uint8).tobytes().decode(errors='replace')}), so it fails on every rank")
    return bool(head[0]), int(head[1])


def _on_train_begin(self, logs=None):
    if not self.model.built:
        raise ValueError(
            "To use the BackupAndRestore callback, you model must be built before you call "
            f"`fit()`. Model {self.model} is unbuilt. You can build it beforehand by calling it "
            "on a batch of data.")  # Keras' words, before any collective (the same on every rank)
    weights, epoch = _masters_reading(self)
    if weights:
        self.model.load_weights(self._weights_path)  # collective; builds the optimizer first
    if epoch >= 0:
        self.model._initial_epoch = epoch


def _write_backup(self):
    """On the master: the backup, as Keras writes it, each file atomically."""
    if not file_utils.exists(self.backup_dir):
        file_utils.makedirs(self.backup_dir)
    if self.double_checkpoint:
        for latest, previous in ((self._weights_path, self._prev_weights_path),
                                 (self._training_metadata_path, self._prev_training_metadata_path)):
            if file_utils.exists(latest):
                _copy_atomically(latest, previous)
    epoch = self._current_epoch

    def write_weights(path):
        self.model.model.save_weights(path, overwrite=True)
        import h5py

        with h5py.File(path, "a") as f:  # the temporary, before its rename
            f.attrs[_EPOCH_MARK] = epoch

    atomic_save(self._weights_path, write_weights)
    _write_text_atomically(self._training_metadata_path, json.dumps(
        {"epoch": epoch, "batch": self._last_batch_seen}))


def _remove_backup(self):
    if file_utils.exists(self.backup_dir):
        file_utils.rmtree(self.backup_dir)


def _on_master(self, work):
    """`work()` on the master, then the ranks meet (every rank sees the files
    as the master left them; its error raised on every rank)."""
    from tarantella.tensorflow.model import master_writes_together  # model.py imports this package

    master_writes_together("BackupAndRestore", self.model, not self.model._tnt_synced, work)


def _save_model(self):
    _on_master(self, lambda: _write_backup(self))


def _on_train_end(self, logs=None):
    if self.delete_checkpoint:
        _on_master(self, lambda: _remove_backup(self))


@class_swap.once_per_class
def _distributed_class(base):
    return class_swap.subclass(base, {
        "_tnt_distributed_backup": True,
        "on_train_begin": _on_train_begin,
        "_save_model": _save_model,
        "on_train_end": _on_train_end,
    })
