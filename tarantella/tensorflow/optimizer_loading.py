"""Load a weights file into a model whose optimizer is not built yet."""
import contextlib


@contextlib.contextmanager
def built_for_loading(optimizer, variables):
    """Build `optimizer` for `variables` (unless it is None or built, or
    `variables` is None: the model is not built) while a weights file loads
    into its model, so that a file saved after training restores its state:
    plain Keras skips it, with a warning, for an unbuilt optimizer, which
    holds only its iterations and learning rate.

    A file saved before training holds those two only: Keras then skipped
    them for the built optimizer ("it has 6 variables whereas the saved
    optimizer has 2"), and the saved learning rate was lost where plain
    Keras' load_weights restores it. They are loaded into the built
    optimizer's first variables, the same two (Keras creates them first)."""
    if optimizer is None or variables is None or optimizer.built:
        yield
        return
    unbuilt = len(optimizer.variables)
    optimizer.build(variables)
    own = optimizer.load_own_variables

    def load_own_variables(store):
        if len(store.keys()) == unbuilt < len(optimizer.variables):
            for i, variable in enumerate(optimizer.variables[:unbuilt]):
                variable.assign(store[str(i)])
        else:
            own(store)

    optimizer.load_own_variables = load_own_variables  # looked up on the object by Keras
    try:
        yield
    finally:
        del optimizer.load_own_variables
