"""The original Tarantella's SplitLayer (`tnt.keras.layers.SplitLayer`)."""
import keras


@keras.saving.register_keras_serializable(package="tarantella", name="SplitLayer")
class SplitLayer(keras.layers.Layer):
    """Marks where a model would be split into pipeline stages (the original
    Tarantella's pipelining). Pipelining is not available yet: with
    `tnt.ParallelStrategy.DATA` the layer passes its inputs through; asking
    for PIPELINING (or ALL) on a model that has one is an error."""

    def call(self, inputs):
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape
