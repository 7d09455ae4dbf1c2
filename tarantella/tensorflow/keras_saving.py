"""Keras' saving functions given a tnt.Model save it as `tnt.Model.save` does.

`keras.saving.save_model(model, path)` (also `keras.models.save_model`,
`tf.keras.models.save_model`) and `keras.saving.save_weights(model, path)`
write the file themselves, without calling the model's `save`: given a
tnt.Model, every rank wrote the same file at once (on 2 ranks a zip whose
reading failed with "Bad CRC-32"), not atomically, and under the wrapper's
class instead of the wrapped model's plain Keras file.

Those functions reach the file through three functions of Keras 3.15's
internals, looked up on their modules at every call
(`saving_lib.save_model`, `saving_lib.save_weights_only`,
`legacy_h5_format.save_model_to_hdf5`). `install` puts a wrapper in their
place that hands a tnt.Model to its own `save` / `save_weights` (the master
writes atomically, every rank meets after) and passes anything else to Keras
unchanged: the wrapped model that tnt.Model.save hands Keras goes there too.

Keras' public `save_model` (`keras.saving`, `keras.models`, `tf.keras.models`)
and `save_weights` (`keras.saving`) are routed too, before they ask on the
terminal whether to replace an existing file (overwrite=False): they asked on
every rank, where only rank 0 can answer under tntrun. A tnt.Model goes to
its own `save` / `save_weights`, overwrite included (a FileExistsError on
every rank). So does Keras' public `load_weights` (`keras.saving`): it walked
the wrapper, which loaded the weights but not the optimizer's state (kept
under the wrapped model in the file), and no rank took the master's values.

`tf.saved_model.save(model, dir)` likewise wrote the SavedModel from every
rank into one directory at once: now and then one rank's save failed in
MergeV2Checkpoints (the other rank had merged and removed the shared
`variables_temp`), that rank alone, and the directory was whichever rank
wrote last. It reaches the directory through
`tensorflow.python.saved_model.save.save_and_return_nodes`, routed the same
way: a tnt.Model's SavedModel is written on the master, atomically (as
`tnt.Model.export`), and the ranks meet after it. Keras' own `export` hands
TensorFlow an ExportArchive, no tnt.Model, which passes unchanged.

Keras makes a missing folder with `if not exists(dir): makedirs(dir)`
(ModelCheckpoint before every save, saving_lib for a directory save). A
ModelCheckpoint runs on every rank: now and then both ranks found the folder
missing, one made it and the other's makedirs failed with FileExistsError,
on that rank alone, in the middle of fit. `file_utils.makedirs` is wrapped to
take a folder made between the check and the call as made; a file in its
place still raises, as before.

Keras 3.15's legacy HDF5 writer (`model.save("m.h5")`, a ModelCheckpoint to
".h5") pops "optimizer" out of the model's own compile config
(`saving_utils.model_metadata`). Under tntrun only the master writes, so its
model then differed from the others': a later `tnt.models.save_model` of the
plain Keras model was a MismatchError ("what compile was given"), and every
later ".keras" file of the model (serial Keras' too) was written without its
optimizer, which `load_model` then replaced with a fresh RMSprop. The HDF5
writer is wrapped to put the compile config back as it was.
"""
import functools
import os

from tarantella.common.logging import get_logger

_INSTALLED = "_tnt_routes_tnt_models"


def _is_path(filepath):
    return isinstance(filepath, (str, os.PathLike))  # not a file object


def _route(original, save):
    """`original(model, filepath, ...)`, or `save(model, filepath, ...)` for a
    tnt.Model written to a path."""

    @functools.wraps(original)
    def routed(model, filepath, *args, **kwargs):
        from tarantella.tensorflow.model import Model  # model.py installs this module

        if isinstance(model, Model) and _is_path(filepath):
            return save(model, filepath, *args, **kwargs)
        return original(model, filepath, *args, **kwargs)

    setattr(routed, _INSTALLED, True)
    return routed


def _save_model(model, filepath, weights_format="h5", zipped=True):
    if weights_format != "h5":  # Keras' own choice for every .keras file it saves
        raise ValueError(f"tnt.Model.save writes the weights as h5. Received: "
                         f"weights_format={weights_format!r}")
    return model.save(filepath, zipped=zipped)


def _save_weights(model, filepath, max_shard_size=None, objects_to_skip=None):
    if objects_to_skip is not None:
        raise ValueError("tnt.Model.save_weights saves every object. Received: objects_to_skip="
                         f"{objects_to_skip!r}")
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    return model.save_weights(filepath, **kwargs)


