"""Gradient compression on N ranks (or serially, for the reference): run by
test_compression.py.

For each compression (none, fp16, bf16) an MLP is trained with tnt.Model
(compression=...) for 3 epochs, seeded, and a custom loop takes 4 steps with
tnt.DistributedGradientTape(compression=...) and 4 with
tnt.DistributedOptimizer(..., compression=...). Each rank writes its final
weights and the core's bytes_reduced of each part; and one direct
weighted_average of float32, float64 and float16 tensors with fp16 records
what travelled and what came back.

    python compression_ranks.py --out DIR
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tarantella as tnt  # noqa: E402
from tarantella.common import core  # noqa: E402
from tarantella.tensorflow import collective_ops  # noqa: E402

SAMPLES, FEATURES, CLASSES, BATCH, EPOCHS = 256, 20, 5, 32, 3


def data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32)
    y = (x[:, :CLASSES] + 0.3 * rng.normal(size=(SAMPLES, CLASSES))).argmax(1).astype(np.int32)
    return x, y


def mlp():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(CLASSES)])


def bytes_reduced():
    return core.stats()["bytes_reduced"] if tnt.get_size() > 1 else 0


def fit(compression):
    x, y = data()
    model = tnt.Model(mlp(), compression=compression)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = bytes_reduced()
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return model.get_weights(), bytes_reduced() - before, {k: [float(v) for v in vs] for k, vs in
                                                            history.history.items()}


def custom_loop(compression, use_tape):
    """4 steps on this rank's slice of each global batch, equal weights."""
    x, y = data()
    model = mlp()
    tnt.broadcast_variables(model.variables)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    if not use_tape:
        optimizer = tnt.DistributedOptimizer(optimizer, compression=compression)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_rank = BATCH // tnt.get_size()
    before = bytes_reduced()
    for step in range(4):
        start = step * BATCH + tnt.get_rank() * per_rank
        xb, yb = x[start:start + per_rank], y[start:start + per_rank]
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        if use_tape:
            tape = tnt.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
    return [v.numpy() for v in model.trainable_variables], bytes_reduced() - before


def direct():
    """weighted_average with fp16 of float32, float64 and float16 tensors: the
    results' dtypes and values, and the bytes that travelled."""
    rank = tnt.get_rank()
    a = tf.constant(np.linspace(-1, 1, 1000, dtype=np.float32) * (rank + 1))
    b = tf.constant(np.linspace(-1, 1, 300) * (rank + 1))  # float64
    c = tf.constant(np.linspace(-1, 1, 200, dtype=np.float16) * (rank + 1))
    before = bytes_reduced()
    out = collective_ops.weighted_average([a, b, c, None], name="tnt.direct", compression=tnt.Compression.fp16)
    return {"dtypes": [None if t is None else t.dtype.name for t in out],
            "values": [t.numpy().astype(np.float64).tolist() for t in out[:3]],
            "bytes": bytes_reduced() - before}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    out = p.parse_args().out
    arrays, result = {}, {"size": tnt.get_size(), "bytes": {}, "history": {}}
    for label, compression in (("none", tnt.Compression.none), ("fp16", tnt.Compression.fp16),
                               ("bf16", tnt.Compression.bf16)):
        weights, nbytes, history = fit(compression)
        arrays.update({f"fit.{label}/{i}": w for i, w in enumerate(weights)})
        result["bytes"][f"fit.{label}"], result["history"][label] = nbytes, history
        for kind, use_tape in (("tape", True), ("optimizer", False)):
            weights, nbytes = custom_loop(compression, use_tape)
            arrays.update({f"{kind}.{label}/{i}": w for i, w in enumerate(weights)})
            result["bytes"][f"{kind}.{label}"] = nbytes
    result["params"] = int(sum(np.prod(w.shape) for w in mlp().trainable_weights))
    result["steps"] = EPOCHS * (-(-SAMPLES // BATCH))
    result["direct"] = direct()
    rank = tnt.get_rank()
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
