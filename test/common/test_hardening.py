"""The core's hardening: settings every rank must share, jobs that share an id,
numbers (float16/int averages, bits independent of fusion), names, fork and
lifecycle. One 3-rank launch checks the in-job items (rank_hardening.py)."""
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

import pytest

from core_helpers import HERE, clean_env, shm_objects, tntrun

CHECKS = ["float16-average-no-overflow", "integer-average-exact", "nul-name-refused",
          "fusion-independent-bits", "unnamed-calls-hit-the-cache", "nested-structures-that-differ-fail",
          "shapes-that-differ-fail", "unnamed-structure-waits-for-its-name", "ctrl-c-in-the-wait-for-a-names-earlier-call-keeps-it", "rows-of-no-elements-are-one-request", "ctrl-c-in-a-blocking-call-keeps-its-buffers", "fork-child-is-not-a-rank",
          "workers-started-before-init-are-not-ranks",
          "bounded-wait-says-still-pending", "ctrl-c-ends-a-wait-with-a-timeout", "wait-after-shutdown-raises", "handle-from-before-shutdown-refused-after-init",
          "unnamed-calls-numbered-afresh-after-init",
          "collective-in-an-exit-handler-registered-before-the-first-call"]


def test_in_job_checks_on_3_ranks():
    res = tntrun(3, "rank_hardening.py", env={"TNT_TIMEOUT_S": 60}, runner_args=["--output-on-all-devices"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    for check in CHECKS:
        assert res.stdout.count(f"ok {check}") == 3, (check, res.stdout[-3000:])


FORK_MID_IMPORT = """
import importlib._bootstrap, os, signal, threading
import numpy as np
import tarantella as tnt
tnt.init()
# a thread in the middle of importing tarantella.common.collectives (lazily, at its first tnt.allreduce
# just after it started) holds that module's import lock when another thread forks
held, release = threading.Event(), threading.Event()
def importing():
    with importlib._bootstrap._ModuleLockManager("tarantella.common.collectives"):
        held.set()
        release.wait()
threading.Thread(target=importing, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(30)  # the lock's owner does not exist in the child: a wait on it never ends
    try:
        tnt.allreduce(np.ones(2))
    except tnt.InvalidUsageError as exc:
        print("child:", exc, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
release.set()
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_child_forked_while_a_thread_imports_the_collectives_fails_clearly():
    """A fork() while another thread was inside the lazy import of tarantella.common.collectives left the
    child waiting forever on that import's lock at its first tnt.* call. tnt.init() imports it now."""
    res = subprocess.run([sys.executable, "-c", FORK_MID_IMPORT], env=clean_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "child exit 0" in res.stdout and "forked child" in res.stdout, res.stdout + res.stderr[-3000:]


FORK_DURING_INIT = """
import os, signal, threading, time
import tarantella as tnt
# a thread starts the core (it waits in tnt.init for rank 1, who never comes) while the main
# thread forks (a data loader's workers)
threading.Thread(target=tnt.init, daemon=True).start()
deadline = time.monotonic() + 60
while not os.path.exists("/dev/shm/tnt-" + os.environ["TNT_JOB_ID"]) and time.monotonic() < deadline:
    time.sleep(0.01)  # until the thread is inside tnt.init's set-up (its segment is there)
pid = os.fork()
if pid == 0:
    signal.alarm(30)  # the parent's init thread held the locks of tnt.init: a wait on them never ended
    try:
        tnt.get_rank()
    except tnt.InvalidUsageError as exc:
        print("child:", exc, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_child_forked_while_another_thread_waits_in_init_fails_clearly():
    """A fork() while another thread waited in tnt.init() left the child's first tnt.* call waiting
    forever for the locks that thread held (a thread the child does not have). It fails as a forked
    child's call does."""
    job = secrets.token_hex(16)
    res = subprocess.run([sys.executable, "-c", FORK_DURING_INIT], capture_output=True, text=True, timeout=120,
                         env=clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID=job, TNT_TIMEOUT_S=60))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "child exit 0" in res.stdout and "cannot be used in a forked child process" in res.stdout, \
        res.stdout + res.stderr[-3000:]
    assert_void_mark_left(job)  # the parent ended while its thread waited (its mark for rank 1)


# A thread of the script starts the core, its outcome in `failed`, while the main thread shuts the
# core down (SHUTDOWN_DURING_INIT, SHUTDOWN_WHILE_INIT_PREPARES)
INIT_IN_A_THREAD = """
def start():
    try:
        tnt.init()
        failed.append(None)
    except tnt.TarantellaError as exc:
        failed.append(f"{type(exc).__name__}: {exc}")
waiting = threading.Thread(target=start)
waiting.start()
"""

SHUTDOWN_DURING_INIT = """
import json, os, threading, time
import tarantella as tnt
failed = []
""" + INIT_IN_A_THREAD + """deadline = time.monotonic() + 60
while not os.path.exists("/dev/shm/tnt-" + os.environ["TNT_JOB_ID"]) and time.monotonic() < deadline:
    time.sleep(0.01)  # until the thread waits in tnt.init's set-up for rank 1, who is not started yet
tnt.shutdown()  # a watchdog giving up on the start
waiting.join()
print(json.dumps({"init": failed}), flush=True)
tnt.init()  # and starting again, once rank 1 is there
print(json.dumps({"size": tnt.get_size()}), flush=True)
"""


def test_shutdown_while_another_thread_waits_in_init_ends_that_wait():
    """tnt.shutdown() while another thread waited in tnt.init() for the other ranks waited for that
    init until TNT_TIMEOUT_S (300 s by default; 120 here), then shut down the job it might just have
    joined. The init now gives up at once (InvalidUsageError naming the shutdown, its job's mark left
    for the others), and a later tnt.init() starts the job."""
    job = secrets.token_hex(16)
    first = subprocess.Popen([sys.executable, "-c", SHUTDOWN_DURING_INIT], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID=job, TNT_TIMEOUT_S=120))
    second = None
    try:
        line = first.stdout.readline()
        assert line.startswith("{"), line + first.stderr.read()[-3000:]
        got = json.loads(line)["init"]
        assert len(got) == 1 and got[0].startswith("InvalidUsageError: tnt.shutdown()"), got
        time.sleep(1.5)  # started after rank 0's mark was left: not of the launch it tells
        second = start(1, 2, job, TNT_TIMEOUT_S=120)
        assert outcome(second)["error"] is None
        line = first.stdout.readline()
        assert line.startswith("{"), line + first.stderr.read()[-3000:]
        assert json.loads(line) == {"size": 2}, line
        assert first.wait(timeout=60) == 0, first.stderr.read()[-3000:]
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    assert shm_objects(job) == []


PROBE = """
import json, os, signal, time, tarantella as tnt
noted = []
if os.environ.get("TNT_TEST_OWN_SIGINT"):  # the program's own handler, which only notes Ctrl-C
    signal.signal(signal.SIGINT, lambda *_: noted.append(1))
time.sleep(float(os.environ.get("TNT_TEST_SLEEP_S", 0)))  # a rank late to call in (a long import)
retries = int(os.environ.get("TNT_TEST_RETRIES", 0))  # a loop around tnt.init: a peer's failure tried again
def attempts():
    for attempt in range(retries + 1):
        try:
            tnt.init()
            print(json.dumps({"error": None, "noted": len(noted), "attempts": attempt + 1}))
        except BaseException as exc:  # KeyboardInterrupt too
            if attempt < retries and type(exc).__name__ == "PeerLostError":
                time.sleep(1)
                continue
            if attempt < retries and os.environ.get("TNT_TEST_FIX") in os.environ:  # its bad setting fixed
                os.environ.pop(os.environ["TNT_TEST_FIX"])
                time.sleep(1.5)
                continue
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
        break
if os.environ.get("TNT_TEST_EXIT_AFTER_S"):  # tnt.init in a daemon thread, and the program ends meanwhile
    import glob, sys, threading
    threading.Thread(target=attempts, daemon=True).start()
    deadline = time.monotonic() + 60
    while not glob.glob(f"/dev/shm/tnt-{os.environ['TNT_JOB_ID']}*") and time.monotonic() < deadline:
        time.sleep(0.01)  # until the thread is inside tnt.init's set-up (the host's marks are there)
    time.sleep(float(os.environ["TNT_TEST_EXIT_AFTER_S"]))
    print(json.dumps({"error": "exited"}), flush=True)
    sys.exit(0)
elif os.environ.get("TNT_TEST_IN_THREAD"):  # tnt.init in a thread; Ctrl-C raises in the main one
    import threading
    done = threading.Event()
    worker = threading.Thread(target=lambda: (attempts(), done.set()))
    worker.start()
    while not done.is_set():  # not an interrupted join: Python 3.11's then returns at once
        try:
            done.wait(0.1)
        except KeyboardInterrupt:
            pass
    worker.join()
else:
    attempts()
"""


def start(rank, size, job, **env):
    e = clean_env(TNT_RANK=rank, TNT_SIZE=size, TNT_JOB_ID=job,
                  **{"TNT_LOCAL_RANK": rank, "TNT_LOCAL_SIZE": size, "TNT_TIMEOUT_S": 20, **env})
    return subprocess.Popen([sys.executable, "-c", PROBE], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def outcome(proc):
    out, err = proc.communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-3000:]
    return lines[0]


@pytest.mark.parametrize("setting, values", [("TNT_FUSION_THRESHOLD_KB", ("1024", "64")),
                                             ("TNT_CACHE_CAPACITY", ("1024", "100")),
                                             # decides whether the ring's last two steps run as one
                                             ("TNT_STREAM_MIN_KB", ("8192", "0")),
                                             # the ring, or two exchange rounds per chunk
                                             ("TNT_SHM_DIRECT", ("1", "0")),
                                             # two ranks on two hosts: MPI's messages, or the ring
                                             ("TNT_MPI_PAIR_SUM", ("1", "0")),
                                             # how many messages a pair of ranks across 2 hosts sends
                                             ("TNT_MPI_PAIR_PIECE_KB", ("256", "512")),
                                             # 2 x 2: summed along the bit round, or not
                                             ("TNT_RIDES", ("1", "0"))])
def test_ranks_that_disagree_on_a_protocol_setting_fail_on_every_rank(setting, values):
    job = secrets.token_hex(16)
    procs = [start(r, 2, job, **{setting: values[r]}) for r in range(2)]
    for r, p in enumerate(procs):
        got = outcome(p)
        assert got["error"] == "InvalidUsageError", (r, got)
        assert setting in got["message"], got
        assert f"rank 0: {int(values[0]) * (1024 if setting.endswith('_KB') else 1)}" in got["message"], got
    assert shm_objects(job) == []


def test_ranks_of_one_host_with_one_local_rank_fail_on_every_rank():
    """Two ranks started by hand with the same TNT_LOCAL_RANK were accepted: get_local_rank() was 0 on
    both, so a GPU chosen by local rank was shared without a word."""
    job = secrets.token_hex(16)
    procs = [start(r, 2, job, TNT_LOCAL_RANK=0) for r in range(2)]
    for r, p in enumerate(procs):
        got = outcome(p)
        assert got["error"] == "InvalidUsageError", (r, got)
        assert "ranks 0 and 1 of host" in got["message"] and "both have local rank 0" in got["message"], got
        assert got["message"].endswith("Received: TNT_LOCAL_RANK=0 on ranks 0 and 1"), got
    assert shm_objects(job) == []
    job = secrets.token_hex(16)
    procs = [start(r, 3, job, TNT_LOCAL_RANK=min(r, 1)) for r in range(3)]
    for r, p in enumerate(procs):
        got = outcome(p)
        assert got["error"] == "InvalidUsageError", (r, got)
        assert "ranks 1 and 2 of host" in got["message"] and "both have local rank 1" in got["message"], got
    assert shm_objects(job) == []


def assert_void_mark_left(job):
    """A voided job leaves only its mark (shm.c: for its ranks that come later); removed here."""
    assert shm_objects(job) == [f"tnt-{job}-void"]
    os.unlink(f"/dev/shm/tnt-{job}-void")


def test_two_processes_claiming_one_rank_void_the_job_on_every_rank():
    # rank 2 never starts, so the segment stays open while the second claimant of rank 1 arrives
    job = secrets.token_hex(16)
    first = [start(0, 3, job)]
    time.sleep(0.5)
    first.append(start(1, 3, job))
    time.sleep(0.5)
    # the rest of either job, started with them but calling in after the segment was voided and removed:
    # rank 2 waited for a rank 0 until TNT_TIMEOUT_S; a rank 0 made a new segment and waited for ranks that
    # had failed
    began = time.monotonic()
    late = [start(2, 3, job, TNT_TIMEOUT_S=120, TNT_TEST_SLEEP_S=6),
            start(0, 3, job, TNT_TIMEOUT_S=120, TNT_TEST_SLEEP_S=6)]
    intruder = start(1, 3, job)
    results = [outcome(p) for p in first + [intruder]]
    for got in results:
        assert got["error"] == "InvalidUsageError" and "claimed rank 1" in got["message"], results
    for got in map(outcome, late):
        assert got["error"] == "InvalidUsageError", got
        assert f"job {job} was voided" in got["message"] and "claimed rank 1" in got["message"], got
        assert "fresh TNT_JOB_ID" in got["message"], got
    assert time.monotonic() - began < 90  # well inside their TNT_TIMEOUT_S
    assert shm_objects(job) == [f"tnt-{job}-void"]  # the mark that told them, a few hundred bytes
    # the job started again afterwards with the same id is a new one: it runs, and removes the mark
    for got in map(outcome, [start(r, 3, job) for r in range(3)]):
        assert got["error"] is None, got
    assert shm_objects(job) == []


def test_a_second_rank_0_of_one_job_id_voids_the_job_it_found():
    # two hand-made jobs of one TNT_JOB_ID, started a little apart: the second job's rank 0 found
    # the name taken and failed ("File exists"), and its rank 1 joined the first job's segment:
    # the two jobs' ranks summed each other's data and exited 0. Now the second rank 0 voids the
    # segment it found, and every rank in it fails with the collision. (Rank 2 never starts, so
    # that the segment stays open while the second rank 0 arrives.)
    job = secrets.token_hex(16)
    first = [start(0, 3, job)]
    time.sleep(0.5)
    first.append(start(1, 3, job))  # the first job's, or the second's: it cannot be told
    time.sleep(0.5)
    results = [outcome(p) for p in first + [start(0, 3, job)]]
    for got in results:
        assert got["error"] == "InvalidUsageError" and "claimed rank 0" in got["message"], results
        assert "same TNT_JOB_ID" in got["message"], results
    assert_void_mark_left(job)


@pytest.mark.parametrize("sizes, envs, says", [
    ((2, 2), ({}, {"TNT_SHM_SLOTS": "16"}), "TNT_SHM_SLOTS or TNT_SHM_SLOT_KB differ"),
    ((2, 2), ({"TNT_SHM_SLOT_KB": "512"}, {}), "TNT_SHM_SLOTS or TNT_SHM_SLOT_KB differ"),
    ((2, 3), ({}, {}), "it has TNT_SIZE=3, rank 0"),
    ((3, 2), ({}, {}), "it has TNT_SIZE=2, rank 0")])
def test_a_rank_whose_shared_memory_would_differ_fails_with_rank_0_at_once(sizes, envs, says):
    # a rank whose segment would be larger than rank 0's waited for one of its size until
    # TNT_TIMEOUT_S ("is rank 0 running with the same TNT_JOB_ID?"); one whose segment would be
    # smaller failed at once ("TNT_SIZE 2 vs 2") but wrote its failure where rank 0 did not look;
    # rank 0 waited until TNT_TIMEOUT_S for it "to start" either way (TNT_TIMEOUT_S=20 here)
    job = secrets.token_hex(16)
    first = start(0, sizes[0], job, **envs[0])
    time.sleep(0.5)
    results = [outcome(p) for p in (first, start(1, sizes[1], job, **envs[1]))]
    for got in results:
        assert got["error"] == "InvalidUsageError", results
        assert "rank 1" in got["message"] and "disagrees with the job" in got["message"], results
        assert says in got["message"], results
    assert_void_mark_left(job)


def test_a_rank_of_a_build_with_another_shared_memory_layout_fails_with_rank_0_at_once():
    # a joining rank whose build lays the segment out otherwise (another magic) waited until
    # TNT_TIMEOUT_S for the magic of its own ("never initialized by rank 0"), and rank 0 for it
    # "to start". Now it fails at once and leaves the magic that every build's rank 0 reads as
    # "another build joined". Both sides, without a second build: the test plays the other one.
    import mmap
    import struct
    job = secrets.token_hex(16)
    path = f"/dev/shm/tnt-{job}"
    with open(path, "wb") as f:  # another build's rank 0 (this process, alive): magic "TNT9"
        f.truncate(64 << 20)
        f.write(struct.pack("<I", 0x544E5439))
    os.chmod(path, 0o600)
    try:
        got = outcome(start(1, 2, job))
        assert got["error"] == "InvalidUsageError" and "has another layout (0x544e5439)" in got["message"], got
        with open(path, "rb") as f:
            assert struct.unpack("<I", f.read(4))[0] == 0x544E5446, "the joining rank leaves TNTF for rank 0"
    finally:
        os.unlink(path)
    # this build's rank 0, and a rank of another build that joins its segment (the test)
    job = secrets.token_hex(16)
    path = f"/dev/shm/tnt-{job}"
    first = start(0, 2, job)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(path, "r+b") as f:
                m = mmap.mmap(f.fileno(), 4096)
                if struct.unpack("<I", m[:4])[0] != 0:  # rank 0 has laid it out (its magic)
                    m[:4] = struct.pack("<I", 0x544E5446)
                    m.close()
                    break
                m.close()
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)
    got = outcome(first)
    assert got["error"] == "InvalidUsageError" and "a rank of another build of Tarantella" in got["message"], got
    assert_void_mark_left(job)  # rank 0's, for this build's ranks still to come


