"""Run inside every rank: a steady loop of small allreduces, then write the
rank's CPUs, the sums it got and how its waits ended to OUTDIR/rank<r>.json."""
import json
import os
import sys

import numpy as np

import tarantella as tnt
from tarantella.common import core

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
