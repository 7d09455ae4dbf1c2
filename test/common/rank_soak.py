"""Run inside every rank (see test_soak.py): a randomized sequence of
collectives drawn from a seed that every rank shares, so that every rank makes
the same calls; each rank draws its own inputs from (seed, step, call, rank),
so every rank can compute every other rank's input and check each result
against a NumPy reference (integers and copies exactly, float sums within a
bound of the dtype's rounding). Asynchronous calls are submitted, polled and
waited for in a different order on every rank. Writes OUTDIR/rank<r>.json with
the count of checked collectives, the mismatches, and a digest of every step's
results, which the test compares across ranks bit for bit.

    rank_soak.py OUTDIR SEED MAX_STEPS BUDGET_S
"""
import hashlib
import json
import os
import random
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import config

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 needs ml_dtypes (installed with TensorFlow): that dtype is skipped
    ml_dtypes = BF16 = None

outdir, seed, max_steps, budget_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
rank, size = tnt.get_rank(), tnt.get_size()
DTYPES = [np.dtype(d) for d in (np.float16, np.float32, np.float64, np.int32, np.int64)] + ([BF16] if BF16 else [])
SMALL_BYTES = 16 * 1024  # the core's switch from one exchange to the ring (TNT_SMALL_ALLREDUCE_BYTES)
FUSION_BYTES = int(float(os.environ.get("TNT_FUSION_THRESHOLD_KB",
                                        config.BY_NAME["TNT_FUSION_THRESHOLD_KB"].default)) * 1024)
MAX_BYTES = 4 << 20


def is_float(dt):
    return dt.kind == "f" or dt == BF16


def eps(dt):
    return float((ml_dtypes.finfo(dt) if dt == BF16 else np.finfo(dt)).eps)


def tiny(dt):
    return float((ml_dtypes.finfo(dt) if dt == BF16 else np.finfo(dt)).smallest_subnormal)


