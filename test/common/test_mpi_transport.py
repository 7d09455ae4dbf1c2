"""The mpi transport, a plugin built at first use, under a real `mpirun` on this
host with TNT_TRANSPORT=mpi forced: every collective x dtype x awkward size,
bitwise identical on every rank (2 and 3 ranks); a killed, an aborting and a
frozen rank named on the others within a bounded time; and the plugin's error
paths (no MPI, a failed build, a missing library, another ABI) with stand-in
plugins built here. Skips with the reason where mpirun or mpicc is absent."""
import glob
import inspect
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from core_helpers import HERE, clean_env, collectives_agree, json_lines, run_job, same_results, tntrun
from tarantella.common import plugins

MPIRUN, MPICC, CC = shutil.which("mpirun"), shutil.which("mpicc"), shutil.which("cc")
CORE = os.path.abspath(os.path.join(HERE, "..", "..", "core"))
needs_mpi = pytest.mark.skipif(not (MPIRUN and MPICC), reason="needs an MPI: mpirun and mpicc not found "
                               "(apt-get install openmpi-bin libopenmpi-dev)")
needs_cc = pytest.mark.skipif(not CC, reason="needs a C compiler (cc) to build the stand-in plugins")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh plugin cache: the first job of this module builds the plugin
    (its ranks race for the build lock), the others load it."""
    return tmp_path_factory.mktemp("xdg-cache")


def mpi_env(cache, **extra):
    return clean_env(TNT_TRANSPORT="mpi", XDG_CACHE_HOME=cache, OMPI_ALLOW_RUN_AS_ROOT=1,
                     OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, OMPI_MCA_rmaps_base_oversubscribe=1, **extra)


def mpirun_cmd(n, script, *args):
    # --enable-recovery: mpirun lets the survivors of a dead rank run on, so
    # that they, not mpirun, report the loss; --bind-to none: each rank has two
    # busy threads, which one core per rank would serialise
    return [MPIRUN, "--bind-to", "none", "--enable-recovery", "-np", str(n), sys.executable,
            os.path.join(HERE, script), *map(str, args)]


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_is_bitwise_identical_on_every_rank(n, cache, tmp_path):
    # TNT_STREAM_MIN_KB=1024: the 3 MiB buffers take the fused last step of the ring, whose
    # carried pieces go through the transport's send buffer (or the ring's staging slot); shm runs it unfused
    res = subprocess.run(mpirun_cmd(n, "rank_collectives.py", tmp_path),
                         env=mpi_env(cache, TNT_TEST_BIG_BYTES=3 << 20, TNT_LOG_LEVEL="INFO", TNT_TIMEOUT_S=120,
                                     TNT_STREAM_MIN_KB=1024),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"initialized: rank 0 of {n}, transport mpi" in res.stderr, res.stderr[-3000:]
    first = collectives_agree([json.load(open(tmp_path / f"rank{r}.json")) for r in range(n)])
    if n == 3:  # the algorithms never know the transport: shm gives the same bits
        shm = tmp_path / "shm"
        shm.mkdir()
        res = tntrun(n, "rank_collectives.py", shm, env={"TNT_TEST_BIG_BYTES": 3 << 20})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        same_results(first, json.load(open(shm / "rank0.json"))["results"], "mpi and shm")


@needs_mpi
def test_ranks_stopped_together_go_on_when_continued_after_the_timeout(cache, tmp_path):
    # the plugin's waits count on the core's clock (host->now), which leaves out the time a
    # process was stopped: every rank stopped (kill -STOP) for twice TNT_TIMEOUT_S and
    # continued goes on. Before, rank 0, which waited for rank 1 (computing), failed once
    # continued and mpirun ended the job
    go = tmp_path / "go"
    proc = subprocess.Popen(mpirun_cmd(2, "rank_paused.py", go), env=mpi_env(cache, TNT_TIMEOUT_S=3),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the ranks' pids from files, not from mpirun's forwarded output: a line it held back
        # (once, for minutes) left this test reading forever, and rank 0 failed at the timeout
        ups = [tmp_path / f"go.up{r}" for r in range(2)]
        deadline = time.monotonic() + 120
        while not all(up.exists() and up.read_text() for up in ups):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not come up"
            time.sleep(0.02)
        pids = [int(up.read_text()) for up in ups]
        time.sleep(0.5)  # rank 0 waits in 'across-the-pause'
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(6)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        go.touch()  # a rank still waiting for it ends, and with it mpirun's hold on the pipes
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    # each rank's result from its file: mpirun's forwarded output lost one rank's DONE line once
    assert [(tmp_path / f"go.done{r}").read_text() for r in range(2)] == ["DONE [2.0, 2.0, 2.0, 2.0]"] * 2, out


def open_mpi():
    """Whether the plugin is built against Open MPI (where it sets the eager limit)."""
    return plugins.describe_mpi(plugins.find_mpicc())["name"].startswith("openmpi-")


@needs_mpi
@pytest.mark.parametrize("user_limit", [None, "65536"])
def test_allreduces_up_to_64_kib_take_one_round_across_the_network(cache, tmp_path, user_limit):
    # the message that carries a 64 KiB payload must go without Open MPI's rendezvous: the
    # plugin raises Open MPI's TCP eager limit to 72 KiB, unless the user set it
    extra = {"OMPI_MCA_btl_tcp_eager_limit": user_limit} if user_limit else {}
    res = subprocess.run(mpirun_cmd(2, "rank_one_round_net.py", tmp_path), env=mpi_env(cache, **extra),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for r in range(2):
        s = json.load(open(tmp_path / f"rank{r}.json"))
        assert s["mid_ok"] and s["big_ok"], s
        assert s["mid_one_round"] == 40 and s["big_one_round"] == 0, s
        if open_mpi():
            assert s["eager_limit"] == (user_limit or "73728"), s


@needs_mpi
def test_plugin_is_built_once_into_the_cache(cache, tmp_path):
    # after the collectives jobs (or now): one library, with its build log, in a
    # folder named after the MPI and the plugin ABI
    res = subprocess.run(mpirun_cmd(2, "rank_collectives.py", tmp_path), env=mpi_env(cache, TNT_TEST_BIG_BYTES=4096),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    libs = list(cache.glob("tarantella/plugins/mpi-*-abi*/libtnt-transport-mpi.so"))
    assert len(libs) == 1, libs
    assert "exit status 0" in (libs[0].parent / "build.log").read_text()
    assert not list(libs[0].parent.glob(".build-*")), "a temporary build file was left behind"
    assert libs[0].parent.stat().st_mode & 0o077 == 0  # the code we load is nobody else's to change


def run_failures(cache, n, mode, env):
    res = run_job(mpirun_cmd(n, "rank_failures.py", mode), mpi_env(cache, **env), timeout=180)
    by_rank = {}
    for line in json_lines(res.stdout):
        by_rank.setdefault(line["rank"], []).append(line)
    return res, by_rank


def assert_killed_rank_named(cache, mode):
    """Rank 2 of 3 kills itself (rank_failures.py's `mode`): both others raise PeerLostError naming it as
    dead within 5 s (a local peer's pid is watched: far sooner than the heartbeats, 10 s, or TNT_TIMEOUT_S),
    and a later call fails at once."""
    res, by_rank = run_failures(cache, 3, mode, {"TNT_TIMEOUT_S": 60})
    # A survivor whose MPI call never returns (Open MPI's shared-memory queue, its sender
    # killed between the two steps of a link) cannot raise: its wedge watch ends it within
    # seconds, naming rank 2 as dead (wedge_watch.h; the watch itself: test_c_core.py)
    wedged = {r for r in (0, 1) if r not in by_rank and
              re.search(rf"rank {r} is stuck inside MPI: .* since rank 2 \(pid \d+ on [^)]+\) died", res.stderr)}
    assert sorted([*by_rank, *wedged]) == [0, 1], res.stdout[-3000:] + res.stderr[-3000:]
    for r, (first, later) in by_rank.items():
        assert first["error"] == "PeerLostError", first
        assert first["peer"] == 2 and "rank 2" in first["message"] and "died" in first["message"], first
        assert first["seconds"] < 5, first
        assert later["later"] == "PeerLostError" and later["seconds"] < 1.0, later


@needs_mpi
def test_killed_rank_is_named_on_every_other_rank(cache):
    assert_killed_rank_named(cache, "kill")


@needs_mpi
def test_rank_killed_during_a_one_round_exchange_is_named(cache):
    # it dies in the exchange that carries its cached 64 KB allreduce's payload (one
    # round): the others, receiving its negotiation message, fail as fast
    assert_killed_rank_named(cache, "kill-one-round")


@needs_mpi
def test_rank_stuck_inside_mpi_after_a_peer_died_ends_itself(cache, tmp_path):
    # rank 1's MPI_Improbe never returns once rank 2 is about to die (mpi_wedge_shim.c, the
    # wedge Open MPI's shared-memory queue leaves by chance): its wedge watch must end it with
    # exit code 70 within seconds, naming rank 2, instead of hanging until mpirun's timeout;
    # rank 0 raises as ever
    shim = tmp_path / "libwedge.so"
    subprocess.run([MPICC, "-shared", "-fPIC", "-o", shim, os.path.join(HERE, "mpi_wedge_shim.c"), "-ldl"], check=True)
    start = time.monotonic()
    res, by_rank = run_failures(cache, 3, "kill", {"TNT_TIMEOUT_S": 60, "LD_PRELOAD": shim,
                                                   "TNT_TEST_WEDGE_FILE": tmp_path / "wedge",
                                                   "TNT_TEST_WEDGE_RANK": 1})
    took = time.monotonic() - start
    assert (tmp_path / "wedge").exists()
    assert sorted(by_rank) == [0], res.stdout[-3000:] + res.stderr[-3000:]
    first = by_rank[0][0]
    assert first["error"] == "PeerLostError" and first["peer"] == 2 and "died" in first["message"], first
    said = re.search(r"rank 1 is stuck inside MPI: a call into it has not returned for 2 s since rank 2 "
                     r"\(pid (\d+) on [^)]+\) died.*ends now with exit code 70", res.stderr)
    assert said, res.stderr[-3000:]
    assert f"pid {said.group(1)} on" in first["message"], (first, said.group(0))  # the same rank 2
    assert took < 60, took  # ended by the watch, not by TNT_TIMEOUT_S or the test's timeout


@needs_mpi
def test_aborting_rank_is_named_with_its_reason(cache):
    res, by_rank = run_failures(cache, 3, "exception", {"TNT_TIMEOUT_S": 60})
    assert sorted(by_rank) == [0, 1], res.stdout[-3000:] + res.stderr[-3000:]
    assert "ValueError: a bug in the user's script" in res.stderr
    for r, (first, later) in by_rank.items():
        assert first["error"] == "PeerLostError" and first["peer"] == 2, first
        assert "ValueError: a bug in the user's script" in first["message"], first
        assert first["seconds"] < 10, first


@needs_mpi
def test_frozen_rank_is_lost_after_missed_heartbeats(cache):
    # a stopped process is alive by its pid: only its silence tells; 10 missed
    # heartbeats of 0.2 s, far inside TNT_TIMEOUT_S
    proc = subprocess.Popen(mpirun_cmd(2, "rank_failures.py", "stop"),
                            env=mpi_env(cache, TNT_TIMEOUT_S=60, TNT_MPI_HEARTBEAT_S=0.2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, frozen = [], None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("later" in x for x in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.extend(json_lines(line))
        first = lines[0]
        found = re.search(r"rank 1 \(pid (\d+) on ", first["message"])
        frozen = int(found.group(1)) if found else None
        assert first["error"] == "PeerLostError" and first["peer"] == 1, first
        assert "sent nothing" in first["message"] and "is stopped" in first["message"], first
        assert 1.5 <= first["seconds"] < 15, first
    finally:
        if frozen:
            os.kill(frozen, signal.SIGKILL)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@needs_mpi
def test_shutdown_and_init_again(cache):
    # every tnt.init() gets a fresh communicator: a goodbye still in flight to
    # the previous one must not reach the next (Open MPI reuses the context id
    # of a freed communicator); with mpi4py, MPI is the application's
    res = subprocess.run(mpirun_cmd(2, "rank_mpi_reinit.py"), env=mpi_env(cache, TNT_TIMEOUT_S=30),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert sorted(x["rank"] for x in json_lines(res.stdout) if x["ok"]) == [0, 1], res.stdout


@needs_mpi
def test_ranks_not_started_by_mpi_are_refused_clearly(cache, tmp_path):
    # tntrun starts plain processes: each one's MPI is a world of one
    res = tntrun(2, "rank_collectives.py", tmp_path, env={"TNT_TRANSPORT": "mpi", "XDG_CACHE_HOME": cache,
                                                          "TNT_TIMEOUT_S": 30}, timeout=120)
    assert res.returncode != 0
    assert "needs ranks started by an MPI launcher" in res.stdout + res.stderr, res.stdout[-2000:] + res.stderr[-2000:]


MIXED = textwrap.dedent("""
    import json, os, sys, time, tarantella as tnt
    time.sleep(float(sys.argv[1]))
    try:
        tnt.init()
        print(json.dumps({"rank": tnt.get_rank(), "error": None}), flush=True)
    except tnt.TarantellaError as exc:
        print(json.dumps({"rank": int(os.environ["OMPI_COMM_WORLD_RANK"]), "error": type(exc).__name__,
                          "message": str(exc)}), flush=True)
""")


@needs_mpi
def test_ranks_of_one_host_that_take_different_transports_fail_at_once(cache):
    # a hand-made launch that gives one rank TNT_TRANSPORT=shm and the other mpi: the shm rank
    # waited for its peer to attach until TNT_TIMEOUT_S ("waited 60 s for ranks [1] to start"),
    # the mpi rank in MPI_Init for its peer to join MPI. Each rank now marks its transport for
    # the others of its host (core/src/transport/host_marks.c): the mpi rank, coming 2 s late,
    # fails at once, and the shm rank, which was waiting, sees it in its wait
    env = mpi_env(cache, TNT_TIMEOUT_S=60)
    del env["TNT_TRANSPORT"]
    app = [sys.executable, "-c", MIXED]
    res = subprocess.run([MPIRUN, "--bind-to", "none", "--enable-recovery", "-np", "1", "-x", "TNT_TRANSPORT=shm",
                          *app, "0", ":", "-np", "1", "-x", "TNT_TRANSPORT=mpi", *app, "2"],
                         env=env, capture_output=True, text=True, timeout=240)
    said = sorted(json_lines(res.stdout), key=lambda x: x["rank"])
    assert [x["rank"] for x in said] == [0, 1], res.stdout[-3000:] + res.stderr[-3000:]
    for x in said:
        assert x["error"] == "InvalidUsageError", said
        assert "the ranks of this host took different transports" in x["message"], x
        assert "shm (TNT_TRANSPORT=shm)" in x["message"] and "mpi (TNT_TRANSPORT=mpi)" in x["message"], x
    assert not glob.glob("/dev/shm/tnt-engine-*-marks-*"), glob.glob("/dev/shm/tnt-engine-*-marks-*")


@needs_mpi
def test_transport_marks_left_by_a_killed_job_do_not_fail_its_relaunch(cache):
    # a hand-made job killed (SIGKILL) during its set-up leaves its host's transport marks,
    # /dev/shm/tnt-<id>-marks-<host>: its relaunch with the same TNT_JOB_ID and another transport
    # failed on rank 0 at once, "the ranks of this host took different transports: rank 0 (pid N)
    # mpi ..., rank 1 (pid <the killed one>) shm". A slot whose writer is gone and that was written
    # before the reader started is a leftover: the relaunch runs, and removes the marks
    job = f"relaunch-{secrets.token_hex(6)}"
    killed = subprocess.Popen([sys.executable, "-c", "import tarantella as tnt; tnt.init()"],
                              env=clean_env(TNT_RANK=1, TNT_SIZE=2, TNT_LOCAL_RANK=1, TNT_LOCAL_SIZE=2, TNT_JOB_ID=job,
                                            TNT_TRANSPORT="shm", TNT_TIMEOUT_S=60),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not glob.glob(f"/dev/shm/tnt-{job}-marks-*") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # its mark is written: it waits for rank 0's segment
    finally:
        killed.kill()
        killed.communicate()
    try:
        assert glob.glob(f"/dev/shm/tnt-{job}-marks-*"), "the killed rank left its marks"
        env = mpi_env(cache, TNT_TIMEOUT_S=60, TNT_JOB_ID=job)
        # rank 1 comes 2 s late, so that rank 0 reads the leftover's slot 1 before it is rewritten
        res = subprocess.run([MPIRUN, "--bind-to", "none", "--enable-recovery", "-np", "1", sys.executable, "-c",
                              MIXED, "0", ":", "-np", "1", sys.executable, "-c", MIXED, "2"],
                             env=env, capture_output=True, text=True, timeout=240)
        said = sorted(json_lines(res.stdout), key=lambda x: x["rank"])
        assert said == [{"rank": 0, "error": None}, {"rank": 1, "error": None}], res.stdout[-3000:] + res.stderr[-3000:]
        assert not glob.glob(f"/dev/shm/tnt-{job}-marks-*")  # the relaunch removed them
    finally:
        for path in glob.glob(f"/dev/shm/tnt-{job}*"):
            os.unlink(path)


# json_lines's own source: mpirun may join two ranks' lines into one
SWEEP = textwrap.dedent(inspect.getsource(json_lines)) + textwrap.dedent("""
    import json, os, subprocess, sys, time
    app, job, cache = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    mark = f"/dev/shm/tnt-{job}-void"
    def run(**env):
        e = dict(os.environ, **env)
        out = subprocess.run(app, env=e, capture_output=True, text=True, timeout=240)
        return json_lines(out.stdout), out.stderr[-2000:]
    first = run(TNT_TIMEOUT_S="1", TNT_JOB_ID=job, TNT_TIMELINE="/nonexistent/timeline.json")
    left = os.path.exists(mark)
    time.sleep(1.5)  # older than its TNT_TIMEOUT_S: it no longer counts
    second = run(TNT_TIMEOUT_S="60")
    print(json.dumps({"first": first, "left": left, "second": second, "after": os.path.exists(mark)}))
""")


@needs_mpi
def test_a_failed_starts_mark_is_swept_by_a_later_job_on_the_mpi_transport(cache):
    """A failed start leaves its job's mark in /dev/shm (job_void.h, a few hundred bytes) for
    TNT_TIMEOUT_S; only the shm transport's rank 0 swept the stale ones, so under mpirun with
    TNT_TRANSPORT=mpi (no tntrun to remove them) every failed start's mark stayed for good where
    every job takes mpi. The next job's first rank of the host sweeps them now, whatever its
    transport. In a /dev/shm of its own (a mount namespace): on a shared one any other job's shm
    rank 0 sweeps the mark too."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a mount namespace of its own (unshare -m) for a /dev/shm no other job sweeps")
    app = [MPIRUN, "--bind-to", "none", "-np", "2", sys.executable, "-c", INIT]
    res = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh",
                          sys.executable, "-c", SWEEP, json.dumps(app), secrets.token_hex(16), str(cache)],
                         env=mpi_env(cache), capture_output=True, text=True, timeout=600)
    got = json_lines(res.stdout)
    assert got, res.stdout[-3000:] + res.stderr[-3000:]
    got = got[-1]
    first, _ = got["first"]
    assert len(first) == 2 and all("TNT_TIMELINE" in (x.get("message") or "") for x in first), got
    assert got["left"], got  # the failed start's mark, for ranks of its host still to come
    assert [x["error"] for x in got["second"][0]] == [None, None], got
    assert not got["after"], got  # swept by the next job, on the mpi transport alone


