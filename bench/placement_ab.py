"""This tree against another, each side a short launch, judged by where the
VM had placed its two vCPUs during both launches: near (sharing a cache) or
far apart (bench/cross_core.c).

    python bench/placement_ab.py --baseline /tmp/old-tree --minutes 8
    python bench/placement_ab.py --baseline /tmp/old-tree --op sum --sizes 64K,1M
    python bench/placement_ab.py --baseline-env TNT_SHM_PLACEMENT=2   # this tree against itself with a setting

Why not bench/allreduce.py: its rounds take tens of seconds, and on the VM of
2026-12-01 the far placement came in episodes of a few seconds to a minute, so
no round of it had both sides far. Here a pair is two launches of about half a
second each (2 ranks, `tntrun`), this tree and the baseline in alternating
order, with a probe before, between and after them; a pair whose three probes
agree counts for that placement, the others are left out. The figure per size
is the median over the pairs of baseline / this tree (above 1: this tree
faster), with the range of the middle 80 % and of all pairs.

Each launch times `tnt.allreduce(x, op=..., out=out)` of float32 ones, the
best of 4 batches per size. The baseline is a source tree built in place
(`python setup.py build_ext --inplace`), reached through PYTHONPATH as in
bench/allreduce.py --baseline, or this tree with the TNT_* settings of
--baseline-env (both: that tree with them).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from allreduce import FAR_NS, cross_core_probe, parse_bytes, tnt_settings  # bench/ is first on sys.path

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def worker(sizes, op):
    import numpy as np

    import tarantella as tnt

    tnt.init()
    times = []
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        out = np.empty_like(x)
        iters = max(20, int(3e7 // nbytes))
        for _ in range(3):
            tnt.allreduce(x, op=op, out=out)
        best = float("inf")
        for _ in range(4):
            tnt.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                tnt.allreduce(x, op=op, out=out)
            best = min(best, (time.perf_counter() - t) / iters)
        assert out[0] == (1.0 if op == "average" else tnt.get_size()), out[0]
        times.append(best)
    if tnt.get_rank() == 0:
        print("TIMES", " ".join(repr(t) for t in times), flush=True)


def launch(tree, settings, sizes, op):
    """Seconds per call at each size, from a 2-rank launch of `tree`'s Tarantella with the
    TNT_* `settings` (a dict) in its environment, or None."""
    env = dict(os.environ, PYTHONPATH=tree, **settings)
    cmd = ["tntrun", "-n", "2", "--no-gpu", "--", sys.executable, HERE, "--worker", "--op", op,
           "--sizes", ",".join(str(s) for s in sizes)]
    # from a folder of its own: the current one may hold another tree's package
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    for line in res.stdout.splitlines():
        if line.startswith("TIMES "):
            return [float(v) for v in line.split()[1:]]
    print(f"a launch of {tree} gave no times (exit {res.returncode}): {res.stderr[-500:]}", file=sys.stderr)
    return None


def spread(ratios):
    q = sorted(ratios)
    k = len(q) // 10
    return statistics.median(q), q[k], q[-1 - k], q[0], q[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", metavar="DIR", help="the other tree (built in place); default: this one")
    p.add_argument("--baseline-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a TNT_* setting for the baseline's launches (repeatable)")
    p.add_argument("--sizes", default="256K,1M,16M", help="comma-separated sizes (default 256K,1M,16M)")
    p.add_argument("--op", choices=["average", "sum"], default="average")
    p.add_argument("--minutes", type=float, default=8.0, help="how long to keep pairing launches (default 8)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    sizes = [parse_bytes(s) for s in a.sizes.split(",")]
    if a.worker:
        worker(sizes, a.op)
        return 0
    if not a.baseline and not a.baseline_env:
        p.error("--baseline DIR or --baseline-env NAME=VALUE is required: what to compare this tree with")
    settings = {"this": {}, "baseline": tnt_settings(p, "--baseline-env", a.baseline_env)}
    probe = cross_core_probe()
    if probe is None:
        p.error("needs bench/cross_core.c compiled (a C compiler) and two CPUs")
    trees = {"this": ROOT, "baseline": os.path.abspath(a.baseline or ROOT)}
    pairs = {"near": [], "far": []}
    end, k, failed = time.time() + 60 * a.minutes, 0, 0
    while time.time() < end and failed < 3:
        order = ["this", "baseline"] if k % 2 == 0 else ["baseline", "this"]
        k += 1
        trips, got = [probe()], {}
        for side in order:
            got[side] = launch(trees[side], settings[side], sizes, a.op)
            trips.append(probe())
        if None in got.values():
            failed += 1
            continue
        failed = 0
        if None in trips:
            continue
        far = {ns > FAR_NS for ns in trips}
        if len(far) == 1:
            pairs["far" if far.pop() else "near"].append(got)
    baseline = " ".join([a.baseline or "this tree"] + a.baseline_env)
    print(f"{a.op} of float32, 2 ranks, {k} pairs of launches in {a.minutes:g} min "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); baseline ({baseline}) / this tree, "
          f"above 1: this tree faster\n")
    print("| placement | pairs | size | this tree | baseline | baseline / this | middle 80 % | all |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for placement, got in pairs.items():
        for i, nbytes in enumerate(sizes):
            if not got:
                continue
            med, lo, hi, least, most = spread([g["baseline"][i] / g["this"][i] for g in got])
            mine = statistics.median(g["this"][i] for g in got) * 1e6
            theirs = statistics.median(g["baseline"][i] for g in got) * 1e6
            print(f"| {placement} | {len(got)} | {nbytes >> 10} KiB | {mine:.1f} us | {theirs:.1f} us | {med:.2f} | "
                  f"{lo:.2f}-{hi:.2f} | {least:.2f}-{most:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
