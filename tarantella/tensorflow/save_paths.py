"""Keras 3's rules for the names of saved files, checked before a save starts.

tnt saves write a temporary twin of the target and rename it (atomic_save), on
the master rank only, then meet at a barrier. A name Keras refuses must
therefore be refused first, on every rank, naming the user's path: otherwise
Keras refuses the temporary name on the master alone while the other ranks
go on to the barrier. The rules are those of Keras 3.15
(`keras.saving.save_model`, `saving_lib.save_model`, `keras.saving.save_weights`).
"""
import os

_MODEL_FILES = (".keras", ".h5", ".hdf5")


def _suggest(path, suffix):
    return path[:-len(".h5")] + suffix if path.endswith(".h5") else path + suffix


def check_model_path(filepath, zipped=None, what="tnt.Model.save"):
    """Raise the ValueError Keras would raise for `model.save(filepath,
    zipped=zipped)`, with the user's path in it."""
    path = os.fspath(filepath)
    if zipped is None:
        zipped = not path.startswith("hf://")  # Keras' default
    if zipped and not path.endswith(_MODEL_FILES):
        raise ValueError(
            f"{what}: Keras 3 saves a model to a file whose name ends in \".keras\" (or \".h5\" "
            f"for the legacy HDF5 format), or to a directory with zipped=False. Add the "
            f"extension: filepath={_suggest(path, '.keras')!r}. Received: filepath={path!r}")
    if not zipped and path.endswith(".keras"):
        raise ValueError(
            f"{what}: with zipped=False Keras 3 saves to a directory, whose name must not end in "
            f"\".keras\". Drop the extension or zipped=False. Received: filepath={path!r}, "
            f"zipped=False")


def check_weights_path(filepath, max_shard_size=None, what="tnt.Model.save_weights"):
    """Raise the ValueError Keras would raise for `model.save_weights(filepath,
    max_shard_size=max_shard_size)`, with the user's path in it."""
    path = os.fspath(filepath)
    suffix = ".weights.h5" if max_shard_size is None else ".weights.json"
    if not path.endswith(suffix):
        sharded = "" if max_shard_size is None else " (sharded: max_shard_size is set)"
        raise ValueError(
            f"{what}: Keras 3 saves weights{sharded} to a file whose name ends in "
            f"\"{suffix}\". Add the extension: filepath={_suggest(path, suffix)!r}. "
            f"Received: filepath={path!r}")


# What Keras 3.15 takes besides filepath, overwrite and zipped: `model.save`
# (saving_api.save_model pops these two and refuses any other keyword with a
# ValueError) and `model.save_weights` (a TypeError for any other keyword).
_SAVE_KEYWORDS = ("include_optimizer", "save_format")
_SAVE_WEIGHTS_KEYWORDS = ("max_shard_size",)


def check_save_keywords(kwargs, what="tnt.Model.save"):
    """Raise, on every rank, the error Keras would raise on the master alone
    for a keyword `model.save` does not take (Keras 2's `options`,
    `signatures`, `save_traces`): the other ranks would wait at the save's
    barrier for a master that had failed."""
    unknown, received = _not_taken(kwargs, _SAVE_KEYWORDS)
    if unknown:
        raise ValueError(
            f"{what}: Keras 3 does not take the argument(s) {unknown} (TensorFlow SavedModel "
            f"options of Keras 2; export a SavedModel with model.export(dir)). Received: {received}")


def check_save_weights_keywords(kwargs, what="tnt.Model.save_weights"):
    """As check_save_keywords, for `model.save_weights` (Keras 2's
    `save_format`, `options`)."""
    unknown, received = _not_taken(kwargs, _SAVE_WEIGHTS_KEYWORDS)
    if unknown:
        raise TypeError(
            f"{what}: Keras 3 does not take the argument(s) {unknown}: the name decides the "
            f"format (NAME.weights.h5). Received: {received}")


def _not_taken(kwargs, taken):
    """The keywords of `kwargs` not in `taken`, sorted, and how they were passed ("k=v, ...")."""
    unknown = sorted(set(kwargs) - set(taken))
    return unknown, ", ".join(f"{k}={kwargs[k]!r}" for k in unknown)