# ---- the plugin's error paths: one process, before any peer is contacted ----

INIT = textwrap.dedent("""
    import json, tarantella as tnt
    try:
        tnt.init()
        print(json.dumps({"error": None}))
    except tnt.TarantellaError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
""")


def init_error(**env):
    """What tnt.init() raises on rank 0 of a 2-rank job with TNT_TRANSPORT=mpi."""
    e = clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID="mpi-error-paths", TNT_TRANSPORT="mpi", **env)
    res = subprocess.run([sys.executable, "-c", INIT], env=e, capture_output=True, text=True, timeout=120)
    out = json_lines(res.stdout)
    assert out, res.stdout + res.stderr
    if os.path.exists("/dev/shm/tnt-mpi-error-paths-void"):  # its failed start's mark (job_void.h)
        os.remove("/dev/shm/tnt-mpi-error-paths-void")
    return out[0]


STAND_IN = textwrap.dedent("""
    #include "transport_plugin.h"
    static tnt_plugin_t desc = {TNT_PLUGIN_SIZES, .name = "mpi"};
    #ifndef ENTRY
    #define ENTRY TNT_PLUGIN_ENTRY
    #endif
    #ifndef NO_ENTRY
    const tnt_plugin_t *ENTRY(const tnt_plugin_host_t *host, char *why, size_t len) {
    #ifdef ABI
      desc.abi_version = ABI;
    #endif
    #ifdef PARAMS_SIZE
      desc.params_size = PARAMS_SIZE;
    #endif
      return &desc;
    }
    #endif
    #ifdef NEEDS
    void needs(void);
    void use(void) { needs(); }
    #endif
""")


