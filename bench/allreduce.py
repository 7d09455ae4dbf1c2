"""Allreduce latency and bus bandwidth: Tarantella side by side with MPI_Allreduce
(Open MPI through mpi4py when installed; Intel MPI and MPICH from the venvs
that bench/setup_peers.sh makes) and with this machine's memory-copy
bandwidth, measured in the same run. Not a test: a table to read.

    python bench/allreduce.py                      # 2 and 4 ranks, 4 B .. 256 MB
    python bench/allreduce.py --ranks 2 --sizes 4,64K,1M --rounds 5 --baseline /tmp/old-tree
    python bench/allreduce.py --transport mpi      # Tarantella over its mpi transport, under mpirun
    python bench/allreduce.py --transport gpi2     # over its gpi2 transport (tntrun; GPI2_HOME set)
    python bench/allreduce.py --ranks 2 --sizes 16M,64M --dtype float16 --simd 0,1  # vector vs scalar kernels
    python bench/allreduce.py --ranks 2 --sizes 4M,64M --tnt-env TNT_STREAM_MIN_KB=0  # a setting against its default
    python bench/allreduce.py --collective allgather --sizes 4,64K,1M,16M   # tnt.allgather against MPI_Allgather
    python bench/allreduce.py --collective broadcast --sizes 4,64K,1M        # tnt.broadcast against MPI_Bcast
    python bench/allreduce.py --collective barrier --ranks 2,4,8              # tnt.barrier against MPI_Barrier

Tarantella is called three ways, in alternating batches inside one job:
`plain` is what a user writes, `tnt.allreduce(x)` (unnamed, a fresh result
array); `named` adds name=; `out` passes out= (no allocation). `--baseline
DIR` also runs the Tarantella of another source tree (built in place) in the
same rounds, for before/after ratios. Implementations are interleaved: every
round launches each of them once, each round in an order rotated by one (the
job launched first after another job's exit runs slower: with a fixed order,
two identical builds differed by up to 1.3x at 8 ranks), and a figure is the
median over the rounds of each round's best batch. A ratio is the median of
the rounds' own ratios (a round the machine slows slows both of its sides),
with their range in brackets from 3 rounds on;
give --rounds a multiple of the implementations' count for an even rotation.
Ratios are to the first of --variants (`plain` by default).

`--dtype float16` or `bfloat16` reduces half-precision buffers (the MPI peers
are left out: MPI has no sum of them), and `--simd 0,1` also runs this tree
with TNT_SIMD=0 (the portable scalar float16/bfloat16 kernels) and TNT_SIMD=1
(at most F16C+AVX2) beside the default (AVX-512 where the CPU has it), in the
same rounds, for the ratios.

Bus bandwidth is 2(N-1)/N x bytes / time, as nccl-tests report it. Sum; float32
unless --dtype says otherwise. The `average` variant (`op="average"`, `out=`)
is what training's gradients take: each input scaled by 1/N on its way in. With `--collective allgather` the size is each
rank's input, the result N times that, and bus bandwidth (N-1) x bytes / time
(nccl-tests' (N-1)/N x the result's size); allgather has no `out` variant.
`--collective broadcast` broadcasts from rank 0; its bus bandwidth is bytes / time.
`--collective barrier` has one row (sizes are ignored) and no `out` variant.

Before each launch, bench/cross_core.c (compiled with cc on first use) times a
cache line's round trip between the first two CPUs, and the figures are printed
under each table: a VM may move its vCPUs from a shared cache to far apart
between launches (2.7x slower hand-offs on the machine of 2026-11-29). The
rounds whose every launch found the cores near make one table, those whose
every launch found them far another, and a round whose launches saw both is
left out.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
VARIANTS = ("plain", "named", "out", "average")


def rotated(items, k):
    """items in the order that starts at item k (mod their count): round k of a
    bench launches its implementations this way, so that none is always first
    (the launch right after another job's exit runs slower) or always after the
    same one."""
    k %= len(items)
    return items[k:] + items[:k]


def median_and_range(ratios):
    """The median of a bench's per-round ratios, and from 3 rounds on their range
    "lo-hi" (None below): how far one round was from the next, the resolution of
    the median. bench/multihost.py reports its ratios the same way."""
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) >= 3 else None
    return statistics.median(ratios), spread


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def sizes_between(lo, hi):
    size, out = lo, []
    while size <= hi:
        out.append(size)
        size *= 4 if size < (1 << 20) else 2
    return out


def iterations_for(nbytes):
    # about 0.05-0.2 s per batch on this machine, and at least 5 repetitions
    return max(5, min(3000, int(1e8 / max(nbytes, 2048))))


def worker(kind, sizes, variants, dtype="float32", collective="allreduce", batches=3):
    if kind == "tnt":
        import tarantella as tnt

        rank, size, barrier = tnt.get_rank(), tnt.get_size(), tnt.barrier
    else:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size, barrier = comm.Get_rank(), comm.Get_size(), comm.Barrier
        variants = ["mpi"]
    results = []
    for nbytes in sizes:
        np_dtype = np.dtype(dtype) if dtype != "bfloat16" else np.dtype(__import__("ml_dtypes").bfloat16)
        x = np.ones(max(1, nbytes // np_dtype.itemsize), np_dtype)
        if collective == "allgather":
            out = np.empty(x.size * size, x.dtype)
            calls = {
                "plain": lambda: tnt.allgather(x),
                "named": lambda: tnt.allgather(x, name="bench"),
                "mpi": lambda: comm.Allgather(x, out),
            }
            expected = (1, out.size)  # (first element, size) of a result
        elif collective == "barrier":
            out = None
            calls = {"plain": lambda: tnt.barrier(), "named": lambda: tnt.barrier(name="bench"),
                     "mpi": lambda: comm.Barrier()}
            expected = None
        elif collective == "broadcast":
            out = np.empty_like(x)
            calls = {
                "plain": lambda: tnt.broadcast(x, root=0),
                "named": lambda: tnt.broadcast(x, root=0, name="bench"),
                "out": lambda: tnt.broadcast(x, root=0, out=out),
                "mpi": lambda: comm.Bcast(x, root=0),  # in place: every x holds ones
            }
            expected = (1, x.size)
        else:
            out = np.empty_like(x)
            calls = {
                "plain": lambda: tnt.allreduce(x),
                "named": lambda: tnt.allreduce(x, name="bench"),
                "out": lambda: tnt.allreduce(x, out=out),
                # what Keras's gradients take: each input scaled by 1/N on its way in
                "average": lambda: tnt.allreduce(x, op="average", out=out),
                "mpi": lambda: comm.Allreduce(x, out, op=MPI.SUM),
            }
            expected = (size, x.size)
        iters = iterations_for(nbytes)
        best = {v: float("inf") for v in variants}
        for v in variants:  # warm: first-touch page faults and the negotiation cache
            calls[v]()
            calls[v]()
        for _ in range(batches):  # variants alternate batch by batch: the machine is shared and noisy
            for v in variants:
                fn = calls[v]
                barrier()
                t = time.perf_counter()
                for _ in range(iters):
                    r = fn()
                best[v] = min(best[v], (time.perf_counter() - t) / iters)
                got = (x if v == "mpi" and collective == "broadcast" else out) if r is None else r
                want = (1, expected[1]) if v == "average" else expected  # the average of ones
                assert want is None or (got[0], got.size) == want, (v, got[0], got.size)
        results.append({"bytes": x.nbytes, "seconds": best})
    if rank == 0:
        print("RESULT " + json.dumps({"kind": kind, "ranks": size, "results": results}), flush=True)


def copy_bandwidth(nbytes=256 << 20):
    """Main-memory copy bandwidth of one core (bytes read / time, like memcpy)."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = min(_timed(lambda: np.copyto(b, a)) for _ in range(5))
    return nbytes / best


def cross_core_probe():
    """A function giving the round trip of a cache line between this process's
    first two CPUs now, in ns (bench/cross_core.c, compiled here once), or None
    where it cannot run (no C compiler, one CPU). A VM's hypervisor can move its
    vCPUs from a shared cache (~55 ns on the machine of 2026-11-29) to far apart
    (~320 ns), where every byte handed between cores costs up to 2.7x."""
    cpus = sorted(os.sched_getaffinity(0))
    cc = shutil.which("cc") or shutil.which("gcc")
    if len(cpus) < 2 or not cc:
        return None
    exe = os.path.join(tempfile.mkdtemp(prefix="tnt-bench-"), "cross_core")
    src = os.path.join(os.path.dirname(HERE), "cross_core.c")
    if subprocess.run([cc, "-O2", "-pthread", "-o", exe, src], capture_output=True).returncode:
        return None

    def probe():
        res = subprocess.run([exe, str(cpus[0]), str(cpus[1])], capture_output=True, text=True, timeout=60)
        return int(res.stdout) if res.returncode == 0 else None
    return probe


# A round trip over this is far apart whatever else the run saw (near: ~55 ns on the
# machine of 2026-11-29, far ~320): a table whose every launch found the cores far
# apart (2026-12-01, 4 ranks: 321-352 ns) was headed "near", being under twice its least.
FAR_NS = 150


def by_placement(trips):
    """[(title, round indices)]: the rounds whose every launch found the cores
    near each other (a cache line's round trip under twice the table's least,
    and under FAR_NS), then those whose every launch found them far apart; a
    round whose launches saw both is left out, since its sides ran on
    different machines in effect. Without the probe, every round in one table."""
    every = [ns for t in trips for _, ns in t if ns is not None]
    if not every:
        return [("All rounds:", list(range(len(trips))))]
    bound = min(2 * min(every), FAR_NS)
    far = [{ns > bound for _, ns in t if ns is not None} for t in trips]
    out = [(f"Rounds whose every launch found the cores {word} ({sum(f == {key} for f in far)} of {len(trips)}):",
            [k for k, f in enumerate(far) if f == {key}]) for word, key in (("near", False), ("far apart", True))]
    return [(title, keep) for title, keep in out if keep] or \
        [("No round found the cores in one placement for all its launches; every round:", list(range(len(trips))))]


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def find_peers(venvs):
    """(label, python, mpiexec) of every MPI to compare against."""
    peers = []
    try:
        import mpi4py  # noqa: F401

        if shutil.which("mpirun"):
            peers.append(("Open MPI", sys.executable, [shutil.which("mpirun"), "--allow-run-as-root",
                                                       "--oversubscribe", "--bind-to", "none"]))
    except ImportError:
        pass
    for label, path in venvs:
        py, mpiexec = os.path.join(path, "bin", "python"), os.path.join(path, "bin", "mpiexec")
        if os.path.exists(py) and os.path.exists(mpiexec):
            peers.append((label, py, [mpiexec]))
    return peers


def launch(label, cmd, env, sizes, variants, dtype="float32", collective="allreduce"):
    args = [HERE, "--worker", "mpi" if label.startswith("mpi:") else "tnt", "--sizes", ",".join(map(str, sizes)),
            "--variants", ",".join(variants), "--dtype", dtype, "--collective", collective]
    res = subprocess.run(cmd + args, capture_output=True, text=True, env=env, timeout=1800)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])["results"]
    print(f"{label} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}", file=sys.stderr)
    return None


