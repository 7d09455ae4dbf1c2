"""The network transports count the cores of the waits' budget as the shm transport does
(test/common/test_cores.py): the CPUs the host's ranks may run on, the union of the affinity
masks they send each other at set-up, not the machine's online CPUs. Two hosts of the test bed
whose ranks are confined to one CPU share that CPU: a rank that spins on it while waiting for
the other's message holds the core the other is queued on. Before, each rank counted the
machine's two CPUs, took itself for a rank with two cores, and spun for up to 1 ms
(TNT_NET_SPIN_US) in every wait. Counted by core.stats() and read from the INFO line, not
timed."""
import json
import os
import sys

import pytest

from multihost_helpers import job_env, nothing_left
from test_collectives_multihost import pytestmark  # noqa: F401 - needs Open MPI, as those tests

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "..", "common", "rank_waits.py")


def test_ranks_of_two_hosts_confined_to_one_cpu_never_spin(multihost, tmp_path):
    one = {min(os.sched_getaffinity(0))}
    env = job_env(tmp_path)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # tntrun, mpirun and its daemon on the other host inherit the affinity, and so every rank
    proc = multihost.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--no-gpu", "--output-on-all-devices", "--",
                                   RANK, str(tmp_path)],
                         env=multihost.env(base=env, TNT_LOG_LEVEL="INFO", TNT_LOG_ON_ALL_DEVICES="1"), cwd=str(tmp_path), timeout=300,
                         preexec_fn=lambda: os.sched_setaffinity(0, one))
    assert proc.returncode == 0, proc.stderr[-3000:]
    observed = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(2)]
    assert all(o["cpus"] == sorted(one) and o["sums_ok"] for o in observed), observed
    # each rank's host has one rank on one core: the network plugin says so ...
    assert proc.stderr.count("1 on this host (on 1 cores") == 2, proc.stderr[-3000:]
    # ... and its waits yield or sleep, never spin (the stats count the plugin's waits)
    stats = [o["stats"] for o in observed]
    assert all(s["waits_spun"] == 0 for s in stats), stats
    assert all(s["waits_yielded"] + s["waits_slept"] > 0 for s in stats), stats
    assert nothing_left(multihost, ["hostA", "hostB"])