EARLY_WORKER = """
import json, os, subprocess, sys, time, tarantella as tnt
if os.environ.get("WORKER"):  # started before the rank's tnt.init, it calls in during it
    time.sleep(1)
try:
    worker = None if os.environ.get("WORKER") else subprocess.Popen(
        [sys.executable, "-c", sys.argv[1], sys.argv[1]], env=dict(os.environ, WORKER="1"),
        stdout=subprocess.PIPE, text=True)
    tnt.init()
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    if os.environ.get("WORKER"):
        raise  # uncaught in the worker: its error is its own, not its rank's (TNT_ERROR_FILE)
if worker:
    print(worker.communicate(timeout=60)[0].strip())
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_a_worker_calling_in_while_its_rank_starts_fails_alone(rank, tmp_path):
    # a process that a rank started before its tnt.init() (a pool's worker) inherits TNT_RANK;
    # calling in while the rank, which had claimed its place, still waited for the others, it
    # claimed that rank a second time and voided the job (rank > 0: "two processes claimed rank
    # 1"), or, for rank 0, failed alone with "File exists" (which now voids the segment, as a
    # second job's rank 0 must: test_a_second_rank_0_of_one_job_id_voids_the_job_it_found). The
    # rank's claim names the worker's ancestor: the worker fails alone, saying what it is
    job = secrets.token_hex(16)
    procs = {0: start(0, 3, job)} if rank else {}  # rank 1 claims its place in rank 0's segment
    time.sleep(0.5)
    error_file = tmp_path / "rank.json"
    env = clean_env(TNT_RANK=rank, TNT_SIZE=3, TNT_JOB_ID=job, TNT_TIMEOUT_S=20, TNT_ERROR_FILE=error_file)
    procs[rank] = subprocess.Popen([sys.executable, "-c", EARLY_WORKER, EARLY_WORKER], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # the others come late: `rank` waits in its set-up meanwhile
    procs.update({r: start(r, 3, job) for r in range(3) if r not in procs})
    out, err = procs[rank].communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 2, out + err[-3000:]
    mine, worker = lines
    assert mine["error"] is None, lines
    assert worker["error"] == "InvalidUsageError", lines
    assert f"which is rank {rank} of job {job} (still starting)" in worker["message"], lines
    # the worker's uncaught error was written into the rank's error file, which inherited it: tntrun's
    # report named it as the failure of the rank, which had none
    assert not error_file.exists(), error_file.read_text()
    for r in set(range(3)) - {rank}:
        assert outcome(procs[r])["error"] is None
    assert shm_objects(job) == []


TAKEN_FIRST = """
import json, os, subprocess, sys, time
import tarantella as tnt
job, flag, role = os.environ["TNT_JOB_ID"], os.environ["TNT_TEST_FLAG"], os.environ.get("TNT_TEST_ROLE", "rank")
formed = os.environ.get("TNT_TEST_FORMED") == "1"  # the worker's job has every rank, or is still attaching
def report(who, *steps):
    try:
        for step in steps:
            step()
        print(json.dumps({"who": who, "pid": os.getpid(), "error": None}), flush=True)
    except tnt.TarantellaError as exc:
        print(json.dumps({"who": who, "pid": os.getpid(), "error": type(exc).__name__, "message": str(exc)}),
              flush=True)
