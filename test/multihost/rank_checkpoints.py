"""Run on every rank of 2 hosts x 2 ranks by test_keras_multihost.py: a custom loop's
tf.train.Checkpoint saves on every rank into one folder that both hosts share, as a serial
script makes them: a CheckpointManager's, and a write of one prefix read back at once (which
may read another rank's write of it: its step and weights must still agree). Prints one JSON
line per rank: what failed (nothing, when the ranks of both hosts write one after the other).
"""
import json
import sys

import numpy as np
import tensorflow as tf

import tarantella as tnt
import tarantella.tensorflow  # noqa: F401 - the frontend, as a custom loop's tnt.data or tnt.DistributedOptimizer loads it

folder, saves = sys.argv[1], int(sys.argv[2])
tnt.init()
weights = tf.Variable(np.zeros(200_000, np.float32))
step = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(weights=weights, step=step)
manager = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=2)
# the fixed prefix's own object: a read of another rank's write of it, a few steps apart, must
# not move the manager's save counter (a serial script reads its own)
fixed = tf.train.Checkpoint(weights=weights, step=step)
failed = []
for i in range(1, saves + 1):
    weights.assign(np.full(200_000, i, np.float32))
    step.assign(i)
    try:
        manager.save()
        fixed.write(f"{folder}/fixed")
        fixed.read(f"{folder}/fixed").assert_consumed()
        got = weights.numpy()
        if not (got[0] == got[-1] == step.numpy()):
            failed.append(f"save {i}: read a torn checkpoint (step {step.numpy()}, {got[0]} .. {got[-1]})")
    except Exception as exc:  # TensorFlow's MergeV2Checkpoints / NotFoundError of a race
        failed.append(f"save {i}: {type(exc).__name__}: {str(exc)[:300]}")
tnt.barrier()  # every rank has saved its last: the manager's latest is step `saves` on every rank
checkpoint.restore(manager.latest_checkpoint).assert_consumed()
if not (weights.numpy()[0] == weights.numpy()[-1] == step.numpy() == saves):
    failed.append(f"the last checkpoint holds step {step.numpy()}, weights {weights.numpy()[0]}")
print("CHECKPOINTS " + json.dumps({"rank": tnt.get_rank(), "failed": failed}), flush=True)
