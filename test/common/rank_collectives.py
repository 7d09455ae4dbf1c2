"""Run inside every rank (started by tntrun): every collective x every dtype x
the sizes of the issue, checked against a NumPy reference computed here, and a
digest of every result written to OUTDIR/rank<r>.json so that the test can
compare ranks and runs bit for bit; then nested structures through the same
collectives (checked here, without TensorFlow)."""
import collections
import hashlib
import json
import os
import sys

import numpy as np

import tarantella as tnt
from tarantella.common import TensorAllgatherer, TensorAllreducer, TensorBroadcaster, collectives, core

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 needs ml_dtypes (installed with TensorFlow)
    BF16 = None

outdir = sys.argv[1]
big = int(os.environ.get("TNT_TEST_BIG_BYTES", 64 << 20))
if os.environ.get("RANK_SHM_PLACEMENTS"):  # "2,1,2": each rank's own TNT_SHM_PLACEMENT, read at init
    os.environ["TNT_SHM_PLACEMENT"] = os.environ["RANK_SHM_PLACEMENTS"].split(",")[int(os.environ["TNT_RANK"])]
rank, size = tnt.get_rank(), tnt.get_size()
dtypes = [np.float16, np.float32, np.float64, np.int32, np.int64] + ([BF16] if BF16 is not None else [])
results, failures = {}, []


def is_float(dt):
    return dt.kind == "f" or dt == BF16


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest()


SAMPLE = np.s_[::4099]  # big results are compared on a sample: the references would dominate the run time


def check(label, got, want, sampled=False):
    results[label] = digest(got)
    if sampled:
        got = got.reshape(-1)[SAMPLE]
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(
            got.astype(np.float64), want.astype(np.float64)):
        failures.append(f"{label}: got {got.dtype}{got.shape} {got.ravel()[:4]}, want {want.dtype}{want.shape} "
                        f"{want.ravel()[:4]}")


def contribution(q, count, dtype, index=None):
    # small integers: every partial sum is exact in every dtype, so the ring's
    # summation order cannot make the result differ from NumPy's
    index = np.arange(count, dtype=np.int64) if index is None else index
    return ((index * 7 + q * 3) % 13).astype(dtype)