def until(ready):
    deadline = time.monotonic() + 60
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.01)
segment_there = lambda: os.path.exists(f"/dev/shm/tnt-{job}")
after_flag = lambda: until(lambda: os.path.exists(flag))
joined = lambda: open(flag + ".joined", "w").close()
if role == "rank":  # a rank that starts a worker before its tnt.init(); the worker calls in first
    worker = None
    if os.environ.get("TNT_TEST_FORK") == "1":
        child = os.fork()
        if child == 0:
            report("worker", tnt.init, lambda: tnt.barrier(name="one"), joined, lambda: tnt.barrier(name="two"))
            os._exit(0)
    else:
        worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[1]],
                                  env=dict(os.environ, TNT_TEST_ROLE="worker"))
    if formed:
        until(lambda: os.path.exists(flag + ".joined"))  # the worker's job is complete, its name gone
    else:
        until(segment_there)
        time.sleep(1)  # the worker claims its block
    report("rank", tnt.init)
    open(flag, "w").close()
    worker.wait() if worker else os.waitpid(child, 0)
elif role == "worker":
    report("worker", tnt.init, lambda: tnt.barrier(name="one"), joined, lambda: tnt.barrier(name="two"))
else:  # the job's other ranks
    report("other", tnt.init, lambda: tnt.barrier(name="one"), after_flag, lambda: tnt.barrier(name="two"))
