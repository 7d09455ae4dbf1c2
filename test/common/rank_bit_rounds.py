"""Run inside every rank: steady loops that the negotiation's bit rounds must
serve (cached gradient-sized allreduces: one AND of readiness bits per cycle
after warm-up) and loops that must stay full rounds (small allreduces, whose
payload rides with the full message), with their results checked. Writes
OUTDIR/rank<r>.json with the core's counters around each loop."""
import json
import os
import sys

import numpy as np

import tarantella as tnt
from tarantella.common import core

outdir = sys.argv[1]
rank, size = tnt.get_rank(), tnt.get_size()
seen = {"size": size}
total = sum(range(size))


def delta(before, after):
    return {k: after[k] - before[k] for k in after}


# 1. gradients: 128 KiB allreduces under three names (above every one-round limit: 64 KiB
#    across hosts), cached after the first step
grads = {f"layer{i}/kernel": np.full(32768, rank + i, np.float32) for i in range(3)}
ok = True
for step in range(3):  # warm-up: announce, then settle
    for name, x in grads.items():
        ok &= bool((tnt.allreduce(x, name=name) == total + size * int(name[5])).all())
tnt.barrier()
before = core.stats()
steps = 40
for step in range(steps):
    handles = [(name, tnt.allreduce_async(x + step, name=name)) for name, x in grads.items()]
    for name, h in handles:
        ok &= bool((h.wait() == total + size * (int(name[5]) + step)).all())
seen["gradients"] = delta(before, core.stats())
seen["gradients_steps"] = steps * len(grads)
# the counters before the sync: no rank can start the next part (a new name:
# full rounds) before this rank has submitted the sync (a cached name: a bit round)
ok &= bool((tnt.allreduce(grads["layer0/kernel"], name="layer0/kernel") == total).all())
seen["gradients_ok"] = ok

# 2. a new name in the middle of the steady state: announced in a full round
before = core.stats()
out = tnt.allreduce(np.full(32768, rank, np.float32), name="late/bias")
seen["late_ok"] = bool((out == total).all())
for name, x in grads.items():
    ok &= bool((tnt.allreduce(x, name=name) == total + size * int(name[5])).all())
seen["late"] = delta(before, core.stats())
seen["late_grads_ok"] = ok

# 3. small allreduces: their payload rides with the full message, one round each
tnt.allreduce(np.ones(4, np.float32), name="loss")
before = core.stats()
small_ok = True
for step in range(30):
    small_ok &= bool((tnt.allreduce(np.full(4, rank + step, np.float32), name="loss") == total + size * step).all())
seen["small"] = delta(before, core.stats())
seen["small_ok"] = small_ok

tnt.barrier()
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
