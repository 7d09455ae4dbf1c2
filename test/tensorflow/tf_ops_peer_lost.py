"""Rank 1 fails (tnt's abort, as an uncaught exception does) before a
collective inside a tf.function; rank 0's op must fail with a TensorFlow
error that names the failed rank, which collective_errors() (as tnt.Model's
fit uses it) raises as the PeerLostError itself (test_tf_ops.py). Rank 1 stays
alive until then, so that tntrun does not stop rank 0 first. Rank 2, if any,
catches the TensorFlow error as a custom training loop does, converting
nothing, and exits 0: the job's error must still be written at its exit."""
import sys
import time

import tensorflow as tf

import tarantella.tensorflow as tnt
from tarantella.common import core, errors
from tarantella.tensorflow import collective_ops, ops


@tf.function
def step(x):
    return tnt.allreduce(x, name="doomed")


step_input = tf.fill([4], 1.0)
ops.get()  # the ranks agree on the compiled ops (a collective) while both are alive
tnt.barrier()
if tnt.get_rank() == 1:
    core.abort("rank 1 fails on purpose")
    time.sleep(20)
    sys.exit(0)
if tnt.get_rank() == 2:
    try:
        step(step_input)
    except tf.errors.OpError as exc:
        print(f"RAW {type(exc).__name__}", flush=True)
        sys.exit(0)
try:
    with collective_ops.collective_errors():
        step(step_input)
except errors.TarantellaError as exc:
    cause = exc.__cause__
    print(f"CAUGHT {type(exc).__name__} rank={exc.rank}: {exc} FROM {type(cause).__name__}: "
          f"{' '.join(cause.message.split())}", flush=True)
    sys.exit(0)
print("NO ERROR", flush=True)
sys.exit(1)