"""


@pytest.mark.parametrize("rank, fork, formed", [(0, True, True), (1, False, False)])
def test_a_worker_that_takes_its_rank_before_the_ranks_init_fails_the_job_naming_it(rank, fork, formed, tmp_path):
    # a worker started before its rank's tnt.init() (a fork, a process pool's) that uses Tarantella first
    # took the rank: the other ranks completed the job with it, and the rank, calling in later, made a
    # second job under the same id and reported the first job's end as "rank 1 ended before it joined
    # the job", or, while that job still attached, "two jobs were started with the same TNT_JOB_ID".
    # Now the rank finds its worker holding its place (ancestry.c) and every process of the worker's
    # job fails with what happened, naming the worker and its rank's process
    job = secrets.token_hex(16)
    size = 2 if formed else 3  # not formed: rank 2 never starts, so the worker's job stays attaching
    env = dict(TNT_JOB_ID=job, TNT_SIZE=size, TNT_TIMEOUT_S=30, TNT_TEST_FLAG=tmp_path / "flag",
               TNT_TEST_FORMED=int(formed), TNT_TEST_FORK=int(fork))
    procs = [subprocess.Popen([sys.executable, "-c", TAKEN_FIRST, TAKEN_FIRST], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=clean_env(TNT_RANK=r, TNT_LOCAL_RANK=r, TNT_LOCAL_SIZE=size,
                                            TNT_TEST_ROLE="rank" if r == rank else "other", **env))
             for r in range(2)]
    said = {}
    for p in procs:
        out, err = p.communicate(timeout=90)
        for line in out.splitlines():
            if line.startswith("{"):
                got = json.loads(line)
                said[got["who"]] = got
        assert said, err[-3000:]
    assert set(said) == {"rank", "worker", "other"}, said
    taken = f"rank {rank} of job {job} was taken by pid {said['worker']['pid']}, a worker that pid " \
            f"{said['rank']['pid']} started before its tnt.init()"
    assert said["rank"]["error"] == "InvalidUsageError" and taken in said["rank"]["message"], said
    for who in ("worker", "other"):
        assert said[who]["error"] is not None and taken in said[who]["message"], (who, said)
    assert_void_mark_left(job)


def test_ctrl_c_while_the_ranks_find_each_other_ends_the_wait():
    """Ctrl-C (SIGINT) on a hand-made rank waiting in tnt.init for a rank that never started did nothing
    until TNT_TIMEOUT_S (300 s by default): Python's handler only notes the signal, and the wait is one C
    call. Now the wait ends at once with KeyboardInterrupt, and the rank that attached learns why. A rank
    of that launch that calls in after it (a long import) found no segment (rank 0 removed its name) and
    waited for a rank 0 until TNT_TIMEOUT_S: the interrupted rank leaves the job's mark, which names it."""
    job = secrets.token_hex(16)
    procs = [start(0, 3, job, TNT_TIMEOUT_S=120)]
    time.sleep(1)
    procs.append(start(1, 3, job, TNT_TIMEOUT_S=120))
    late = start(2, 3, job, TNT_TIMEOUT_S=120, TNT_TEST_SLEEP_S=6)  # calls in after the Ctrl-C
    time.sleep(2)
    began = time.monotonic()
    procs[0].send_signal(signal.SIGINT)
    first, second, third = outcome(procs[0]), outcome(procs[1]), outcome(late)
    assert time.monotonic() - began < 60  # well inside TNT_TIMEOUT_S
    assert first["error"] == "KeyboardInterrupt", first
    assert second["error"] == "PeerLostError", second
    # rank 1 reads why in the segment ("rank 0 aborted (...)") or, where it had not attached yet (3 s
    # may not be enough for its import on a loaded 2-core machine) or read the job's mark first (rank 0
    # leaves it just before its block says it failed), in the mark: both name rank 0 and the Ctrl-C
    assert any(f"{said}interrupted (SIGINT, Ctrl-C) while setting up the job" in second["message"] for said in
               ("rank 0 aborted (", f"rank 1: the job cannot start: rank 0 (pid {procs[0].pid}) failed to start: ")), \
        second
    assert third["error"] == "PeerLostError", third
    assert f"rank 2: the job cannot start: rank 0 (pid {procs[0].pid}) failed to start: interrupted (SIGINT, " \
        "Ctrl-C) while setting up the job" in third["message"], third
    assert_void_mark_left(job)
    # a joining rank waiting for rank 0 to make the job's shared memory (its mark: for a rank 0 late to come)
    lone_job = secrets.token_hex(16)
    lone = start(1, 3, lone_job, TNT_TIMEOUT_S=120)
    time.sleep(2)
    lone.send_signal(signal.SIGINT)
    assert outcome(lone)["error"] == "KeyboardInterrupt"
    assert_void_mark_left(lone_job)
    # tnt.init in a thread other than the main one: Python raises KeyboardInterrupt in the main
    # thread only, and the init thread's failure was a SystemError blaming "an operating-system
    # call". It is the same KeyboardInterrupt now
    thread_job = secrets.token_hex(16)
    in_thread = start(0, 2, thread_job, TNT_TIMEOUT_S=120, TNT_TEST_IN_THREAD=1)
    time.sleep(2)
    in_thread.send_signal(signal.SIGINT)
    got = outcome(in_thread)
    assert got["error"] == "KeyboardInterrupt", got
    assert "interrupted (SIGINT, Ctrl-C) while setting up the job" in got["message"], got


