"""The gpi2 transport across hosts, on the test bed: `tntrun --transport gpi2 -H ...` runs on
hostA and starts the ranks through GPI-2's gaspi_run, which reaches hostB through the ssh
stand-in, as on a cluster. Every collective x dtype x awkward size, bitwise identical on every
rank and to shm on one host; a host cut off from the others (its link taken down): all its
ranks named by their silence on the other host within seconds; a rank SIGKILLed on hostB named
first in tntrun's report; and ranks gaspi_run starts without tntrun. Skips where GPI-2 is not installed (GPI2_HOME, or /work/gpi2:
GPI-2 is GPL-3.0 and packaged nowhere) or the test bed cannot be made (not root)."""
import glob
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from multihost_helpers import (cut_off, job_env, next_json, nothing_left, placement, probes, python_missing_on,
                               root_cause, without_tarantella_on_hostB)

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common")
sys.path.insert(0, COMMON)
from core_helpers import collectives_agree, same_results, tntrun as tntrun_here  # noqa: E402
from test_gpi2_transport import find_gpi2  # noqa: E402

GPI2_HOME = find_gpi2()
pytestmark = [
    pytest.mark.skipif(not GPI2_HOME or not os.path.exists(os.path.join(GPI2_HOME or "", "bin", "gaspi_run")),
                       reason="needs GPI-2 with its gaspi_run (GPI2_HOME or /work/gpi2): build it from "
                              "https://github.com/cc-hpc-itwm/GPI-2 with ./configure --with-ethernet"),
    pytest.mark.skipif(not shutil.which("tntrun"), reason="needs an installed tntrun (pip install -e .)"),
]


@pytest.mark.parametrize("hosts,n", [("hostA:1,hostB:1", 2), ("hostA:2,hostB:2", 4)])
def test_collectives_across_hosts_are_bitwise_identical(multihost, tmp_path, hosts, n):
    check_collectives(multihost, tmp_path, hosts, n)


@pytest.mark.parametrize("hosts,n", [("hostA:1,hostB:1,hostC:1", 3), ("hostA:3,hostB:1", 4)], ids=["3x1", "3+1"])
def test_collectives_across_three_hosts_and_uneven_hosts(multihost3, tmp_path, hosts, n):
    check_collectives(multihost3, tmp_path, hosts, n)


def test_hosts_of_different_sizes_give_each_rank_its_local_place(multihost, tmp_path):
    # gaspi_run gives a rank no local rank: the wrapper took rank % size, and with -H hostA:3,
    # hostB:1 every rank had local size 4, rank 3 local rank 3 on hostB, alone there (its GPU
    # and get_local_rank() follow). tntrun now tells the wrapper the ranks of each host
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:3,hostB:1", "--transport", "gpi2", "--", "probe.py"],
                        env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert placement(res.stdout + res.stderr) == [
        ("0", "hostA", "0", "3", "4"), ("1", "hostA", "1", "3", "4"), ("2", "hostA", "2", "3", "4"),
        ("3", "hostB", "0", "1", "4")]



def test_output_on_all_devices_labels_every_line_with_its_rank(multihost, tmp_path):
    # mpirun (--tag-output) and srun (--label) label each rank's lines, gaspi_run cannot: the
    # ranks' stdout and stderr came unlabelled, mixed. The rank wrapper labels them "[RANK] "
    # (whole lines), its failure record still reaching tntrun unlabelled
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:2,hostB:1", "--transport", "gpi2", "-l", "--",
                                  "probe.py", "2", "3"], env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    shown = (res.stdout + res.stderr[:res.stderr.index("=" * 72)]).splitlines()
    for rank in range(3):
        assert f"[{rank}] stdout of rank {rank}" in shown, shown
        assert [ln for ln in shown if ln.startswith(f"[{rank}] PROBE ")], shown
    assert "[2] rank 2 fails on purpose on hostB" in shown, shown
    # each stream to its own: gaspi_run's ssh commands end in 2>&1, and every rank but 0 wrote
    # its stderr to tntrun's stdout (`2>/dev/null` hid nothing of theirs)
    assert [ln for ln in res.stdout.splitlines() if ln.strip()] and all(
        re.fullmatch(r"\[[0-2]\] stdout of rank [0-2]|Killing GASPI procs...", ln) for ln in res.stdout.splitlines() if ln.strip()), res.stdout
    # (gaspi_run's own words as tntrun stops it: rank 2 failed, the others wait)
    assert [ln for ln in shown if ln.strip() and not re.match(r"\[[0-2]\] |tntrun: ", ln)
            and ln not in ("Killing GASPI procs...", "Terminated")] == [], shown
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    2 (local_rank 0)\n  host:    hostB\n"), res.stderr[-3000:]
    assert "    rank 2 fails on purpose on hostB\n" in root, root  # its stderr as written
    assert "\x1e" not in res.stdout + res.stderr
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}
    # tntrun stopped the job (rank 2 failed, the others wait): the ranks' wrappers were given
    # their grace period (the engine died at once, and they were killed at once: their private
    # folders stayed in /tmp)
    job = {p["job_id"] for p in probes(res.stdout + res.stderr)}.pop()
    assert glob.glob(f"{tempfile.gettempdir()}/tnt-rank-{job[:8]}-*") == []

