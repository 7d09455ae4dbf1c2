"""Run inside every rank: tnt.allreduce's common call goes through the C fast
path (tarantella._fastpath) and gives what the general Python path gives.
Writes OUTDIR/rank<r>.json."""
import json
import sys
import time
import weakref

import numpy as np

import tarantella as tnt
from tarantella.common import collectives

outdir = sys.argv[1]
rank, size = tnt.get_rank(), tnt.get_size()
seen = {}

def count_calls(attr):
    """Count the calls of collectives.<attr>, a kind's general path (the fast
    path never enters it): a list whose item 0 is the count."""
    calls, real = [0], getattr(collectives, attr)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(collectives, attr, counting)
    return calls


general_calls = count_calls("_allreduce_now")


def contribution(dtype, count, salt):
    return ((np.arange(count) * 7 + rank * 13 + salt) % 23 - 11).astype(dtype)


# 1. the common calls, after an unnamed barrier and broadcast have left their
#    requests' names in flight: plain, out=, out= the input itself, named,
#    prescaled, averaged; every dtype; sizes on both sides of the aligned-result limit
tnt.barrier()
tnt.broadcast(np.zeros(2, np.float32))
dtypes = [np.float32, np.float64, np.int32, np.int64, np.float16]
for dt in dtypes:  # the first call of each dtype goes the general way
    tnt.allreduce(np.zeros(1, dt))
general_calls[0] = 0
bad = []
for dt in dtypes:
    for count in (1, 5, 4096, 70000, 300000):  # plain results: numpy.empty, aligned, pooled
        for salt in range(3):
            x = contribution(dt, count, salt)
            want = np.zeros(count, dt)
            for q in range(size):
                want = want + ((np.arange(count) * 7 + q * 13 + salt) % 23 - 11).astype(dt)
            got = {"plain": tnt.allreduce(x), "named": tnt.allreduce(x, name=f"fp-{count}-{salt}")}
            out = np.empty_like(x)
            got["out"] = tnt.allreduce(x, out=out)
            got["out_is_out"] = got["out"] if got["out"] is out else None
            inplace = x.copy()
            got["inplace"] = tnt.allreduce(inplace, out=inplace)
            if x.nbytes >= 64 * 1024 and got["plain"].__array_interface__["data"][0] % 64:
                bad.append(f"plain {np.dtype(dt).name}[{count}] not 64-byte aligned")
            for label, g in got.items():
                if g is None or g.dtype != np.dtype(dt) or g.shape != (count,) or \
                        g.tobytes() != want.astype(dt).tobytes():
                    bad.append(f"{label} {np.dtype(dt).name}[{count}] salt {salt}")
            if dt is np.float32:
                avg = tnt.allreduce(x, op="average", prescale=2.0)
                if not np.allclose(avg, 2.0 * want / size):
                    bad.append(f"average float32[{count}] salt {salt}")
seen["common_calls_bad"] = bad
seen["general_calls"] = general_calls[0]

# 2. a slow peer: rank 1 arrives 0.6 s late, longer than one wait slice (0.25 s),
#    so the others' fast calls hand over to the Python wait; the loop then goes on
x = np.full(3, rank + 1, np.float32)
if rank == 1:
    time.sleep(0.6)
slow = tnt.allreduce(x)
after = [tnt.allreduce(x) for _ in range(70)]  # past the 60 unnamed names: the slow one's name comes back
total = size * (size + 1) / 2
seen["slow_ok"] = slow.tolist() == [total] * 3 and all(a.tolist() == [total] * 3 for a in after)

# 3. what the fast path leaves to the general path still works there
class Tagged(np.ndarray):  # a subclass: the general path decides what it is
    pass


general_calls[0] = 0
ones = np.ones(3, np.float32)
fallbacks = [tnt.allreduce(ones, prescale=2),  # an int prescale
             tnt.allreduce(ones.view(Tagged)),
             tnt.allreduce(ones, op=np.str_("sum"))]  # a str subclass
seen["fallbacks"] = general_calls[0]
seen["fallbacks_ok"] = [f.tolist() for f in fallbacks] == [[2.0 * size] * 3, [size] * 3, [size] * 3]

# 4. small plain results are handed out again once nothing refers to them (a loop
#    `y = tnt.allreduce(x)`), never while something does
def summed(value, count=2, dtype=np.float32):
    return tnt.allreduce(np.full(count, value, dtype))


def total(value):
    return [value * size] * 2


recycling_bad = []
kept = [summed(i) for i in range(10)]  # all alive: ten arrays, each its own values
if len({k.ctypes.data for k in kept}) != 10 or [k.tolist() for k in kept] != [total(i) for i in range(10)]:
    recycling_bad.append("results kept alive were handed out again")
del kept
first = summed(1.0)
alive = weakref.ref(first)  # dies with `first` unless it is kept for reuse
del first
again = summed(2.0)
seen["recycled"] = alive() is again and again.tolist() == total(2.0)
view = again[:1]  # a view keeps its base alive
del again
if summed(3.0).ctypes.data == view.ctypes.data or view.tolist() != [2.0 * size]:
    recycling_bad.append("a result whose view is alive was handed out again")
frozen = summed(4.0)
frozen.flags.writeable = False
del frozen
if not summed(5.0).flags.writeable:
    recycling_bad.append("a read-only result was handed out again")
retyped = summed(6.0)
retyped.dtype = np.int32  # same bytes, another dtype
del retyped
got = summed(7.0)
if got.dtype != np.float32 or got.tolist() != total(7.0):
    recycling_bad.append("a result whose dtype was reassigned was handed out as float32")
if summed(8, dtype=np.int32).tolist() != total(8) or summed(9, 4).tolist() != [9.0 * size] * 4:
    recycling_bad.append("another dtype or shape")
