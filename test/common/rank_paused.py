"""A rank of the pause tests: rank 1 computes (waits for the file argv[1], which the test
makes once it has stopped every rank for longer than TNT_TIMEOUT_S and continued them)
while rank 0 waits for it in a collective. With "own-handler" in argv[2:], rank 0 installs a
SIGCONT handler of its own after tnt.init() (Python's signal.signal), which must still run. With
"bounded-wait", rank 0 waits in Handle.wait(timeout=2.5) instead, and meanwhile, in a thread, for
the checkpoint lock argv[3] (tf.train.Checkpoint's, checkpoint_writes.py) that the test holds, with
TNT_BUSY_TIMEOUT_S=2.5; rank 1 calls in, and the test frees the lock, 0.5 s after the continuation:
neither bound, shorter than the pause, may count it."""
import os
import signal
import sys
import time

import numpy as np

import tarantella as tnt

# both ranks imported before either starts the job: its set-up has only TNT_TIMEOUT_S=3, which a
# loaded machine's import skew between the two processes could use up (rank 0 then failed before "UP")
with open(f"{sys.argv[1]}.ready{os.environ.get('TNT_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0'))}", "w"):
    pass
began = time.monotonic()
while not all(os.path.exists(f"{sys.argv[1]}.ready{r}") for r in range(2)) and time.monotonic() - began < 120:
    time.sleep(0.01)
x = np.ones(4, np.float32)
tnt.allreduce(x, name="warm-up")
conts = []
own_handler, bounded = "own-handler" in sys.argv[2:], "bounded-wait" in sys.argv[2:]
if own_handler and tnt.get_rank() == 0:
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
    if bounded:
        time.sleep(0.5)  # time that counts, after the pause: rank 0's bound must not have passed in it
if bounded and tnt.get_rank() == 0:
    import fcntl
    import importlib.util
    import threading

    # the module alone: tarantella.tensorflow's package imports TensorFlow (seconds per rank)
    spec = importlib.util.spec_from_file_location(
        "checkpoint_writes", os.path.join(os.path.dirname(tnt.__file__), "tensorflow", "checkpoint_writes.py"))
    checkpoint_writes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checkpoint_writes)
    os.environ["TNT_BUSY_TIMEOUT_S"] = "2.5"  # the lock's bound (the core read its own at tnt.init)
    fd, locked = os.open(sys.argv[3], os.O_RDWR), []

    def lock():
        try:
            checkpoint_writes._lock(fd, fcntl.LOCK_EX, sys.argv[3])
            locked.append("LOCKED")
        except Exception as exc:  # noqa: BLE001 - reported below
            locked.append(f"{type(exc).__name__}: {exc}")

    locking = threading.Thread(target=lock)
    locking.start()
    done = tnt.allreduce_async(x, name="across-the-pause").wait(timeout=2.5)
    locking.join()
    print("LOCK", locked, flush=True)
else:
    done = tnt.allreduce(x, name="across-the-pause")
print("DONE", done.tolist(), flush=True)
# and in a file: mpirun's forwarding of output has lost a rank's line (test_mpi_transport.py)
with open(f"{sys.argv[1]}.done{tnt.get_rank()}", "w") as out:
    out.write(f"DONE {done.tolist()}")
if own_handler and tnt.get_rank() == 0:
    print("OWN HANDLER RAN", len(conts) > 0, flush=True)
