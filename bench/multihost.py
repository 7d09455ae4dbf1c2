"""Allreduce across hosts on the multi-host test bed (test/multihost/multihost_testbed.py:
each host a network namespace on one bridge, as a cluster's nodes on one switch), measured
side by side in one run. Not a test: a table to read. Needs root (namespaces) and Open MPI.

    sudo python bench/multihost.py                       # 4 B .. 64 MB
    sudo python bench/multihost.py --max-bytes 256M --markdown docs/table.md

Columns, float32 sums (--dtype float16: Tarantella's) on the same hosts in the same run:
  - Tarantella on 2 hosts x 2 ranks (--per-host: another count), hierarchical (the default)
    and with one flat ring over all ranks (TNT_HIERARCHICAL=0);
  - Open MPI's MPI_Allreduce on the same 2 x 2 ranks (a small C program built here with mpicc:
    no mpi4py needed), and on 2 x 1 beside Tarantella on 2 x 1;
  - the link bounds: one TCP stream from hostA to hostB, and the rate of each direction
    while two streams run at once, one each way (what an allreduce needs: with 2 ranks
    each sends and receives the whole buffer at the same time). The test bed's "link" is
    a veth pair whose copies run on the same cores as the ranks, so the two directions
    share them: on a 2-core machine each gets about half of the one-way rate.
Bus bandwidth is 2(N-1)/N x bytes / time (nccl-tests' convention). Each round launches every
column once, in an order rotated by one from the round before (bench/allreduce.py found the
launch right after another job's exit slower): --repeat a multiple of the columns' count
gives every column every place equally often."""
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
sys.path.insert(0, os.path.join(ROOT, "test", "multihost"))
sys.path.insert(0, os.path.dirname(HERE))

from allreduce import human, median_and_range, parse_bytes, rotated  # noqa: E402  (bench/allreduce.py's, the same units)

