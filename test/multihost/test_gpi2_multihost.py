"""The gpi2 transport across hosts, on the test bed: `tntrun --transport gpi2 -H ...` runs on
hostA and starts the ranks through GPI-2's gaspi_run, which reaches hostB through the ssh
stand-in, as on a cluster. Every collective x dtype x awkward size, bitwise identical on every
rank and to shm on one host. Skips where GPI-2 is not installed (GPI2_HOME, or /work/gpi2:
GPI-2 is GPL-3.0 and packaged nowhere) or the test bed cannot be made (not root)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from multihost_helpers import job_env, nothing_left

COMMON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common")
sys.path.insert(0, COMMON)
from core_helpers import tntrun as tntrun_here  # noqa: E402
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
    reports = [json.load(open(out / f"rank{r}.json")) for r in range(n)]
    first = reports[0]["results"]
    assert len(first) > 100
    for rep in reports:
        assert rep["failures"] == [], rep["failures"]
        differing = [k for k in first if rep["results"].get(k) != first[k]]
        assert not differing, f"rank {rep['rank']} differs from rank 0 on {differing[:5]}"
    # gaspi_run reached hostB through ssh, as on a cluster
    assert "hostB" in [c["host"] for c in multihost.ssh_calls()]
    # the algorithms never know the transport: shm on one host gives the same bits
    shm = tmp_path / "shm"
    shm.mkdir()
    res = tntrun_here(n, "rank_collectives.py", shm, env={"TNT_TEST_BIG_BYTES": 3 << 20})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    other = json.load(open(shm / "rank0.json"))["results"]
    differing = [k for k in first if other.get(k) != first[k]]
    assert not differing, f"gpi2 across hosts and shm differ on {differing[:5]}"
    assert nothing_left(multihost, multihost.hosts), {h: multihost.pids(h) for h in multihost.hosts}