def test_a_rank_that_exits_while_another_thread_waits_in_init_cleans_up_and_tells_the_others():
    """A program that ended (sys.exit, the end of the main thread, an interrupted join of Python 3.11)
    while a daemon thread waited in tnt.init for the other ranks left its segment /dev/shm/tnt-<job>
    (rank 0) and the host's marks for good, and its peers read only that it died. The exit now ends
    the set-up as a Ctrl-C does: the names go, the rank's block says why, and the job's mark tells the
    ranks still to come."""
    for rank in (0, 1):  # rank 0 made the segment; rank 1 waited for it: each alone, its peers never came
        job = secrets.token_hex(16)
        got = outcome(start(rank, 2, job, TNT_TIMEOUT_S=120, TNT_TEST_EXIT_AFTER_S=2))
        assert got["error"] == "exited", got
        mark = open(f"/dev/shm/tnt-{job}-void", "rb").read()
        assert f"rank {rank} (pid ".encode() in mark and b"the process exited while this rank was setting" in mark
        assert_void_mark_left(job)  # and nothing else: no segment, no host marks
    job = secrets.token_hex(16)
    procs = [start(0, 3, job, TNT_TIMEOUT_S=120, TNT_TEST_EXIT_AFTER_S=4)]
    time.sleep(1)
    procs.append(start(1, 3, job, TNT_TIMEOUT_S=120))
    late = start(2, 3, job, TNT_TIMEOUT_S=120, TNT_TEST_SLEEP_S=9)  # calls in after rank 0 has gone
    began = time.monotonic()
    first, second, third = outcome(procs[0]), outcome(procs[1]), outcome(late)
    assert time.monotonic() - began < 60  # well inside TNT_TIMEOUT_S
    assert first["error"] == "exited", first
    why = "the process exited while this rank was setting up the job"
    assert second["error"] == "PeerLostError", second
    # read in the segment, or (rank 1 not attached yet on a loaded machine) in the job's mark
    assert any(f"{said}{why}" in second["message"] for said in
               ("rank 0 aborted (", f"rank 1: the job cannot start: rank 0 (pid {procs[0].pid}) failed to start: ")), \
        second
    assert third["error"] == "PeerLostError", third
    assert f"rank 2: the job cannot start: rank 0 (pid {procs[0].pid}) failed to start: {why}" in third["message"], third
    assert_void_mark_left(job)


