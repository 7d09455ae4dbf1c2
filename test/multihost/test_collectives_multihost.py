"""Ranks spread over several hosts of the test bed (network namespaces with their own names,
multihost_testbed.py): TNT_TRANSPORT=auto takes shm within each host and mpi between hosts,
and the allreduce is hierarchical where every host holds several ranks.

One launch per placement checks everything rank_multihost.py runs (every collective x dtype x
awkward size, bitwise identical on every rank; the same bits fused or alone): 2 hosts x 2
ranks (hierarchical), 3 hosts x 1 rank (flat ring over mpi) and 3 + 1 ranks (uneven: flat
ring, shm or mpi hop by hop), the last started by mpirun directly, without tntrun. Then a
rank SIGKILLed on one host: every rank on every host raises naming it, tntrun ends the job
with that rank as the root cause, and nothing is left in /dev/shm or running on any host.
Last, a host cut off (its link taken down) under auto (shm+mpi) and --transport mpi: every
rank on either side names all the ranks of the other within TNT_TIMEOUT_S + 2 s, and tntrun
ends the job although mpirun, waiting for its daemon beyond the cut, would not."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from multihost_helpers import cut_off, job_env, nothing_left
from multihost_helpers import root_cause as root_cause_of

COMMON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common")
sys.path.insert(0, COMMON)
from core_helpers import collectives_agree, json_lines  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "rank_multihost.py")
MPIRUN = shutil.which("mpirun")


def _openmpi():
    if not (MPIRUN and shutil.which("mpicc")):
        return False
    out = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True)
    return "Open MPI" in out.stdout + out.stderr


pytestmark = pytest.mark.skipif(not _openmpi(), reason="needs Open MPI (mpirun, mpicc: apt-get install "
                                "openmpi-bin libopenmpi-dev): the transport between hosts is mpi")


@pytest.fixture(scope="module")
def bed(multihost3):
    """Three hosts (the session's `multihost` fixture has two)."""
    return multihost3


def env_for(bed, tmp_path):
    env = job_env(tmp_path)
    # this interpreter's tntrun (the installed one), wherever PATH would look first
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return bed.env(base=env, TNT_LOG_LEVEL="INFO")


def tntrun(bed, tmp_path, layout, *args, settings=None):
    """`settings`: TNT_* variables for every rank (tntrun forwards its environment to every host)."""
    env = dict(env_for(bed, tmp_path), **(settings or {}))
    return bed.run("hostA", ["tntrun", "-H", layout, "--no-gpu", "--output-on-all-devices", "--", RANK,
                             str(tmp_path), *args], env=env, cwd=str(tmp_path), timeout=600)


def mpirun(bed, tmp_path, layout, *args, here_only=None):
    """mpirun itself; `here_only`: variables set in its environment but not named with -x, which
    only the ranks on hostA see (Open MPI's ssh launch forwards what -x names)."""
    n = sum(int(h.split(":")[1]) for h in layout.split(","))
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    env = env_for(bed, tmp_path)
    env.update(here_only or {})
    # the same Tarantella on every host: the one under test where PYTHONPATH names it
    forward = ["-x", "PATH", "-x", "TNT_LOG_LEVEL"] + (["-x", "PYTHONPATH"] if env.get("PYTHONPATH") else [])
    return bed.run("hostA", [MPIRUN, *root, "--bind-to", "none", "-np", str(n), "--host", layout,
                             *forward, sys.executable, RANK, str(tmp_path), *args],
                   env=env, cwd=str(tmp_path), timeout=600)


def hosts_of(layout):
    """[host of rank r] for a --host list (ranks fill the hosts in order)."""
    return [h.split(":")[0] for h in layout.split(",") for _ in range(int(h.split(":")[1]))]


def shm_names(job):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"tnt-{job}"))


