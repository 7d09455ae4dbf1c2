"""Gradient compression on the wire, as Horovod's `hvd.Compression`.

Off by default: gradients travel exactly as computed, and training matches
serial Keras to float32 rounding. A user who chooses `tnt.Compression.fp16`
or `bf16` halves the bytes every float32 gradient moves: it is cast to the
16-bit type before the allreduce (the core sums 16-bit buffers, adding in
float32 and rounding once per addition) and back to float32 after. float64
and 16-bit gradients travel as they are. Every rank gets the same bits, so
the weights stay identical on every rank; they drift from serial training by
the rounding (docs/keras.md, "Gradient compression", has the measured effect).
"""
import tensorflow as tf


class Compressor:
    """How a gradient travels through the allreduce (Horovod's interface):
    `compress(tensor)` gives the tensor to send and a context, and
    `decompress(tensor, context)` the gradient back from the reduced one."""

    wire_dtype = None  # float32 gradients travel as this dtype; None: as they are
    label = "none"

    @classmethod
    def compress(cls, tensor):
        if cls.wire_dtype is None or tensor.dtype != tf.float32:
            return tensor, None
        return tf.cast(tensor, cls.wire_dtype), tensor.dtype

    @staticmethod
    def decompress(tensor, context):
        return tensor if context is None else tf.cast(tensor, context)


class NoneCompressor(Compressor):
    """Gradients travel as computed (the default)."""


class FP16Compressor(Compressor):
    """float32 gradients travel as float16: 11 significant bits, values up to
    65504 (larger ones become infinite, which a loss scale detects)."""

    wire_dtype = tf.float16
    label = "fp16"


class BF16Compressor(Compressor):
    """float32 gradients travel as bfloat16: float32's range, 8 significant bits."""

    wire_dtype = tf.bfloat16
    label = "bf16"


class Compression:
    """The choices of `compression=` (`tnt.DistributedOptimizer`,
    `tnt.DistributedGradientTape`, `tnt.Model`): `none` (exact, the default),
    `fp16` and `bf16` (float32 gradients travel as 16-bit floats).

    Example:

    ```python
    optimizer = tnt.DistributedOptimizer(keras.optimizers.Adam(1e-3),
                                         compression=tnt.Compression.fp16)
    ```
    """

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


_CHOICES = {c.label: c for c in (NoneCompressor, FP16Compressor, BF16Compressor)}


def resolve(compression, argument="compression"):
    """The Compressor class `compression` names (None: none), or a clear error."""
    if compression is None:
        return NoneCompressor
    if isinstance(compression, type) and compression in _CHOICES.values():
        return compression
    choices = "tnt.Compression.none, tnt.Compression.fp16 or tnt.Compression.bf16"
    if isinstance(compression, str):
        hint = f" (write {argument}=tnt.Compression.{compression})" if compression in _CHOICES else ""
        raise TypeError(f"{argument} takes {choices}, not a string{hint}. Received: {argument}={compression!r}")
    raise ValueError(f"{argument} takes {choices}. Received: {argument}={compression!r}")
