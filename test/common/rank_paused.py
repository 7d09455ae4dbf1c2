"""A rank of the pause tests: rank 1 computes (waits for the file argv[1], which the test
makes once it has stopped every rank for longer than TNT_TIMEOUT_S and continued them)
while rank 0 waits for it in a collective. With argv[2], rank 0 installs a SIGCONT handler of
its own after tnt.init() (Python's signal.signal), which must still run."""
import os
import signal
import sys
import time

import numpy as np

import tarantella as tnt

x = np.ones(4, np.float32)
tnt.allreduce(x, name="warm-up")
conts = []
if len(sys.argv) > 2 and tnt.get_rank() == 0:
    # it replaces the core's handler, which the core puts back in front of it (pause.c):
    # a moment for that, as for a program that does not stop at once
    signal.signal(signal.SIGCONT, lambda signum, frame: conts.append(signum))
    time.sleep(1.5)
print("UP", tnt.get_rank(), os.getpid(), flush=True)
# and a file beside argv[1]: under mpirun the line comes through its forwarding of output,
# which may hold it (or lose it), while rank 0 waits for rank 1 only TNT_TIMEOUT_S
with open(f"{sys.argv[1]}.up{tnt.get_rank()}", "w") as up:
    up.write(str(os.getpid()))
if tnt.get_rank() == 1:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
print("DONE", tnt.allreduce(x, name="across-the-pause").tolist(), flush=True)
if len(sys.argv) > 2 and tnt.get_rank() == 0:
    print("OWN HANDLER RAN", len(conts) > 0, flush=True)