# results of 64 KiB - 1 MiB are aligned views of a raw block, which NumPy makes the base of
# every view of them: a view (a reshape) must keep the result from being handed out again
aligned = 32 * 1024  # float32 elements: 128 KiB
shaped = summed(10.0, aligned).reshape(2, -1)
sliced = summed(11.0, aligned)[:4]
for i in range(6):
    summed(100.0 + i, aligned)
if shaped[:, :2].tolist() != [[10.0 * size] * 2] * 2 or sliced.tolist() != [11.0 * size] * 4:
    recycling_bad.append(f"a view of an aligned result was overwritten: {shaped[:, :2].tolist()}, {sliced.tolist()}")
dropped = summed(12.0, aligned)
address = dropped.ctypes.data
del dropped
if summed(13.0, aligned).ctypes.data != address:
    recycling_bad.append("a dropped aligned result was not handed out again")
seen["recycling_bad"] = recycling_bad

# 5. Python and NumPy scalars (a loss, a metric) take the fast path too, with the
#    general path's results: 0-d arrays of the dtype np.asarray gives them
for v in (1.5, 2, np.float32(0.5), np.int32(3)):  # each dtype's first call fills its code
    tnt.allreduce(v)
general_calls[0] = 0
scalars = [tnt.allreduce(v) for v in (1.5, 2, np.float32(0.5), np.int32(3), np.float64(rank))]
seen["scalars"] = [[type(r).__name__, r.shape, r.dtype.name, r.item()] for r in scalars]
seen["scalar_general_calls"] = general_calls[0]

# 6. broadcast's common call takes the fast path too: every dtype and form, both
#    roots, the root's bits everywhere; a bad root still gets the general path's error
broadcast_calls = count_calls("_broadcast")
for dt in dtypes:  # codes known already (section 1)
    tnt.broadcast(np.zeros(1, dt))
broadcast_calls[0] = 0
broadcast_bad = []
for dt in dtypes:
    for count in (1, 5, 70000):
        for root in (0, size - 1):
            x = contribution(dt, count, root)
            want = ((np.arange(count) * 7 + root * 13 + root) % 23 - 11).astype(dt).tobytes()
            out = np.empty_like(x)
            inplace = x.copy()
            got = {"plain": tnt.broadcast(x, root=root), "named": tnt.broadcast(x, root=root, name=f"bc-{count}"),
                   "out": tnt.broadcast(x, root=root, out=out), "inplace": tnt.broadcast(inplace, root, out=inplace)}
            if got["out"] is not out or got["inplace"] is not inplace:
                broadcast_bad.append(f"out= not returned {np.dtype(dt).name}[{count}]")
            for label, g in got.items():
                if g.dtype != np.dtype(dt) or g.shape != (count,) or g.tobytes() != want:
                    broadcast_bad.append(f"{label} {np.dtype(dt).name}[{count}] root {root}")
if rank == 1:  # a slow peer: the others' fast calls hand over to the Python wait
    time.sleep(0.6)
late = [tnt.broadcast(np.full(3, rank + 1.0, np.float32), root=0) for _ in range(70)]
if any(v.tolist() != [1.0] * 3 for v in late):
    broadcast_bad.append("with a slow peer")
seen["broadcast_bad"] = broadcast_bad
seen["broadcast_general_calls"] = broadcast_calls[0]
try:
    tnt.broadcast(np.ones(2, np.float32), root=size)
    seen["bad_root"] = None
except Exception as exc:  # noqa: BLE001 - recorded for the test
    seen["bad_root"] = [type(exc).__name__, str(exc)]
seen["bad_root_general_calls"] = broadcast_calls[0]

# 7. allgather's common call (a result below 64 KiB) takes the fast path too: every
#    dtype, 1-d and 2-d, as many rows on every rank or not, and with a slow peer
gather_calls = count_calls("_allgather")
for dt in dtypes:
    tnt.allgather(np.zeros(1, dt))
gather_calls[0] = 0
gather_bad = []
for dt in dtypes:
    for shape in ((1,), (5,), (3, 4)):
        for uneven in (False, True):
            rows = shape[0] + (rank if uneven else 0)
            x = np.full((rows,) + shape[1:], rank + 1, dt)
            want = np.concatenate([np.full((shape[0] + (q if uneven else 0),) + shape[1:], q + 1, dt)
                                   for q in range(size)])
            for label, g in (("plain", tnt.allgather(x)), ("named", tnt.allgather(x, name=f"ag-{shape}"))):
                if g.dtype != np.dtype(dt) or g.shape != want.shape or g.tobytes() != want.tobytes():
                    gather_bad.append(f"{label} {np.dtype(dt).name}{shape} uneven={uneven}")
if rank == 1:
    time.sleep(0.6)
late = [tnt.allgather(np.full(2, rank, np.int32)) for _ in range(70)]
if any(v.tolist() != [q for q in range(size) for _ in range(2)] for v in late):
    gather_bad.append("with a slow peer")
seen["gather_bad"] = gather_bad
seen["gather_general_calls"] = gather_calls[0]
mid = tnt.allgather(np.ones(24576 // size, np.float32))  # a result of about 96 KiB: aligned
big = tnt.allgather(np.ones(70000, np.float32))  # from 128 KiB: from result_pool
seen["gather_big_general_calls"] = gather_calls[0] - seen["gather_general_calls"]
seen["gather_big_ok"] = (big.shape == (70000 * size,) and bool((big == 1).all()) and bool((mid == 1).all())
                         and mid.ctypes.data % 64 == 0 and big.ctypes.data % 64 == 0)

with open(f"{outdir}/rank{rank}.json", "w") as f:
    json.dump(seen, f)
