"""DistributedGradientTape: a tf.GradientTape whose gradients are averaged across ranks."""
import tensorflow as tf

from tarantella.common import request_names
from tarantella.tensorflow import collective_ops
from tarantella.tensorflow import compression as compression_lib


class DistributedGradientTape:
    """Wrap a `tf.GradientTape` so that `gradient()` returns gradients
    averaged over all ranks (as Horovod's DistributedGradientTape).

    Use it in a custom training loop with a plain optimizer; or keep the tape
    plain and wrap the optimizer with `tnt.DistributedOptimizer` instead
    (never both: gradients would be averaged twice, which is harmless but
    wasteful).

    Args:
        tape: A `tf.GradientTape`, used as a context manager as usual.
        name: Optional string naming the requests across ranks; by default
            "tnt.tape" (with "@<thread name>" in a thread other than the
            main one, as unnamed collectives, docs/api.md).
        compression: `tnt.Compression.none` (the default: exact), `fp16` or
            `bf16` (float32 gradients travel as 16-bit floats; see
            docs/keras.md, "Gradient compression").

    Example:

    ```python
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = tnt.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    ```
    """

    def __init__(self, tape, name=None, compression=compression_lib.Compression.none):
        if not isinstance(tape, tf.GradientTape):
            raise TypeError(
                "DistributedGradientTape expects a tf.GradientTape. Received: "
                f"tape={tape!r} (of type {type(tape).__name__})")
        self._tape = tape
        self._name = name
        self._compression = compression_lib.resolve(compression)

    def __enter__(self):
        self._tape.__enter__()
        return self

    def __exit__(self, *exc):
        return self._tape.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._tape, name)

    @tf.autograph.experimental.do_not_convert  # as tensor_collectives.plain_python (no user code)
    def gradient(self, target, sources, output_gradients=None, weight=None, **kwargs):
        """`tf.GradientTape.gradient`, averaged over ranks; `weight` (this
        rank's micro-batch size, say) weights this rank's gradients, so that
        uneven micro-batches still give the serial mean gradient."""
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **kwargs)
        flat = tf.nest.flatten(grads)
        name = self._name or request_names.in_thread("tnt.tape")  # the thread that computes the gradients
        averaged = collective_ops.weighted_average(flat, weight=weight, name=name,
                                                   compression=self._compression)
        return tf.nest.pack_sequence_as(grads, averaged)
