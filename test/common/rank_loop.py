"""Run inside every rank: say who we are, then allreduce until stopped."""
import os

import numpy as np

import tarantella as tnt

rank = tnt.get_rank()
print(f"READY {rank} {os.getpid()} {os.environ['TNT_JOB_ID']}", flush=True)
x = np.ones(1 << 20, np.float32)
i = 0
while True:
    tnt.allreduce(x, name=f"loop{i % 7}")
    i += 1
