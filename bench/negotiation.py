"""What a negotiation cycle costs in the steady state: a loop of cached 64 KiB
allreduces (a gradient-sized tensor, too large to ride with the negotiation)
with bit rounds (TNT_BIT_ROUNDS=1, the default: one AND-allreduce of
readiness bits per cycle) against full rounds forced (TNT_BIT_ROUNDS=0: every
rank's whole message to every rank), side by side in one run. Not a test: a
table to read.

    python bench/negotiation.py                         # shm, 2, 4 and 8 ranks
    python bench/negotiation.py --transport mpi --ranks 4
    GPI2_HOME=/opt/gpi2 python bench/negotiation.py --transport gpi2 --ranks 4
    python bench/negotiation.py --names 8 --rounds 7    # 8 tensors per step

Each job runs its loop in batches and reports rank 0's best batch; the two
settings alternate job by job over --rounds rounds, and a figure is the median
over the rounds. `cycles/call` says how many negotiation cycles a call took
(core.stats()), `bit` the share of those that were bit rounds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import jobs_for, rotated  # noqa: E402

HERE = os.path.abspath(__file__)
SETTINGS = (("bit rounds", "1"), ("full rounds", "0"))


def worker(nbytes, names, iters, batches=5):
    import tarantella as tnt
    from tarantella.common import core

    grads = [np.ones(nbytes // 4, np.float32) for _ in range(names)]

    def step():
        handles = [tnt.allreduce_async(g, name=f"grad{i}") for i, g in enumerate(grads)]
        for h in handles:
            h.wait()

    for _ in range(3):  # warm: announcements, then the steady state
        step()
    best, before = float("inf"), core.stats()
    for _ in range(batches):
        tnt.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            step()
        best = min(best, (time.perf_counter() - t) / iters)
    after = core.stats()
    if tnt.get_rank() == 0:
        calls = batches * iters * names
        cycles = after["cycles"] - before["cycles"]
        print("RESULT " + json.dumps({"step_s": best, "cycles_per_call": cycles / calls,
                                      "bit_share": (after["bit_rounds"] - before["bit_rounds"]) / max(cycles, 1)}),
              flush=True)


def launch(cmd, env, args, bits):
    env = dict(env, TNT_BIT_ROUNDS=bits)
    res = subprocess.run(cmd + [HERE, "--worker", "--bytes", str(args.bytes), "--names", str(args.names),
                                "--iters", str(args.iters)], capture_output=True, text=True, env=env, timeout=900)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"TNT_BIT_ROUNDS={bits} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}", file=sys.stderr)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", default="shm", choices=("shm", "mpi", "gpi2"),
                    help="gpi2 needs GPI2_HOME (or GPI-2 on the library path)")
    ap.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts")
    ap.add_argument("--bytes", type=int, default=64 << 10, help="bytes per tensor (default 64 KiB)")
    ap.add_argument("--names", type=int, default=1, help="tensors per step")
    ap.add_argument("--iters", type=int, default=200, help="steps per batch")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.worker:
        return worker(args.bytes, args.names, args.iters)
    print(f"transport {args.transport}, {args.names} x {args.bytes} B cached allreduce(s) per step, "
          f"median of {args.rounds} rounds (each: best of 5 batches of {args.iters} steps)")
    print(f"{'ranks':>5} | {'bit rounds us/call':>18} | {'full rounds us/call':>19} | {'full / bit':>10} | "
          f"{'cycles/call bit, full':>21} | {'bit share':>9}")
    for ranks in map(int, args.ranks.split(",")):
        (_, cmd, env), = jobs_for(ranks, args.transport, None, [])
        if args.transport == "mpi":
            env = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        elif args.transport == "shm":
            env = dict(env, TNT_TRANSPORT="shm")
        got = {label: [] for label, _ in SETTINGS}
        last = {}
        for k in range(args.rounds):  # alternate, in a rotated order: the machine is shared and noisy
            for label, bits in rotated(SETTINGS, k):
                r = launch(cmd, env, args, bits)
                if r:
                    got[label].append(r["step_s"] / args.names)
                    last[label] = r
        if not all(got.values()):
            print(f"{ranks:>5} | failed")
            continue
        bit, full = (statistics.median(got[label]) for label, _ in SETTINGS)
        cycles = f"{last['bit rounds']['cycles_per_call']:.2f}, {last['full rounds']['cycles_per_call']:.2f}"
        print(f"{ranks:>5} | {bit * 1e6:>18.1f} | {full * 1e6:>19.1f} | {full / bit:>10.2f} | {cycles:>21} | "
              f"{last['bit rounds']['bit_share']:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
