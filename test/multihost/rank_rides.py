"""Run inside every rank of a job of 2 hosts x 2 ranks: allreduces that ride in
their bit round (ride.h) and those that do not, called the way users call them
(unnamed, in a loop). Writes OUTDIR/rank<r>.json (how many calls rode, per
case) and OUTDIR/rank<r>.npz (every result), which the test compares between
a job with TNT_RIDES=1 and one with TNT_RIDES=0, bit for bit."""
import json
import os
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import core

rank, size = tnt.get_rank(), tnt.get_size()
rng = np.random.default_rng(1000 + rank)

# (name, dtype, count, op, prescale): which ride is up to the job's shape
CASES = [
    ("f32_4b", np.float32, 1, "sum", 1.0),
    ("f32_40k", np.float32, 10_001, "sum", 1.0),  # an odd count: segments of unequal length
    ("f16_20k", np.float16, 10_000, "sum", 1.0),  # float16: every addition rounds, the order shows
    ("f64_avg_32k", np.float64, 4_096, "average", 0.5),  # scaled by 0.5 / N on the way in
    ("i64_64k", np.int64, 8_192, "sum", 1.0),  # 64 KiB: the largest that rides
    ("i32_avg_40k", np.int32, 10_000, "average", 1.0),  # an integer average never rides
    ("f32_100k", np.float32, 25_000, "sum", 1.0),  # above 64 KiB: the data path
]
CALLS = 6

counts, results = {}, {}
for name, dt, n, op, prescale in CASES:
    if np.issubdtype(dt, np.integer):
        x = rng.integers(-1000, 1000, n).astype(dt)
    else:
        x = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)).astype(dt)
    for _ in range(60):  # unnamed calls cycle through 60 names: announced once, then cached
        tnt.allreduce(x, op=op, prescale=prescale)
    before = core.stats()["one_round"]
    outs = [tnt.allreduce(x, op=op, prescale=prescale) for _ in range(CALLS)]
    counts[name] = core.stats()["one_round"] - before
    assert all(np.array_equal(o, outs[0]) for o in outs), f"{name}: calls of one input differ"
    results[name] = outs[0]

# a late peer: rank 0's ride goes out alone (its partner joins its round with no
# data, or not at all), is thrown away, and the call still gets the sum
x = rng.standard_normal(10_000).astype(np.float32)
late = []
for i in range(64):
    if rank == size - 1 and i >= 60:
        time.sleep(0.05)
    late.append(tnt.allreduce(x))
results["late"] = late[-1]
assert all(np.array_equal(o, late[0]) for o in late)

np.savez(os.path.join(sys.argv[1], f"rank{rank}.npz"), **results)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "counts": counts, "calls": CALLS}, f)