def count_for(plan, dt, big=True):
    """An element count from the size classes of the brief: 0, 1, odd, around
    the small/ring switch, around the fusion threshold, up to a few MB."""
    e = dt.itemsize
    kinds = ["zero", "one", "odd", "switch", "fusion", "medium"] + (["large"] if big else [])
    kind = plan.choice(kinds)
    if kind == "zero":
        return 0
    if kind == "one":
        return 1
    if kind == "odd":
        return plan.randrange(3, 2002, 2)
    if kind == "switch":
        return SMALL_BYTES // e + plan.randint(-2, 2)
    if kind == "fusion":
        return max(0, FUSION_BYTES // e + plan.randint(-2, 2)) if big else SMALL_BYTES // e * 2 + plan.randint(-2, 2)
    if kind == "medium":
        return plan.randrange(SMALL_BYTES, 512 * 1024) // e
    return plan.randrange(512 * 1024, MAX_BYTES) // e


def data(dt, count, *key):
    """The input of one rank for one call: the same on every rank that asks."""
    rng = np.random.default_rng([seed, *key])
    if is_float(dt):
        return rng.standard_normal(count).astype(dt)
    return rng.integers(-1000, 1000, count).astype(dt)


# ---------------------------------------------------------------- one call
# Each call is described by a dict drawn from the shared plan; `submit` starts
# it on this rank and `check` compares its result with the reference.

def draw_call(plan, step, j, in_batch):
    kind = plan.choices(["allreduce", "broadcast", "allgather", "barrier"], [6, 2, 2, 1])[0]
    call = {"kind": kind, "key": (step, j),
            "name": f"soak-{step}-{j}" if plan.random() < 0.7 else None}
    if kind == "barrier":
        return call
    dt = plan.choice(DTYPES)
    call["dtype"] = dt
    if kind == "allreduce":
        call["count"] = count_for(plan, dt, big=not in_batch)
        call["op"] = plan.choice(["sum", "average"])
        # a per-rank weight (integers: whole factors, which truncation keeps exact)
        call["prescale"] = [1.0] * size if plan.random() < 0.6 else [
            plan.choice([1.0, 2.0, -1.0, 3.0]) if not is_float(dt) else plan.uniform(0.25, 2.0)
            for _ in range(size)]
        call["in_place"] = plan.random() < 0.3
    elif kind == "broadcast":
        call["count"] = count_for(plan, dt, big=not in_batch)
        call["root"] = plan.randrange(size)
        call["in_place"] = plan.random() < 0.3
    else:
        call["row_shape"] = plan.choice([(), (3,), (2, 5)])
        per_row = int(np.prod(call["row_shape"], dtype=np.int64))
        top = max(1, (256 * 1024 if in_batch else MAX_BYTES // size) // (per_row * dt.itemsize))
        call["rows"] = [plan.choice([0, 1, plan.randrange(top)]) for _ in range(size)]
    return call


def input_of(call, q):
    dt = call["dtype"]
    if call["kind"] == "allgather":
        rows = call["rows"][q]
        return data(dt, rows * int(np.prod(call["row_shape"], dtype=np.int64)), *call["key"], q).reshape(
            (rows, *call["row_shape"]))
    return data(dt, call["count"], *call["key"], q)


def submit(call):
    kind, name = call["kind"], call["name"]
    if kind == "barrier":
        return tnt.barrier_async(name=name)
    x = input_of(call, rank)
    call["mine"] = x.copy()  # to see that the input is left alone
    call["x"] = x
    if kind == "allreduce":
        return tnt.allreduce_async(x, op=call["op"], name=name, prescale=call["prescale"][rank],
                                   out=x if call["in_place"] else None)
    if kind == "broadcast":
        return tnt.broadcast_async(x, root=call["root"], name=name, out=x if call["in_place"] else None)
    return tnt.allgather_async(x, name=name)


def reference(call):
    """(expected array, tolerance array or None for an exact comparison)."""
    kind, dt = call["kind"], call["dtype"]
    if kind == "broadcast":
        return input_of(call, call["root"]), None
    if kind == "allgather":
        return np.concatenate([input_of(call, q) for q in range(size)]), None
    inputs = [input_of(call, q) for q in range(size)]
    pre = call["prescale"]
    if not is_float(dt):
        total = sum(np.trunc(x.astype(np.float64) * p).astype(np.int64) for x, p in zip(inputs, pre))
        if call["op"] == "average":
            total = total // size  # floor division, as the core's integer average
        return total.astype(dt), None
    terms = [x.astype(np.float64) * p for x, p in zip(inputs, pre)]
    ref = sum(terms) if terms else np.zeros(0)
    if call["op"] == "average":
        ref = ref / size
    # every scaling, addition and division rounds once in the dtype, by at most
    # eps/2 of a value bounded by the sum of magnitudes
    bound = sum(np.abs(t) for t in terms)
    tol = eps(dt) * ((size + 2) * bound + np.abs(ref)) + 4 * size * tiny(dt)
    return ref, tol


mismatches, checked, by_kind = [], 0, {}


def check(call, got, step_hash):
    global checked
    kind = call["kind"]
    label = f"step {call['key'][0]} call {call['key'][1]} {kind} name={call['name']}"
    checked += 1
    by_kind[kind] = by_kind.get(kind, 0) + 1
    step_hash.update(label.encode())
    if kind == "barrier":
        if got is not None:
            mismatches.append(f"{label}: barrier returned {got!r}")
        return
    label += f" {call['dtype'].name}"
    if not (kind == "allreduce" and call["in_place"]) and not (kind == "broadcast" and call["in_place"]):
        if not np.array_equal(call["x"].view(np.uint8), call["mine"].view(np.uint8)):
            mismatches.append(f"{label}: the input array changed")
    want, tol = reference(call)
    step_hash.update(np.ascontiguousarray(got).view(np.uint8).tobytes())
    if got.dtype != call["dtype"] or got.shape != want.shape:
        mismatches.append(f"{label}: got {got.dtype}{got.shape}, want {call['dtype']}{want.shape}")
        return
    if tol is None:  # bit for bit: an unsigned view of the same width compares the bits
        bits = np.dtype(f"u{call['dtype'].itemsize}")
        got, want = got.reshape(-1), want.astype(call["dtype"]).reshape(-1)
        bad = np.flatnonzero(got.view(bits) != want.view(bits))
        if bad.size:
            i = bad[0]
            mismatches.append(f"{label}{call.get('count', want.shape)}: {bad.size} elements differ, first {i}: "
                              f"got {got[i]!r}, want {want[i]!r}")
        return
    err = np.abs(got.astype(np.float64) - want)
    bad = np.flatnonzero(~(err <= tol))
    if bad.size:
        i = bad[0]
        mismatches.append(f"{label}[{call['count']}] op={call['op']} prescale={call['prescale']}: {bad.size} "
                          f"elements off, first {i}: got {got[i]!r}, want {want[i]!r} (tolerance {tol[i]:.3g})")


# ---------------------------------------------------------------- the steps

mine = random.Random(f"{seed}-{rank}")  # this rank's own order and timing
digests = []
start = time.monotonic()
step = 0
while step < max_steps:
    plan = random.Random(f"{seed}-{step}")  # the same on every rank
    h = hashlib.sha256()
    if plan.random() < 0.5:  # one blocking call
        call = draw_call(plan, step, 0, in_batch=False)
        check(call, submit(call).wait(), h)
    else:  # several requests in flight at once
        calls = [draw_call(plan, step, j, in_batch=True) for j in range(plan.randint(2, 8))]
        # named requests in any order; unnamed ones keep their relative order
        # (they are numbered in submission order), at random places among them
        order = [c for c in calls if c["name"]]
        mine.shuffle(order)
        pos = 0
        for c in (c for c in calls if not c["name"]):
            pos = mine.randint(pos, len(order))
            order.insert(pos, c)
            pos += 1
        handles = {}
        for c in order:
            handles[c["key"]] = submit(c)
            if mine.random() < 0.2:
                time.sleep(mine.random() * 0.002)  # let the engine cut the batch differently on every rank
        # poll some with test(), then wait for all in this rank's own order
        waits = calls[:]
        mine.shuffle(waits)
        results = {}
        for c in waits[: len(waits) // 2]:
            deadline = time.monotonic() + 60
            while not handles[c["key"]].test() and time.monotonic() < deadline:
                time.sleep(0.0005)
        for c in waits:
            results[c["key"]] = handles[c["key"]].wait()
        for c in calls:  # check (and hash) in the plan's order, the same on every rank
            check(c, results[c["key"]], h)
    digests.append(h.hexdigest()[:16])
    step += 1
    if step % 8 == 0:  # stop together: every rank must make the same calls
        over = np.array([time.monotonic() - start > budget_s], np.int32)
        if tnt.allreduce(over, name=f"soak-stop-{step}")[0]:
            break

with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "seed": seed, "steps": step, "checked": checked, "by_kind": by_kind,
               "bfloat16": BF16 is not None, "mismatches": len(mismatches), "first_mismatches": mismatches[:20],
               "digests": digests, "job": os.environ.get("TNT_JOB_ID"), "seconds": time.monotonic() - start}, f)
print(f"rank {rank}: seed {seed}, {step} steps, {checked} collectives checked, {len(mismatches)} mismatches")
sys.exit(1 if mismatches else 0)
