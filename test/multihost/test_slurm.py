"""tntrun (and srun alone) inside a Slurm allocation, on a real Slurm cluster on the test bed (slurm_cluster.py):
slurmctld and munged on the login host `slurmctl`, a slurmd on hostA and on hostB. A plain
`tntrun -- probe.py` given to `salloc -N 2` must use both nodes through srun, and a failed
rank must be reported with its own exit status, not srun's."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import multihost_testbed
import slurm_cluster
from multihost_helpers import job_env, nothing_left, placement, probes, root_cause, without_tarantella_on_hostB
from multihost_testbed import TestbedUnavailable

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(
    not shutil.which("tntrun"),
    reason="needs an installed tntrun (pip install -e .): the ranks run tarantella.runner.rank")


@pytest.fixture(scope="module")
def cluster():
    reason = slurm_cluster.unavailable_reason() or multihost_testbed.unavailable_reason()
    if reason:
        pytest.skip(reason)
    c = slurm_cluster.SlurmCluster(["hostA", "hostB"])
    try:
        c.start()  # daemons that do not come up fail the tests (SlurmStartError)
    except TestbedUnavailable as exc:  # no namespaces here
        pytest.skip(str(exc))
    try:
        yield c
    finally:
        c.close()


def salloc(cluster, tmp_path, args, timeout=180, env=None):
    res = cluster.run("slurmctl", ["salloc", *args], env=cluster.env(env or job_env(tmp_path)),
                      cwd=str(tmp_path), timeout=timeout)
    daemons = [p.pid for _, p in cluster.procs]
    assert nothing_left(cluster.bed, cluster.nodes, keep=daemons), "job steps left on the nodes"
    return res


def test_plain_tntrun_uses_the_whole_allocation(cluster, tmp_path):
    # salloc -N 2 asks for no tasks: one rank per node (no GPUs here)
    res = salloc(cluster, tmp_path, ["-N", "2", "tntrun", "--", "probe.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert placement(res.stderr) == [("0", "hostA", "0", "1", "2"), ("1", "hostB", "0", "1", "2")]
    # the tasks the allocation asked for
    res = salloc(cluster, tmp_path, ["-N", "2", "--ntasks-per-node=2", "tntrun", "--", "probe.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert placement(res.stderr) == [
        ("0", "hostA", "0", "2", "4"), ("1", "hostA", "1", "2", "4"),
        ("2", "hostB", "0", "2", "4"), ("3", "hostB", "1", "2", "4")]
    assert len({p["job_id"] for p in probes(res.stderr)}) == 1
    assert res.stdout.splitlines() == ["stdout of rank 0"]
    # -n 3 in blocks (2 + 1): the allocation's SLURM_NTASKS_PER_NODE=2 reached srun beside
    # tntrun's own counts, and srun warned "can't honor --ntasks-per-node set to 2 ..."
    res = salloc(cluster, tmp_path, ["-N", "2", "--ntasks-per-node=2", "tntrun", "-n", "3", "--", "probe.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert placement(res.stderr) == [
        ("0", "hostA", "0", "2", "3"), ("1", "hostA", "1", "2", "3"), ("2", "hostB", "0", "1", "3")]
    assert "honor" not in res.stderr and "Warning" not in res.stderr, res.stderr


def test_an_allocation_of_one_node_runs_on_that_node_not_on_the_login_node(cluster, tmp_path):
    # salloc's shell runs on the login host (slurmctl here): tntrun started the ranks of an
    # allocation of one node itself, there, outside the allocation. It now goes through srun
    res = salloc(cluster, tmp_path, ["-N", "1", "-n", "2", "tntrun", "--", "probe.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    ranks = placement(res.stderr)
    assert [r[0] for r in ranks] == ["0", "1"] and {r[1] for r in ranks} < {"hostA", "hostB"}, ranks
    assert ranks[0][1] == ranks[1][1] and [r[2:] for r in ranks] == [("0", "2", "2"), ("1", "2", "2")], ranks



def test_more_ranks_than_the_allocation_has_cpus_says_how_to_fix_it(cluster, tmp_path):
    # salloc -N 1 holds one CPU (select/cons_tres): `tntrun -n 2` ended with srun's bare "More
    # processors requested than permitted"; tntrun now says what to ask for instead
    res = salloc(cluster, tmp_path, ["-N", "1", "tntrun", "-n", "2", "--", "probe.py"])
    assert res.returncode != 0, res.stdout + res.stderr
    assert "More processors requested than permitted\ntntrun: srun needs a CPU of the allocation per rank" \
        in res.stderr, res.stderr
    assert "(SLURM_JOB_CPUS_PER_NODE=1): allocate a task per rank (salloc -N 1 -n 2, " in res.stderr, res.stderr

def test_tntrun_as_the_one_task_of_a_step_uses_the_allocation(cluster, tmp_path):
    # `srun -N1 -n1 tntrun` (as a shell from `srun --pty bash`): tntrun's own step holds the
    # allocation's CPU on hostA, and the ranks' step waited for it for ever ("step creation
    # temporarily disabled, retrying (Requested nodes are busy)"): now it may overlap
    res = salloc(cluster, tmp_path, ["-N", "2", "srun", "-N1", "-n1", "tntrun", "-n", "2", "--", "probe.py"],
                 timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert placement(res.stderr) == [("0", "hostA", "0", "1", "2"), ("1", "hostB", "0", "1", "2")]
    assert res.stdout.splitlines() == ["stdout of rank 0"]
    # the step's own SLURM_DISTRIBUTION=cyclic (a step of one task) reached the ranks' srun:
    # ranks 0 and 2 ran on hostA, 1 and 3 on hostB; now in blocks, as tntrun places them
    res = salloc(cluster, tmp_path, ["-N", "2", "--ntasks-per-node=2", "srun", "-N1", "-n1", "tntrun", "--",
                                     "probe.py"], timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert placement(res.stderr) == [
        ("0", "hostA", "0", "2", "4"), ("1", "hostA", "1", "2", "4"),
        ("2", "hostB", "0", "2", "4"), ("3", "hostB", "1", "2", "4")]


def test_the_failed_rank_and_its_own_status_not_sruns(cluster, tmp_path):
    res = salloc(cluster, tmp_path, ["-N", "2", "--ntasks-per-node=2", "tntrun", "--",
                                     "probe.py", "2", "3"])
    assert res.returncode == 3, res.stdout + res.stderr  # salloc returns tntrun's status
    root = root_cause(res.stderr)
    assert "  rank:    2 (local_rank 0)\n" in root and "  host:    hostB\n" in root
    assert "  exit:    exit code 3\n" in root
    assert "rank 2 fails on purpose on hostB" in root
    assert "srun (on slurmctl" in res.stderr


    # the rank wrapper could not be imported on hostB: srun ended the job, and the report named
    # srun alone, with Python's "No module named ..." (no rank, no host); now hostB's first rank
    res = salloc(cluster, tmp_path, ["-N", "2", "--ntasks-per-node=2", "tntrun", "--", "probe.py", "9", "1"],
                 env=without_tarantella_on_hostB(tmp_path, job_env(tmp_path)))
    assert res.returncode == 127, res.stdout + res.stderr
    root = root_cause(res.stderr)
    first = re.match(r"  rank:    ([23]) \(local_rank ([01])\)\n  host:    hostB\n  pid:     not started\n", root)
    assert first and int(first[1]) - 2 == int(first[2]), res.stderr
    assert f"NotStartedError: rank {first[1]} could not start on hostB: " in root, root
    assert "cannot import tarantella.runner.rank" in root, root


def test_a_rank_that_ends_before_init_is_named_at_once(cluster, tmp_path):
    # rank 1 ends, exit 0, before tnt.init(): rank 0 waited for it until TNT_TIMEOUT_S (srun
    # starts the ranks: tntrun cannot tell them, as on one host, TNT_LAUNCHER_DIR); tntrun,
    # told by the rank wrappers through srun, ends the job at once naming rank 1. One node:
    # across nodes the mpi transport needs MPI started by srun, which this machine cannot do
    # (see test_ranks_srun_started_find_their_placement_and_reduce)
    env = dict(job_env(tmp_path), TNT_TIMEOUT_S="120")
    started = time.monotonic()
    res = salloc(cluster, tmp_path, ["-N", "1", "--ntasks-per-node=2", "tntrun", "--no-gpu", "--", sys.executable,
                                     os.path.join(HERE, "rank_multihost.py"), str(tmp_path), "early"], env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert time.monotonic() - started < 90, res.stderr  # well inside TNT_TIMEOUT_S
    root = root_cause(res.stderr)
    host = re.match(r"  rank:    1 \(local_rank 1\)\n  host:    (host[AB])\n", root)
    assert host, res.stderr
    assert f"before it joined the job, while rank 0 on {host[1]} waited for it in tnt.init()" in root, root
    assert f"rank 1 has no shard on {host[1]}" in root, root
    assert f"tntrun stopped srun: rank 1 ended on {host[1]}" in res.stderr, res.stderr


TRAPPED = """
import os, signal, sys, time
rank = os.environ["TNT_RANK"]
def stopped(signum, frame):  # what a program that saves a checkpoint when stopped does
    with open(os.path.join(sys.argv[1], "stopped" + rank), "w") as f:
        f.write(signal.Signals(signum).name)
    sys.exit(5)
