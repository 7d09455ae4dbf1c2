"""Run inside every rank: small allreduces in one round (the payload rides with
the negotiation; core.stats()['one_round'] counts them), their bits, their
fallbacks, and mismatches on that path. Writes OUTDIR/rank<r>.json."""
import json
import os
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import core

outdir = sys.argv[1]
rank, size = tnt.get_rank(), tnt.get_size()
seen = {}


def delta(before):
    after = core.stats()
    return {k: after[k] - before[k] for k in after}


# 1. a user's loop of plain unnamed calls: once the 60 unnamed names are known,
#    every call is a cache hit served in one round (no announcement, no data round)
x = np.arange(3, dtype=np.float32) + rank
for _ in range(60):
    tnt.allreduce(x)
before = core.stats()
results = [tnt.allreduce(x) for _ in range(120)]
seen["loop"] = delta(before)
seen["loop_ok"] = all((r == np.arange(3) * size + sum(range(size))).all() for r in results)

# 1b. a metrics dict of one dtype (a custom loop's loss and accuracy) is one
#     blocking request: one round too
for _ in range(60):
    tnt.allreduce({"loss": 0.5, "acc": 1.0})
before = core.stats()
metrics = [tnt.allreduce({"loss": 0.5 * rank, "acc": 1.0}) for _ in range(30)]
seen["metrics"] = delta(before)["one_round"]
seen["metrics_ok"] = all(m == {"loss": 0.5 * sum(range(size)), "acc": float(size)} for m in metrics)

# 2. the same bits as the small path's order: segment j of the result is
#    c_j + c_(j+1) + ... + c_(j+N-1) (indices mod N), added left to right in float32
contrib = [np.random.default_rng(q).standard_normal(1000).astype(np.float32) * 3.7 for q in range(size)]
expected = np.empty(1000, np.float32)
for j in range(size):
    lo, hi = 1000 * j // size, 1000 * (j + 1) // size
    acc = contrib[j][lo:hi].copy()
    for k in range(1, size):
        acc = acc + contrib[(j + k) % size][lo:hi]
    expected[lo:hi] = acc
tnt.allreduce(contrib[rank], name="bits")  # negotiated in full; the next ones are cached
before = core.stats()
got = [tnt.allreduce(contrib[rank], name="bits") for _ in range(3)]
got.append(tnt.allreduce(contrib[rank], name="bits", out=np.empty(1000, np.float32)))
seen["bits_one_round"] = delta(before)["one_round"]
seen["bits"] = all(g.tobytes() == expected.tobytes() for g in got)
avg = tnt.allreduce(contrib[rank], name="bits-avg", op="average", prescale=2.0)
avg = tnt.allreduce(contrib[rank], name="bits-avg", op="average", prescale=2.0)
seen["avg_close"] = bool(np.allclose(avg, 2.0 * sum(contrib) / size, rtol=1e-5, atol=1e-5))
seen["avg_hex"] = avg.tobytes().hex()  # compared across ranks by the test

# 3. not one round: an integer average (its own two-part sum) and a payload
#    beyond the one-round limit; still exact
ints, big = np.full(5, 7 * rank, np.int64), np.ones(8192, np.float32)  # 32 KB
for _ in range(2):
    r_int = tnt.allreduce(ints, op="average", name="int-avg")
    r_big = tnt.allreduce(big, name="big")
before = core.stats()
r_int = tnt.allreduce(ints, op="average", name="int-avg")
r_big = tnt.allreduce(big, name="big")
seen["other_paths"] = delta(before)["one_round"]
seen["other_ok"] = bool((r_int == 7 * sum(range(size)) // size).all() and (r_big == size).all())

# 4. a peer that comes late: the calling thread's slice ends, the wait goes on
#    through a handle, and the result is the same
tnt.allreduce(x, name="late")
if rank == size - 1:
    time.sleep(0.7)
seen["late_ok"] = bool((tnt.allreduce(x, name="late") == np.arange(3) * size + sum(range(size))).all())


# 5. mismatches on the one-round path: a cached name called with another size,
#    or as another collective, fails on every rank; the next calls work
def expect_mismatch(label, fn):
    try:
        fn()
        seen[label] = "no error"
    except tnt.MismatchError as exc:
        seen[label] = str(exc)


for _ in range(3):
    tnt.allreduce(np.ones(4, np.float32), name="hot")
    tnt.allreduce(np.ones(4, np.float32), name="hot-kind")
expect_mismatch("size", lambda: tnt.allreduce(np.ones(4 + (rank == 0), np.float32), name="hot"))
expect_mismatch("kind", lambda: (tnt.allreduce if rank == 0 else tnt.broadcast)(np.ones(4, np.float32),
                                                                                 name="hot-kind"))
seen["after"] = [bool((tnt.allreduce(np.ones(4, np.float32), name="hot") == size).all()) for _ in range(3)]
tnt.barrier()
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