def tnt_settings(parser, flag, values):
    """The NAME=VALUE strings given to `flag` as a dict of TNT_* settings, or the parser's error."""
    if any(not s.startswith("TNT_") or "=" not in s for s in values):
        parser.error(f"{flag} takes NAME=VALUE with a TNT_* name. Received: {values}")
    return dict(s.split("=", 1) for s in values)


def jobs_for(ranks, transport, baseline, peers, tnt_envs=()):
    """[(label, command prefix, env)] of every implementation to run each round."""
    base_env = dict(os.environ, OMP_NUM_THREADS="1")
    tnt_cmd = [sys.executable, "-m", "tarantella.runner", "-n", str(ranks), "--no-gpu", "--", sys.executable]
    if transport == "mpi":
        tnt_cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(ranks),
                   sys.executable]
        base_env["TNT_TRANSPORT"] = "mpi"
    elif transport == "gpi2":
        base_env["TNT_TRANSPORT"] = "gpi2"
    jobs = [("tnt", tnt_cmd, base_env)]
    if baseline:
        env = dict(base_env, PYTHONPATH=os.path.abspath(baseline))
        jobs.append(("tnt@baseline", tnt_cmd, env))
    for setting in tnt_envs:  # the same tree with another setting, e.g. TNT_SIMD=0
        name, value = setting.split("=", 1)
        jobs.append((f"tnt@{setting}", tnt_cmd, dict(base_env, **{name: value})))
    for label, py, mpiexec in peers:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("PYTHONPATH", None)
        jobs.append((f"mpi:{label}", mpiexec + ["-n", str(ranks), py], env))
    return jobs


