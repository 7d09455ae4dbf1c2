"""Choosing the default fusion threshold (TNT_FUSION_THRESHOLD_KB): the time of
one training step's gradient allreduce, for gradient sets shaped like the
models we train, at several thresholds, in one run.

    python bench/fusion.py [--ranks 2] [--thresholds 0,32,256,1024,4096,32768,131072]

Each step submits every gradient asynchronously (as the Keras frontend does, in
backprop order) and waits for all of them.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.abspath(__file__)

# (name, list of tensor sizes in float32 elements)
WORKLOADS = {
    # ResNet-style CNN of about 0.7M parameters: many small conv/BN tensors
    "cnn-0.6M": [3 * 3 * c_in * c_out for c_in, c_out in [(3, 24)] + [(24, 24)] * 6 + [(24, 48)] + [(48, 48)] * 5
                 + [(48, 96)] + [(96, 96)] * 5] + [24, 24, 48, 48, 96, 96] * 9 + [96 * 10, 10],
    # MLP of 10M parameters: a few large tensors
    "mlp-10M": [784 * 2048, 2048, 2048 * 2048, 2048, 2048 * 2048, 2048, 2048 * 10, 10],
}


def worker(steps):
    import tarantella as tnt

    out = {}
    for name, sizes in WORKLOADS.items():
        grads = [np.ones(n, np.float32) for n in sizes]
        outs = [np.empty_like(g) for g in grads]

        def step():
            hs = [tnt.allreduce_async(g, name=f"{name}/{i}", out=o) for i, (g, o) in
                  reversed(list(enumerate(zip(grads, outs))))]
            for h in hs:
                h.wait()

        step()
        step()
        best = float("inf")
        for _ in range(3):
            tnt.barrier()
            t = time.perf_counter()
            for _ in range(steps):
                step()
            best = min(best, (time.perf_counter() - t) / steps)
        out[name] = best
    if tnt.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--thresholds", default="0,32,256,1024,4096,32768,131072", help="KB")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.steps)
        return 0
    print(f"{a.ranks} ranks; time of one step's gradient allreduce (best of 3 x {a.steps} steps)\n")
    print("| threshold | " + " | ".join(WORKLOADS) + " |")
    print("| ---: |" + " ---: |" * len(WORKLOADS))
    for kb in [int(t) for t in a.thresholds.split(",")]:
        env = dict(os.environ, TNT_FUSION_THRESHOLD_KB=str(kb))
        res = subprocess.run([sys.executable, "-m", "tarantella.runner", "-n", str(a.ranks), "--no-gpu", "--", HERE,
                              "--worker", "--steps", str(a.steps)], capture_output=True, text=True, env=env)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(f"threshold {kb} KB failed: {res.stderr[-1500:]}", file=sys.stderr)
            continue
        r = json.loads(line[0][7:])
        print(f"| {kb} KB | " + " | ".join(f"{r[w] * 1e3:.2f} ms" for w in WORKLOADS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
