"""What the code fragments of the docs assume exists, made small.

Pages of fragments (a few lines cut out of a training script, such as
`model = tnt.Model(keras_model)`) run after SETUP, which defines the names they
use; the docstring examples of the API reference too, each on its own. Every
other page's blocks must be complete programs: they run in a fresh namespace.
The blocks of one page share their namespace and run in order, as a reader
would type them.
"""

# pages whose python blocks are fragments (relative to docs/)
FRAGMENT_PAGES = {"index.md", "keras.md", "api.md", "../README.md"}

SETUP = '''
import keras
import numpy as np
import tensorflow as tf

import tarantella as tnt

_rng = np.random.default_rng(0)
_x = _rng.normal(size=(256, 4)).astype("float32")
_y = _rng.integers(0, 3, size=256).astype("int32")


def _classifier():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


keras.utils.set_random_seed(0)
keras_model = _classifier()                                  # a plain Keras model
train_ds = tf.data.Dataset.from_tensor_slices((_x, _y))      # unbatched datasets
val_ds = test_ds = dataset = train_ds.take(128)
ds = train_ds.batch(64)                                      # batched with the global batch
x, y = tf.constant(_x[:64]), tf.constant(_y[:64])            # one batch
model = tnt.Model(_classifier())                             # a compiled tnt.Model
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
loss_fn = keras.losses.SparseCategoricalCrossentropy()
optimizer = keras.optimizers.SGD(0.01)
epochs = 1
array = np.arange(4, dtype=np.float32)
grads = [np.ones(3, np.float32), np.ones(5, np.float32)]
'''