def _save_model_to_hdf5(model, filepath, overwrite=True, include_optimizer=True):
    # Keras' save_model asked about an existing file before it came here
    return model.save(filepath, include_optimizer=include_optimizer)


def _keeping_compile_config(original):
    """`original` (Keras' legacy HDF5 writer), with the model's compile config
    as it was before the call: the writer pops its "optimizer" (see above)."""

    @functools.wraps(original)
    def save(model, *args, **kwargs):
        config = getattr(getattr(model, "_compile_config", None), "config", None)
        kept = dict(config) if isinstance(config, dict) else None
        try:
            return original(model, *args, **kwargs)
        finally:
            if kept is not None and config != kept:
                config.clear()
                config.update(kept)

    return save


def _saved_model_save(original):
    """`original` (TensorFlow's save_and_return_nodes) of a tnt.Model, on the
    master only (every rank in the call, as for `tnt.Model.export`); returns
    what it returned there, None on the other ranks."""

    def save(model, export_dir, *args, **kwargs):
        from tarantella.tensorflow.model import save_together

        written = []
        save_together("tf.saved_model.save", model, not model._tnt_synced, os.fspath(export_dir),
                      lambda path: written.append(original(model, path, *args, **kwargs)), False)
        return written[0] if written else None

    return save


# the tf.numpy_function nodes of the TF-level collectives (tensor_collectives._run_in_graph,
# _root_has_samples): TensorFlow saves no Python code of a numpy_function
_PY_FUNCS = ("PyFunc", "EagerPyFunc", "PyFuncStateless")
_TNT_PY_FUNC_NAMES = ("TntCollective", "TntRootHasSamples")


