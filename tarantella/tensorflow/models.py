"""tnt.models: Keras' model functions, returning tnt.Model objects.

Files are written by `tnt.Model.save`: on the master rank only (every rank
with `tnt_save_all_devices=True`), atomically. A `.keras` file saved from a
tnt.Model is the plain Keras file of the wrapped model, compiled, with its
optimizer state (recorded as the plain Keras class): plain Keras loads it
without Tarantella, and `load_model` here returns it as a tnt.Model.
"""

import keras

from tarantella.common import busy, master_only
from tarantella.tensorflow import call_agreement
from tarantella.tensorflow.atomic_save import explain_missing
from tarantella.tensorflow.model import Model, save_together
from tarantella.tensorflow.model import model_from_config as _model_from_config
from tarantella.tensorflow.save_paths import check_model_path, check_save_keywords


def _wrap(model):
    return model if isinstance(model, Model) else Model(model)


def save_model(model, filepath, overwrite=True, tnt_save_all_devices=False, **kwargs):
    """Save a tnt.Model (or a plain keras.Model, on the master rank only)."""
    if isinstance(model, Model):
        return model.save(filepath, overwrite=overwrite, tnt_save_all_devices=tnt_save_all_devices,
                          **kwargs)
    return _wrap_plain_save(model, filepath, overwrite, tnt_save_all_devices, **kwargs)


def _wrap_plain_save(model, filepath, overwrite, save_all_devices, **kwargs):
    check_model_path(filepath, kwargs.get("zipped"), what="tnt.models.save_model")
    check_save_keywords({k: v for k, v in kwargs.items() if k != "zipped"},
                        what="tnt.models.save_model")
    # the write goes to a fresh temporary, where Keras' own overwrite check never fires:
    # save_together refuses it (on every rank, as tnt.Model.save does), or the file was replaced
    save_together("save", model, False, filepath,
                  lambda path: model.save(path, overwrite=True, **kwargs), save_all_devices,
                  overwrite=overwrite)


@call_agreement.one_thread_at_a_time("load_model")
def load_model(filepath, custom_objects=None, compile=True, safe_mode=True):  # noqa: A002
    """Load a model saved by `tnt.Model.save` or by plain Keras, as a tnt.Model.

    Every rank reads the file (a shared filesystem is assumed); the weights,
    optimizer state and random generators' states are then broadcast from the
    master rank. The model is compiled if it was saved
    compiled and `compile=True`; its optimizer state is restored.
    """
    master_only.refuse("tnt.models.load_model")
    model, error = None, None
    try:
        with busy.section():  # a rank slower to read (another host's file system) is waited for
            model = _loaded(filepath, custom_objects, compile, safe_mode)
    except Exception as exc:  # noqa: BLE001 - raised on every rank by the agreement
        error = explain_missing(exc, filepath)
    # a rank that could not read the file fails every rank here, before the broadcast
    call_agreement.check("load_model", model, getattr(model, "_tnt_agreement", None), True,
                         error=error)
    model._broadcast_loaded_state()  # weights, optimizer state, random generators
    return model


def _loaded(filepath, custom_objects, compile, safe_mode):  # noqa: A002
    loaded = keras.saving.load_model(filepath, custom_objects=custom_objects, compile=compile,
                                     safe_mode=safe_mode)
    if isinstance(loaded, Model):
        return loaded
    model = Model(loaded)
    if compile and getattr(loaded, "compiled", False):
        # compile the wrapper alike, with the loaded optimizer and its state; the loss and
        # metrics are the user's custom objects where Keras' load took them from there
        arguments = keras.saving.deserialize_keras_object(
            loaded.get_compile_config(), custom_objects=custom_objects, safe_mode=safe_mode)
        model.compile(**dict(arguments, optimizer=loaded.optimizer))
    return model


def model_from_config(config, custom_objects=None):
    """A tnt.Model from a model config: `model.get_config()` of a Functional or
    Sequential model (or of a tnt.Model over one), or a serialized model
    (`keras.saving.serialize_keras_object(model)`, any class)."""
    return _wrap(_model_from_config(config, custom_objects))


def model_from_json(json_string, custom_objects=None):
    return _wrap(keras.models.model_from_json(json_string, custom_objects=custom_objects))


def clone_model(model, **kwargs):
    """A tnt.Model with the same structure and fresh weights (Keras semantics)."""
    inner = model.model if isinstance(model, Model) else model
    return Model(keras.models.clone_model(inner, **kwargs))


def __getattr__(name):
    if name == "model_from_yaml":  # the original Tarantella's (docs/migration.md)
        raise AttributeError("tarantella.models.model_from_yaml is not available: YAML was removed "
                             "from Keras; use to_json and tnt.models.model_from_json")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["save_model", "load_model", "model_from_config", "model_from_json", "clone_model"]