for dtype in dtypes:
    dt = np.dtype(dtype)
    # 24000 + N: 96 KB of float32 or int32, which 2 ranks on one host sum by
    # swapping whole buffers (48-128 KiB; the ring above and below)
    sizes = [0, 1, 17, 2 * size + 1, 1000 * size + 3, 24000 + size, big // dt.itemsize]
    for count in sizes:
        tag = f"{dt.name}-{count}"
        x = contribution(rank, count, dt)
        sampled = count >= big // dt.itemsize
        index = np.arange(count, dtype=np.int64)[SAMPLE] if sampled else None
        want = sum(contribution(q, count, np.int64, index) for q in range(size)).astype(dt) if count else x.copy()
        check(f"allreduce-sum-{tag}", tnt.allreduce(x, name=f"ar-{tag}"), want, sampled)
        if count <= 100_000:
            avg = tnt.allreduce(x, op="average", name=f"avg-{tag}")
            if is_float(dt):
                want_avg = (sum(contribution(q, count, np.float64) for q in range(size)) / size).astype(dt) \
                    if count else x.copy()
                results[f"allreduce-avg-{tag}"] = digest(avg)
                if not np.allclose(avg.astype(np.float64), want_avg.astype(np.float64), rtol=1e-2):
                    failures.append(f"average {tag}")
            else:
                total = sum(contribution(q, count, np.int64) for q in range(size))
                check(f"allreduce-avg-{tag}", avg, (total // size).astype(dt) if count else x.copy())
            # prescale: a weighted sum in one pass
            ws = tnt.allreduce(x, prescale=2.0, name=f"pre-{tag}")
            check(f"allreduce-prescale-{tag}", ws, (2 * sum(contribution(q, count, np.int64)
                                                            for q in range(size))).astype(dt) if count else x)
        if count < big // dt.itemsize or dt == np.float32:
            root = size - 1
            b = tnt.broadcast(x, root=root, name=f"bc-{tag}")
            check(f"broadcast-{tag}", b, contribution(root, count, dt, index), sampled)
            # allgather: a different first dimension on every rank, rows of 3
            rows = (count // 3 + rank) if count < big // dt.itemsize else count // 3 // size
            g = tnt.allgather(contribution(rank, rows * 3, dt).reshape(rows, 3), name=f"ag-{tag}")
            want_rows = [(count // 3 + q) if count < big // dt.itemsize else count // 3 // size for q in range(size)]
            check(f"allgather-{tag}", g, np.concatenate(
                [contribution(q, r * 3, dt).reshape(r, 3) for q, r in enumerate(want_rows)]))

# 2 ranks add each element once, and a + b is b + a to the bit: whatever the
# path (the swap of whole buffers at 48-128 KiB), non-integer sums are NumPy's
if size == 2:
    xs = [np.random.default_rng([99, q]).standard_normal(24_001).astype(np.float32) for q in range(2)]
    check("pair-window", tnt.allreduce(xs[rank], name="pair-window"), xs[0] + xs[1])
    check("pair-window-pre", tnt.allreduce(xs[rank], prescale=2.0, name="pair-window-pre"), xs[0] * 2 + xs[1] * 2)
    z = xs[rank].copy()  # in place: what is sent must leave before the sum overwrites it
    check("pair-window-in-place", tnt.allreduce(z, out=z, name="pair-window-in-place"), xs[0] + xs[1])

# NaNs of other signs and payloads on each rank at the same places: a sum of two NaNs keeps
# one of them, and every rank must keep the same one (the digests are compared across ranks).
# The pair's swap of whole buffers (2 ranks, 48-128 KiB) had each rank keep its own NaN.
NAN_BITS = {"float16": 0x7E00, "bfloat16": 0x7FC0, "float32": 0x7FC00000, "float64": 0x7FF8000000000000}
for dtype in dtypes:
    dt = np.dtype(dtype)
    if not is_float(dt):
        continue
    bits = np.dtype(f"u{dt.itemsize}")
    sign = 1 << (8 * dt.itemsize - 1)
    nan = NAN_BITS[dt.name] | (rank + 1) | (sign if rank % 2 else 0)  # quiet, a payload of its own, signs alternate
    for count in (5, 96 * 1024 // dt.itemsize + 1, 300_001):  # one exchange, the pair's window, the ring
        x = np.ones(count, dt)
        x.view(bits)[::3] = nan
        # each rank's own prescale: its contribution is scaled where it is added
        for variant, op, prescale in (("sum", "sum", 1.0), ("own-prescale", "sum", 1.0 if rank == 0 else 0.5),
                                      ("average", "average", 1.0)):
            tag = f"nan-bits-{dt.name}-{count}-{variant}"
            y = tnt.allreduce(x, op=op, prescale=prescale, name=tag)
            results[tag] = digest(y)
            if not np.isnan(y[::3].astype(np.float32)).all():
                failures.append(f"{tag}: a NaN did not propagate")
            inplace = x.copy()
            tnt.allreduce(inplace, op=op, prescale=prescale, out=inplace, name=f"{tag}-in-place")
            results[f"{tag}-in-place"] = digest(inplace)

# non-integer data: rounding differs from NumPy's order, but must be the same
# bits on every rank and on every run
for dtype in dtypes:
    dt = np.dtype(dtype)
    if not is_float(dt):
        continue
    x = np.random.default_rng([1234, rank]).standard_normal(100_003).astype(dt)
    y = tnt.allreduce(x, name=f"random-{dt.name}")
    results[f"random-{dt.name}"] = digest(y)
    ref = sum(np.random.default_rng([1234, q]).standard_normal(100_003).astype(dt).astype(np.float64)
              for q in range(size))
    if not np.allclose(y.astype(np.float64), ref, rtol=0.05, atol=0.05 * size):
        failures.append(f"random-{dt.name} far from the float64 sum")

# async: several requests in flight at once, waited in reverse order
handles = [tnt.allreduce_async(np.full(1000, rank + i, np.float32), name=f"async-{i}") for i in range(20)]
for i, h in reversed(list(enumerate(handles))):
    check(f"async-{i}", h.wait(), np.full(1000, sum(q + i for q in range(size)), np.float32))
tnt.barrier()

# nested structures: one fused call (one request per dtype), the same structure back
Pair = collections.namedtuple("Pair", "first second")


class HasNumpy:  # stands for a framework tensor (TensorFlow's has .numpy())
    def __init__(self, array):
        self._array = array

    def numpy(self):
        return self._array


class HasArray:  # anything with the array interface
    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array


def nested(q):
    return {"w": [np.full((2, 3), q + 1, np.float32), (q + 0.5) * np.ones(4)],
            "b": Pair(np.arange(3, dtype=np.int32) * (q + 1), q + 1),
            "a": (float(q), HasNumpy(np.full(2, q, np.float32)), HasArray(np.full(3, q, np.int64)))}


def same(got, want, label):
    """Structure, leaf types and values (NaN == NaN)."""
    if isinstance(want, dict):
        if not isinstance(got, dict) or list(got) != list(want):
            return failures.append(f"{label}: got {type(got).__name__} {got!r}, want keys {list(want)}")
        return [same(got[k], want[k], f"{label}.{k}") for k in want]
    if isinstance(want, (list, tuple)):
        if type(got) is not type(want) or len(got) != len(want):
            return failures.append(f"{label}: got {type(got).__name__}, want {type(want).__name__}")
        return [same(g, w, f"{label}[{i}]") for i, (g, w) in enumerate(zip(got, want))]
    if type(got) is not type(want) or np.shape(got) != np.shape(want) or \
            np.asarray(got).dtype != np.asarray(want).dtype or \
            not np.array_equal(got, want, equal_nan=True):
        failures.append(f"{label}: got {type(got).__name__} {got!r}, want {type(want).__name__} {want!r}")


requests = collections.Counter()
for kind in ("_allreduce_async", "_allreduce_now"):  # what each dtype's request of a structure goes through
    def counted(*args, _real=getattr(collectives, kind), _kind=kind, **kwargs):
        requests[_kind] += 1
        return _real(*args, **kwargs)
    setattr(collectives, kind, counted)

everyone = sum(q + 1 for q in range(size))
want_sum = {"w": [np.full((2, 3), everyone, np.float32), sum(q + 0.5 for q in range(size)) * np.ones(4)],
            "b": Pair(np.arange(3, dtype=np.int32) * everyone, np.int64(everyone)),
            "a": (np.float64(sum(range(size))), np.full(2, sum(range(size)), np.float32),
                  np.full(3, sum(range(size)), np.int64))}
same(tnt.allreduce(nested(rank), name="nest-sum"), want_sum, "nested-allreduce")
if sum(requests.values()) != 4:  # the first blocking (_allreduce_now), the others async once it has completed
    failures.append(f"nested allreduce: {dict(requests)} requests, want one per dtype (4)")
same(TensorAllreducer(nested(0)).allreduce(nested(rank)), want_sum, "TensorAllreducer")
root = size - 1
want_root = nested(root)
want_root["a"] = (np.float64(root), np.full(2, root, np.float32), np.full(3, root, np.int64))
want_root["b"] = Pair(want_root["b"].first, np.int64(root + 1))
same(tnt.broadcast(nested(rank), root=root), want_root, "nested-broadcast")
# the original's form: ranks other than the root pass nothing
broadcaster = TensorBroadcaster(nested(rank), root_rank=root)
same(broadcaster.broadcast(nested(rank) if rank == root else None), want_root, "TensorBroadcaster")
# a scalar comes back a NumPy scalar from the original's classes, as it did there (a 0-d array,
# tnt.allreduce's, was refused by json.dumps and isinstance(v, float) in scripts written for it)
same(TensorAllreducer(0.5).allreduce(rank + 0.5), np.float64(sum(q + 0.5 for q in range(size))),
     "TensorAllreducer-scalar")
same(TensorAllreducer(1).allreduce(rank), np.int64(sum(range(size))), "TensorAllreducer-int")
same(TensorBroadcaster(float(rank), root).broadcast(float(rank) if rank == root else None),
     np.float64(root), "TensorBroadcaster-scalar")
# allgather: a different number of rows per rank, scalars become one row each
mine = {"rows": np.full((rank + 1, 2), rank, np.float32), "scalar": rank * 10, "empty": np.zeros((0, 3))}
want_gather = {"rows": np.concatenate([np.full((q + 1, 2), q, np.float32) for q in range(size)]),
               "scalar": np.array([q * 10 for q in range(size)], np.int64), "empty": np.zeros((0, 3))}
same(tnt.allgather(mine), want_gather, "nested-allgather")
same(TensorAllgatherer(mine).allgather(mine), want_gather, "TensorAllgatherer")
# rows of no elements: no data, but every rank's rows count (a (6, 0) result on 3 ranks, not (0, 0))
no_elems = np.zeros((sum(q + 1 for q in range(size)), 0, 2), np.float32)
same(tnt.allgather(np.zeros((rank + 1, 0, 2), np.float32)), no_elems, "allgather-rows-of-no-elements")
same(tnt.allgather_async(np.zeros((rank + 1, 0, 2), np.float32)).wait(), no_elems, "allgather-async-rows-of-no-elements")
same(tnt.allgather({"none": np.zeros((rank + 1, 0, 2), np.float32)}), {"none": no_elems}, "nested-rows-of-no-elements")
# NaN and Inf propagate; an empty structure is returned as is
special = [np.array([np.nan if rank == 0 else 1.0, np.inf, 1.0], np.float32), -np.inf if rank == size - 1 else 2.0]
same(tnt.allreduce(special), [np.array([np.nan, np.inf, size], np.float32),
                              np.float64(-np.inf)], "nan-inf")
same(tnt.allreduce({"x": [], "y": ()}), {"x": [], "y": ()}, "empty-structure")
# dict subclasses come back as themselves (they came back plain dicts: a defaultdict lost its factory)
ordered = tnt.allreduce(collections.OrderedDict([("z", 1.0), ("a", np.ones(2))]))
if type(ordered) is not collections.OrderedDict or list(ordered) != ["z", "a"] or ordered["z"] != size:
    failures.append(f"OrderedDict: got {type(ordered).__name__} {ordered!r}")
counts = tnt.broadcast(collections.defaultdict(list, {"n": np.full(2, rank, np.int32)}), root=0)
if type(counts) is not collections.defaultdict or counts.default_factory is not list or counts["new"] != [] or \
        counts["n"].tolist() != [0, 0]:
    failures.append(f"defaultdict: got {type(counts).__name__} {counts!r}")
try:  # keys that do not sort: say so (it was "'<' not supported between instances of 'str' and 'int'")
    tnt.allreduce({1: 1.0, "a": 2.0})
    failures.append("unsortable keys did not raise")
except TypeError as exc:
    if "keys that sort" not in str(exc) or "int, str" not in str(exc):
        failures.append(f"unsortable keys: {exc}")
for bad, name in ((["text"], "str"), ({"k": None}, "NoneType"), ([{1, 2}], "set")):
    try:
        tnt.allreduce(bad)
        failures.append(f"allreduce({bad!r}) did not raise")
    except TypeError as exc:
        if f"type {name}" not in str(exc):
            failures.append(f"allreduce({bad!r}): {exc}")
if "tensorflow" in sys.modules:
    failures.append("the framework-neutral collectives imported TensorFlow")

# Puts are asynchronous (transport interface 2): a buffer sent from may change the moment a
# collective returns, and the allgather writes over segments the reduce-scatter sent from. A
# transport or ring that let a send outlive the collective would hand the peers garbage here.
reuse = np.empty(min(big, 2 << 20) // 4, np.float32)
for i in range(12):
    reuse[:] = rank + 1 + i
    tnt.allreduce(reuse, out=reuse, name="reuse-at-once")  # in place: the allgather overwrites what was sent
    want = sum(q + 1 + i for q in range(size))
    if not np.all(reuse == want):
        failures.append(f"reuse-at-once {i}: {np.unique(reuse)[:4]} instead of {want}")
        break
    reuse[:] = np.nan  # at once: a send still in flight would carry this

stats = core.stats()
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "results": results, "failures": failures,
               "job": os.environ.get("TNT_JOB_ID"), "pair_swaps": stats["pair_swaps"],
               "bytes_streamed_far": stats["bytes_streamed_far"]}, f)
print(f"rank {rank}: {len(results)} results, {len(failures)} failures")
sys.exit(1 if failures else 0)