def stand_in(tmp_path, name, *defines, libs=()):
    src = tmp_path / "stand_in.c"
    src.write_text(STAND_IN)
    out = tmp_path / f"{name}.so"
    subprocess.run([CC, "-shared", "-fPIC", "-I", os.path.join(CORE, "src"), "-I", os.path.join(CORE, "include"),
                    *(f"-D{d}" for d in defines), str(src), "-o", str(out), *libs], check=True)
    return out


def test_missing_plugin_library_is_named():
    err = init_error(TNT_MPI_PLUGIN="/nonexistent/libtnt-transport-mpi.so")
    assert err["error"] == "InvalidArgumentError", err
    assert "TNT_MPI_PLUGIN=/nonexistent/libtnt-transport-mpi.so does not exist" in err["message"], err


@needs_cc
def test_plugin_whose_library_is_gone_says_what_is_missing(tmp_path):
    # what an MPI uninstalled after the build looks like: a dependency is missing
    dep = tmp_path / "libtntgone.so"
    subprocess.run([CC, "-shared", "-fPIC", "-x", "c", "-", "-o", str(dep)], input="void needs(void) {}",
                   text=True, check=True)
    plugin = stand_in(tmp_path, "needs-gone", "NEEDS", libs=[f"-L{tmp_path}", "-ltntgone"])
    dep.unlink()
    err = init_error(TNT_MPI_PLUGIN=plugin)
    assert err["error"] == "InvalidUsageError", err
    assert "cannot load the mpi transport plugin" in err["message"] and "libtntgone.so" in err["message"], err


