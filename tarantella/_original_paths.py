"""The original Tarantella's module paths: `import tarantella.keras.callbacks`,
`from tarantella.optimizers import Optimizer`, `tarantella.data`,
`tarantella.models` (also `tarantella.keras.models`, `.model`, `.sequential`). Each is the module of tarantella.tensorflow that serves
it (the same object as `tnt.keras`, ...), imported only when asked for, so
that `import tarantella` stays free of TensorFlow."""
import importlib
import importlib.abc
import importlib.util

_MOVED = {
    # the original's modules under tarantella.keras whose names differ here; its __init__
    # imported them, so `tnt.keras.models.load_model` ran as `tnt.models.load_model`
    "tarantella.keras.models": "tarantella.tensorflow.models",
    "tarantella.keras.model": "tarantella.tensorflow.model",
    "tarantella.keras.sequential": "tarantella.tensorflow.model",
    **{f"tarantella.{name}": f"tarantella.tensorflow.{name}"
       for name in ("keras", "data", "models", "optimizers")},
}


def _new_name(fullname):
    for old, new in _MOVED.items():  # the specific names before "tarantella.keras"
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


class OriginalPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder on sys.meta_path whose modules are tarantella.tensorflow's."""

    def find_spec(self, fullname, path=None, target=None):
        new = _new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(_new_name(spec.name))
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # Imported already, under its own name; the import system has just set its __spec__
        # to the alias's: give back its own, which reload() and find_spec() read.
        module.__spec__ = self._own_spec
