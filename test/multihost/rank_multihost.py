"""Run inside every rank of a job spread over the test bed's hosts (started by tntrun -H or
by mpirun directly), so that one launch checks many things:

1. every collective x dtype x awkward size (test/common/rank_collectives.py: results against
   NumPy, a digest of each in OUTDIR/rank<r>.json for the test to compare ranks bit for bit);
2. fusion: tensors of awkward sizes reduced one at a time, then submitted together (the core
   fuses them into one buffer, which takes the large-buffer path even for the small ones)
   give the same bits: the order of additions depends on the tensor alone; so does calling
   the same name again (cached: a small one goes in one round, its payload in the negotiation);
3. where the rank ran (host name, transport), in OUTDIR/host<r>.json.

    rank_multihost.py OUTDIR collectives [BIG_BYTES]
    rank_multihost.py OUTDIR kill        the job id in OUTDIR/job, then test/common/rank_failures.py
                                         kill: the last rank SIGKILLs itself in an allreduce, the
                                         others print what they raised (JSON on stdout); in a
                                         child, whose end this process shows 3 s later
    rank_multihost.py OUTDIR kill-one-round   the same in a cached 64 KB allreduce (on 2 x 2 it
                                         rides in the bit round, ride.h)
    rank_multihost.py OUTDIR init        only tnt.init(): its error, if any, in OUTDIR/init<r>.json (r: the
                                         engine's rank), then exit 3 after 3 s (a bare mpirun with
                                         settings that differ between hosts)
    rank_multihost.py OUTDIR early       the last rank ends (exit 0) before tnt.init(), the others call it
    rank_multihost.py OUTDIR early-after the last rank ends (exit 0) after one allreduce, the others make two
    rank_multihost.py OUTDIR early-master the same with rank 0

BIG_BYTES is an argument, not an environment variable: mpirun forwards only the variables
it is told to (-x) to other hosts."""
import hashlib
import json
import os
import runpy
import socket
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import core

outdir, mode = sys.argv[1], sys.argv[2]
COMMON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common")
if mode in ("kill", "kill-one-round"):
    # The rank runs in a child; this process, which the launcher watches, ends 3 s after it,
    # the same way: mpirun stops every rank as soon as one ends badly, and would otherwise
    # stop the survivors before they can show what they raised.
    with open(os.path.join(outdir, "job"), "w") as f:
        f.write(os.environ["TNT_JOB_ID"])
    child = os.fork()
    if child == 0:  # exits as any rank does (its SystemExit; Tarantella shuts down at exit)
        sys.argv = [os.path.join(COMMON, "rank_failures.py"), mode]
        runpy.run_path(sys.argv[0], run_name="__main__")
        sys.exit(0)
    _, status = os.waitpid(child, 0)
    time.sleep(3)
    if os.WIFSIGNALED(status):
        os.kill(os.getpid(), os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))
if mode in ("early", "early-after", "early-master"):
    last = int(os.environ["TNT_RANK"]) == (0 if mode == "early-master" else int(os.environ["TNT_SIZE"]) - 1)
    if last and mode == "early":
        print(f"rank {os.environ['TNT_RANK']} has no shard on {socket.gethostname()}", file=sys.stderr)
        sys.exit(0)  # its program had nothing to do (a finished shard, a wrong branch)
    tnt.init()
    for step in range(1 if last else 2):
        tnt.allreduce(np.ones(3, np.float32), name=f"step-{step}")
    if last:
        print(f"rank {os.environ['TNT_RANK']} left its loop early on {socket.gethostname()}", file=sys.stderr)
    sys.exit(0)
if mode == "init":
    try:
        tnt.init()
    except tnt.TarantellaError as exc:
        with open(os.path.join(outdir, f"init{os.environ['OMPI_COMM_WORLD_RANK']}.json"), "w") as f:
            json.dump({"host": socket.gethostname(), "error": type(exc).__name__, "message": str(exc)}, f)
        time.sleep(3)  # mpirun stops every rank once one ended badly: let the others write theirs
        sys.exit(3)
    sys.exit(0)
os.environ["TNT_TEST_BIG_BYTES"] = sys.argv[3] if len(sys.argv) > 3 else str(3 << 20)
tnt.init()
rank = tnt.get_rank()


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest()


