"""Class swaps: how Tarantella changes what a user's Keras object does, in place.

Tarantella changes a few methods of objects that the user made: an
optimizer's `apply` (distributed_optimizer), a BatchNormalization layer's
`_moments` (keras/layers/sync_batch_normalization), a compiled loss's `call`
(global_loss), a Mean's `update_state` (metrics_aggregation), a random
layer's `call` (random_layers), a callback's hooks (keras/callbacks/callback).
It does not wrap the object: it assigns to `obj.__class__` a subclass of the
object's own class, because

* the object stays the one that the user holds and that Keras tracks: the
  model's layers, the optimizer's slots and iteration count, a metric's
  variables and the callbacks list keep pointing at it, with its state;
* `isinstance` checks (Keras' search for a History or a ProgbarLogger among
  the callbacks, the user's own) still see what it is;
* the subclass has its base's `__name__`, `__module__` and `__qualname__`, so
  `type(obj).__name__`, `get_config` and Keras' serialisation name the base
  class: a saved file says "Adam" from "keras.optimizers" and loads without
  Tarantella. A class the user registered
  (`keras.saving.register_keras_serializable`) is saved under its registered
  name ("package>Name"), which Keras looks up by the class object: the
  subclass is given the base's.

`subclass` makes such a class, and `once_per_class` makes each kind of swap
create one subclass per base class (under a lock: the first swaps may run on
several threads at once) and reuse it, so that two objects of one class still
share one type and repeated swaps do not multiply classes. Whether an object
is already swapped (idempotence) is each caller's test: a marker attribute of
the subclass, or the method it replaces.
"""
import functools
import threading

from keras.src.saving import object_registration


def subclass(base, members, mixins=()):
    """A subclass of `base` (after `mixins`, whose methods then come first)
    with the attributes `members`, named as `base` (see the module's docstring).
    A method of `members` calls the base's as `super(cls, self).method(...)`,
    `cls` being this function's result."""
    cls = type(base.__name__, (*mixins, base), {
        **members, "__module__": base.__module__, "__qualname__": base.__qualname__})
    # Without it a registered class was saved as its bare name, which loading cannot find.
    # Only the name: the registry of objects still gives the user's class back on loading.
    registered = object_registration.GLOBAL_CUSTOM_NAMES.get(base)
    if registered is not None:
        object_registration.GLOBAL_CUSTOM_NAMES[cls] = registered
    return cls


def once_per_class(make):
    """Decorate `make(base, *args)`, which returns the swap subclass of the
    class `base`: the decorated function calls it once per `base`, under a
    lock, and returns that class ever after. The class must depend on `base`
    alone: later arguments serve the first call only."""
    classes = {}  # base class -> its subclass
    lock = threading.Lock()

    @functools.wraps(make)
    def cached(base, *args):
        with lock:
            if base not in classes:
                classes[base] = make(base, *args)
            return classes[base]

    return cached
