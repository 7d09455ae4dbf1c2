"""Tarantella's allreduce over each of its transports, side by side in one run,
with MPI_Allreduce (mpi4py) as the reference. Not a test: a table to read.

    python bench/transports.py                          # 2 ranks; shm, gpi2, mpi; 4 B .. 16 MB
    python bench/transports.py --transports shm,gpi2 --rounds 5 --markdown t.md

Each round runs every transport once (bench/allreduce.py's worker: best of three
batches of the plain call `tnt.allreduce(x)`, float32 sum) and the table keeps
each one's best round, so that a
busy moment of a shared machine hurts every column alike. gpi2 needs GPI-2
(GPI2_HOME); mpi and MPI_Allreduce need mpirun (and mpi4py for the latter).
"""
import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import allreduce  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--transports", default="shm,gpi2,mpi")
    p.add_argument("--sizes", default="4,64K,1M,16M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--markdown", help="also write the table to this file")
    a = p.parse_args()
    sizes = [allreduce.parse_bytes(s) for s in a.sizes.split(",")]
    names = [t for t in a.transports.split(",") if t]
    if "mpi" in names and not shutil.which("mpirun"):
        names.remove("mpi")
    # (column, label, command prefix, env, variant): bench/allreduce.py's jobs, one per transport
    jobs = [(c, *allreduce.jobs_for(a.ranks, c, None, [])[0], "plain") for c in names]
    jobs += [("MPI_Allreduce", *job, "mpi")  # Open MPI through mpi4py, when both are here
             for job in allreduce.jobs_for(a.ranks, "shm", None, allreduce.find_peers([]))[1:]]
    columns = [c for c, *_ in jobs]
    best = {c: [float("inf")] * len(sizes) for c in columns}
    for k in range(a.rounds):
        for c, label, cmd, env, variant in allreduce.rotated(jobs, k):
            res = allreduce.launch(label, cmd, env, sizes, ["plain"])
            for i, r in enumerate(res or []):
                best[c][i] = min(best[c][i], r["seconds"][variant])
    lines = [f"{a.ranks} ranks, float32 sum, best of {a.rounds} interleaved rounds", "",
             "| size | " + " | ".join(columns) + " | " + " | ".join(f"{c}/shm" for c in columns if c != "shm") + " |",
             "| ---: |" + " ---: |" * (2 * len(columns) - ("shm" in columns))]
    for i, nbytes in enumerate(sizes):
        cells = [f"{best[c][i] * 1e6:.0f} us" if best[c][i] < 1e-2 else f"{best[c][i] * 1e3:.1f} ms" for c in columns]
        ratios = [f"{best[c][i] / best['shm'][i]:.1f}" for c in columns if c != "shm" and "shm" in best]
        lines.append(f"| {allreduce.human(nbytes)} | " + " | ".join(cells + ratios) + " |")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
