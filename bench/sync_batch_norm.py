"""Step cost of synchronised batch normalisation against plain BatchNormalization,
side by side in one run.

    python bench/sync_batch_norm.py                  # 2 ranks, micro-batch 32
    python bench/sync_batch_norm.py --ranks 3 --rounds 9

One `tntrun` launch trains two copies of the same ResNet-style CNN (32x32x3
images, 9 BatchNormalization layers, about 0.7M parameters): one with plain
BatchNormalization (each rank normalises its micro-batch), one with
BatchNormalization(synchronized=True) (global batch statistics: per layer and
step, one allreduce in the forward pass and one in the backward pass). The
two are trained in alternating rounds of --steps steps each, in the same
processes, so that the machine's changing load falls on both alike. Printed:
the median ms per step of each and their ratio (synchronised / plain).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def build(keras, synchronized):
    layers = keras.layers

    def bn(h):
        return layers.BatchNormalization(synchronized=synchronized)(h)

    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3))
    h = layers.Activation("relu")(bn(layers.Conv2D(32, 3, padding="same")(inputs)))
    for width, stride in ((32, 1), (64, 2), (128, 2), (128, 1)):
        shortcut = h if stride == 1 and h.shape[-1] == width else layers.Conv2D(
            width, 1, strides=stride)(h)
        y = layers.Activation("relu")(bn(layers.Conv2D(width, 3, strides=stride,
                                                       padding="same")(h)))
        y = bn(layers.Conv2D(width, 3, padding="same")(y))
        h = layers.Activation("relu")(layers.Add()([shortcut, y]))
    h = layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, layers.Dense(10)(h))


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf

    import tarantella as tnt

    size = tnt.get_size()
    global_batch = args.micro * size
    rng = np.random.default_rng(0)
    n = global_batch * args.steps
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).cache()
    models = {}
    for name, synchronized in (("plain", False), ("synchronized", True)):
        model = tnt.Model(build(keras, synchronized))
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(data, epochs=1, verbose=0)  # trace and warm up
        models[name] = model
    times = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            tnt.barrier(name="bench.round")
            start = time.perf_counter()
            model.fit(data, epochs=1, verbose=0)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    if tnt.is_master_rank():
        print("RESULT " + json.dumps({"ranks": size, "micro": args.micro, "times": times}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--micro", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=10, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    tntrun = shutil.which("tntrun")
    if not tntrun:
        sys.exit("tntrun is not installed: pip install -e .")
    cmd = [tntrun, "-n", str(args.ranks), "--no-gpu", "--", sys.executable, HERE, "--worker",
           "--micro", str(args.micro), "--steps", str(args.steps), "--rounds", str(args.rounds)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        sys.exit(out.stdout[-2000:] + out.stderr[-4000:])
    result = json.loads(line[len("RESULT "):])
    plain = statistics.median(result["times"]["plain"])
    synced = statistics.median(result["times"]["synchronized"])
    print(f"{result['ranks']} ranks, micro-batch {result['micro']} (global "
          f"{result['micro'] * result['ranks']}), 9 BatchNormalization layers, "
          f"{args.rounds} alternating rounds of {args.steps} steps; ms per step, median:")
    print("| BatchNormalization | ms/step | rounds (ms/step) |")
    print("| --- | ---: | --- |")
    for name, median in (("plain (per-rank statistics)", plain),
                         ("synchronized=True (global statistics)", synced)):
        key = "plain" if name.startswith("plain") else "synchronized"
        rounds = ", ".join(f"{t:.1f}" for t in result["times"][key])
        print(f"| {name} | {median:.1f} | {rounds} |")
    print(f"ratio synchronised / plain: {synced / plain:.2f}")


if __name__ == "__main__":
    main()
