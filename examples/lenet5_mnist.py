"""LeNet-5 on MNIST, data-parallel with Tarantella.

    tntrun -n 2 -- examples/lenet5_mnist.py        # 2 ranks on this machine
    python examples/lenet5_mnist.py                 # the same script, serially

The two Tarantella lines are marked "# tnt". MNIST is read from the Keras
cache (~/.keras/datasets/mnist.npz) or --data-dir; without it, the 1,797
handwritten digits that scikit-learn ships are used, resized to 28x28 (no
download either way). The script says which.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # tnt  # noqa: E402


def load_data(data_dir):
    """((x_train, y_train), (x_test, y_test), description), images 28x28x1 in [0, 1]."""
    candidates = [os.path.join(data_dir, "mnist.npz")] if data_dir else []
    candidates.append(os.path.expanduser(os.path.join("~", ".keras", "datasets", "mnist.npz")))
    for path in candidates:
        if os.path.exists(path):
            with np.load(path) as f:
                train = (f["x_train"][..., None] / 255.0).astype("float32"), f["y_train"]
                test = (f["x_test"][..., None] / 255.0).astype("float32"), f["y_test"]
            return train, test, f"MNIST from {path}"
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = tf.image.resize(digits.images[..., None] / 16.0, (28, 28)).numpy().astype("float32")
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], digits.target[order].astype("int32")
    split = int(0.8 * len(images))
    return ((images[:split], labels[:split]), (images[split:], labels[split:]),
            "scikit-learn's 8x8 handwritten digits resized to 28x28 (MNIST not found locally)")


def lenet5():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(6, 5, padding="same", activation="relu"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Conv2D(16, 5, activation="relu"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(120, activation="relu"),
        keras.layers.Dense(84, activation="relu"),
        keras.layers.Dense(10),
    ], name="lenet5")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--epochs", type=int, default=None,
                        help="default: 2 on MNIST, 15 on the scikit-learn digits")
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--data-dir", default=None, help="a folder holding mnist.npz")
    args = parser.parse_args()

    (x_train, y_train), (x_test, y_test), source = load_data(args.data_dir)
    epochs = args.epochs or (2 if source.startswith("MNIST") else 15)
    if tnt.is_master_rank():
        print(f"data: {source}; {len(x_train)} training and {len(x_test)} test images; "
              f"{tnt.get_size()} rank(s), global batch {args.batch_size}")

    keras.utils.set_random_seed(42)
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)) \
        .shuffle(len(x_train), seed=42).batch(args.batch_size)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)

    model = tnt.Model(lenet5())  # tnt
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(train, epochs=epochs, validation_data=test, verbose=2)
    loss, accuracy = model.evaluate(test, verbose=0)
    if tnt.is_master_rank():
        print(f"test accuracy: {accuracy:.4f} (LeNet-5 reaches about 0.98 on either data set)")


if __name__ == "__main__":
    main()