def test_ctrl_c_on_a_program_with_its_own_handler_leaves_the_set_up_to_it():
    """A program whose SIGINT handler only notes Ctrl-C (to stop gracefully later) waited in tnt.init as
    before 0155d72 and joined its job; since, its tnt.init failed with SystemError 'interrupted (SIGINT,
    Ctrl-C) ... (an operating-system call failed)' and took the job down. The program's handler decides."""
    job = secrets.token_hex(16)
    first = start(0, 2, job, TNT_TIMEOUT_S=120, TNT_TEST_OWN_SIGINT=1)
    time.sleep(3)  # rank 0 waits for rank 1 in tnt.init (its handler installed before)
    first.send_signal(signal.SIGINT)
    time.sleep(1)
    second = start(1, 2, job, TNT_TIMEOUT_S=120)
    got = outcome(first)
    assert (got["error"], got["noted"]) == (None, 1), got
    assert outcome(second)["error"] is None
    assert shm_objects(job) == []


@pytest.mark.parametrize("bad_rank, bad, words", [
    (0, {"TNT_FUSION_THRESHOLD_KB": "abc"}, "environment variable TNT_FUSION_THRESHOLD_KB must be"),
    (1, {"TNT_FUSION_THRESHOLD_KB": "abc"}, "environment variable TNT_FUSION_THRESHOLD_KB must be"),
    # a bad local placement (TNT_LOCAL_RANK=$LOCAL with it unset) failed before the rank knew its job:
    # it left no mark, and the others waited for it until TNT_TIMEOUT_S
    (1, {"TNT_LOCAL_RANK": ""}, "bad placement from tntrun: TNT_LOCAL_RANK and TNT_LOCAL_SIZE must be"),
    # a rank told by hand that it is alone on its host takes the mpi transport, whose set-up fails
    # at once without an MPI launcher; the others, on shm, waited for it until TNT_TIMEOUT_S: only
    # shm's own set-up left the job's mark, and that rank's failure came from the mpi transport's
    pytest.param(1, {"TNT_LOCAL_SIZE": "1", "TNT_LOCAL_RANK": "0"},
                 "TNT_LOCAL_SIZE=1 with TNT_SIZE=3 puts this rank on a host with 1 of the job's 3 ranks",
                 marks=pytest.mark.skipif(not (shutil.which("mpirun") and shutil.which("mpicc")),
                                          reason="needs an MPI (the mpi transport's plugin)"))])