@needs_cc
def test_plugin_of_another_abi_version_is_refused(tmp_path):
    err = init_error(TNT_MPI_PLUGIN=stand_in(tmp_path, "abi99", "ABI=99"))
    assert err["error"] == "InvalidUsageError", err
    assert "declares plugin ABI version 99" in err["message"] and f"speaks ABI version {plugins.abi_version(CORE)}" in err["message"], err
    assert "rebuild the plugin" in err["message"], err


@needs_cc
def test_plugin_exporting_only_another_entry_is_refused(tmp_path):
    other = plugins.abi_version(CORE) + 1  # a release this core does not speak
    err = init_error(TNT_MPI_PLUGIN=stand_in(tmp_path, "entry-next", f"ENTRY=tnt_transport_plugin_v{other}"))
    assert err["error"] == "InvalidUsageError", err
    assert f"built for plugin ABI version {other}" in err["message"], err


@needs_cc
def test_plugin_built_from_other_headers_is_refused(tmp_path):
    err = init_error(TNT_MPI_PLUGIN=stand_in(tmp_path, "size", "PARAMS_SIZE=12345"))
    assert err["error"] == "InvalidUsageError", err
    assert "built from other headers" in err["message"] and "12345" in err["message"], err


@needs_cc
def test_library_that_is_not_a_plugin_is_refused(tmp_path):
    err = init_error(TNT_MPI_PLUGIN=stand_in(tmp_path, "none", "NO_ENTRY"))
    assert err["error"] == "InvalidUsageError", err
    assert "is not a Tarantella transport plugin" in err["message"], err


