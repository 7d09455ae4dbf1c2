"""Two ranks, one on the compiled ops and one on the NumPy API, under the same
names (test_tf_ops.py): one rank's tf.function meets another's eager call,
whose collectives are the NumPy API's. Arrays
of one shape must pair (both sides carry the same shape layout,
tnt_shape_layout); arrays of another shape but as many elements must fail
with a MismatchError on both sides that names both shapes."""
import sys

import numpy as np
import tensorflow as tf

import tarantella as tnp
import tarantella.tensorflow as tnt
from tarantella.common import errors
from tarantella.tensorflow import ops

rank = tnt.get_rank()
# First of all, before either rank has asked for the compiled ops: a named tnt.allreduce traced on
# rank 0 and called eagerly on rank 1 (a custom loop traced on some ranks only). The trace's choice of
# path is a collective of every rank ("tnt.tf_ops.agree"), which the eager rank made nowhere: both
# waited until TNT_TIMEOUT_S (rank 0 in the agreement, rank 1 in the call).
first = tf.constant([1.0, 2.0]) * (rank + 1)
first_call = (lambda: tnt.allreduce(first, name="first-ever"))
first_got = (tf.function(first_call) if rank == 0 else first_call)().numpy().tolist()
assert first_got == [3.0, 6.0], f"FAILED the first call, traced on rank 0 only: {first_got!r}"
compiled = ops.get()
assert compiled is not None, "the compiled ops cannot be built here"


def call(kind, array, name):
    """rank 0: the compiled op; rank 1: the NumPy API."""
    if rank == 0:
        try:
            return compiled.run(kind, [tf.constant(array)], [name])[0].numpy()
        except tf.errors.OpError as exc:
            raise ops.tarantella_error(exc) or exc
    return getattr(tnp, kind)(array, name=name)


six = np.arange(6, dtype=np.float32)
same = {"allreduce": (2, 3), "broadcast": (2, 3), "allgather": (1, 2, 3)}
other = {"allreduce": (2, 3) if rank == 0 else (3, 2), "broadcast": (2, 3) if rank == 0 else (3, 2),
         "allgather": (1, 2, 3) if rank == 0 else (1, 3, 2)}
want = {"allreduce": 2 * six.reshape(2, 3), "broadcast": six.reshape(2, 3),
        "allgather": np.concatenate([six.reshape(1, 2, 3)] * 2)}
failures = 0
for kind in ("allreduce", "broadcast", "allgather"):
    got = call(kind, six.reshape(same[kind]), f"alike-{kind}")
    if not (got.shape == want[kind].shape and (got == want[kind]).all()):
        print(f"FAILED {kind} of one shape: {got!r}", flush=True)
        failures += 1
    try:
        call(kind, six.reshape(other[kind]), f"unlike-{kind}")
        print(f"FAILED {kind} of other shapes: no error", flush=True)
        failures += 1
    except errors.MismatchError as exc:
        if "shape (2, 3)" not in str(exc) or "shape (3, 2)" not in str(exc):
            print(f"FAILED {kind} of other shapes: {exc}", flush=True)
            failures += 1
# rows of no elements: their data is no bytes, so each side sends its row count (the op's
# result had no rows at all: (0, 0, 2) where the NumPy API gave (5, 0, 2)); rows of another
# shape are still a MismatchError on both sides
# Rank 1 comes late: rank 0's op holds its row count for as long as the core may read it (the
# wait's op let it go, and it sent what came to lie there: (22948089398, 0, 2) now and then,
# every time with rank 1 late)
if rank == 1:
    import time

    time.sleep(0.5)
got = call("allgather", np.zeros((3 if rank == 0 else 2, 0, 2), np.float16), "no-elements")
if got.shape != (5, 0, 2) or got.dtype != np.float16:
    print(f"FAILED allgather of rows of no elements: {got.shape} {got.dtype}", flush=True)
    failures += 1
try:
    call("allgather", np.zeros((3, 0, 2 if rank == 0 else 3), np.float32), "no-elements-unlike")
    print("FAILED allgather of rows of no elements, of other shapes: no error", flush=True)
    failures += 1
except errors.MismatchError:
    pass
# A wait for a late peer delays no other wait: rank 0's thread waits (on the compiled ops) for a
# request rank 1 submits only after 100 others, which the main threads make meanwhile. One
# completion thread served every wait, blocking 1 s at a time on the oldest while it was alone:
# each of the 100 waited up to 1 s for that slice to end (4 ops in 3 s, where 1383 ran without
# the pending one), so the loop took minutes, and the pending request failed at TNT_TIMEOUT_S.
import threading
import time

pending = []
if rank == 0:
    waiter = threading.Thread(target=lambda: pending.append(call("allreduce", np.ones(4, np.float32), "late")))
    waiter.start()
began = time.monotonic()
for i in range(100):
    got = call("allreduce", np.full(3, i, np.int64), f"meanwhile-{i}")
    if not (got == 2 * i).all():
        print(f"FAILED allreduce meanwhile-{i}: {got!r}", flush=True)
        failures += 1