def test_a_rank_that_fails_before_it_joins_fails_the_others_at_once(bad_rank, bad, words):
    """A hand-made job whose rank has a bad setting of its own fails at once on that rank; the others
    waited for it (rank 0 for it to attach, the others for rank 0's segment) until TNT_TIMEOUT_S. Its
    failure now leaves the job's mark, and they fail at once naming it."""
    job = secrets.token_hex(16)
    began = time.monotonic()
    procs = [start(r, 3, job, TNT_TIMEOUT_S=120, **(bad if r == bad_rank else {})) for r in range(3)]
    results = [outcome(p) for p in procs]
    assert time.monotonic() - began < 60, results  # well inside TNT_TIMEOUT_S
    assert results[bad_rank]["error"] in ("InvalidArgumentError", "InvalidUsageError"), results
    for r in set(range(3)) - {bad_rank}:
        got = results[r]
        assert got["error"] == "PeerLostError", results
        assert f"the job cannot start: rank {bad_rank} (pid " in got["message"], results
        assert "failed to start: " + words in got["message"], results
    assert_void_mark_left(job)


def test_a_rank_started_again_after_it_failed_to_start_lifts_its_mark():
    """A rank 0 that retried tnt.init in a loop after the PeerLostError of a rank that failed to start
    (its bad setting) failed at once on every try for TNT_TIMEOUT_S, on that rank's mark, while the rank
    started again with the setting fixed waited for rank 0's segment until TNT_TIMEOUT_S. A process of
    the failed rank started after the mark stands in for it: the mark goes, and the job runs."""
    job = secrets.token_hex(16)
    first = start(0, 2, job, TNT_TIMEOUT_S=30, TNT_TEST_RETRIES=20)
    bad = start(1, 2, job, TNT_TIMEOUT_S=30, TNT_FUSION_THRESHOLD_KB="abc")
    assert outcome(bad)["error"] == "InvalidArgumentError"
    time.sleep(1.5)  # started after the mark was left (a process started with it may be of that launch)
    again = start(1, 2, job, TNT_TIMEOUT_S=30)
    got = outcome(first)
    assert got["error"] is None and got["attempts"] > 1, got
    assert outcome(again)["error"] is None
    assert shm_objects(job) == []
    # the failed rank itself trying again in the same process, its setting fixed
    job = secrets.token_hex(16)
    first = start(0, 2, job, TNT_TIMEOUT_S=30, TNT_TEST_RETRIES=20)
    bad = start(1, 2, job, TNT_TIMEOUT_S=30, TNT_TEST_RETRIES=1, TNT_TEST_FIX="TNT_FUSION_THRESHOLD_KB",
                TNT_FUSION_THRESHOLD_KB="abc")
    got = outcome(first)
    assert got["error"] is None and got["attempts"] > 1, got
    assert outcome(bad) == {"error": None, "noted": 0, "attempts": 2}
    assert shm_objects(job) == []


def test_a_mark_that_no_longer_counts_is_swept_by_the_next_job():
    """A failed start's mark counts for its job's TNT_TIMEOUT_S; a random id is never used again, so
    marks of failed hand-made jobs gathered in /dev/shm for good. The next job's rank 0 sweeps them.
    The mark of a rank that failed before it read TNT_TIMEOUT_S (on a setting read before it) counted
    300 s, the default, whatever the job's TNT_TIMEOUT_S: it read that one on its own since."""
    stale, early, fresh, job = (secrets.token_hex(16) for _ in range(4))
    # a failure once the settings are read (their timeout), and one before TNT_TIMEOUT_S is read
    for mark_job, timeout, bad in ((stale, 1, {"TNT_TIMELINE": "/nonexistent/timeline.json"}),
                                   (early, 1, {"TNT_FUSION_THRESHOLD_KB": "abc"}),
                                   (fresh, 600, {"TNT_TIMELINE": "/nonexistent/timeline.json"})):
        got = outcome(start(1, 2, mark_job, TNT_TIMEOUT_S=timeout, **bad))
        assert got["error"] is not None and next(iter(bad)) in got["message"], got
        assert shm_objects(mark_job) == [f"tnt-{mark_job}-void"]
    time.sleep(1.5)
    try:
        results = [outcome(p) for p in [start(r, 2, job) for r in range(2)]]
        assert all(r.get("error") is None for r in results), results
        assert shm_objects(stale) == []  # older than its 1 s: swept
        assert shm_objects(early) == []
    finally:
        assert_void_mark_left(fresh)  # still counts: kept


def test_a_segment_never_laid_out_is_named_as_a_leftover():
    # a rank 0 killed between creating its segment and writing its header leaves a name with no
    # header: a joining rank waits for it until TNT_TIMEOUT_S and then says how to remove it
    job = secrets.token_hex(16)
    path = f"/dev/shm/tnt-{job}"
    with open(path, "wb") as f:
        f.truncate(64 << 20)
    os.chmod(path, 0o600)
    try:
        got = outcome(start(1, 2, job, TNT_TIMEOUT_S=2))
    finally:
        os.unlink(path)
    assert got["error"] == "TimeoutError", got
    assert f"/dev/shm/tnt-{job} was never initialized by rank 0" in got["message"], got
    assert f"rm /dev/shm/tnt-{job}" in got["message"], got


