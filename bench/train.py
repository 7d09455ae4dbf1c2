"""Training throughput: plain Keras, tnt on 1 and 2 ranks, the no-communication
ceiling and MultiWorkerMirroredStrategy, side by side in one run.

    python bench/train.py                      # both workloads, every setup
    python bench/train.py --workloads cnn --steps 40
    python bench/train.py --workloads mlp --setups tnt2,tnt2-fp16,tnt2-bf16,ceiling --rounds 3

Workloads (synthetic data, micro-batch 32 per process):
  cnn  a ResNet-style CNN of about 0.7M parameters on 32x32x3 images
  mlp  an MLP of about 10M parameters
Setups (every process pinned to its own core, one TF thread each):
  keras       plain Keras, 1 process
  tnt1        tnt.Model on 1 rank (tntrun -n 1)
  tnt2        tnt.Model on 2 ranks (tntrun -n 2), global batch 64, the compiled TF ops
  tnt2-numpy  the same through tf.numpy_function (TNT_TF_OPS=numpy)
  tnt2-fp16   tnt2 with gradient compression: tnt.Model(compression=tnt.Compression.fp16)
  tnt2-bf16   the same with tnt.Compression.bf16
  ceiling     two independent plain-Keras processes at once: what 2 cores give
              with no communication at all (throughputs added)
  ceiling-lockstep  (reported with ceiling, not run) the ceiling's two processes'
              steps paired in order, each pair as long as its slower step: what
              two synchronous ranks with free communication would reach on
              cores whose step times vary from step to step
  mwms        tf.distribute.MultiWorkerMirroredStrategy, 2 local workers, global batch 64
  tnt2@NAME=VALUE  any tnt setup with one more setting, e.g. tnt2@TNT_STREAM_MIN_KB=1000000000
              (reported as its ratio to tnt2)
Throughput is samples/s from the median step time after warm-up. Ratios:
tnt1/keras (target >= 0.97), tnt2/ceiling (targets: cnn >= 0.95, mlp >= 0.80),
tnt2/mwms, tnt2/tnt2-numpy (the compiled ops against the fallback),
tnt2-fp16/ceiling and tnt2-fp16/tnt2 (what compression buys),
ceiling-lockstep/ceiling (what waiting for the slower rank alone costs) and
tnt2/ceiling-lockstep. With --rounds N
every setup runs N times, interleaved (round 1: every setup, round 2: ...),
a figure is the median of its rounds and a ratio the median of the rounds'
ratios.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

from allreduce import rotated  # bench/ is this script's directory, first on sys.path

HERE = os.path.abspath(__file__)
MICRO = 32


def _pin(core):
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core % os.cpu_count()})


def build(workload, keras):
    layers = keras.layers
    if workload == "mlp":
        inputs = keras.Input((1024,))
        h = inputs
        for width in (2304, 2304, 1024):
            h = layers.Dense(width, activation="relu")(h)
        return keras.Model(inputs, layers.Dense(10)(h), name="mlp10m"), (1024,)
    inputs = keras.Input((32, 32, 3))
    h = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    for width, stride in ((32, 1), (64, 2), (128, 2), (128, 1)):
        shortcut = h if stride == 1 and h.shape[-1] == width else layers.Conv2D(
            width, 1, strides=stride)(h)
        y = layers.Conv2D(width, 3, strides=stride, padding="same", activation="relu")(h)
        y = layers.Conv2D(width, 3, padding="same")(y)
        h = layers.Activation("relu")(layers.Add()([shortcut, y]))
    h = layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, layers.Dense(10)(h), name="resnet_small"), (32, 32, 3)


def worker(args):
    """One process of one setup: train, print a JSON line with the median step time."""
    rank = int(os.environ.get("TNT_RANK", os.environ.get("BENCH_RANK", "0")))
    _pin(rank if args.pin is None else args.pin)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras

    processes = 2 if args.setup.startswith("tnt2") or args.setup == "mwms" else 1
    global_batch = MICRO * processes
    strategy = None
    if args.setup == "mwms":
        _patch_keras_for_mwms(tf)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    scope = strategy.scope() if strategy else _nullcontext()
    with scope:
        model, shape = build(args.workload, keras)
        if args.setup.startswith("tnt"):
            import tarantella as tnt

            compression = {"tnt2-fp16": tnt.Compression.fp16, "tnt2-bf16": tnt.Compression.bf16}
            model = tnt.Model(model, compression=compression.get(args.setup))
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch,) + shape).astype("float32")
    y = rng.integers(0, 10, size=global_batch).astype("int32")
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    if strategy:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
    times = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.t)

    model.fit(ds, steps_per_epoch=args.steps + args.warmup, epochs=1, verbose=0,
              callbacks=[Timer()])
    step = float(np.median(times[args.warmup:]))
    params = int(sum(np.prod(w.shape) for w in model.trainable_weights))
    if rank == 0:
        print("BENCH " + json.dumps({"step_s": step, "samples_per_s": global_batch / step,
                                     "params": params, "steps_s": times[args.warmup:]}), flush=True)


def _patch_keras_for_mwms(tf):
    """The two workarounds of keras-team/keras#20585, without which `fit` under
    MultiWorkerMirroredStrategy fails on Keras 3 (3.15 included); applied in the
    benchmark's MWMS worker only.

    1. `_maybe_symbolic_build` builds the model from the first batch by
       `strategy.reduce("MEAN", per_replica_batch)`, which MWMS cannot do on
       the input PerReplica values ("Attempt to convert a value (PerReplica...)
       to a Tensor"): build from this worker's local batch instead.
    2. `reduce_per_replica` reduces scalar logs with `axis=0` under MWMS
       ("Invalid reduction dimension 0 for input with 0 dimensions"): reduce
       scalars with `axis=None`.
    """
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                data_batch = tf.nest.map_structure(
                    lambda v: self.distribute_strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v, batch)
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(strategy):
            def reduce(v):
                rank = v.values[0].shape.rank if tf_trainer._is_per_replica_instance(v) else v.shape.rank
                return strategy.reduce("MEAN", v, axis=0 if rank else None)
            return tf.nest.map_structure(reduce, values)
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _parse(output):
    for line in output.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_setup(setup, workload, args):
    setup, _, setting = setup.partition("@")  # tnt2@TNT_X=1: tnt2 with that setting
    me = [sys.executable, HERE, "--worker", setup, "--workload", workload,
          "--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TNT_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if setting:
        name, _, value = setting.partition("=")
        env[name] = value
    if setup.startswith("tnt"):
        env["TNT_TF_OPS"] = "numpy" if setup == "tnt2-numpy" else "compiled"
        cmd = ["tntrun", "-n", "1" if setup == "tnt1" else "2", "--no-gpu", "--"] + me
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        result = _parse(out.stdout)
        return result, None if result else (out.stdout + out.stderr)[-800:]
    if setup == "keras":
        out = subprocess.run(me + ["--pin", "0"], env=env, capture_output=True, text=True,
                             timeout=args.timeout)
        result = _parse(out.stdout)
        return result, None if result else out.stderr[-800:]
    procs = []
    if setup == "ceiling":
        for core in (0, 1):
            procs.append(subprocess.Popen(me + ["--pin", str(core)], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    else:  # mwms
        ports = [_free_port(), _free_port()]
        cluster = {"worker": [f"localhost:{p}" for p in ports]}
        for index in (0, 1):
            e = dict(env, BENCH_RANK=str(index), TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}))
            procs.append(subprocess.Popen(me, env=e, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=args.timeout))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return None, "timed out"
    if setup == "ceiling":
        parsed = [_parse(o) for o, _ in outs]
        if None in parsed:
            return None, outs[0][1][-800:]
        # The same steps taken in lockstep, each as long as the slower process's:
        # what two synchronous ranks with free communication would do on these
        # cores, whose step times vary from step to step (other jobs, shared caches).
        lockstep = float(np.median(np.maximum(*(np.array(p["steps_s"][:min(
            len(q["steps_s"]) for q in parsed)]) for p in parsed))))
        return {"samples_per_s": sum(p["samples_per_s"] for p in parsed),
                "step_s": max(p["step_s"] for p in parsed), "params": parsed[0]["params"],
                "lockstep_samples_per_s": 2 * MICRO / lockstep, "lockstep_step_s": lockstep}, None
    result = _parse(outs[0][0])
    return result, None if result else outs[0][1][-800:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cnn,mlp")
    parser.add_argument("--setups", default="keras,tnt1,tnt2,tnt2-fp16,tnt2-numpy,ceiling,mwms")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; a figure is their median")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="cnn", help=argparse.SUPPRESS)
    parser.add_argument("--pin", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.setup = args.worker
        return worker(args)
    results = {}
    setups = args.setups.split(",")
    for workload in args.workloads.split(","):
        row = results.setdefault(workload, {})
        runs = {setup: [] for setup in setups}
        for k in range(args.rounds):
            for setup in rotated(setups, k):
                result, error = run_setup(setup, workload, args)
                if result:
                    runs[setup].append(result)
                else:
                    row[setup] = {"error": (error or "").strip().splitlines()[-1:]}
        shown = list(setups)
        if runs.get("ceiling"):  # the ceiling's steps in lockstep, as a setup of its own
            shown.append("ceiling-lockstep")
            runs["ceiling-lockstep"] = [dict(r, samples_per_s=r["lockstep_samples_per_s"],
                                             step_s=r["lockstep_step_s"]) for r in runs["ceiling"]]
        for setup in shown:
            if runs[setup]:  # the round of median throughput
                ordered = sorted(runs[setup], key=lambda r: r["samples_per_s"])
                row[setup] = dict(ordered[(len(ordered) - 1) // 2], rounds=[r["samples_per_s"] for r in runs[setup]])
            result = row[setup] if runs[setup] else None
            shown = (f"{result['samples_per_s']:9.1f} samples/s  (step {result['step_s'] * 1e3:7.1f} "
                     f"ms, {result['params'] / 1e6:.2f}M params)" if result
                     else f"failed: {row[setup]['error']}")
            print(f"{workload:4s} {setup:10s} {shown}", flush=True)
        def ratio(a, b):
            """The median over rounds of each round's ratio (rounds interleave: both ran under
            the same outside load), or the ratio of the two figures."""
            if "samples_per_s" not in row.get(a, {}) or "samples_per_s" not in row.get(b, {}):
                return None
            ra, rb = row[a]["rounds"], row[b]["rounds"]
            if len(ra) != len(rb):
                return row[a]["samples_per_s"] / row[b]["samples_per_s"]
            return sorted(x / y for x, y in zip(ra, rb))[(len(ra) - 1) // 2]

        row["ratios"] = {"tnt1/keras": ratio("tnt1", "keras"), "tnt2/ceiling": ratio("tnt2", "ceiling"),
                         "mwms/ceiling": ratio("mwms", "ceiling"), "tnt2/mwms": ratio("tnt2", "mwms"),
                         "tnt2/tnt2-numpy": ratio("tnt2", "tnt2-numpy"),
                         "tnt2-fp16/ceiling": ratio("tnt2-fp16", "ceiling"),
                         "tnt2-fp16/tnt2": ratio("tnt2-fp16", "tnt2"),
                         "tnt2-bf16/ceiling": ratio("tnt2-bf16", "ceiling"),
                         "ceiling/keras (2 cores)": ratio("ceiling", "keras"),
                         "ceiling-lockstep/ceiling": ratio("ceiling-lockstep", "ceiling"),
                         "tnt2/ceiling-lockstep": ratio("tnt2", "ceiling-lockstep"),
                         **{f"{s}/tnt2": ratio(s, "tnt2") for s in setups if "@" in s}}
        print("     ratios: " + ", ".join(f"{k} {v:.3f}" if v else f"{k} n/a"
                                          for k, v in row["ratios"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
