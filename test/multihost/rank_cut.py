"""Run on every rank by the tests of a host cut off (test_gpi2_multihost.py,
test_collectives_multihost.py): allreduces in a loop. It prints one JSON line when warmed up
({"ready": true} and the job id) and, at the first error, one with the error, the rank it names, its message
and how long the failing step took; then it exits 3.

    rank_cut.py [OUTDIR]    the lines also go to OUTDIR/rank<r>.json, one per line: a rank on
                            a host cut off cannot print through an engine's daemon there"""
import json
import os
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import core

rank = tnt.get_rank()
copy = open(f"{sys.argv[1]}/rank{rank}.json", "w") if len(sys.argv) > 1 else None


def say(line):
    for out in (sys.stdout, copy):
        if out is not None:
            out.write(json.dumps(line) + "\n")
            out.flush()


x = np.ones(1 << 18, np.float32)  # 1 MB: a few pieces of the ring per step
tnt.allreduce(x, name="warm-up")
# pair_sums: between 2 hosts the steps are the pair's sum in MPI's own messages (TNT_MPI_PAIR_SUM)
say({"rank": rank, "ready": True, "job": os.environ.get("TNT_JOB_ID"), "pair_sums": core.stats()["pair_sums"]})
for i in range(10_000_000):
    start = time.monotonic()
    try:
        tnt.allreduce(x, name=f"step{i}")
    except tnt.TarantellaError as exc:
        say({"rank": rank, "error": type(exc).__name__, "peer": getattr(exc, "rank", None),
             "message": str(exc), "seconds": time.monotonic() - start})
        sys.exit(3)