def test_a_rank_whose_set_up_failed_tells_the_others_why():
    # rank 1 never starts; rank 2 gives up first (a bound of its own) and rank 0 learns it from
    # rank 2's abort, whose reason was empty: rank 0 read "rank 2 aborted ()", without the missing rank
    job = secrets.token_hex(16)
    procs = [start(0, 3, job, TNT_TIMEOUT_S=60), start(2, 3, job, TNT_TIMEOUT_S=2)]
    waited, gave_up = (outcome(p) for p in procs)
    assert gave_up["error"] == "TimeoutError" and "ranks [1] to start" in gave_up["message"], gave_up
    assert waited["error"] == "PeerLostError", waited
    assert "rank 2 aborted (rank 2 waited 2 s (TNT_TIMEOUT_S) for ranks [1] to start" in waited["message"], waited
    assert_void_mark_left(job)  # rank 2's, for rank 1 if it comes later: it fails at once


BUSY_ACROSS_JOBS = """
import tarantella as tnt
from tarantella.common import busy, core
real, told = core.lib(), []
class Lib:  # records what the sections tell the core, and passes it on
    def __getattr__(self, name): return getattr(real, name)
    def tnt_set_busy(self, flag): told.append(flag); real.tnt_set_busy(flag)
core.lib = lambda: Lib()
tnt.init()
outer = tnt.rank_only(); outer.__enter__()  # job 1: told busy
tnt.shutdown(); tnt.init()                   # job 2, job 1's section still open
with tnt.rank_only():                         # job 2's own section: told busy, then not
    told.append("in")
outer.__exit__(None, None, None)            # ends with job 1: nothing to tell job 2
with tnt.rank_only():
    pass
print(told)
"""


def test_a_section_open_across_shutdown_and_init_ends_with_its_job():
    """`with tnt.rank_only():` (or a save's section) open across tnt.shutdown() and a new tnt.init():
    the count of open sections was the process's, so job 2's core never heard of job 2's own section
    (its peers failed at TNT_TIMEOUT_S while it was busy), and with the counts the other way round it
    stayed told busy after its sections ended. A section now belongs to the job it was opened in."""
    res = subprocess.run([sys.executable, "-c", BUSY_ACROSS_JOBS], env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[1, 1, 'in', 0, 1, 0]", res.stdout + res.stderr[-3000:]


BARRIER_AFTER_INIT = """
import json, tarantella as tnt
try:
    tnt.init()
    tnt.barrier()
    print(json.dumps({"error": None}))
except tnt.TarantellaError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


def test_a_rank_whose_engine_fails_to_start_is_reported_failed_not_shut_down(tmp_path):
    """Rank 1 joins the job's shared memory, then cannot start its background thread (a thread
    limit: no_engine_thread_shim.c). Its set-up released the transport as at a normal end, and
    rank 0's first collective said "rank 1 has shut down ...: every rank must make the same
    collective calls before shutdown", blaming the program. Rank 1 is now marked failed, with why."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the shim")
    shim = tmp_path / "shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), os.path.join(HERE, "no_engine_thread_shim.c"), "-ldl"],
                   check=True)
    job = secrets.token_hex(16)
    procs = [subprocess.Popen([sys.executable, "-c", BARRIER_AFTER_INIT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=clean_env(TNT_RANK=r, TNT_SIZE=2, TNT_LOCAL_RANK=r, TNT_LOCAL_SIZE=2, TNT_JOB_ID=job,
                                            TNT_TIMEOUT_S=60, **({"LD_PRELOAD": str(shim)} if r else {})))
             for r in range(2)]
    waited, failed = (outcome(p) for p in procs)
    assert failed["error"] == "SystemError" and "cannot start the background thread" in failed["message"], failed
    assert waited["error"] == "PeerLostError", waited
    assert "rank 1 aborted (cannot start the background thread" in waited["message"], waited
    assert "shut down" not in waited["message"], waited
    assert shm_objects(job) == []


SHUTDOWN_WHILE_INIT_PREPARES = """
import json, threading, time, tarantella as tnt
from tarantella.common import plugins
first_use = plugins.prepare
def prepare():  # the mpi plugin built at its first use: seconds before the set-up begins
    started.set()
    time.sleep(1.0)
    first_use()
plugins.prepare, started, failed = prepare, threading.Event(), []
""" + INIT_IN_A_THREAD + """started.wait(60)
tnt.shutdown()  # a watchdog giving up on the start
waiting.join()
print(json.dumps({"init": failed}), flush=True)
"""


def test_shutdown_while_another_thread_prepares_init_ends_it():
    """tnt.shutdown() in another thread ended a tnt.init() only once it waited for the other ranks:
    called while that init still prepared (built the mpi plugin at its first use), it waited for the
    init's lock, and the init went on to wait for rank 1 until TNT_TIMEOUT_S (TimeoutError; 120 s
    here). The init now gives up at once, as from its wait."""
    job = secrets.token_hex(16)
    res = subprocess.run([sys.executable, "-c", SHUTDOWN_WHILE_INIT_PREPARES], capture_output=True, text=True,
                         timeout=300, env=clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID=job, TNT_TIMEOUT_S=120))
    try:
        lines = [line for line in res.stdout.splitlines() if line.startswith("{")]
        assert lines, res.stdout + res.stderr[-3000:]
        got = json.loads(lines[0])["init"]
        assert len(got) == 1 and got[0].startswith("InvalidUsageError: tnt.shutdown()"), got
    finally:
        for name in shm_objects(job):  # the job's mark, left for rank 1 (never started)
            os.unlink(f"/dev/shm/{name}")
