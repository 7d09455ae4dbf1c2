"""Run inside every rank of a job over a network transport (mpi, gpi2): there a
cached allreduce of up to 64 KiB rides with its bit for up to 4 ranks (one
network latency instead of the ring's 2(N-1)), a larger one takes the ring,
and both give the sum; under Open MPI, the TCP eager limit that the plugin
sets unless the environment does. Writes OUTDIR/rank<r>.json."""
import ctypes
import json
import os
import sys

import numpy as np

import tarantella as tnt
from tarantella.common import core

rank, size = tnt.get_rank(), tnt.get_size()


def loop(count, calls):
    x = np.full(count, rank + 1, np.float32)
    want = sum(q + 1 for q in range(size))
    for _ in range(60):  # unnamed calls cycle through 60 names: announced once, then cached
        tnt.allreduce(x)
    before = core.stats()
    ok = all(bool(np.all(tnt.allreduce(x) == want)) for _ in range(calls))
    after = core.stats()
    return ok, after["one_round"] - before["one_round"]


mid_ok, mid_one_round = loop(16384, 40)  # 64 KiB
big_ok, big_one_round = loop(16385, 5)  # one element more: the ring
# the process's environment as MPI read it (os.environ is Python's copy from start-up)
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
eager = getenv(b"OMPI_MCA_btl_tcp_eager_limit")
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "mid_ok": mid_ok, "mid_one_round": mid_one_round, "big_ok": big_ok,
               "big_one_round": big_one_round, "eager_limit": eager and eager.decode()}, f)