@pytest.mark.parametrize("layout, launcher, scheme", [
    ("hostA:2,hostB:2", tntrun, "allreduce: hierarchical, 2 hosts x 2 ranks (inside the host, then position 0 of "
                                "every host in MPI's direct messages (TNT_MPI_PAIR_SUM=1) of at most 256 KiB"),
    # the pair's messages in pieces of 16 KiB, not the 256 of 2 x 2: its halves of the sizes
    # here go in 1-10 pieces each, and the 36 MB in place in over a thousand, through the scratch
    ("hostA:1,hostB:1", tntrun, "allreduce: flat ring over all 2 ranks (one rank per host); above 16 KiB the two "
                                "sum in MPI's direct messages (TNT_MPI_PAIR_SUM=1) of at most 16 KiB"),
    ("hostA:1,hostB:1,hostC:1", tntrun, "allreduce: flat ring over all 3 ranks (one rank per host)"),
    ("hostA:3,hostB:1", mpirun, "allreduce: flat ring over all 4 ranks (hosts hold different numbers of ranks)"),
], ids=["2x2-tntrun", "2x1-tntrun", "3x1-tntrun", "3+1-mpirun"])
def test_every_collective_across_hosts(bed, tmp_path, layout, launcher, scheme):
    pieces = {"settings": {"TNT_MPI_PAIR_PIECE_KB": "16"}} if layout == "hostA:1,hostB:1" else {}
    res = launcher(bed, tmp_path, layout, "collectives", **pieces)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    n = len(hosts_of(layout))
    pairs = layout in ("hostA:2,hostB:2", "hostA:1,hostB:1")
    # auto chose shm within hosts and mpi between them, and said why (rank 0 logs at INFO)
    assert re.search(r"transport shm\+mpi selected \(TNT_TRANSPORT=auto\): the %d ranks are on several hosts" % n,
                     res.stderr), res.stderr[-3000:]
    assert scheme in res.stderr, res.stderr[-3000:]
    where = [json.load(open(tmp_path / f"host{r}.json")) for r in range(n)]
    assert [w["host"] for w in where] == hosts_of(layout)
    assert {w["transport"] for w in where} == {"shm+mpi"}
    for w in where:
        assert w["failures"] == [], w["failures"]  # fused, alone or in one round: the same bits
    print("one-round calls per rank:", [w["one_round"] for w in where])
    # which cached calls may ride with the negotiation (3 each): up to 64 KiB where every rank
    # has its host to itself or the hosts are uneven (flat ring); under the hierarchical
    # allreduce of 2 x 2, alone in their cycle, summed along the bit round, up to 64 KiB too
    # (ride.h), and in a full round up to 16 KiB (tnt_one_round_bytes)
    limit = 64 << 10
    may_ride = 3 * sum(n * size <= limit for size in (4, 2) for n in (1, 17, 1000, 3001, 4099, 20_000, 100_003))
    assert all(0 < w["one_round"] <= may_ride for w in where), ([w["one_round"] for w in where], may_ride)
    # a pair of ranks across 2 hosts (2 x 1, and each position's link of 2 x 2): the tensors
    # above 16 KiB of both dtypes, fused (and alone, above what rides), summed in MPI's direct
    # messages (TNT_MPI_PAIR_SUM); never with more hosts or uneven ones
    assert all((n > 0) == pairs for w in where for n in w["pair_sums"].values()), [w["pair_sums"] for w in where]
    # the large cached names called again negotiate in bit rounds (an AND across hosts)
    assert all(w["bit_rounds"] > 0 for w in where), [w["bit_rounds"] for w in where]
    reports = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(n)]
    collectives_agree(reports)
    assert all(w["alone"] == where[0]["alone"] for w in where), [w["alone"] for w in where]
    assert shm_names(reports[0]["job"]) == []
    assert nothing_left(bed, bed.hosts)


