"""Run inside every rank: names in a different order on each rank, the
steady-state cache, renegotiation, and mismatches that must fail on every rank.
Writes OUTDIR/rank<r>.json with what each scenario observed."""
import json
import os
import random
import sys

import numpy as np

import tarantella as tnt

outdir = sys.argv[1]
rank, size = tnt.get_rank(), tnt.get_size()
seen = {}

# 1. fifty named tensors, submitted in a different order on every rank, five
#    iterations (the first negotiates in full, the others hit the cache)
names = [f"layer{i}/kernel" for i in range(50)]
ok = True
for it in range(5):
    order = names[:]
    random.Random(rank * 100 + it).shuffle(order)
    handles = {n: tnt.allreduce_async(np.full(i + 1, rank + it, np.float32), name=n)
               for i, n in sorted(enumerate(names), key=lambda p: order.index(p[1]))}
    for i, n in enumerate(names):
        out = handles[n].wait()
        ok &= out.shape == (i + 1,) and bool((out == sum(q + it for q in range(size))).all())
seen["reordered"] = ok

# 2. a cached name whose size changes on every rank: renegotiated, not an error
a = tnt.allreduce(np.ones(10, np.float32), name="grows")
b = tnt.allreduce(np.ones(20, np.float32), name="grows")
seen["renegotiated"] = a.shape == (10,) and b.shape == (20,) and bool((b == size).all())


def expect_mismatch(label, fn):
    try:
        fn()
        seen[label] = "no error"
    except tnt.MismatchError as exc:
        seen[label] = str(exc)


# 3. mismatches: the error reaches every rank and names the tensor and the ranks
expect_mismatch("dtype", lambda: tnt.allreduce(np.ones(4, np.float32 if rank == 0 else np.float64), name="mm-dtype"))
expect_mismatch("count", lambda: tnt.allreduce(np.ones(4 + (rank == size - 1), np.float32), name="mm-count"))
expect_mismatch("op", lambda: tnt.allreduce(np.ones(4, np.float32), op="sum" if rank else "average", name="mm-op"))
expect_mismatch("root", lambda: tnt.broadcast(np.ones(4, np.float32), root=rank % 2, name="mm-root"))
expect_mismatch("kind", lambda: (tnt.allreduce if rank == 0 else tnt.broadcast)(np.ones(4, np.float32), name="mm-kind"))
expect_mismatch("rows", lambda: tnt.allgather(np.ones((2, 3 + (rank == 0)), np.float32), name="mm-rows"))
# 4. a mismatch under a name that every rank had cached
tnt.allreduce(np.ones(8, np.float32), name="cached")
expect_mismatch("cached", lambda: tnt.allreduce(np.ones(8 + (rank == 0), np.float32), name="cached"))

# 5. the context still works after all of that
seen["after"] = bool((tnt.allreduce(np.ones(3, np.int64), name="after") == size).all())

# 6. a name submitted twice while in flight is refused on this rank at once.
#    Rank 0 asks twice before the others submit the name, so the first request
#    cannot have completed yet.
if rank == 0:
    h = tnt.allreduce_async(np.ones(3, np.float32), name="twice")
    try:
        tnt.allreduce_async(np.ones(3, np.float32), name="twice")
        seen["duplicate"] = "no error"
    except tnt.InvalidUsageError as exc:
        seen["duplicate"] = str(exc)
    tnt.barrier(name="duplicate-tested")
else:
    tnt.barrier(name="duplicate-tested")
    h = tnt.allreduce_async(np.ones(3, np.float32), name="twice")
seen["twice"] = bool((h.wait() == size).all())

# 7. a handle dropped before completion neither blocks nor frees buffers in use;
#    it is released at a later submission
tnt.allreduce_async(np.ones(5, np.float32), name="dropped")
tnt.allreduce(np.ones(1, np.float32), name="after-dropped")
tnt.allreduce(np.ones(1, np.float32), name="reaps-dropped")
seen["orphans"] = len(tnt.common.collectives._orphans)
tnt.barrier()
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
