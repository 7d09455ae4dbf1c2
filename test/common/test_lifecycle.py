"""The job's lifecycle seen from outside: Ctrl+C leaves no process and nothing
in /dev/shm; TNT_TIMELINE writes one valid Chrome trace per rank."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil

from core_helpers import HERE, clean_env, shm_objects, tntrun


def test_ctrl_c_leaves_no_process_and_no_shared_memory():
    import shutil

    proc = subprocess.Popen([shutil.which("tntrun"), "-n", "4", "--no-gpu", "--output-on-all-devices", "--",
                             os.path.join(HERE, "rank_loop.py")], env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ready = []
    while len(ready) < 4:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        if "READY" in line:
            ready.append(line.split("READY", 1)[1].split())
    pids = [int(p) for _, p, _ in ready]
    job = ready[0][2]
    time.sleep(1.0)  # well inside the allreduce loop
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert time.monotonic() - start < 15
    assert proc.returncode != 0
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert shm_objects(job) == []


def test_timeline_has_one_trace_per_rank(tmp_path):
    script = tmp_path / "timeline_rank.py"
    script.write_text(
        "import time, numpy as np, tarantella as tnt\n"
        "for step in range(4):\n"
        "    # rank 1 comes late, so rank 0's five requests are all waiting for it:\n"
        "    # they become ready together and are fused\n"
        "    if tnt.get_rank() == 1: time.sleep(0.3)\n"
        "    hs = [tnt.allreduce_async(np.ones(100 * (i + 1), np.float32), name=f'grad{i}') for i in range(5)]\n"
        "    [h.wait() for h in hs]\n"
        "tnt.broadcast(np.ones(10, np.float32), name='weights')\n"
        "# a context made again writes on after the first's trace: it truncated the file\n"
        "tnt.shutdown(); tnt.init()\n"
        "tnt.allreduce(np.ones(3, np.float32), name='after-init')\n")
    trace = tmp_path / "trace.json"
    res = subprocess.run([sys.executable, "-c", "import sys; from tarantella.runner.cli import main; sys.exit(main())",
                          "-n", "2", "--no-gpu", "--timeline", str(trace), "--", str(script)],
                         env=clean_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for r in range(2):
        events = json.load(open(tmp_path / f"trace.rank{r}.json"))
        rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        assert {f"grad{i}" for i in range(5)} | {"weights", "after-init"} <= rows
        phases = {e["name"] for e in events if e.get("ph") == "X"}
        assert {"NEGOTIATE", "ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER", "BROADCAST"} <= phases
        fused = [e for e in events if e.get("name") == "ALLREDUCE" and "fused" in e.get("args", {}).get("detail", "")]
        assert fused, "the five small gradients should have been fused"
        assert all(e["dur"] >= 0 for e in events if e.get("ph") == "X")


def test_a_timeline_cut_by_a_full_disk_is_named():
    # /dev/full: every write fails as on a full disk. The trace was left cut short without
    # a word (it still reads as a valid trace, of less work)
    if not os.path.exists("/dev/full"):
        import pytest
        pytest.skip("no /dev/full")
    res = subprocess.run([sys.executable, "-c", "import numpy as np, tarantella as tnt\n"
                          "tnt.init(); tnt.allreduce(np.ones(3)); tnt.shutdown(); print('done')"],
                         env=clean_env(TNT_TIMELINE="/dev/full"), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "done" in res.stdout, res.stderr
    assert "timeline: /dev/full could not be written in full" in res.stderr, res.stderr


def test_shared_memory_is_owner_only_and_removed_when_set_up_fails():
    import stat
    import secrets

    job = secrets.token_hex(16)
    proc = subprocess.Popen([sys.executable, "-c", "import tarantella as tnt; tnt.init()"],
                            env=clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID=job, TNT_TIMEOUT_S=3),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while len(shm_objects(job)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    # rank 0 waits for rank 1, which never starts: the segment, and the host's transport marks
    # (core/src/transport/host_marks.c)
    names = shm_objects(job)
    assert sorted(names) == [f"tnt-{job}", f"tnt-{job}-marks-{socket.gethostname()}"], names
    for name in names:
        assert stat.S_IMODE(os.stat(os.path.join("/dev/shm", name)).st_mode) == 0o600
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "TimeoutError" in err and "ranks [1] to start" in err, err[-2000:]
    # the segment and the marks are gone; what is left is the job's void mark (a few hundred bytes,
    # transport/job_void.h) that tells a rank 1 still to come why the job cannot start
    assert shm_objects(job) == [f"tnt-{job}-void"]
    os.unlink(f"/dev/shm/tnt-{job}-void")


def test_a_segment_left_by_a_killed_job_is_named_on_every_rank_of_a_job_reusing_its_id():
    """A job of a user's own TNT_JOB_ID killed while its rank 0 waited for the others
    leaves /dev/shm/tnt-<id> (the last rank to attach removes it). A new job with the
    same id failed three ways, none naming it: rank 0 "shm_open ... File exists", a rank
    that joined the leftover "rank 0 (pid of the dead job) died", or rank 0 (started
    after that rank had joined and removed the name) timing out for it. Now every rank,
    whichever starts first, names the leftover and how to remove it, and leaves it there
    for the others to find."""
    import secrets

    job = f"reused-{secrets.token_hex(4)}"
    path = f"/dev/shm/tnt-{job}"
    init = [sys.executable, "-c", "import tarantella as tnt; tnt.init()"]

    def start(rank, timeout_s):
        return subprocess.Popen(init, env=clean_env(TNT_RANK=rank, TNT_SIZE=2, TNT_LOCAL_RANK=rank, TNT_LOCAL_SIZE=2,
                                                    TNT_JOB_ID=job, TNT_TIMEOUT_S=timeout_s),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    killed = start(0, 60)
    try:
        deadline = time.monotonic() + 30
        while not shm_objects(job) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # past its set-up: waiting for rank 1
    finally:
        killed.kill()
        killed.communicate()
    def leftovers():
        # the segment, and the host's transport marks (transport/host_marks.c), which the next
        # job of this id takes over and removes
        names = shm_objects(job)
        return [n for n in names if not n.startswith(f"tnt-{job}-marks-")]

    try:
        assert leftovers() == [f"tnt-{job}"]
        for order in ((0, 1), (1, 0)):
            ranks = {}
            for rank in order:
                ranks[rank] = start(rank, 10)
                time.sleep(0.5)  # the first has looked at the segment
            for rank, proc in ranks.items():
                _, err = proc.communicate(timeout=60)
                assert proc.returncode != 0
                assert (f"InvalidUsageError: rank {rank}: the shared segment {path} is left from a job with "
                        f"TNT_JOB_ID={job} that ended before all its ranks started (its rank 0, pid {killed.pid}, is "
                        f"gone). Remove it (rm {path})") in err, (order, rank, err[-2000:])
            assert leftovers() == [f"tnt-{job}"], order  # still there, for the next rank to name
    finally:
        for name in shm_objects(job):
            os.unlink(os.path.join("/dev/shm", name))