took = time.monotonic() - began
if took > 30:  # well inside TNT_TIMEOUT_S (60 s): without the pending request, about 0.1 s
    print(f"FAILED 100 allreduces beside a pending one took {took:.0f} s", flush=True)
    failures += 1
if rank == 0:
    waiter.join()
    if len(pending) != 1 or not (pending[0] == 2).all():
        print(f"FAILED the pending allreduce: {pending!r}", flush=True)
        failures += 1
else:
    call("allreduce", np.ones(4, np.float32), "late")
# tnt.allreduce / broadcast / allgather (tarantella.tensorflow) traced into a tf.function on rank 0
# and run eagerly on rank 1 (run_eagerly=True on one rank, a custom loop traced on some ranks):
# each call pairs with the same call on the other rank, named or not, once or in a loop. A named
# call was "<name>.0" traced on the compiled ops and "<name>" eagerly, an unnamed one
# "tf.allreduce.<function>.0" traced and "allreduce.<k>" eagerly: both ranks waited until
# TNT_TIMEOUT_S for partners that never came.
v = tf.constant([1.0, 2.0]) * (rank + 1)
n = tf.constant([3, 4], tf.int64) * (rank + 1)
g = tf.reshape(tf.range(2 * (rank + 1), dtype=tf.float32), [rank + 1, 2])
cases = {
    "named": lambda: tnt.allreduce(v, name="mixed-x"),
    "named-average": lambda: tnt.allreduce(v, op="average", name="mixed-avg"),
    "named-structure": lambda: tnt.allreduce({"a": v, "b": n}, name="mixed-s"),
    "named-broadcast": lambda: tnt.broadcast([v, n], root=1, name="mixed-b"),
    "named-allgather": lambda: tnt.allgather({"g": g, "n": n}, name="mixed-g"),
    "named-allgather-one": lambda: tnt.allgather(g, name="mixed-g1"),
    "unnamed": lambda: tnt.allreduce(v),
    "unnamed-two": lambda: (tnt.allreduce(n), tnt.allgather(g), tnt.broadcast(v, root=1)),
    "unnamed-structure": lambda: tnt.allreduce((v, n)),
}
want = {
    "named": [3.0, 6.0], "named-average": [1.5, 3.0], "named-structure": {"a": [3.0, 6.0], "b": [9, 12]},
    "named-broadcast": [[2.0, 4.0], [6, 8]], "named-allgather": {"g": [[0, 1], [0, 1], [2, 3]], "n": [3, 4, 6, 8]},
    "named-allgather-one": [[0, 1], [0, 1], [2, 3]], "unnamed": [3.0, 6.0],
    "unnamed-two": [[9, 12], [[0, 1], [0, 1], [2, 3]], [2.0, 4.0]], "unnamed-structure": [[3.0, 6.0], [9, 12]],
}


def plain(x):
    if isinstance(x, dict):
        return {k: plain(x[k]) for k in x}
    if isinstance(x, (list, tuple)):
        return [plain(i) for i in x]
    return np.asarray(x).tolist()


for key, case in cases.items():
    run = tf.function(case, autograph=False) if rank == 0 else case
    for i in range(3):  # a loop: the function traced once and run 3 times, against 3 eager calls
        try:
            got = plain(run())
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            got = f"{type(exc).__name__}: {exc}"[:300]
        if got != want[key]:
            print(f"FAILED {key} traced on rank 0, eager on rank 1 (call {i}): {got!r}", flush=True)
            failures += 1
# The gradient averaging on the numpy_function path (TNT_TF_OPS=numpy, or no compiler): a step
# whose wait never runs (an op between its buckets' starts and its wait fails, on every rank)
# kept its requests, their buffers and handles in collective_ops._steps for good, one more
# gradient-sized leak at every such step; the next step of the name now lets them go (released
# once the core is done with them).
from tarantella.tensorflow import collective_ops

real_get = collective_ops.tf_ops.get
collective_ops.tf_ops.get = lambda: None  # the numpy_function path for weighted_average
try:
    big = tf.ones([300_000])  # 1.2 MB each: two buckets, the first started before the second's input fails

    def late_nan_check(x):  # a gradient whose computation fails late: after the other bucket started
        time.sleep(0.5)
        if np.isnan(x).any():
            raise ValueError("a NaN gradient")
        return x

    @tf.function(autograph=False)
    def grads_step(bad):
        checked = tf.numpy_function(late_nan_check, [big * bad], tf.float32, stateful=False)
        return collective_ops.weighted_average([tf.reshape(checked, big.shape), big * 1.0], name="tnt.grads.stale")

    for bad in (np.nan, np.nan, 1.0):
        try:
            got = grads_step(tf.constant(bad, tf.float32))
        except tf.errors.OpError as exc:
            if "a NaN gradient" not in str(exc):
                raise
    if not (float(got[0][0]) == float(got[1][0]) == 1.0):
        print(f"FAILED the gradient averaging after failed steps: {got!r}", flush=True)
        failures += 1
    if collective_ops._steps:
        print(f"FAILED steps left behind by failed steps: {collective_ops._steps!r}", flush=True)
        failures += 1
finally:
    collective_ops.tf_ops.get = real_get
print("OK" if not failures else f"{failures} FAILED", flush=True)
sys.exit(1 if failures else 0)
