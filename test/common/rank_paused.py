"""A rank of the pause tests: rank 1 computes (waits for the file argv[1], which the test
makes once it has stopped every rank for longer than TNT_TIMEOUT_S and continued them)
while rank 0 waits for it in a collective."""
import os
import sys
import time

import numpy as np

import tarantella as tnt

x = np.ones(4, np.float32)
tnt.allreduce(x, name="warm-up")
print("UP", tnt.get_rank(), os.getpid(), flush=True)
if tnt.get_rank() == 1:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
print("DONE", tnt.allreduce(x, name="across-the-pause").tolist(), flush=True)
