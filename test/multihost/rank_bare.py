"""Run on every rank that gaspi_run or srun starts by itself, without tntrun (test_gpi2_multihost.py,
test_slurm.py):
what the rank found (rank, size, local rank and size, job id, transport, host) and one
allreduce of its rank number, as JSON in OUTDIR/bare<rank>.json.

    rank_bare.py OUTDIR"""
import json
import os
import socket
import sys

import numpy as np

import tarantella as tnt
from tarantella.common import core

launcher_set = sorted(k for k in os.environ if k.startswith("TNT_RANK"))  # before init sets TNT_RANK_PID
tnt.init()
rank = tnt.get_rank()
total = tnt.allreduce(np.full(1000, rank + 1, np.float32), name="ranks")
with open(os.path.join(sys.argv[1], f"bare{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": tnt.get_size(), "local_rank": tnt.get_local_rank(),
               "local_size": tnt.get_local_size(), "host": socket.gethostname(),
               "transport": core.ffi().string(core.lib().tnt_transport_name()).decode(),
               "sum": float(total[0]), "tnt_env": launcher_set}, f)
