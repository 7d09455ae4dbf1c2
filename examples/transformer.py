"""A small Transformer for text classification, data-parallel with Tarantella.

    tntrun -n 2 -- examples/transformer.py --epochs 2 --steps 10   # here: seconds
    python examples/transformer.py --epochs 2 --steps 10            # the same script, serially

The texts are synthetic, made with a fixed seed so that every rank builds the
same data set (Tarantella gives each rank its slice of every global batch):
sequences of random words in which a few "topic words" of the document's
class are hidden among the topic words of other classes. Finding the class
means counting them, which one attention layer learns in a few hundred steps.

The model is an encoder block (token and position embeddings, multi-head
self-attention, a feed-forward layer, layer normalisation, dropout), averaged
over positions and classified. AdamW with a linear warm-up and a cosine
decay; the learning rate grows with the square root of the global batch.
The lines that concern Tarantella are marked "# tnt".
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # tnt  # noqa: E402


def synthetic_texts(samples, length, vocabulary, classes, seed):
    """(tokens, labels): each text holds 6 topic words of its class and 3 of another."""
    rng = np.random.default_rng(seed)
    topics = np.arange(1, 1 + 10 * classes).reshape(classes, 10)  # token 0 is padding
    tokens = rng.integers(1 + 10 * classes, vocabulary, size=(samples, length))
    labels = rng.integers(0, classes, size=samples)
    others = (labels + rng.integers(1, classes, size=samples)) % classes
    for i in range(samples):
        words = np.concatenate([rng.choice(topics[labels[i]], 6), rng.choice(topics[others[i]], 3)])
        tokens[i, rng.choice(length, len(words), replace=False)] = words
    return tokens.astype("int32"), labels.astype("int32")


class TokenAndPositionEmbedding(keras.layers.Layer):
    def __init__(self, length, vocabulary, width, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocabulary, width)
        self.positions = keras.layers.Embedding(length, width)

    def call(self, x):
        positions = keras.ops.arange(keras.ops.shape(x)[-1])
        return self.tokens(x) + self.positions(positions)


def encoder_block(x, width, heads, hidden, dropout):
    attention = keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dropout(dropout)(attention))
    feed_forward = keras.Sequential([keras.layers.Dense(hidden, activation="gelu"),
                                     keras.layers.Dense(width)])(x)
    feed_forward = keras.layers.Dropout(dropout)(feed_forward)
    return keras.layers.LayerNormalization(epsilon=1e-6)(x + feed_forward)


def transformer(length, vocabulary, classes, width, heads, layers, dropout=0.1):
    inputs = keras.Input((length,), dtype="int32")
    x = TokenAndPositionEmbedding(length, vocabulary, width)(inputs)
    for _ in range(layers):
        x = encoder_block(x, width, heads, 2 * width, dropout)
    x = keras.layers.Dropout(dropout)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, keras.layers.Dense(classes)(x), name="transformer")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=64, help="tokens per text")
    parser.add_argument("--vocabulary", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--width", type=int, default=32, help="embedding width")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--batch-per-rank", type=int, default=32,
                        help="samples per rank and step; global batch = this x ranks")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="steps (global batches) per epoch")
    parser.add_argument("--base-learning-rate", type=float, default=1e-3,
                        help="the learning rate of a global batch of 32")
    args = parser.parse_args()

    ranks = tnt.get_size()  # tnt
    global_batch = args.batch_per_rank * ranks
    learning_rate = args.base_learning_rate * (global_batch / 32) ** 0.5  # square-root scaling
    total_steps = args.epochs * args.steps

    # the same seed on every rank: the same data set, of which each rank trains on its slice
    x, y = synthetic_texts(args.steps * global_batch, args.length, args.vocabulary,
                           args.classes, seed=1)
    x_test, y_test = synthetic_texts(8 * global_batch, args.length, args.vocabulary,
                                     args.classes, seed=2)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=42) \
        .batch(global_batch).prefetch(tf.data.AUTOTUNE)
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(global_batch)

    keras.utils.set_random_seed(42)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0, warmup_target=learning_rate,
        warmup_steps=max(total_steps // 10, 1), decay_steps=total_steps - max(total_steps // 10, 1))
    model = tnt.Model(transformer(args.length, args.vocabulary, args.classes,  # tnt
                                  args.width, args.heads, args.layers))
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    if tnt.is_master_rank():
        print(f"transformer: {model.count_params()} parameters, {ranks} rank(s), "
              f"global batch {global_batch}, peak learning rate {learning_rate:.2g}", flush=True)
    model.fit(train, epochs=args.epochs, verbose=2)
    loss, accuracy = model.evaluate(test, verbose=0)
    if tnt.is_master_rank():
        print(f"test accuracy: {accuracy:.4f} (chance: {1 / args.classes:.2f})")


if __name__ == "__main__":
    main()
