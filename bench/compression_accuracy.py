"""The effect of gradient compression on what training reaches: LeNet-5
(examples/lenet5_mnist.py: MNIST if cached, else scikit-learn's digits) trained
with tnt.Model(compression=none / fp16 / bf16) on N ranks, beside serial
Keras (where nothing travels, so compression changes nothing). Not a test: a
table to read.

    python bench/compression_accuracy.py                 # 2 ranks, 15 epochs on the digits
    python bench/compression_accuracy.py --ranks 4 --epochs 5

Per compression: the final training loss, test loss and test accuracy (the
mean over --seeds seeds, and their range: how much the seed alone moves them),
and how far the weights of the first seed ended from serial training's
(largest absolute difference, relative to the largest weight). With a seed,
every run starts from the same weights and sees the same global batches; over
many steps rounding differences grow (exact training on 2 ranks too drifts
from serial Keras after a few hundred Adam steps), so the losses and the
accuracy are the measure, the weight distance only a sign of the drift.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples")
LABELS = ("none", "fp16", "bf16")


def worker(args, out):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, EXAMPLES)
    import keras
    import numpy as np
    import tensorflow as tf

    import tarantella as tnt
    from lenet5_mnist import lenet5, load_data

    (x_train, y_train), (x_test, y_test), source = load_data(None)
    epochs = args.epochs or (2 if source.startswith("MNIST") else 15)
    results, weights = {"source": source, "epochs": epochs, "ranks": tnt.get_size()}, {}
    for label, seed in ((label, seed) for label in LABELS for seed in range(args.seeds)):
        keras.utils.set_random_seed(42 + seed)
        train = tf.data.Dataset.from_tensor_slices((x_train, y_train)) \
            .shuffle(len(x_train), seed=42 + seed).batch(args.batch_size)
        test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)
        model = tnt.Model(lenet5(), compression=getattr(tnt.Compression, label))
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        history = model.fit(train, epochs=epochs, verbose=0)
        test_loss, test_accuracy = model.evaluate(test, verbose=0)
        results.setdefault(label, []).append({"train_loss": history.history["loss"][-1], "test_loss": test_loss,
                                              "test_accuracy": test_accuracy})
        if seed == 0:
            weights.update({f"{label}/{i}": w for i, w in enumerate(model.get_weights())})
    if tnt.is_master_rank():
        np.savez(out + ".npz", **weights)
        with open(out + ".json", "w") as f:
            json.dump(results, f)


def launch(cmd, out, args):
    me = [HERE, "--worker", out, "--epochs", str(args.epochs or 0), "--batch-size", str(args.batch_size),
          "--learning-rate", str(args.learning_rate), "--seeds", str(args.seeds)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TNT_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    res = subprocess.run(cmd + [sys.executable] + me, env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd) or 'serial'} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    import numpy as np

    with open(out + ".json") as f:
        return json.load(f), dict(np.load(out + ".npz"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=0, help="default: 2 on MNIST, 15 on the digits")
    p.add_argument("--batch-size", type=int, default=64, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--seeds", type=int, default=3, help="seeds per compression (default 3)")
    p.add_argument("--out", default="/tmp/tnt-compression-accuracy", help="folder for the runs' files")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args, args.worker)
    os.makedirs(args.out, exist_ok=True)
    serial, serial_w = launch([], os.path.join(args.out, "serial"), args)
    ranks, ranks_w = launch(["tntrun", "-n", str(args.ranks), "--no-gpu", "--"],
                            os.path.join(args.out, f"ranks{args.ranks}"), args)
    lines = [f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: LeNet-5, {serial['source']}, "
             f"{serial['epochs']} epochs, global batch {args.batch_size}, Adam({args.learning_rate}), "
             f"{args.seeds} seed(s): mean [min, max]", "",
             "| run | train loss | test loss | test accuracy | weights vs serial, seed 0: max abs diff (relative) |",
             "| --- | ---: | ---: | ---: | ---: |"]

    def cells(runs):
        def one(key, digits):
            values = [r[key] for r in runs]
            spread = f" [{min(values):.{digits}f}, {max(values):.{digits}f}]" if len(values) > 1 else ""
            return f"{sum(values) / len(values):.{digits}f}{spread}"
        return f"{one('train_loss', 4)} | {one('test_loss', 4)} | {one('test_accuracy', 4)}"

    lines.append(f"| serial Keras | {cells(serial['none'])} | - |")
    scale = max(abs(w).max() for k, w in serial_w.items() if k.startswith("none/"))
    for label in LABELS:
        diff = max(abs(ranks_w[k] - serial_w["none/" + k.split("/")[1]]).max()
                   for k in ranks_w if k.startswith(label + "/"))
        lines.append(f"| {args.ranks} ranks, compression={label} | {cells(ranks[label])} | "
                     f"{diff:.1e} ({diff / scale:.1e}) |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