MPI_BENCH = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
/* argv: sizes in bytes; rank 0 prints RESULT {"results": [{"bytes", "seconds"}]} */
static int iterations(long bytes) { long n = 50000000L / (bytes > 4096 ? bytes : 4096); return n < 3 ? 3 : n > 200 ? 200 : (int)n; }
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!rank) printf("RESULT {\"results\": [");
  for (int a = 1; a < argc; a++) {
    long bytes = atol(argv[a]), n = bytes / 4 > 0 ? bytes / 4 : 1;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    for (long i = 0; i < n; i++) x[i] = 1.0f;
    int iters = iterations(bytes);
    double best = 1e30;
    MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int b = 0; b < 3; b++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      for (int i = 0; i < iters; i++) MPI_Allreduce(x, y, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t = (MPI_Wtime() - t) / iters;
      if (t < best) best = t;
    }
    if (y[0] != (float)size) { fprintf(stderr, "wrong sum %f\n", y[0]); MPI_Abort(MPI_COMM_WORLD, 1); }
    if (!rank) printf("%s{\"bytes\": %ld, \"seconds\": %.9f}", a > 1 ? ", " : "", n * 4, best);
    free(x);
    free(y);
  }
  if (!rank) printf("]}\n");
  MPI_Finalize();
  return 0;
}
"""


def sizes_between(lo, hi):
    """x16 steps up to 16 KB, x4 beyond (the issue's targets start at 64 KB)."""
    size, out = lo, []
    while size <= hi:
        out.append(size)
        size *= 16 if size < (16 << 10) else 4
    return out


def iterations_for(nbytes):  # the C program's rule: about 0.1-1 s per size on the test bed
    return max(3, min(200, int(5e7 / max(nbytes, 4096))))


def worker(sizes, dtype):
    import tarantella as tnt

    rank, size = tnt.get_rank(), tnt.get_size()
    results = []
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // np.dtype(dtype).itemsize), dtype)
        out = np.empty_like(x)
        tnt.allreduce(x, name="bench", out=out)  # warm: first touch, the negotiation cache
        best = float("inf")
        for _ in range(3):
            tnt.barrier()
            t = time.perf_counter()
            for _ in range(iterations_for(nbytes)):
                tnt.allreduce(x, name="bench", out=out)
            best = min(best, (time.perf_counter() - t) / iterations_for(nbytes))
        assert out[0] == size, out[0]
        results.append({"bytes": x.nbytes, "seconds": best})
    if rank == 0:
        print("RESULT " + json.dumps({"results": results}), flush=True)


def result_of(res, label):
    for line in res.stdout.splitlines():
        at = line.find("RESULT ")
        if at >= 0:
            return json.loads(line[at + len("RESULT "):])["results"]
    print(f"{label} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}", file=sys.stderr)
    return None


def run_tnt(bed, env, hosts, sizes, dtype, *exports, tree=None):
    """Tarantella on `hosts`; `tree`: the source tree (built in place) of another Tarantella."""
    cmd = [sys.executable, "-m", "tarantella.runner", "-H", hosts, "--no-gpu",
           *[a for e in exports for a in ("-x", e)], "--", HERE, "--worker", "--sizes", ",".join(map(str, sizes)),
           "--dtype", dtype]
    if tree:
        env = dict(env, PYTHONPATH=os.path.abspath(tree))
    return result_of(bed.run("hostA", cmd, env=env, timeout=1800), f"tarantella {hosts} {exports} {tree or ''}")


def run_mpi(bed, env, hosts, exe, sizes):
    n = sum(int(h.split(":")[1]) for h in hosts.split(","))
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    # yield when idle: 4 ranks that busy-poll on 2 cores starve each other (Open MPI's own advice
    # for oversubscribed nodes); Tarantella's waits sleep too
    cmd = ["mpirun", *root, "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1", "-np", str(n), "--host",
           hosts, exe, *map(str, sizes)]
    return result_of(bed.run("hostA", cmd, env=env, timeout=1800), f"MPI_Allreduce {hosts}")


TCP_RECEIVER = """import socket,sys,time
s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind(('0.0.0.0',{port}));s.listen(1);print('READY',flush=True)
c,_=s.accept()
buf=bytearray(1<<20);got=0;t=None
while got<{nbytes}:
 n=c.recv_into(buf)
 t=t or time.perf_counter()
 if not n: break
 got+=n
print(got/(time.perf_counter()-t),flush=True)"""

TCP_SENDER = """import socket
s=socket.create_connection(('{address}',{port}))
b=bytes(1<<20)
for _ in range({nbytes} >> 20): s.sendall(b)
s.close()"""


def tcp_streams(bed, env, both_ways, nbytes=1 << 30, port=47123):
    """Bytes per second of one TCP stream hostA -> hostB or, with both_ways, of the slower
    direction while hostA -> hostB and hostB -> hostA stream at the same time."""
    pairs = [("hostA", "hostB")] + ([("hostB", "hostA")] if both_ways else [])
    receivers = []
    for _, dst in pairs:
        proc = bed.popen(dst, [sys.executable, "-c", TCP_RECEIVER.format(port=port, nbytes=nbytes)], env=env,
                         stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()
        receivers.append(proc)
    senders = [bed.popen(src, [sys.executable, "-c", TCP_SENDER.format(address=bed.addresses[dst], port=port,
                                                                       nbytes=nbytes)], env=env)
               for src, dst in pairs]
    for proc in senders:
        proc.wait(timeout=600)
    return min(float(proc.communicate(timeout=600)[0].strip().splitlines()[-1]) for proc in receivers)


def time_of(rounds, i, statistic):
    """Seconds of size i in a column's rounds (the median, or the best with --statistic best);
    None if no round of it gave a result."""
    times = [r[i]["seconds"] for r in rounds or [] if r]
    if not times:
        return None
    return min(times) if statistic == "best" else statistics.median(times)


def cell(rounds, i, n, statistic):
    if rounds is None:  # not asked for (--only)
        return "-", None
    t = time_of(rounds, i, statistic)
    if t is None:
        return "failed", None
    busbw = 2 * (n - 1) / n * next(r for r in rounds if r)[i]["bytes"] / t / 1e9
    return f"{t * 1e3:.3f} ms, {busbw:.2f} GB/s", t


def ratio(slow, fast, i, statistic):
    """slow's time over fast's at size i. With the median: the median of the rounds' own
    ratios (each round ran both columns back to back, so a round that the machine slowed
    down slows both), with their range; with the best: the ratio of the best times."""
    if statistic == "best":
        a, b = time_of(slow, i, "best"), time_of(fast, i, "best")
        return f"{a / b:.2f}x" if a and b else "-"
    pairs = [a[i]["seconds"] / b[i]["seconds"] for a, b in zip(slow or [], fast or []) if a and b]
    if not pairs:
        return "-"
    median, spread = median_and_range(pairs)
    return f"{median:.2f}x" + (f" ({spread})" if spread else "")


def table(sizes, cols, link, both, statistic="median", per_host=2):
    many = f"2x{per_host}"
    head = ["size", f"hier {many}", f"flat {many}", f"MPI {many}", "flat/hier", "MPI/hier", "tnt 2x1", "MPI 2x1", "MPI/tnt 2x1",
            "tnt 2x1 / link", "tnt 2x1 / both ways"]
    base = [k for k in ("hier@base", "tnt2@base") if cols.get(k)]
    head += [f"{k} / {k.split('@')[0]}" for k in base]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, nbytes in enumerate(sizes):
        (h, _), (f, _), (m, _) = (cell(cols[k], i, 4, statistic) for k in ("hier", "flat", "mpi4"))
        (t2, tt2), (m2, _) = (cell(cols[k], i, 2, statistic) for k in ("tnt2", "mpi2"))
        # 2 ranks: bus bandwidth = bytes / time, what each direction of the link carries
        of_link = f"{nbytes / tt2 / link:.2f} | {nbytes / tt2 / both:.2f}" if tt2 else "- | -"
        extra = [ratio(cols[k], cols[k.split("@")[0]], i, statistic) for k in base]
        lines.append(f"| {human(nbytes)} | {h} | {f} | {m} | {ratio(cols['flat'], cols['hier'], i, statistic)} | "
                     f"{ratio(cols['mpi4'], cols['hier'], i, statistic)} | {t2} | {m2} | "
                     f"{ratio(cols['mpi2'], cols['tnt2'], i, statistic)} | {of_link} |"
                     + "".join(f" {e} |" for e in extra))
    rounds = max((len(r) for r in cols.values() if r), default=0)
    how = (f"the best of {rounds} rounds" if statistic == "best" else
           f"times: the median of {rounds} rounds; ratios: the median of the rounds' own ratios"
           + (" (their range in brackets)" if rounds > 2 else ""))
    lines.append(f"\nLink bounds: one TCP stream hostA -> hostB {link / 1e9:.2f} GB/s; each direction while both "
                 f"stream at once {both / 1e9:.2f} GB/s. Ratios above 1 mean "
                 "Tarantella's hierarchical allreduce (or Tarantella on 2x1) is faster"
                 + (" (x@base / x: this tree is that much faster than the baseline's)" if base else "")
                 + f"; {how}.")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-bytes", default="4")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--size-list", metavar="S,S,...", help="measure these sizes (e.g. 64K,256K,1M) instead of "
                   "--min-bytes..--max-bytes")
    p.add_argument("--markdown", help="also write the table to this file")
    p.add_argument("--only", default="hier,flat,mpi4,tnt2,mpi2",
                   help="columns to measure (default: all): hier, flat, mpi4, tnt2, mpi2 (and, with --baseline, "
                   "hier@base, tnt2@base)")
    p.add_argument("--baseline", metavar="DIR", help="also run the Tarantella of this source tree (built in place: "
                   "python setup.py build_ext --inplace) in the same rounds, as columns hier@base and tnt2@base")
    p.add_argument("--repeat", type=int, default=1, help="rounds of all columns, each a fresh launch of every "
                   "column in turn (default 1)")
    p.add_argument("--statistic", default="median", choices=["median", "best"],
                   help="median (default): a time is the median of the rounds, a ratio the median of the rounds' "
                   "own ratios, with their range; best: the best time of each column and the ratio of those "
                   "(the tables in docs/benchmarks.md before 2026-11-28 morning)")
    p.add_argument("--tnt-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting for every Tarantella column (repeatable), e.g. TNT_SHM_SLOT_KB=1024")
    p.add_argument("--per-host", type=int, default=2, metavar="L",
                   help="ranks on each host of the hier, flat and mpi4 columns (default 2; e.g. 4: 8 ranks on "
                   "this machine's 2 cores, oversubscribed)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"],
                   help="what Tarantella sums (MPI's columns stay float32 of the same bytes: MPI has no float16)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.per_host < 2:
        p.error(f"--per-host must be at least 2 (2 x 1 is the tnt2 and mpi2 columns). Received: {args.per_host}")
    if args.worker:
        return worker([int(s) for s in args.sizes.split(",")], args.dtype)
    from multihost_testbed import Testbed, TestbedUnavailable

    sizes = ([parse_bytes(s) for s in args.size_list.split(",")] if args.size_list
             else sizes_between(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)))
    mpicc = shutil.which("mpicc")
    if not (mpicc and shutil.which("mpirun")):
        sys.exit("needs Open MPI: mpirun and mpicc (apt-get install openmpi-bin libopenmpi-dev)")
    work = tempfile.mkdtemp(prefix="tnt-bench-mh-")
    exe = os.path.join(work, "mpi_allreduce")
    with open(exe + ".c", "w") as f:
        f.write(MPI_BENCH)
    subprocess.run([mpicc, "-O2", "-o", exe, exe + ".c"], check=True)
    try:
        bed = Testbed(["hostA", "hostB"]).start()
    except TestbedUnavailable as exc:
        sys.exit(f"cannot make the test bed: {exc}")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TNT_", "OMPI_", "SLURM_", "PMI_"))}
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env = bed.env(base=env, OMP_NUM_THREADS="1")
        link, both = tcp_streams(bed, env, False), tcp_streams(bed, env, True)
        x, dt = args.tnt_env, args.dtype
        many = f"hostA:{args.per_host},hostB:{args.per_host}"
        runs = {"hier": lambda: run_tnt(bed, env, many, sizes, dt, *x),
                "flat": lambda: run_tnt(bed, env, many, sizes, dt, "TNT_HIERARCHICAL=0", *x),
                "mpi4": lambda: run_mpi(bed, env, many, exe, sizes),
                "tnt2": lambda: run_tnt(bed, env, "hostA:1,hostB:1", sizes, dt, *x),
                "mpi2": lambda: run_mpi(bed, env, "hostA:1,hostB:1", exe, sizes),
                "hier@base": lambda: run_tnt(bed, env, many, sizes, dt, *x, tree=args.baseline),
                "tnt2@base": lambda: run_tnt(bed, env, "hostA:1,hostB:1", sizes, dt, *x, tree=args.baseline)}
        only = args.only.split(",")
        if args.baseline and "--only" not in sys.argv:
            only += ["hier@base", "tnt2@base"]
        cols = {k: None for k in runs}
        for r in range(args.repeat):  # rounds of every column in turn: a busy machine hits them alike
            for k in rotated(only, r):
                cols[k] = (cols[k] or []) + [runs[k]() or []]  # [] marks a launch that failed
    finally:
        bed.close()
        shutil.rmtree(work, ignore_errors=True)
    text = table(sizes, cols, link, both, args.statistic, args.per_host)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
