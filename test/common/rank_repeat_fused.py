"""Run inside every rank (see test_fused_determinism.py): the same four
float32 gradients, under the same names, allreduced again and again as in
training steps, submitted in a different order on every rank with random
pauses in between, so that the core fuses them into different groups from one
step to the next. The inputs never change, so the bits of the results must not
change either. Prints one JSON line: the steps whose results differ from the
first step's, and how many different results there were.

    rank_repeat_fused.py STEPS
"""
import hashlib
import json
import random
import sys
import time

import numpy as np

import tarantella as tnt

steps = int(sys.argv[1])
rank = tnt.get_rank()
# 12 KiB each: alone, under the 16 KiB switch (the one-exchange algorithm);
# fused in twos or more, the ring
grads = [np.random.default_rng([7, rank, k]).standard_normal(n).astype(np.float32)
         for k, n in enumerate((3000, 3001, 2999, 3002))]
mine = random.Random(rank)
first, differing, seen = None, [], set()
for step in range(steps):
    order = list(range(len(grads)))
    mine.shuffle(order)
    handles = {}
    for k in order:
        handles[k] = tnt.allreduce_async(grads[k], name=f"grad{k}")
        if mine.random() < 0.5:
            time.sleep(mine.random() * 0.003)
    digest = hashlib.sha256(b"".join(handles[k].wait().tobytes() for k in range(len(grads)))).hexdigest()
    seen.add(digest)
    if first is None:
        first = digest
    elif digest != first:
        differing.append(step)
print(json.dumps({"rank": rank, "steps": steps, "differing": differing, "distinct": len(seen)}), flush=True)