def numpy_function_collectives(export_dir):
    """The names of the nodes of the SavedModel in `export_dir` that are TF-level collectives
    made through tf.numpy_function, sorted; [] where it cannot be read."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    try:
        with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
            saved.ParseFromString(f.read())
    except Exception:  # noqa: BLE001 - no SavedModel to look at (another format): nothing to say
        return []
    found = set()
    for meta in saved.meta_graphs:
        nodes = list(meta.graph_def.node)
        for function in meta.graph_def.library.function:
            nodes.extend(function.node_def)
        for node in nodes:
            if node.op in _PY_FUNCS and node.name.rsplit("/", 1)[-1].startswith(_TNT_PY_FUNC_NAMES):
                found.add(node.name)
    return sorted(found)


def _warning_unservable(original):
    """TensorFlow's save_and_return_nodes (tf.saved_model.save, Keras' export), with a WARNING
    where the SavedModel it wrote holds TF-level collectives made through tf.numpy_function: a
    numpy_function's Python code is not saved, so serving the model in another process failed at
    those calls with TensorFlow's "Could not find callback with key=pyfunc_<k> in the registry",
    which names no cause (the compiled ops' calls load and run, docs/api.md)."""

    @functools.wraps(original)
    def save(obj, export_dir, *args, **kwargs):
        result = original(obj, export_dir, *args, **kwargs)
        if _is_path(export_dir):
            found = numpy_function_collectives(os.fspath(export_dir))
            if found:
                get_logger().warning(
                    "The SavedModel just written (tf.saved_model.save, export) holds %d tnt collective call(s) "
                    "made through "
                    "tf.numpy_function (%s): TensorFlow does not save their Python code, so serving it in "
                    "another process fails at them (\"Could not find callback with key=pyfunc_... in the "
                    "registry\"). Such calls are structures with a leaf whose shape is not known when traced "
                    "(None in a dimension), empty structures, and every call with TNT_TF_OPS=numpy or "
                    "without the compiled ops; call such leaves one tensor at a time, or give them a known "
                    "shape, to have them on the compiled ops, which a SavedModel keeps (docs/api.md)",
                    len(found), ", ".join(found[:5]) + (", ..." if len(found) > 5 else ""))
        return result

    return save


def _makedirs_made_meanwhile(original):
    """Keras' makedirs(path), which leaves a folder another rank has made
    since Keras found it missing (the only way Keras reaches it with a folder
    in place: every caller checks first)."""

    @functools.wraps(original)
    def makedirs(path):
        try:
            return original(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise

    setattr(makedirs, _INSTALLED, True)
    return makedirs


# Where Keras' public save_model and save_weights are bound by name (`from ... import`): each
# must take the routed function, as saving_api (looked up at every call by Keras' own
# Model.save and save_weights)
_PUBLIC_MODULES = ("keras.saving", "keras.models", "keras._tf_keras.keras.saving",
                   "keras._tf_keras.keras.models")


def _public_save_model(original):
    """Keras' `save_model(model, filepath, overwrite, zipped, **kwargs)`,
    which hands a tnt.Model saved to a path to its own `save`, overwrite
    included. Keras' asked on the terminal about an existing file with
    overwrite=False, on every rank, before it reached the routed internals:
    rank 0 waited for an answer while another rank (its stdin /dev/null under
    tntrun) failed with an EOFError; tnt.Model.save raises the same
    FileExistsError on every rank instead."""

    @functools.wraps(original)
    def save_model(model, filepath, overwrite=True, zipped=None, **kwargs):
        from tarantella.tensorflow.model import Model

        if isinstance(model, Model) and _is_path(filepath):
            return model.save(filepath, overwrite=overwrite, zipped=zipped, **kwargs)
        return original(model, filepath, overwrite=overwrite, zipped=zipped, **kwargs)

    setattr(save_model, _INSTALLED, True)
    return save_model


def _public_save_weights(original):
    """Keras' `save_weights(model, filepath, overwrite, max_shard_size)`, as
    _public_save_model: a tnt.Model's own `save_weights`, overwrite included."""

    @functools.wraps(original)
    def save_weights(model, filepath, overwrite=True, max_shard_size=None, **kwargs):
        from tarantella.tensorflow.model import Model

        if isinstance(model, Model) and _is_path(filepath):
            if max_shard_size is not None:
                kwargs["max_shard_size"] = max_shard_size
            return model.save_weights(filepath, overwrite=overwrite, **kwargs)
        return original(model, filepath, overwrite=overwrite, max_shard_size=max_shard_size,
                        **kwargs)

    setattr(save_weights, _INSTALLED, True)
    return save_weights


def _public_load_weights(original):
    """Keras' `load_weights(model, filepath, skip_mismatch, **kwargs)`, which
    hands a tnt.Model to its own `load_weights`. Keras' walked the wrapper
    itself: the weights loaded, but the optimizer's state did not (found
    under the wrapped model in the file: "the saved optimizer has 0
    variables"), where serial Keras restores it; and no rank took the
    master's values."""

    @functools.wraps(original)
    def load_weights(model, filepath, skip_mismatch=False, **kwargs):
        from tarantella.tensorflow.model import Model

        if isinstance(model, Model):
            return model.load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)
        return original(model, filepath, skip_mismatch=skip_mismatch, **kwargs)

    setattr(load_weights, _INSTALLED, True)
    return load_weights


def _install_public_saves():
    import importlib

    from keras.src.saving import saving_api

    modules = []
    for name in _PUBLIC_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:  # another Keras' layout: its internals are routed all the same
            pass
    for name, route in (("save_model", _public_save_model),
                        ("save_weights", _public_save_weights),
                        ("load_weights", _public_load_weights)):
        original = getattr(saving_api, name)
        if getattr(original, _INSTALLED, False):
            continue
        routed = route(original)
        setattr(saving_api, name, routed)
        for module in modules:
            if getattr(module, name, None) is original:
                setattr(module, name, routed)


def install():
    """Route Keras' (and tf.saved_model's) saving functions' tnt.Models to
    their own saves, and let Keras' makedirs meet a folder another rank made
    (once)."""
    from keras.src.legacy.saving import legacy_h5_format
    from keras.src.saving import saving_lib
    from keras.src.utils import file_utils
    from tensorflow.python.saved_model import save as saved_model_save

    for module, name, save in (
            (saving_lib, "save_model", lambda original: _save_model),
            (saving_lib, "save_weights_only", lambda original: _save_weights),
            (legacy_h5_format, "save_model_to_hdf5", lambda original: _save_model_to_hdf5),
            (saved_model_save, "save_and_return_nodes", _saved_model_save)):
        original = getattr(module, name)
        if not getattr(original, _INSTALLED, False):
            plain = _keeping_compile_config(original) if module is legacy_h5_format else original
            if module is saved_model_save:
                plain = original = _warning_unservable(original)
            setattr(module, name, _route(plain, save(original)))
    if not getattr(file_utils.makedirs, _INSTALLED, False):
        file_utils.makedirs = _makedirs_made_meanwhile(file_utils.makedirs)
    _install_public_saves()