signal.signal(signal.SIGTERM, stopped)
signal.signal(signal.SIGINT, stopped)
open(os.path.join(sys.argv[1], "ready" + rank), "w").close()
time.sleep(120)
"""


def test_a_stopped_job_gives_its_ranks_the_grace_period(cluster, tmp_path):
    # tntrun stopped srun with SIGTERM, on which srun SIGKILLs its tasks ("forcing job
    # termination"): no rank's handler ran (a checkpoint when stopped, Python's clean-up).
    # srun now gets SIGINT, which it passes on to them (--disable-status)
    (tmp_path / "trapped.py").write_text(TRAPPED)
    out = tmp_path / "out"
    out.mkdir()
    pid_file = tmp_path / "tntrun.pid"
    script = f"tntrun -- trapped.py {out} & echo $! > {pid_file}; wait $!"
    proc = cluster.bed.popen("slurmctl", ["salloc", "-N", "2", "sh", "-c", script], env=cluster.env(job_env(tmp_path)),
                             cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if {"ready0", "ready1"} <= set(os.listdir(out)) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate(timeout=60)
        os.kill(int(pid_file.read_text()), signal.SIGTERM)  # (a background job ignores SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "tntrun: interrupted: all processes were stopped" in err, err[-3000:]
    assert sorted(f for f in os.listdir(out) if f.startswith("stopped")) == ["stopped0", "stopped1"], err[-3000:]
    daemons = [p.pid for _, p in cluster.procs]
    assert nothing_left(cluster.bed, cluster.nodes, keep=daemons), "job steps left on the nodes"


def test_ranks_srun_started_find_their_placement_and_reduce(cluster, tmp_path):
    # srun itself, no tntrun: the core reads Slurm's variables (SLURM_PROCID, SLURM_NTASKS,
    # SLURM_LOCALID, SLURM_NTASKS_PER_NODE) and reduces over shm. On one node: across nodes
    # the mpi transport needs MPI started by srun, which this machine cannot do (Debian's
    # Open MPI has no Slurm PMI; with --mpi=pmix both slurmstepds make the same PMIx folder in
    # the test bed's shared /tmp), see docs/cli.md
    out = tmp_path / "bare"
    out.mkdir()
    res = salloc(cluster, tmp_path, ["-N", "1", "--ntasks-per-node=2", "srun", sys.executable,
                                     os.path.join(HERE, "rank_bare.py"), str(out)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    found = [json.load(open(out / f"bare{r}.json")) for r in range(2)]
    assert [(f["rank"], f["size"], f["local_rank"], f["local_size"]) for f in found] == [(0, 2, 0, 2), (1, 2, 1, 2)]
    assert found[0]["host"] == found[1]["host"] and found[0]["host"] in ("hostA", "hostB")
    assert {f["transport"] for f in found} == {"shm"} and {f["sum"] for f in found} == {3.0}
    assert all(f["tnt_env"] == [] for f in found)  # no TNT_RANK: Slurm's own variables