def test_auto_across_hosts_without_a_usable_mpi_says_why(tmp_path):
    """A rank whose job spans hosts (local size < size) under auto needs the mpi plugin between hosts."""
    e = clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_LOCAL_RANK=0, TNT_LOCAL_SIZE=1, TNT_JOB_ID="auto-no-mpi",
                  TNT_TRANSPORT="auto", TNT_MPI_PLUGIN="/nonexistent/libtnt-transport-mpi.so")
    res = subprocess.run([sys.executable, "-c", INIT], env=e, capture_output=True, text=True, timeout=120)
    if os.path.exists("/dev/shm/tnt-auto-no-mpi-void"):  # its failed start's mark (job_void.h)
        os.remove("/dev/shm/tnt-auto-no-mpi-void")
    err = json_lines(res.stdout)[0]
    assert err["error"] == "InvalidArgumentError", err
    assert err["message"].startswith("the 2 ranks of this job are on several hosts (1 on this one): "
                                     "TNT_TRANSPORT=auto needs the mpi transport between hosts, and it cannot be "
                                     "used: the mpi transport plugin TNT_MPI_PLUGIN=/nonexistent/"), err


@needs_mpi
def test_a_local_size_of_one_on_ranks_started_by_hand_names_it(cache):
    """Two ranks of one host started by hand with TNT_LOCAL_SIZE=1 took auto to shm+mpi and failed with
    the mpi launcher's error ("start it with mpirun"), which did not name the local size."""
    job = secrets.token_hex(8)
    procs = [subprocess.Popen([sys.executable, "-c", INIT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(TNT_RANK=r, TNT_SIZE=2, TNT_LOCAL_RANK=0, TNT_LOCAL_SIZE=1, TNT_JOB_ID=job,
                                            TNT_TIMEOUT_S=30, XDG_CACHE_HOME=cache)) for r in range(2)]
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        got = json_lines(out)
        assert got, out + err[-3000:]
        assert got[0]["error"] == "InvalidUsageError", (r, got)
        message = got[0]["message"]
        assert message.startswith("TNT_LOCAL_SIZE=1 with TNT_SIZE=2 puts this rank on a host with 1 of the job's 2 "
                                  "ranks"), message
        assert "MPI sees only this process" in message and "give each TNT_LOCAL_SIZE=2" in message, message
        assert message.endswith("Received: TNT_LOCAL_SIZE=1, TNT_SIZE=2"), message
    # each rank's failed set-up leaves the job's mark (for ranks of its host waiting in shm): this test's own
    assert set(glob.glob(f"/dev/shm/tnt-{job}*")) <= {f"/dev/shm/tnt-{job}-void"}
    for mark in glob.glob(f"/dev/shm/tnt-{job}*"):
        os.remove(mark)


def test_no_mpi_found_says_so(tmp_path):
    err = init_error(PATH=str(tmp_path), XDG_CACHE_HOME=tmp_path)  # no mpicc on this PATH
    assert err["error"] == "InvalidArgumentError", err
    assert "no MPI was found" in err["message"] and "libopenmpi-dev" in err["message"], err


def test_failed_build_shows_the_compiler_output(tmp_path):
    fake = tmp_path / "mpicc"
    fake.write_text("#!/bin/sh\n"  # answers the version probes, fails the build
                    "case \"$*\" in *-show*) echo fake-cc; exit 0;; *-dM*) echo '#define MPI_VERSION 3'; exit 0;; esac\n"
                    "echo 'mpi.c:1: error: this compiler refuses on purpose' >&2\nexit 1\n")
    fake.chmod(0o755)
    err = init_error(TNT_MPICC=fake, XDG_CACHE_HOME=tmp_path / "cache")
    assert err["error"] == "SystemError", err
    assert "building the mpi transport plugin" in err["message"], err
    assert "this compiler refuses on purpose" in err["message"], err
    log = re.search(r"full log: (\S+)\)", err["message"]).group(1)
    assert "this compiler refuses on purpose" in open(log).read()


@needs_mpi
def test_cache_that_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "tarantella" / "plugins"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    err = init_error(XDG_CACHE_HOME=tmp_path)
    assert err["error"] == "InvalidUsageError", err
    assert f"the plugin cache {shared} " in err["message"] and "mode 777" in err["message"], err


def test_bad_mpicc_setting_is_named():
    err = init_error(TNT_MPICC="/nonexistent/mpicc")
    assert err["error"] == "InvalidArgumentError", err
    assert "TNT_MPICC=/nonexistent/mpicc is not an executable" in err["message"], err


def test_shm_is_still_chosen_by_auto_on_one_host(tmp_path):
    res = tntrun(2, "rank_collectives.py", tmp_path, env={"TNT_TEST_BIG_BYTES": 4096, "TNT_LOG_LEVEL": "INFO"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "transport shm selected (TNT_TRANSPORT=auto)" in res.stderr, res.stderr[-2000:]
    assert "plugin" not in res.stderr  # nothing is loaded, nothing built
