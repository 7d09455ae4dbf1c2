"""Run inside every rank (started by hand, see test_failures.py). MODE says
which rank misbehaves and how; every other rank reports, as one JSON line on
stdout, which error it got, the rank the error names, and how long it took."""
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import tarantella as tnt

mode = sys.argv[1]
if mode == "busy":
    # the master busy past TNT_TIMEOUT_S (a download) in its first Tarantella call: the section starts
    # the core, as a collective would, so that rank 1 waits for it in "warm-up" (it failed in its
    # set-up at TNT_TIMEOUT_S: rank 0 had not started); rank 1's warning is on a rank whose output
    # tntrun does not show, so the master says it is waited for
    with tnt.rank_only():
        if os.environ["TNT_RANK"] == "0":
            time.sleep(2 * float(os.environ["TNT_TIMEOUT_S"]))
rank, size = tnt.get_rank(), tnt.get_size()
victim = size - 1
x = np.ones(4 << 20, np.float32)  # 16 MB: a rank dies in the middle of moving it
if mode == "kill-one-round":
    # 64 KB under one name: cached after the first call, so its payload rides in the
    # negotiation message (over the network, a message above MPI's eager limit)
    x = np.ones(16 << 10, np.float32)


def report(exc, since):
    print(json.dumps({"rank": rank, "error": type(exc).__name__, "peer": getattr(exc, "rank", None),
                      "message": str(exc), "seconds": time.monotonic() - since}), flush=True)


tnt.allreduce(x, name="warm-up")
if mode == "thread-names":
    # Rank 1 starts one more thread first (a callback's, a data loader's), so Python names its
    # training thread "Thread-2 (train)" where rank 0's is "Thread-1 (train)": their unnamed calls,
    # named after the thread, never meet. Every rank reports the error it gets.
    if rank == 1:
        extra = threading.Thread(target=print, args=("an extra thread",))
        extra.start()
        extra.join()

    def train():
        since = time.monotonic()
        try:
            tnt.allreduce(np.ones(4, np.float32))
            print(json.dumps({"rank": rank, "error": None}), flush=True)
        except tnt.TarantellaError as exc:
            report(exc, since)

    trainer = threading.Thread(target=train)
    trainer.start()
    trainer.join()
    sys.exit(3)
start = time.monotonic()
try:
    for i in range(10_000):
        if rank == victim and i == 3:
            if os.environ.get("TNT_TEST_WEDGE_FILE"):  # test_mpi_transport.py's wedge: from now on
                open(os.environ["TNT_TEST_WEDGE_FILE"], "w").close()
            if mode == "kill":
                h = tnt.allreduce_async(x, name=f"step{i}")
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "kill-one-round":
                h = tnt.allreduce_async(x, name="step")
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "stop":
                h = tnt.allreduce_async(x, name=f"step{i}")
                os.kill(os.getpid(), signal.SIGSTOP)
            elif mode == "exception":
                raise ValueError("a bug in the user's script")
            elif mode == "busy":
                # alive and busy on its own (a save on the master) past TNT_TIMEOUT_S: the others
                # wait for it, while the TNT_BUSY_TIMEOUT_S bound holds
                with tnt.rank_only():
                    time.sleep(2 * float(os.environ["TNT_TIMEOUT_S"]))
            elif mode == "exit":  # the program's own failure status, no exception
                print(f"rank {rank} exits 4", file=sys.stderr, flush=True)
                sys.exit(4)
            elif mode == "crossed":
                # another collective where rank 0 waits in "step3": neither ever completes
                start = time.monotonic()
                tnt.allreduce(x, name="other")
            elif mode == "stall":
                # late beyond the bound: rank 0 gives up on "step3" and aborts, and
                # our own submission then fails at once
                time.sleep(float(os.environ["TNT_TIMEOUT_S"]) + 2)
        if rank == victim and i == 5 and mode == "busy":  # ... but not beyond TNT_BUSY_TIMEOUT_S
            with tnt.rank_only():
                time.sleep(float(os.environ["TNT_BUSY_TIMEOUT_S"]) + 4)
        start = time.monotonic()
        tnt.allreduce(x, name="step" if mode == "kill-one-round" else f"step{i}")
    print(json.dumps({"rank": rank, "error": None}), flush=True)
except tnt.TarantellaError as exc:
    report(exc, start)
    # later operations fail at once with the same cause
    t = time.monotonic()
    try:
        tnt.allreduce(x, name="after")
    except tnt.TarantellaError as exc2:
        print(json.dumps({"rank": rank, "later": type(exc2).__name__, "seconds": time.monotonic() - t}), flush=True)
    sys.exit(3)
