"""The compiled TensorFlow ops against the tf.numpy_function path, side by side in one run.

    python bench/grad_op.py                 # both parts
    python bench/grad_op.py --repeats 300

Part 1, one TF-level collective (1 rank, plain python): a tf.function holding
K allreduces of 4 bytes (tnt.allreduce on a float32 scalar), chained, against
the same function without them: the cost of one collective call, per path;
named calls, then unnamed ones (named when they run, from the sequence the eager
calls count in: on the compiled ops since the core holds that count).
With --structure N, part 1 also times calls of a structure (a list of N float32 tensors of 4
elements; and of N/2 float32 and N/2 int64 ones, two requests a call), named and unnamed.
Part 2, the gradient path (2 ranks, tntrun -n 2): tnt's gradient averaging
(collective_ops.weighted_average, weighted by a micro-batch size, as
tnt.Model does) of three sets of gradient-shaped tensors inside a
tf.function, against a function that only makes them (t * 1.0: fresh
buffers that nothing else holds, as backprop's gradients are): the per-step
cost of averaging, communication included, per path.

Both paths run in the same process, interleaved, so the machine's load hits
them alike; medians of --repeats calls. The ratio is compiled / numpy_function
(below 1: the compiled ops are cheaper).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
# name -> shapes of the tensors (float32): the benchmark models' gradients
GRADIENTS = {
    "mlp 10M params, 8 tensors": [(1024, 2304), (2304,), (2304, 2304), (2304,), (2304, 1024), (1024,),
                                  (1024, 10), (10,)],
    "cnn 0.7M params, 30 tensors": [(3, 3, 3, 32), (32,)] + [(3, 3, 32, 32), (32,)] * 2 + [
        (1, 1, 32, 64), (64,), (3, 3, 32, 64), (64,), (3, 3, 64, 64), (64,), (1, 1, 64, 128), (128,),
        (3, 3, 64, 128), (128,), (3, 3, 128, 128), (128,)] + [(3, 3, 128, 128), (128,)] * 2 + [
        (128, 10), (10,)] + [(16,)] * 8,
    "100 small tensors of 1000 floats": [(1000,)] * 100,
}


def _paths():
    """(compiled ops, a context that selects the numpy_function path while tracing)."""
    import contextlib

    from tarantella.tensorflow import ops

    compiled = ops._load("compiled")[0]

    @contextlib.contextmanager
    def numpy_path():
        saved = dict(ops._state)
        ops._state.update(ops=None, why="benchmark")
        try:
            yield
        finally:
            ops._state.clear()
            ops._state.update(saved)

    ops._state.update(ops=compiled, why="")
    return compiled, numpy_path


def _median_times(functions, args, repeats):
    """{name: median seconds per call}, the functions called in turn."""
    import numpy as np

    for f in functions.values():
        for _ in range(5):
            f(*args)
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, f in functions.items():
            t = time.perf_counter()
            out = f(*args)
            _ = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])][:1]
            times[name].append(time.perf_counter() - t)
    return {name: float(np.median(ts)) for name, ts in times.items()}


def call_worker(args):
    import tensorflow as tf

    import tarantella.tensorflow as tnt

    _, numpy_path = _paths()
    k = args.calls

    def chain(x):
        for i in range(k):
            x = tnt.allreduce(x, name=f"bench.{i}")
        return x

    def unnamed_chain(x):  # named when they run, allreduce.<k mod 60>, as eager calls are
        for i in range(k):
            x = tnt.allreduce(x)
        return x

    baseline = tf.function(lambda x: x * 1.0)
    functions = {"compiled": tf.function(chain), "numpy": tf.function(chain),
                 "unnamed compiled": tf.function(unnamed_chain), "unnamed numpy": tf.function(unnamed_chain)}
    x = tf.constant(1.0)
    for path, f in functions.items():
        if path.endswith("numpy"):
            with numpy_path():
                f(x)
        else:
            f(x)
    graph_types = {op.type for op in functions["compiled"].get_concrete_function(x).graph.get_operations()}
    assert "TntCollectiveStart" in graph_types and "PyFunc" not in graph_types, graph_types
    # which path an unnamed call took (tf.numpy_function before the core held the count)
    unnamed_types = {op.type for op in functions["unnamed compiled"].get_concrete_function(x).graph.get_operations()}
    unnamed_path = "compiled ops" if "PyFunc" not in unnamed_types else "tf.numpy_function"
    t = _median_times({"none": baseline, **functions}, (x,), args.repeats)
    per = {p: (t[p] - t["none"]) / k * 1e6 for p in functions}
    structure = structure_calls(args, numpy_path) if args.structure else {}
    print("BENCH " + json.dumps({"us_per_call": per, "calls": k, "unnamed_path": unnamed_path,
                                 "structure": structure}), flush=True)


def structure_calls(args, numpy_path):
    """{row: {path: us per call}} for calls of a structure of args.structure small tensors, chained
    (each call's result is the next one's input), and {row: which path TNT_TF_OPS=auto takes}."""
    import numpy as np
    import tensorflow as tf

    import tarantella.tensorflow as tnt

    k, n = args.calls, args.structure

    def chain(named):
        def run(*xs):
            for i in range(k):
                xs = tnt.allreduce(list(xs), name=f"bench.s{i}" if named else None)
            return xs
        return run

    one = [tf.constant(np.arange(4, dtype=np.float32) + j) for j in range(n)]
    two = [tf.constant(np.arange(4) + j, tf.float32 if j % 2 == 0 else tf.int64) for j in range(n)]
    rows, runs_on = {}, {}
    for label, xs in ((f"{n} float32 tensors", one), (f"{n // 2} float32 + {n - n // 2} int64", two)):
        for named in (True, False):
            row = f"{label}, {'named' if named else 'unnamed'}"
            functions = {"compiled": tf.function(chain(named)), "numpy": tf.function(chain(named))}
            functions["compiled"](*xs)
            with numpy_path():
                functions["numpy"](*xs)
            got = [[a.numpy() for a in f(*xs)] for f in functions.values()]
            assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(*got)), "the paths disagree"
            types = {op.type for op in functions["compiled"].get_concrete_function(*xs).graph.get_operations()}
            runs_on[row] = "tf.numpy_function" if "PyFunc" in types else "compiled ops"
            baseline = tf.function(lambda *ts: [t * 1 for t in ts])
            t = _median_times({"none": baseline, **functions}, tuple(xs), args.repeats)
            rows[row] = {p: (t[p] - t["none"]) / k * 1e6 for p in functions}
    return {"us_per_call": rows, "runs_on": runs_on}


def grads_worker(args):
    import numpy as np
    import tensorflow as tf

    import tarantella as tnt
    from tarantella.tensorflow import collective_ops

    _, numpy_path = _paths()
    rank = tnt.get_rank()
    rows = {}
    for i, (label, shapes) in enumerate(GRADIENTS.items()):
        rng = np.random.default_rng(rank)
        tensors = [tf.constant(rng.normal(size=s).astype("float32")) for s in shapes]
        weight = tf.constant(32 + rank)

        # each function first makes the "gradients" (fresh buffers, as backprop
        # does: nothing else holds them), then averages them, or not
        def average(name):
            return tf.function(lambda *ts: collective_ops.weighted_average([t * 1.0 for t in ts], weight,
                                                                           name=name))

        none = tf.function(lambda *ts: [t * 1.0 for t in ts])
        compiled, numpy_fn = average(f"bench.c{i}"), average(f"bench.n{i}")
        compiled(*tensors)
        with numpy_path():
            numpy_fn(*tensors)
        ref = [a.numpy() for a in numpy_fn(*tensors)]
        got = [a.numpy() for a in compiled(*tensors)]
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)), "the paths disagree"
        t = _median_times({"none": none, "compiled": compiled, "numpy": numpy_fn}, tensors, args.repeats)
        rows[label] = {p: (t[p] - t["none"]) * 1e3 for p in ("compiled", "numpy")}
    if rank == 0:
        print("BENCH " + json.dumps(rows), flush=True)


def _run(cmd, timeout):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TNT_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in out.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    sys.exit(f"benchmark failed:\n{(out.stdout + out.stderr)[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--calls", type=int, default=100, help="collectives per function in part 1")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--worker", choices=("call", "grads"), help=argparse.SUPPRESS)
    parser.add_argument("--calls-only", action="store_true", help="part 1 only")
    parser.add_argument("--structure", type=int, default=0, metavar="N",
                        help="part 1 also times calls of a structure of N small tensors")
    args = parser.parse_args()
    if args.worker == "call":
        return call_worker(args)
    if args.worker == "grads":
        return grads_worker(args)
    me = [sys.executable, HERE, "--repeats", str(args.repeats), "--calls", str(args.calls),
          "--structure", str(args.structure)]
    call = _run(me + ["--worker", "call"], args.timeout)
    c, n = call["us_per_call"]["compiled"], call["us_per_call"]["numpy"]
    print(f"one TF-level collective, 4 B, 1 rank ({args.calls} per tf.function, {args.repeats} repeats):")
    print(f"  named    compiled op {c:7.1f} us   numpy_function {n:7.1f} us   ratio {c / n:.2f}")
    c, n = call["us_per_call"]["unnamed compiled"], call["us_per_call"]["unnamed numpy"]
    print(f"  unnamed  compiled op {c:7.1f} us   numpy_function {n:7.1f} us   ratio {c / n:.2f}"
          f"   (TNT_TF_OPS=auto runs it on: {call['unnamed_path']})")
    if args.structure:
        print(f"one TF-level call of a structure, 1 rank ({args.calls} per tf.function, {args.repeats} repeats):")
        for row, per in call["structure"]["us_per_call"].items():
            c, n = per["compiled"], per["numpy"]
            print(f"  {row:36s} compiled op {c:7.1f} us   numpy_function {n:7.1f} us   ratio {c / n:.2f}"
                  f"   (TNT_TF_OPS=auto runs it on: {call['structure']['runs_on'][row]})")
    if args.calls_only:
        return
    tntrun = shutil.which("tntrun") or "tntrun"
    grads = _run([tntrun, "-n", "2", "--no-gpu", "--"] + me + ["--worker", "grads"], args.timeout)
    print(f"gradient averaging per step, 2 ranks ({args.repeats} repeats), over returning the tensors:")
    for label, row in grads.items():
        print(f"  {label:34s} compiled op {row['compiled']:7.3f} ms   numpy_function {row['numpy']:7.3f} ms"
              f"   ratio {row['compiled'] / row['numpy']:.2f}")


if __name__ == "__main__":
    main()
