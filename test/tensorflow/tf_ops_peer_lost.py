"""Rank 1 dies before a collective inside a tf.function; rank 0's op must fail
with a TensorFlow error that names the lost rank (test_tf_ops.py)."""
import os
import sys

import tensorflow as tf

import tarantella.tensorflow as tnt


@tf.function
def step(x):
    return tnt.allreduce(x, name="doomed")


step_input = tf.fill([4], 1.0)
tnt.barrier()
if tnt.get_rank() == 1:
    os._exit(3)
try:
    step(step_input)
except tf.errors.OpError as exc:
    print(f"CAUGHT {type(exc).__name__}: {exc.message.splitlines()[0]}", flush=True)
    sys.exit(0)
print("NO ERROR", flush=True)
sys.exit(1)
