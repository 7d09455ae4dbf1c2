"""Run inside every rank (started by tntrun): every collective x every dtype x
the sizes of the issue, checked against a NumPy reference computed here, and a
digest of every result written to OUTDIR/rank<r>.json so that the test can
compare ranks and runs bit for bit."""
import hashlib
import json
import os
import sys

import numpy as np

import tarantella as tnt

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 needs ml_dtypes (installed with TensorFlow)
    BF16 = None

outdir = sys.argv[1]
big = int(os.environ.get("TNT_TEST_BIG_BYTES", 64 << 20))
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
    sizes = [0, 1, 17, 2 * size + 1, 1000 * size + 3, big // dt.itemsize]
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

with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "results": results, "failures": failures,
               "job": os.environ.get("TNT_JOB_ID")}, f)
print(f"rank {rank}: {len(results)} results, {len(failures)} failures")
sys.exit(1 if failures else 0)
