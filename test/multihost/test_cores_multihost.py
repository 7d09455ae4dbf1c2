"""The network transports count the cores of the waits' budget as the shm transport does
(test/common/test_cores.py): the CPUs the ranks of the machine may run on, the union of the
affinity masks they send each other at set-up, not the machine's online CPUs. The two hosts of
the test bed share one kernel, so its ranks count together. Confined to one CPU, a rank that
spins on it while waiting for the other's message holds the core the other is queued on.
Before, each rank counted the machine's two CPUs, took itself for a rank with cores to spare,
and spun for up to 1 ms (TNT_NET_SPIN_US) in every wait. Ranks pinned to a CPU each (Slurm's
binding) do have a core each, and may spin: counting the ranks of one host name alone took such
a rank for one without a core to spare. Counted by core.stats() and read from the INFO lines,
not timed."""
import json
import os
import sys

import pytest

from multihost_helpers import job_env, nothing_left
from test_collectives_multihost import pytestmark  # noqa: F401 - needs Open MPI, as those tests

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "..", "common", "rank_waits.py")


def launch(bed, tmp_path, *rank_args, **run_kw):
    env = job_env(tmp_path)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return bed.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--no-gpu", "--output-on-all-devices", "--",
                             RANK, str(tmp_path), *rank_args],
                   env=bed.env(base=env, TNT_LOG_LEVEL="INFO", TNT_LOG_ON_ALL_DEVICES="1"), cwd=str(tmp_path),
                   timeout=300, **run_kw)


def test_ranks_of_two_hosts_confined_to_one_cpu_never_spin(multihost, tmp_path):
    one = {min(os.sched_getaffinity(0))}
    # tntrun, mpirun and its daemon on the other host inherit the affinity, and so every rank
    proc = launch(multihost, tmp_path, preexec_fn=lambda: os.sched_setaffinity(0, one))
    assert proc.returncode == 0, proc.stderr[-3000:]
    observed = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert all(o["cpus"] == sorted(one) and o["sums_ok"] for o in observed), observed
    # the two hosts share the machine (its kernel) and its one CPU: the network plugin says so ...
    assert proc.stderr.count("1 on this host; 2 on this machine on 1 cores") == 2, proc.stderr[-3000:]
    # ... and its waits yield or sleep, never spin (the stats count the plugin's waits)
    stats = [o["stats"] for o in observed]
    assert all(s["waits_spun"] == 0 for s in stats), stats
    assert all(s["waits_yielded"] + s["waits_slept"] > 0 for s in stats), stats
    assert nothing_left(multihost, ["hostA", "hostB"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin the ranks to one each")
def test_ranks_pinned_to_a_cpu_each_count_a_core_each(multihost, tmp_path):
    proc = launch(multihost, tmp_path, "--own-cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    observed = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert all(len(o["cpus"]) == 1 and o["sums_ok"] for o in observed), observed
    assert observed[0]["cpus"] != observed[1]["cpus"], observed
    # a core each: as many cores as ranks on the machine, where spinning is allowed
    assert proc.stderr.count("1 on this host; 2 on this machine on 2 cores") == 2, proc.stderr[-3000:]
