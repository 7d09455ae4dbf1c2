"""Run on every rank by test_gpi2_multihost.py: allreduces in a loop. It prints one JSON
line when warmed up ({"ready": true}) and, at the first error, one with the error, the rank
it names, its message and how long the failing step took; then it exits 3."""
import json
import sys
import time

import numpy as np

import tarantella as tnt

rank = tnt.get_rank()
x = np.ones(1 << 18, np.float32)  # 1 MB: a few pieces of the ring per step
tnt.allreduce(x, name="warm-up")
print(json.dumps({"rank": rank, "ready": True}), flush=True)
for i in range(10_000_000):
    start = time.monotonic()
    try:
        tnt.allreduce(x, name=f"step{i}")
    except tnt.TarantellaError as exc:
        print(json.dumps({"rank": rank, "error": type(exc).__name__, "peer": getattr(exc, "rank", None),
                          "message": str(exc), "seconds": time.monotonic() - start}), flush=True)
        sys.exit(3)
