"""Many short jobs whose last call is a broadcast (see test_last_broadcast.py).

In each job, every rank makes one allreduce, then a broadcast from rank 0 as
its last call, then exits normally. Rank 0, the root, has nothing to wait for
and leaves first; the others come to the broadcast a few random milliseconds
late, so they are still inside it when rank 0 exits. Every rank must still
finish it and exit 0. Rank r also runs at niceness 5r, which makes the
race with today's core three times likelier on a loaded 2-core machine.

    rank_last_broadcast.py LAUNCHES RANKS OUTDIR

To keep a launch cheap, this process imports NumPy and Tarantella once and
forks the ranks of each job from itself (with a fresh TNT_JOB_ID each time,
and before any core is started here): a rank is a new process that runs
main() and leaves through the interpreter's normal exit, as a script does.
One JSON line per job on stdout: the exit status of every rank, and the
output of the ranks that failed."""
import json
import os
import random
import secrets
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import core

# 1.2 and 2.1 MB: several shared-memory pieces (TNT_SHM_SLOT_KB, 256 KiB), so
# the ranks at the end of the chain are still receiving when the root leaves
# (one piece made the race ten times rarer on 2 cores)
SIZES = (300_000, 520_000)


def main(count, seed):
    rank, size = tnt.get_rank(), tnt.get_size()
    total = tnt.allreduce(np.full(4, rank + 1, np.int64), name="first")
    assert (total == size * (size + 1) // 2).all(), total
    if rank != 0:
        time.sleep(random.Random(f"{seed}-{rank}").random() * 0.005)
    got = tnt.broadcast(np.full(count, rank + 1, np.float32), root=0, name="last")
    assert got.shape == (count,) and (got == 1).all(), got[:4]


def launch(n, count, seed, outdir):
    """One job of n forked ranks; returns (exit statuses, output of the failed ranks)."""
    job = secrets.token_hex(16)
    pids = []
    for r in range(n):
        log = os.path.join(outdir, f"job{seed}-rank{r}.log")
        pid = os.fork()
        if pid == 0:  # the rank: errors leave through Tarantella's excepthook, as in a script
            os.environ.update(TNT_RANK=str(r), TNT_SIZE=str(n), TNT_LOCAL_RANK=str(r), TNT_LOCAL_SIZE=str(n),
                              TNT_JOB_ID=job)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.nice(5 * r)  # the later in the chain, the later scheduled: the root leaves first
            main(count, seed)
            sys.exit(0)
        pids.append((pid, log))
    codes, errors = [], {}
    for r, (pid, log) in enumerate(pids):
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        codes.append(code)
        if code != 0:
            with open(log) as f:
                errors[r] = f.read()[-2000:]
    return job, codes, errors


if __name__ == "__main__":
    launches, n, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    core.lib()  # load the extension once, before forking; the core itself starts in each rank
    for i in range(launches):
        job, codes, errors = launch(n, SIZES[i % len(SIZES)], i, outdir)
        print(json.dumps({"launch": i, "job": job, "codes": codes, "errors": errors}), flush=True)
