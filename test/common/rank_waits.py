"""Run inside every rank: a steady loop of small allreduces, then write the
rank's CPUs, the sums it got and how its waits ended to OUTDIR/rank<r>.json.
`--own-cpu`: first pin this process to one CPU of its own (rank r to the r-th
CPU it may run on), as Slurm's binding does, before Tarantella starts."""
import json
import os
import sys

if "--own-cpu" in sys.argv:
    sys.argv.remove("--own-cpu")
    launched_as = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("TNT_RANK", "0")))
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[launched_as % len(allowed)]})

import numpy as np  # noqa: E402 - after the pinning, which the ranks' threads inherit

import tarantella as tnt  # noqa: E402
from tarantella.common import core  # noqa: E402

outdir = sys.argv[1]
rank, size = tnt.get_rank(), tnt.get_size()
x = np.full(1, rank + 1, np.float32)
out = np.empty_like(x)
sums_ok = True
for _ in range(300):
    tnt.allreduce(x, name="waits", out=out)
    sums_ok &= bool(out[0] == size * (size + 1) / 2)
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "sums_ok": sums_ok, "stats": core.stats()}, f)