def human(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def figure(seconds, nbytes, ranks, collective="allreduce"):
    """Latency below 1 MB, bus bandwidth from 1 MB (how the peers' table reads)."""
    if seconds != seconds:
        return "-"
    if nbytes < (1 << 20):
        return f"{seconds * 1e6:.1f} us"
    moved = {"allgather": (ranks - 1) * nbytes, "broadcast": nbytes}.get(collective, 2 * (ranks - 1) / ranks * nbytes)
    return f"{moved / seconds / 1e9:.2f} GB/s"


def table(ranks, sizes, per_job, columns, collective="allreduce"):
    """Markdown rows: one column per implementation/variant, then the ratios."""
    ref = next(v for label, v in columns if label == "tnt")  # the first of --variants

    def seconds(label, variant, i):
        """Each round's time (None where that launch failed)."""
        return [r[i]["seconds"][variant] if r else None for r in per_job.get(label, [])]

    def median_of(label, variant, i):
        runs = [t for t in seconds(label, variant, i) if t is not None]
        return statistics.median(runs) if runs else float("nan")

    def ratio_of(label, variant, i, note=""):
        """Median of the rounds' own ratios to Tarantella's reference call, with
        their range from 3 rounds on (how far one round is from the next: the
        resolution of the median)."""
        pairs = zip(seconds(label, variant, i), seconds("tnt", ref, i))
        ratios = [t / r for t, r in pairs if t is not None and r is not None]
        if not ratios:
            return "nan"
        median, spread = median_and_range(ratios)
        inside = ", ".join(x for x in (spread, note) if x)
        return f"{median:.2f}" + (f" ({inside})" if inside else "")

    heads = [f"{label} {variant}" if not label.startswith("mpi:") else label[4:] for label, variant in columns]
    peers = [(label, v) for label, v in columns if label.startswith("mpi:")]
    ratio_heads = [f"best peer / tnt {ref}"] if peers else []
    if any(label == "tnt@baseline" for label, _ in columns):
        ratio_heads.append(f"baseline {ref} / tnt {ref}")
    setting_jobs = sorted({label for label, _ in columns if label.startswith("tnt@TNT_")})
    ratio_heads += [f"{label[4:]} / tnt" for label in setting_jobs]
    lines = ["| size | " + " | ".join(heads + ratio_heads) + " |",
             "| ---: | " + " | ".join("---:" for _ in heads + ratio_heads) + " |"]
    for i, nbytes in enumerate(sizes):
        cells = [figure(median_of(label, v, i), nbytes, ranks, collective) for label, v in columns]
        if peers:  # the peer of the lowest median time, and its ratio
            best = min(peers, key=lambda p: median_of(p[0], p[1], i))
            cells.append(ratio_of(*best, i, note=best[0][4:]))
        if any(label == "tnt@baseline" for label, _ in columns):
            cells.append(ratio_of("tnt@baseline", ref, i))
        cells += [ratio_of(label, ref, i) for label in setting_jobs]
        lines.append(f"| {human(nbytes)} | " + " | ".join(cells) + " |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    p.add_argument("--min-bytes", default="4")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--sizes", help="comma-separated sizes (4,64K,1M) instead of --min/--max-bytes")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the figure is their median (default 1)")
    p.add_argument("--variants", default="plain,named,out", help="Tarantella call forms: plain,named,out,average (op=\"average\", out=: the way Keras's gradients go)")
    p.add_argument("--baseline", metavar="DIR", help="also run the Tarantella of this source tree (built in place)")
    p.add_argument("--peer-venv", action="append", default=[], metavar="LABEL=DIR",
                   help="an MPI to compare with: a venv holding mpi4py and that MPI's mpiexec "
                        "(bench/setup_peers.sh makes 'Intel MPI' and 'MPICH' ones)")
    p.add_argument("--markdown", help="also write the table to this file")
    p.add_argument("--transport", choices=["shm", "mpi", "gpi2"], default="shm",
                   help="Tarantella's transport: shm (tntrun, default), mpi (mpirun, TNT_TRANSPORT=mpi) or "
                        "gpi2 (tntrun, TNT_TRANSPORT=gpi2)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="element type of the buffers (default float32; the MPI peers only run float32)")
    p.add_argument("--simd", default="", metavar="LEVELS",
                   help="also run with these TNT_SIMD levels (0: scalar float16/bfloat16 kernels, 1: at most "
                        "F16C+AVX2), e.g. 0,1, for the ratios to the default")
    p.add_argument("--tnt-env", action="append", default=[], metavar="NAME=VALUE",
                   help="also run this tree with this TNT_* setting, for its time / the default's "
                        "(repeatable), e.g. TNT_STREAM_MIN_KB=0")
    p.add_argument("--collective", choices=["allreduce", "allgather", "broadcast", "barrier"], default="allreduce",
                   help="what to time: allreduce (default), allgather (each size is one rank's input), "
                        "broadcast (from rank 0) or barrier")
    p.add_argument("--worker", choices=["tnt", "mpi"], help=argparse.SUPPRESS)
    a = p.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        p.error(f"--variants takes {', '.join(VARIANTS)}. Received: {a.variants}")
    if a.collective in ("allgather", "barrier"):
        variants = [v for v in variants if v != "out"]  # they take no out=
    if a.collective != "allreduce":
        variants = [v for v in variants if v != "average"]
    if a.worker:
        worker(a.worker, [int(s) for s in a.sizes.split(",")], variants, a.dtype, a.collective)
        return 0
    sizes = [parse_bytes(s) for s in a.sizes.split(",")] if a.sizes else \
        sizes_between(parse_bytes(a.min_bytes), parse_bytes(a.max_bytes))
    if a.collective == "barrier":
        sizes = [0]
    if a.transport == "mpi" and not shutil.which("mpirun"):
        print("--transport mpi needs mpirun (apt-get install openmpi-bin libopenmpi-dev)", file=sys.stderr)
        return 1
    settings = [f"TNT_SIMD={int(v)}" for v in a.simd.split(",") if v] + a.tnt_env
    tnt_settings(p, "--tnt-env", a.tnt_env)
    peers = find_peers([tuple(s.split("=", 1)) for s in a.peer_venv]) if a.dtype == "float32" else []
    copy_bw = copy_bandwidth()
    lines = [f"memory copy bandwidth of one core (measured now): {copy_bw / 1e9:.1f} GB/s",
             f"run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {a.rounds} interleaved round(s); "
             f"peers: {', '.join(label for label, _, _ in peers) or 'none'}; {a.dtype}", ""]
    probe = cross_core_probe()
    for ranks in [int(r) for r in a.ranks.split(",")]:
        jobs = jobs_for(ranks, a.transport, a.baseline, peers, settings)
        rounds, trips = [], []  # per round: {label: results}; [(label, ns)]
        for k in range(a.rounds):
            rounds.append({})
            trips.append([])
            for label, cmd, env in rotated(jobs, k):
                trips[-1].append((label, probe() if probe else None))
                rounds[-1][label] = launch(label, cmd, env, sizes, variants, a.dtype, a.collective)
        columns = [(label, v) for label, _, _ in jobs for v in (variants if not label.startswith("mpi:") else ["mpi"])]
        lines.append(f"### {a.collective}, {ranks} ranks (Tarantella over {a.transport})")
        for title, keep in by_placement(trips):
            per_job = {label: [rounds[k].get(label) for k in keep] for label, _, _ in jobs}
            lines += ["", title, "", *table(ranks, sizes, per_job, columns, a.collective)]
        lines += ["", "Cross-core round trip (ns) just before each launch (bench/cross_core.c):", "",
                  *[f"- round {k + 1}: " + ", ".join(f"{label} {ns if ns is not None else '?'}" for label, ns in t)
                    for k, t in enumerate(trips)], ""]
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
