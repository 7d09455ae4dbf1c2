"""Run inside every rank under mpirun (test_mpi_transport.py): three cycles of
tnt.init(), collectives, tnt.shutdown(), back to back, so that the last
messages of one cycle (a goodbye) are still in flight when the next starts.
With mpi4py installed, MPI is initialized by mpi4py first and used beside
Tarantella, as an application would."""
import json

import numpy as np

try:
    from mpi4py import MPI
except ImportError:
    MPI = None

import tarantella as tnt

for cycle in range(6):
    tnt.init()
    rank, size = tnt.get_rank(), tnt.get_size()
    for n in (1000, 100_000):  # the exchange path, then the ring
        x = tnt.allreduce(np.full(n, rank + cycle, np.float32), name=f"cycle{cycle}-{n}")
        want = sum(q + cycle for q in range(size))
        assert x[0] == want and x[-1] == want, (cycle, n, x[0], want)
    tnt.barrier(name=f"cycle{cycle}-end")  # every rank shuts down at once
    if MPI is not None:
        assert MPI.COMM_WORLD.allreduce(1) == size
    tnt.shutdown()
print(json.dumps({"rank": rank, "ok": True, "mpi4py": MPI is not None}), flush=True)