# both sides of the 16 KB small-buffer path, and of the 256 KiB where a pair across 2 hosts stops
# swapping whole buffers and sums halves (allreduce_pair_direct.c): 20_000 float32 (80 KB) and 100_003
# float16 (200 KB) swap, 100_003 and 150_001 float32 (400, 600 KB) and 150_001 float16 (300 KB) go in halves;
# on 2 x 2 each position's slice is half of that
SIZES = [1, 17, 1000, 3001, 4099, 20_000, 100_003, 150_001]
ROUNDS = 4
alone, fused, failures = {}, {}, []
one_round = 0  # calls that took the one-round path (their payload in the negotiation)
bit_rounds = 0  # negotiation cycles that were one AND of readiness bits (cached names, no payload)
pair_sums = {}  # dtype: allreduces of a pair of ranks across 2 hosts in direct messages
for dtype in (np.float32, np.float16):
    pairs_before = core.stats()["pair_sums"]
    xs = [np.random.default_rng([77, rank, i]).standard_normal(n).astype(dtype) for i, n in enumerate(SIZES)]
    for i, x in enumerate(xs):
        alone[f"{np.dtype(dtype).name}-{i}"] = digest(tnt.allreduce(x, name=f"alone-{i}"))
    before, bits_before = core.stats()["one_round"], core.stats()["bit_rounds"]
    for i, x in enumerate(xs):  # the same names again: cached, so the small ones may go in one round
        key = f"{np.dtype(dtype).name}-{i}"
        for _ in range(3):
            if digest(tnt.allreduce(x, name=f"alone-{i}")) != alone[key]:
                failures.append(f"{key} (size {SIZES[i]}) called again differs from its first result")
    one_round += core.stats()["one_round"] - before
    bit_rounds += core.stats()["bit_rounds"] - bits_before
    for r in range(ROUNDS):  # submitted at once: fused in groups that differ from round to round
        handles = [tnt.allreduce_async(x, name=f"fused-{r}-{i}") for i, x in enumerate(xs)]
        for i, h in enumerate(handles):
            key = f"{np.dtype(dtype).name}-{i}"
            fused[key] = digest(h.wait())
            if fused[key] != alone[key]:
                failures.append(f"{key} (size {SIZES[i]}) fused in round {r} differs from its result alone")
    pair_sums[np.dtype(dtype).name] = core.stats()["pair_sums"] - pairs_before

# In place and larger than what a pair of ranks receives at once in place (allreduce_pair_direct.c:
# pieces of 8 MiB): 36 MB, an odd count, so the halves (and on 2 x 2 each rank's slice) differ in
# length. Small integers: exact in float32 whatever the order of additions.
index = np.arange(9_000_003)
x = ((index * 7 + rank * 3) % 13).astype(np.float32)
want = sum((index * 7 + q * 3) % 13 for q in range(tnt.get_size())).astype(np.float32)
tnt.allreduce(x, out=x, name="in-place-big")
if not np.array_equal(x, want):
    failures.append(f"in-place-big: {np.flatnonzero(x != want).size} elements differ, the first at "
                    f"{np.flatnonzero(x != want)[0]}")
del index, x, want

# fork(): a child that leaves normally (sys.exit: atexit handlers run in it) is no rank and
# must leave its parent's job alone. The mpi plugin's own atexit used to call MPI_Finalize
# in it: a segfault on one host, and across hosts the parent's peers lost it
if rank in (0, tnt.get_size() - 1):
    child = os.fork()
    if child == 0:
        sys.exit(0)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        failures.append(f"a forked child that exited normally ended with {os.waitstatus_to_exitcode(status)}")
if tnt.allreduce(np.ones(5, np.float32), name="after-fork")[0] != tnt.get_size():
    failures.append("the allreduce after a fork is wrong")

with open(os.path.join(outdir, f"host{rank}.json"), "w") as f:
    json.dump({"rank": rank, "host": socket.gethostname(), "local_rank": tnt.get_local_rank(),
               "transport": core.ffi().string(core.lib().tnt_transport_name()).decode(),
               "alone": alone, "failures": failures, "one_round": one_round,
               "bit_rounds": bit_rounds, "pair_sums": pair_sums}, f)

sys.argv = [os.path.join(COMMON, "rank_collectives.py"), outdir]
runpy.run_path(sys.argv[0], run_name="__main__")