def test_allreduces_that_ride_their_bit_round_give_the_bits_of_the_usual_path(bed, tmp_path):
    # 2 x 2: a cached allreduce alone in its cycle, up to 64 KiB, rides in its bit round
    # (ride.h). The results must be those of the job with TNT_RIDES=0, bit for bit, on
    # every rank, and every call of a steady loop must ride (a counter, not a timing)
    script = os.path.join(HERE, "rank_rides.py")
    for rides in (1, 0):
        out = tmp_path / f"rides{rides}"
        out.mkdir()
        res = bed.run("hostA", ["tntrun", "-H", "hostA:2,hostB:2", "--no-gpu", "-x", f"TNT_RIDES={rides}", "--",
                                script, str(out)], env=env_for(bed, tmp_path), cwd=str(tmp_path), timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    runs = [(rides, r) for rides in (1, 0) for r in range(4)]
    results = {run: np.load(tmp_path / f"rides{run[0]}" / f"rank{run[1]}.npz") for run in runs}
    for name in results[(1, 0)].files:
        for run in runs:
            assert np.array_equal(results[run][name], results[(1, 0)][name]), (name, run)
    for r in range(4):
        with_rides = json.load(open(tmp_path / "rides1" / f"rank{r}.json"))
        without = json.load(open(tmp_path / "rides0" / f"rank{r}.json"))
        calls = with_rides["calls"]
        assert with_rides["counts"] == {"f32_4b": calls, "f32_40k": calls, "f16_20k": calls, "f64_avg_32k": calls,
                                        "i64_64k": calls, "i32_avg_40k": 0, "f32_100k": 0}, with_rides
        # without rides: the small ones in a full round (tnt_one_round_bytes: 16 KiB here)
        assert without["counts"] == {"f32_4b": calls, "f32_40k": 0, "f16_20k": 0, "f64_avg_32k": 0,
                                     "i64_64k": 0, "i32_avg_40k": 0, "f32_100k": 0}, without


@pytest.mark.parametrize("mode", ["kill", "kill-one-round"], ids=["announced", "riding"])
def test_a_rank_killed_on_one_host_is_named_on_every_host(bed, tmp_path, mode):
    # rank 3 (hostB) SIGKILLs itself inside an allreduce: rank 2 shares its host (shm), ranks 0
    # and 1 are on hostA (mpi). Every rank on every host raises, naming it. "riding": 64 KB
    # under one name, cached, so that the others wait in a bit round that carries it (ride.h)
    res = tntrun(bed, tmp_path, "hostA:2,hostB:2", mode)
    by_rank = {}
    for line in json_lines(res.stdout):
        by_rank.setdefault(line["rank"], []).append(line)
    assert sorted(by_rank) == [0, 1, 2], res.stdout[-3000:] + res.stderr[-3000:]
    for r, (first, later) in by_rank.items():
        assert first["error"] == "PeerLostError", first
        assert first["peer"] == 3 and "rank 3 (pid" in first["message"] and "on hostB" in first["message"], first
        assert "died" in first["message"], first
        assert first["seconds"] < 5, first
        assert later["later"] == "PeerLostError", later
    # tntrun ended the job, with the killed rank as the root cause
    assert res.returncode == 128 + 9, res.stderr[-3000:]
    root = res.stderr[res.stderr.index("Root cause"):]
    assert "  rank:    3 (local_rank 1)\n" in root and "  host:    hostB\n" in root, root
    assert "  exit:    signal 9 (SIGKILL)\n" in root, root
    assert shm_names(open(tmp_path / "job").read()) == []
    assert nothing_left(bed, bed.hosts)


def test_a_rank_that_exits_with_a_status_on_one_host_is_the_root_cause(bed, tmp_path):
    # rank 3 (hostB) calls sys.exit(4) between two allreduces. It waited at exit in
    # MPI_Finalize (Open MPI's fence) for the others, which, told that it had shut down, failed
    # with PeerLostError and exited 3 without finalizing; mpirun then killed it: tntrun blamed
    # rank 0's PeerLostError and exited 3, never naming rank 3 or its status
    res = bed.run("hostA", ["tntrun", "-H", "hostA:2,hostB:2", "--no-gpu", "--transport", "mpi", "--",
                            os.path.join(COMMON, "rank_failures.py"), "exit"],
                  env=env_for(bed, tmp_path), cwd=str(tmp_path), timeout=600)
    assert res.returncode == 4, res.stdout[-3000:] + res.stderr[-3000:]  # the rank's own status
    root = res.stderr[res.stderr.index("Root cause"):]
    assert "  rank:    3 (local_rank 1)\n" in root and "  host:    hostB\n" in root, root
    assert "  exit:    exit code 4\n" in root and "rank 3 exits 4" in root, root
    assert "PeerLostError" in root.split("Other failures:")[1], root  # the others, caused by it
    assert nothing_left(bed, bed.hosts)


@pytest.mark.parametrize("mode", ["early", "early-after"])
def test_a_rank_that_ends_early_on_one_host_is_named_at_once(bed, tmp_path, mode):
    # rank 1 (hostB) ends, exit 0, before it calls tnt.init() ("early"), or after one
    # allreduce of the two the other makes ("early-after"). Before it joined: rank 0 waited in
    # MPI_Init until TNT_TIMEOUT_S (Open MPI's start-up fence has no time limit of its own, and
    # mpirun accepts an exit 0), where on one host tntrun tells it at once; tntrun, told by
    # the rank wrappers which ranks began tnt.init() and how every rank ended, now ends the job
    # at once naming rank 1. After: rank 0 was told at once ("rank 1 has shut down"), but the
    # report showed nothing of rank 1 (still in MPI_Finalize when mpirun stopped it), where on
    # one host it shows its host and the last lines of its stderr
    env = env_for(bed, tmp_path)
    env["TNT_TIMEOUT_S"] = "60"
    started = time.monotonic()
    res = bed.run("hostA", ["tntrun", "-H", "hostA:1,hostB:1", "--no-gpu", "--", RANK, str(tmp_path), mode],
                  env=env, cwd=str(tmp_path), timeout=300)
    took = time.monotonic() - started
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert took < 45, (took, res.stderr[-3000:])  # well inside TNT_TIMEOUT_S
    report = res.stderr[res.stderr.index(" FAILED\n"):]
    if mode == "early":
        root = root_cause_of(res.stderr)
        assert root.startswith("  rank:    1 (local_rank 0)\n  host:    hostB\n"), report
        assert "  exit:    exit code 0\n" in root, report
        assert ("  error:   rank 1 ended (exit code 0) before it joined the job, while rank 0 on hostA waited for it "
                "in tnt.init()") in root, report
        assert "rank 1 has no shard on hostB" in root, report  # its stderr, forwarded from hostB
        assert "tntrun stopped mpirun: rank 1 ended on hostB (exit code 0) without joining the job" in report, report
    else:
        root = root_cause_of(res.stderr)
        assert root.startswith("  rank:    0 (local_rank 0)\n  host:    hostA\n"), report
        assert "PeerLostError: rank 1 has shut down" in root, report
        assert re.search(r"\nRank 1 \(hostB, pid \d+\) had (ended, exit code 0,|shut down \(its process)", report), report
        assert "rank 1 left its loop early on hostB" in report.split("\nRank 1 (hostB")[1], report
    assert nothing_left(bed, bed.hosts)


def test_a_transport_set_on_one_host_only_fails_every_rank_saying_so(bed, tmp_path):
    # TNT_TRANSPORT=mpi set before a bare mpirun reaches only hostA's ranks: hostB's take auto
    # (shm+mpi), which discovers the hosts where mpi goes on with its set-up. Their exchanges
    # stopped pairing up: hostA's ranks said "rank 2 sent a set-up record of 6 bytes, not 96:
    # every rank must run the same release of Tarantella" (its host name), hostB's that a
    # rank of hostA had shut down. Every rank now names the setting, in the transport's hello
    res = mpirun(bed, tmp_path, "hostA:2,hostB:2", "init", here_only={"TNT_TRANSPORT": "mpi"})
    assert res.returncode != 0, res.stderr[-3000:]
    for r in range(4):
        got = json.load(open(tmp_path / f"init{r}.json"))
        assert got["error"] == "InvalidUsageError", got
        assert "the ranks disagree on TNT_TRANSPORT (rank 0 on hostA: mpi, rank 2 on hostB: auto)" in got["message"], got
    assert nothing_left(bed, bed.hosts)


def ready_ranks(out):
    return [f for f in os.listdir(out) if f.startswith("rank") and open(os.path.join(out, f)).read()]


@pytest.mark.parametrize("layout, transport", [("hostA:2,hostB:2", "auto"), ("hostA:2,hostB:2", "mpi"),
                                               ("hostA:1,hostB:1", "auto")], ids=["2x2-auto", "2x2-mpi", "2x1-auto"])
def test_a_host_cut_off_is_named_on_every_other_host(bed, tmp_path, layout, transport):
    # hostB's link goes down while the ranks reduce: no connection breaks (no RST, no error
    # from Open MPI), mpirun's daemon on hostB is cut off from mpirun; only silence tells, 10
    # missed heartbeats of 0.2 s. The ranks of each side must name every rank of the other, in
    # files (hostB's output cannot cross the cut). Between the hosts the ranks wait on MPI's own
    # messages of the pair (TNT_MPI_PAIR_SUM), which must end by the same deadline
    out = tmp_path / "cut"
    out.mkdir()
    env = env_for(bed, tmp_path)
    env.update(TNT_MPI_HEARTBEAT_S="0.2", TNT_TIMEOUT_S="10")
    hosts = hosts_of(layout)
    n, far = len(hosts), [r for r, h in enumerate(hosts) if h == "hostB"]
    proc = bed.popen("hostA", ["tntrun", "-H", layout, "--no-gpu", "--transport", transport,
                               "-x", "TNT_MPI_HEARTBEAT_S", "-x", "TNT_TIMEOUT_S", "--",
                               os.path.join(HERE, "rank_cut.py"), str(out)],
                     env=env, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):
            if len(ready_ranks(out)) == n or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert len(ready_ranks(out)) == n, proc.communicate(timeout=60)
        with cut_off(bed, "hostB"):
            _, err = proc.communicate(timeout=120)  # tntrun ended the job (it stopped mpirun)
            # nothing left on hostA, and on hostB (its ranks ended on their own, tntrun ended
            # the daemon mpirun had started there) while the link is still down
            assert nothing_left(bed, bed.hosts), {h: bed.pids(h) for h in bed.hosts}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err[-3000:]
    pids = {}
    lines = {r: [json.loads(ln) for ln in open(out / f"rank{r}.json")] for r in range(n)}
    for r, (ready, got) in lines.items():
        assert ready["ready"] and got["error"] == "PeerLostError", got
        assert ready["pair_sums"] == 1, ready  # the warm-up: between the hosts in MPI's own messages
        assert got["seconds"] < 10 + 2, got  # within TNT_TIMEOUT_S + 2 s
        if r in far:
            # the cut-off host's own ranks name a rank of hostA: silent, or, since the test bed's
            # hosts share one pid namespace, gone once it raised and exited (whichever they see first)
            near = "|".join(str(q) for q in range(n) if q not in far)
            assert re.search(r"\branks? (%s)\b" % near, got["message"]) and "hostA" in got["message"], got["message"]
            continue
        if " died while " in got["message"]:
            # the same race from this side: a rank of hostB saw the silence first, raised and
            # exited, and the shared pid namespace let this rank see it gone (seen once in a full
            # suite; on real hosts pids are never compared across hosts)
            assert re.search(r"\brank (%s) \(pid \d+ on hostB\) died" % "|".join(map(str, far)), got["message"]), \
                got["message"]
            continue
        pids[r] = re.findall(r"(\d+) \(pid (\d+)\)", got["message"])
        assert [int(q) for q, _ in pids[r]] == far, got["message"]  # every unreachable rank
        assert "on hostB" in got["message"], got["message"]  # named by host
        assert "sent nothing for" in got["message"] and "cut off" in got["message"], got["message"]
    assert len(set(map(tuple, pids.values()))) <= 1, pids  # ranks 0 and 1 name the same silent ranks
    # tntrun stopped mpirun, and said why; a rank of hostA is the root cause
    assert "and mpirun had not ended the job 10 s later: stopping it" in err, err[-3000:]
    assert "  host:    hostA\n" in err[err.index("Root cause"):], err[-3000:]
    assert shm_names(lines[0][0]["job"]) == []
