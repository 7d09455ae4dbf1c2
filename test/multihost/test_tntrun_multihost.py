"""tntrun across hosts, on the test bed: hostA and hostB are network namespaces with their own
names, reached by mpirun through the ssh stand-in. tntrun runs on hostA, as a user logged in
there would run it.

The probe program (probe.py) only prints what a rank sees (placement, job id, host name): the
shm transport cannot serve ranks on several hosts, so no collective runs here yet.
"""
import os
import re
import shutil
import signal
import subprocess

import pytest

from multihost_helpers import job_env, nothing_left, placement, probes, root_cause, without_tarantella_on_hostB


def _openmpi():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return False
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    return "Open MPI" in out.stdout + out.stderr


pytestmark = [
    pytest.mark.skipif(not _openmpi(), reason="needs Open MPI's mpirun (apt-get install openmpi-bin)"),
    pytest.mark.skipif(not shutil.which("tntrun"), reason="needs an installed tntrun (pip install -e .): "
                       "the ranks on other hosts run tarantella.runner.rank"),
]


@pytest.fixture
def bed(multihost, tmp_path):
    """The session's test bed, with probe.py in tmp_path and a clean environment."""
    multihost.test_env = multihost.env(base=job_env(tmp_path))
    multihost.clear_ssh_log()
    yield multihost
    # whatever happened, no process of the job is left on any host
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}


def tntrun(bed, args, tmp_path, timeout=180):
    return bed.run("hostA", ["tntrun", *args], env=bed.test_env, cwd=str(tmp_path),
                   timeout=timeout)


def test_ranks_see_their_placement_on_each_host(bed, tmp_path):
    # set before tntrun, as a user does: every host's ranks see it, not only hostA's (mpirun
    # gives ranks it starts through ssh only what -x names)
    bed.test_env.update(PROBE_SETTING="a b=c", TNT_FUSION_THRESHOLD_KB="512")
    res = tntrun(bed, ["-H", "hostA:2,hostB:2", "--transport", "mpi", "--", "probe.py"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = probes(res.stderr)
    assert placement(res.stderr) == [
        ("0", "hostA", "0", "2", "4"), ("1", "hostA", "1", "2", "4"),
        ("2", "hostB", "0", "2", "4"), ("3", "hostB", "1", "2", "4")]
    job_ids = {p["job_id"] for p in seen}
    assert len(job_ids) == 1 and len(job_ids.pop()) == 32  # one job, one shared random id
    assert {p["transport"] for p in seen} == {"mpi"}
    assert [(p["setting"], p["fusion_kb"]) for p in seen] == [("a b=c", "512")] * 4
    assert res.stdout.splitlines() == ["stdout of rank 0"]  # only the master's stdout
    # mpirun started hostB's ranks through ssh, as on a cluster
    assert [c["host"] for c in bed.ssh_calls()] == ["hostB"]


def test_a_failing_rank_is_named_with_its_host(bed, tmp_path):
    res = tntrun(bed, ["-H", "hostA:2,hostB:2", "--", "probe.py", "2", "3"], tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    report = res.stderr[res.stderr.index("tntrun: probe.py FAILED"):]
    root = root_cause(res.stderr)
    assert "  rank:    2 (local_rank 0)\n" in root
    assert "  host:    hostB\n" in root
    assert "  exit:    exit code 3\n" in root
    assert "rank 2 fails on purpose on hostB" in root  # its stderr, forwarded from hostB
    assert "mpirun (on hostA" in report
    assert "\x1e" not in res.stderr  # the records themselves are not shown


def test_a_host_without_tarantella_is_named_with_its_rank(bed, tmp_path):
    # the rank wrapper could not be imported on hostB: mpirun ended the job, and the report
    # named mpirun alone, with Python's "No module named ..." (no rank, no host). The
    # wrapper's bootstrap now sends the record of a rank that did not start; rank 0, which
    # would wait (rank 9 does not exist), is stopped
    bed.test_env = without_tarantella_on_hostB(tmp_path, bed.test_env)
    res = tntrun(bed, ["-H", "hostA:1,hostB:1", "--", "probe.py", "9", "1"], tmp_path)
    assert res.returncode == 127, res.stdout + res.stderr
    root = root_cause(res.stderr)
    assert root.startswith("  rank:    1 (local_rank 0)\n  host:    hostB\n  pid:     not started\n"), res.stderr
    assert "NotStartedError: rank 1 could not start on hostB: " in root, root
    assert "cannot import tarantella.runner.rank" in root, root
    assert "\x1e" not in res.stderr


def test_ctrl_c_stops_every_rank_on_every_host(bed, tmp_path):
    # every rank waits (rank 9 does not exist): only Ctrl+C ends the job
    proc = bed.popen("hostA", ["tntrun", "-H", "hostA:2,hostB:2", "--", "probe.py", "9", "1"],
                     env=bed.test_env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
    started = []
    while len(started) < 4:  # all four ranks are up
        line = proc.stderr.readline()
        assert line, "tntrun ended before its ranks started"
        if "PROBE " in line:
            started.append(line)
    assert {"hostA", "hostB"} <= {h for h in bed.hosts if len(bed.pids(h)) > 1}
    proc.send_signal(signal.SIGINT)  # the process is tntrun itself (the host's sh exec'd it)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "tntrun: interrupted: all processes were stopped" in err
    # the bed fixture checks that nothing is left on hostA and hostB


def test_one_line_report(bed, tmp_path):
    res = tntrun(bed, ["-H", "hostA:1,hostB:1", "--log-level", "ERROR", "--",
                       "probe.py", "1", "4"], tmp_path)
    assert res.returncode == 4, res.stdout + res.stderr
    assert "tntrun: error: hostB: rank 1: Exit code 4" in res.stderr.splitlines()


def test_dry_run_prints_the_mpirun_command(bed, tmp_path):
    res = tntrun(bed, ["--dry-run", "--verbose", "-H", "hostA:2,hostB:2", "--", "probe.py"],
                 tmp_path)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    words = line.split()
    mpirun = next(i for i, w in enumerate(words) if w.endswith("/mpirun"))
    assert words[mpirun + 1:mpirun + 8] == ["--allow-run-as-root", "-np", "4", "--host",
                                            "hostA:2,hostB:2", "-npernode", "2"]
    # tntrun's own interpreter (which may be the one a pyenv shim resolves to, not ours)
    rank_cmd = re.search(r"(\S+) -m tarantella\.runner\.rank --report --size=4 --per-node=2 -- (\S+) probe\.py", line)
    assert rank_cmd, line
    assert os.path.realpath(rank_cmd.group(1)) == os.path.realpath(rank_cmd.group(2)), line
    assert os.path.basename(rank_cmd.group(1)).startswith("python"), line
    assert "tntrun: INFO: running as root: passing --allow-run-as-root" in res.stderr
    assert bed.ssh_calls() == []  # nothing started


def test_a_host_listed_again_under_its_address_is_refused_naming_both(bed, tmp_path):
    # hostA and hostA's address are one machine: mpirun merged them into one node and refused
    # the job in its own words ("more processes than the ppr for this topology can support")
    address = bed.addresses["hostA"]
    res = tntrun(bed, ["-H", f"hostA:1,{address}:1", "--", "probe.py"], tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert (f"names one machine twice: 'hostA' and '{address}' are both this machine (hostA: {address}; "
            f"{address}: {address})") in res.stderr, res.stderr
    assert "ppr" not in res.stderr and probes(res.stderr) == []
