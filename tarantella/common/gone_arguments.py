"""The original Tarantella's keyword arguments that are gone, refused with what
to do instead (docs/migration.md): Python's "got an unexpected keyword
argument 'group'" (or Keras' "Unrecognized keyword arguments") said nothing
of why, nor what replaces them."""

NO_GROUPS = "there are no rank groups: every collective spans all ranks"

# its `group=` of tnt.Model, the optimizer, the Tensor* collectives and callbacks
GROUP = {"group": f"{NO_GROUPS}, so leave it out"}


def refuse(where, kwargs, gone, others_allowed=False):
    """Raise a TypeError for an argument of `kwargs` named in `gone` (name:
    what to do), saying so. `others_allowed`: `kwargs` may hold arguments the
    callee passes on (tnt.Model's to keras.Model); otherwise any other name is
    refused as Python refuses an unexpected keyword argument."""
    for name, value in kwargs.items():
        if name in gone:
            raise TypeError(f"{where}: {name} of the original Tarantella is not available: "
                            f"{gone[name]} (docs/migration.md). Received: {name}={value!r:.80}")
        if not others_allowed:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