LATE = """
import os, sys, time
import numpy as np
import tarantella as tnt
tnt.init()
tnt.allreduce(np.ones(4, np.float32), name="last")
if tnt.get_rank() == tnt.get_size() - 1:  # on hostB: its results, after the last collective
    time.sleep(3)
    with open(os.path.join(sys.argv[1], "late.txt"), "w") as f:
        f.write("written")
"""


def test_the_job_lasts_until_the_ranks_of_every_host_have_ended(multihost, tmp_path):
    # gaspi_run starts other hosts' ranks in a subshell it never waits for: it ended with rank
    # 0, and tntrun, the job over, killed hostB's rank while it wrote its results (late.txt
    # never written) and exited 0
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    (tmp_path / "late.py").write_text(LATE)
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--transport", "gpi2", "--", "late.py",
                                  str(tmp_path)], env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "late.txt").read_text() == "written"
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def test_a_killed_tntrun_leaves_nothing_running_on_any_host(multihost, tmp_path):
    # tntrun SIGKILLed while its ranks reduce: its parent-death signal (SIGTERM) came to the
    # engine's process alone, which died, and gaspi_run and the ranks of every host went on
    # reducing, unseen (mpirun, given the same signal, stops its job). The engine now stops
    # its process group itself once tntrun is gone
    multihost.clear_ssh_log()
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    out = tmp_path / "out"
    out.mkdir()
    proc = multihost.popen("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--transport", "gpi2", "--",
                                     os.path.join(HERE, "rank_cut.py"), str(out)], env=env, cwd=str(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # both ranks reduce
            if len([f for f in os.listdir(out) if open(out / f).read()]) == 2 or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate(timeout=60)
        proc.kill()  # the process is tntrun itself (the host's sh exec'd it)
        proc.communicate(timeout=60)
        assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}
        # what the job left, tntrun --cleanup removes: the script and machine file in the current
        # folder, and gaspi_run's own machine files in /tmp (/tmp/.gpi2.XXXXXXXX, in its ssh calls),
        # which it removes only when it ends by itself (a pair was left by every stopped job)
        made = {w for c in multihost.ssh_calls() for w in c["command"].split() if "/.gpi2." in w}
        assert made, multihost.ssh_calls()
        res = multihost.run("hostA", ["tntrun", "--cleanup"], env=env, cwd=str(tmp_path), timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert [f for f in made if os.path.exists(f)] == [] and not list(tmp_path.glob(".tnt-*"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_two_jobs_at_once_on_the_same_hosts(multihost, tmp_path):
    # GPI-2 ignores the TCP port gaspi_config_set gives it: its ethernet device listened on
    # 19000 in every job, and a second job on the same hosts failed in gaspi_proc_init with
    # "Device operation error". The first job reduces until stopped; the second runs whole
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")  # gaspi_run
    first_out, second_out = tmp_path / "first", tmp_path / "second"
    first_out.mkdir()
    second_out.mkdir()
    tntrun = ["tntrun", "-H", "hostA:1,hostB:1", "--transport", "gpi2", "--"]
    first = multihost.popen("hostA", tntrun + [os.path.join(HERE, "rank_cut.py"), str(first_out)], env=env,
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # both ranks of the first job reduce
            ready = [f for f in os.listdir(first_out) if open(first_out / f).read()]
            if len(ready) == 2 or first.poll() is not None:
                break
            time.sleep(0.1)
        assert len(ready) == 2, first.communicate(timeout=60)
        second = multihost.run("hostA", tntrun + [os.path.join(HERE, "rank_bare.py"), str(second_out)], env=env,
                               cwd=str(tmp_path), timeout=300)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert [json.load(open(second_out / f"bare{r}.json"))["sum"] for r in range(2)] == [3.0, 3.0]
        assert first.poll() is None, first.communicate(timeout=60)  # undisturbed
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def check_collectives(multihost, tmp_path, hosts, n):
    """Every collective x dtype x awkward size over gpi2 on `hosts`, bitwise identical on every rank
    and to the same scheme over another transport."""
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TEST_BIG_BYTES=str(3 << 20),
                        TNT_TIMEOUT_S="120")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")  # gaspi_run
    out = tmp_path / "out"
    out.mkdir()
    res = multihost.run("hostA", ["tntrun", "-H", hosts, "--transport", "gpi2", "--log-level", "INFO",
                                  "-x", "TNT_TEST_BIG_BYTES", "-x", "TNT_TIMEOUT_S", "--",
                                  os.path.join(COMMON, "rank_collectives.py"), str(out)],
                        env=env, cwd=str(tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "initialized: rank 0 of %d, transport gpi2" % n in res.stderr, res.stderr[-3000:]
    first = collectives_agree([json.load(open(out / f"rank{r}.json")) for r in range(n)])
    # gaspi_run reached hostB through ssh, as on a cluster
    assert "hostB" in [c["host"] for c in multihost.ssh_calls()]
    # The algorithms never know the transport: the same scheme over other transports gives
    # the same bits. One rank per host: the flat ring, as shm runs it on one host. Two per
    # host: the hierarchical allreduce (its channels over gpi2), as auto (shm+mpi) runs it
    # on the same hosts; its order of additions is not the flat ring's.
    counts = {int(h.split(":")[1]) for h in hosts.split(",")}
    hierarchical = len(counts) == 1 and counts.pop() > 1  # hosts alike, several ranks each
    assert ("allreduce: hierarchical" in res.stderr) == hierarchical, res.stderr[-3000:]
    other_out = tmp_path / "other"
    other_out.mkdir()
    if hierarchical:
        other = multihost.run("hostA", ["tntrun", "-H", hosts, "-x", "TNT_TEST_BIG_BYTES", "--",
                                        os.path.join(COMMON, "rank_collectives.py"), str(other_out)],
                              env=env, cwd=str(tmp_path), timeout=600)
    else:
        other = tntrun_here(n, "rank_collectives.py", other_out, env={"TNT_TEST_BIG_BYTES": 3 << 20})
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    same_results(first, json.load(open(other_out / "rank0.json"))["results"],
                 f"gpi2 and {'shm+mpi' if hierarchical else 'shm'}")
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def test_host_cut_off_is_named_by_its_silence(multihost, tmp_path):
    # 2 hosts x 2 ranks started on their hosts directly, with the GASPI_* placement gaspi_run
    # would give them, so that each one's own error can be read; once all run, hostB's link
    # goes down: its TCP connections stay open (no error from GPI-2), its pids are alive (one
    # pid namespace), only silence tells: 10 missed heartbeats of 0.2 s. Each rank names
    # both ranks of the other host
    hosts = ["hostA", "hostA", "hostB", "hostB"]
    machines = tmp_path / "machines"
    machines.write_text("".join(h + "\n" for h in hosts))
    job, procs = secrets.token_hex(16), []
    for rank, host in enumerate(hosts):
        env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TRANSPORT="gpi2", TNT_RANK=str(rank),
                            TNT_SIZE="4", TNT_LOCAL_RANK=str(rank % 2), TNT_LOCAL_SIZE="2", TNT_JOB_ID=job,
                            GASPI_RANK=str(rank), GASPI_NRANKS="4", GASPI_SOCKET=str(rank % 2),
                            GASPI_MFILE=str(machines), TNT_GPI2_HEARTBEAT_S="0.2", TNT_TIMEOUT_S="60")
        procs.append(multihost.popen(host, [sys.executable, os.path.join(HERE, "rank_cut.py")], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for proc in procs:
            ready = next_json(proc, 120)
            assert ready and ready["rank"] == procs.index(proc) and ready["ready"], proc.stderr.read()[-3000:]
        with cut_off(multihost, "hostB") as cut:
            for rank, proc in enumerate(procs):
                other = [2, 3] if rank < 2 else [0, 1]
                got = next_json(proc, 30)
                assert got and got["error"] == "PeerLostError" and got["peer"] in other, got
                named = [int(r) for r in re.findall(r"(\d+) \(pid \d+\)", got["message"].split(" sent nothing")[0])]
                assert named == other and "sent nothing" in got["message"], got
                assert f"on {hosts[other[0]]} sent nothing" in got["message"], got
                assert time.monotonic() - cut < 15, got  # far inside TNT_TIMEOUT_S (60 s)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("mode, code, exit_line", [
    ("kill", 128 + 9, "  exit:    signal 9 (SIGKILL)\n"),
    ("exit", 4, "  exit:    exit code 4\n")])
def test_a_rank_killed_or_exiting_on_hostB_is_the_root_cause(multihost, tmp_path, mode, code, exit_line):
    # rank 1 (hostB) SIGKILLs itself in an allreduce; rank 0 raises, naming it, and exits 3.
    # The wrapper's record of rank 1 reaches tntrun on gaspi_run's stdout (its ssh commands
    # end in 2>&1): without it the report named rank 0, the only failure tntrun had heard of.
    # `exit`: rank 1 calls sys.exit(4) instead; rank 0, told that it had shut down, raised and
    # ended first, and gaspi_run, which ends with rank 0, ended the job before rank 1's record
    # came (the report named rank 0's PeerLostError, tntrun exited 3)
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--transport", "gpi2", "--",
                                  os.path.join(COMMON, "rank_failures.py"), mode],
                        env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == code, res.stdout[-3000:] + res.stderr[-3000:]
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    1 (local_rank 0)\n  host:    hostB\n"), res.stderr[-3000:]
    assert exit_line in root, root
    if mode == "exit":
        assert "rank 1 exits 4" in root, root
    assert "gaspi_run (on hostA" in res.stderr
    assert "\x1e" not in res.stdout + res.stderr  # the records themselves are not shown
    said = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert said[0]["rank"] == 0 and said[0]["peer"] == 1, said  # rank 0 named it
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def test_a_master_that_ends_early_does_not_hide_the_others_failures(multihost, tmp_path):
    # rank 0 (hostA) makes one allreduce of the two rank 1 (hostB) makes, and ends, exit 0;
    # rank 1 fails at once ("rank 0 has shut down") and exits 1. gaspi_run exits with its
    # master rank's status alone: tntrun exited 0, with no report, for a job that failed
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--transport", "gpi2", "--",
                                  os.path.join(HERE, "rank_multihost.py"), str(tmp_path), "early-master"],
                        env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    1 (local_rank 0)\n  host:    hostB\n"), res.stderr[-3000:]
    assert "PeerLostError: rank 0 has shut down" in root, root
    below = res.stderr.split("\nRank 0 (hostA, pid ")[1]  # as on one host: rank 0, with its stderr
    assert "had ended, exit code 0, while the others" in below and "rank 0 left its loop early on hostA" in below
    assert "gaspi_run (on hostA, pid" in res.stderr and "ended with exit code 0" in res.stderr
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def test_a_host_ssh_cannot_reach_is_named_at_once(multihost, tmp_path):
    # gaspi_run starts each host's ranks with `ssh HOST ... &` and never looks at ssh's exit:
    # with a host that does not resolve, rank 0 waited in gaspi_proc_init until TNT_TIMEOUT_S
    # and the report blamed it (a TimeoutError on hostA). tntrun's ssh for gaspi_run
    # (gaspi_ssh.py) reports the host; tntrun stops the job at once and names it
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="30")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:1,nohost:2", "--transport", "gpi2", "--",
                                  os.path.join(HERE, "rank_bare.py"), str(tmp_path)],
                        env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 255, res.stdout[-3000:] + res.stderr[-3000:]
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    1 (local_rank 0)\n  host:    nohost\n  pid:     not started\n"), \
        res.stderr[-3000:]  # not "pid: None"
    assert "NotStartedError: ssh could not reach nohost: rank(s) 1, 2 were not started" in root, root
    assert "Could not resolve hostname nohost" in root, root  # ssh's own words
    assert "TimeoutError" not in res.stderr, res.stderr[-3000:]
    assert "tntrun stopped gaspi_run: gaspi_run could not start the ranks on nohost" in res.stderr
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tnt-")]  # its script and machine file
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def test_a_host_where_tarantella_cannot_be_imported_is_named_at_once(multihost, tmp_path):
    # the rank wrapper could not be imported on hostB (Tarantella not installed for that Python
    # there): its rank never started, gaspi_run did not notice, rank 0 waited in gaspi_proc_init
    # until TNT_TIMEOUT_S and the report blamed its TimeoutError. The wrapper's bootstrap now
    # sends a record saying why, and tntrun stops the job at once
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    env = without_tarantella_on_hostB(tmp_path, env)
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--transport", "gpi2", "--",
                                  os.path.join(HERE, "rank_bare.py"), str(tmp_path)],
                        env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 127, res.stdout[-3000:] + res.stderr[-3000:]
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    1 (local_rank 0)\n  host:    hostB\n  pid:     not started\n"), root
    assert "NotStartedError: rank 1 could not start on hostB: " in root, root
    assert "cannot import tarantella.runner.rank (No module named" in root, root
    assert "TimeoutError" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert "tntrun stopped gaspi_run: gaspi_run could not start the ranks on hostB" in res.stderr
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def test_a_host_without_tntruns_python_is_named_at_once(multihost, tmp_path):
    # the ranks run with tntrun's own Python, at its path: on hostB there is none there. The
    # script gaspi_run runs said "No such file or directory", gaspi_run's spawner exited 0
    # all the same, and rank 0 waited in gaspi_proc_init until TNT_TIMEOUT_S; the report blamed
    # its TimeoutError. The script now sends the record of a rank that did not start
    env = multihost.env(base=job_env(tmp_path), GPI2_HOME=GPI2_HOME, TNT_TIMEOUT_S="60")
    env["PATH"] = env["PATH"] + os.pathsep + os.path.join(GPI2_HOME, "bin")
    with python_missing_on(multihost, "hostB") as python:
        res = multihost.run("hostA", [python, "-m", "tarantella.runner.cli", "-H", "hostA:1,hostB:1", "--transport",
                                      "gpi2", "--", os.path.join(HERE, "rank_bare.py"), str(tmp_path)],
                            env=env, cwd=str(tmp_path), timeout=300)
    assert res.returncode == 127, res.stdout[-3000:] + res.stderr[-3000:]
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    1 (local_rank 0)\n  host:    hostB\n  pid:     not started\n"), root
    assert f"NotStartedError: rank 1 could not start on hostB: {python} is not there: " in root, root
    assert "TimeoutError" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert "tntrun stopped gaspi_run: gaspi_run could not start the ranks on hostB" in res.stderr
    assert "\x1e" not in res.stdout + res.stderr
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def bare_gaspi_run(bed, tmp_path, hosts, transport):
    """`gaspi_run -m MACHINEFILE -n N PROGRAM` on hostA, no tntrun: PROGRAM is a script that
    sets what a user's shell profile would on every host (gaspi_run forwards no environment)
    and runs rank_bare.py. Not `python` itself: when its rank 0 fails, gaspi_run runs
    `killall -9 PROGRAM` on every host, which would end every python of the machine here
    (one pid namespace)."""
    out = tmp_path / "bare"
    out.mkdir()
    machines = tmp_path / "machines"
    machines.write_text("".join(h + "\n" for h in hosts))
    program = tmp_path / f"tnt-bare-{secrets.token_hex(4)}.sh"
    program.write_text(f"#!/bin/sh\nexport GPI2_HOME={GPI2_HOME} TNT_TRANSPORT={transport} TNT_LOG_LEVEL=INFO\n"
                       f"exec {sys.executable} {os.path.join(HERE, 'rank_bare.py')} {out}\n")
    program.chmod(0o755)
    env = job_env(tmp_path)
    res = bed.run("hostA", ["bash", os.path.join(GPI2_HOME, "bin", "gaspi_run"), "-m", str(machines),
                            "-n", str(len(hosts)), str(program)], env=bed.env(base=env), cwd=str(tmp_path), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    found = [json.load(open(out / f"bare{r}.json")) for r in range(len(hosts))]
    assert nothing_left(bed, bed.hosts), {h: bed.pids(h) for h in bed.hosts}
    return found, res


def test_ranks_gaspi_run_started_find_their_placement_across_hosts(multihost, tmp_path):
    # auto: gpi2 (no MPI runs under gaspi_run), with the reason at INFO
    found, res = bare_gaspi_run(multihost, tmp_path, ["hostA", "hostA", "hostB"], "auto")
    assert [(f["rank"], f["size"], f["local_rank"], f["local_size"], f["host"]) for f in found] == [
        (0, 3, 0, 2, "hostA"), (1, 3, 1, 2, "hostA"), (2, 3, 0, 1, "hostB")]
    assert {f["transport"] for f in found} == {"gpi2"} and {f["sum"] for f in found} == {6.0}
    assert all(f["tnt_env"] == [] for f in found)  # no TNT_RANK: GPI-2's own variables
    assert "transport gpi2 selected (TNT_TRANSPORT=auto)" in res.stdout + res.stderr
    assert "hostB" in [c["host"] for c in multihost.ssh_calls()]


def test_ranks_gaspi_run_started_on_one_host(multihost, tmp_path):
    found, _ = bare_gaspi_run(multihost, tmp_path, ["hostA", "hostA"], "gpi2")
    assert [(f["rank"], f["size"], f["local_rank"], f["local_size"]) for f in found] == [(0, 2, 0, 2), (1, 2, 1, 2)]
    assert {f["transport"] for f in found} == {"gpi2"} and {f["sum"] for f in found} == {3.0}
