"""The gpi2 transport, a plugin built at first use that loads GPI-2 at run time,
on this host with TNT_TRANSPORT=gpi2 (tntrun --transport gpi2): every collective
x dtype x awkward size, bitwise identical on every rank (2, 3 and 4 ranks) and
to shm; a killed rank named on the others within seconds (by its pid, and, for
a rank in another pid namespace, by GPI-2's own state vector as for a rank on
another host), an aborting rank named with its reason, a frozen one after
missed heartbeats; init again in one process; and bad configuration refused
with a message that says what to do. GPI-2 is GPL-3.0 and packaged nowhere:
these tests run where it is installed ($GPI2_HOME, or /work/gpi2, the folder
the project's development machine builds it into) and skip, saying so,
elsewhere (CI)."""
import ctypes.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from core_helpers import HERE, clean_env, collectives_agree, json_lines, same_results, spawn_ranks, tntrun


def find_gpi2():
    """GPI-2's install folder (holding lib64/ or lib/libGPI2.so), or None."""
    for home in (os.environ.get("GPI2_HOME"), "/work/gpi2"):
        if home and any(os.path.exists(os.path.join(home, d, "libGPI2.so")) for d in ("lib64", "lib")):
            return home
    return None


GPI2_HOME, CC = find_gpi2(), shutil.which("cc") or shutil.which("gcc")
needs_gpi2 = pytest.mark.skipif(not (GPI2_HOME and CC), reason=(
    "needs GPI-2 (GPL-3.0, packaged nowhere): build it from https://github.com/cc-hpc-itwm/GPI-2 with "
    "./configure --with-ethernet --prefix=DIR and set GPI2_HOME=DIR" if not GPI2_HOME
    else "needs a C compiler (cc) to build the gpi2 plugin"))
UNSHARE = shutil.which("unshare") if os.geteuid() == 0 else None


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh plugin cache: the first job of this module builds the plugin."""
    return tmp_path_factory.mktemp("xdg-cache")


def gpi2_env(cache, **extra):
    return {"TNT_TRANSPORT": "gpi2", "GPI2_HOME": GPI2_HOME, "XDG_CACHE_HOME": str(cache), **extra}


def reports(folder, n):
    return [json.load(open(folder / f"rank{r}.json")) for r in range(n)]


@needs_gpi2
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_collective_is_bitwise_identical_on_every_rank(n, cache, tmp_path):
    # TNT_STREAM_MIN_KB=1024: the 3 MiB buffers take the fused last step of the ring, whose
    # carried pieces go through the transport's send buffer (or the ring's staging slot); shm runs it unfused
    res = tntrun(n, "rank_collectives.py", tmp_path, runner_args=("--transport", "gpi2"), timeout=600,
                 env=gpi2_env(cache, TNT_TEST_BIG_BYTES=3 << 20, TNT_LOG_LEVEL="INFO", TNT_TIMEOUT_S=120,
                              TNT_STREAM_MIN_KB=1024))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"initialized: rank 0 of {n}, transport gpi2" in res.stderr, res.stderr[-3000:]
    assert re.search(r"transport plugin gpi2 loaded .*: GPI-2 1\.\d", res.stderr), res.stderr[-3000:]
    first = collectives_agree(reports(tmp_path, n))
    if n == 3:  # the algorithms never know the transport: shm gives the same bits
        shm = tmp_path / "shm"
        shm.mkdir()
        res = tntrun(n, "rank_collectives.py", shm, env={"TNT_TEST_BIG_BYTES": 3 << 20})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        same_results(first, json.load(open(shm / "rank0.json"))["results"], "gpi2 and shm")


@needs_gpi2
def test_plugin_is_built_once_into_the_cache(cache, tmp_path):
    res = tntrun(2, "rank_collectives.py", tmp_path, runner_args=("--transport", "gpi2"),
                 env=gpi2_env(cache, TNT_TEST_BIG_BYTES=4096))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    libs = list(cache.glob("tarantella/plugins/gpi2-abi*/libtnt-transport-gpi2.so"))
    assert len(libs) == 1, libs
    assert "exit status 0" in (libs[0].parent / "build.log").read_text()
    assert libs[0].parent.stat().st_mode & 0o077 == 0
    # the plugin holds no GPI-2: it finds GPI-2 when the transport starts
    needed = subprocess.run(["ldd", str(libs[0])], capture_output=True, text=True).stdout
    assert "GPI2" not in needed, needed


def failures(cache, n, mode, env, wrap_last=None):
    """Start n ranks by hand (so that each survivor reports its own fate) running
    rank_failures.py MODE; the last rank's command may be wrapped. Returns
    {rank: [json lines]} and the processes' output."""
    job = secrets.token_hex(16)
    procs = []
    for r in range(n):
        e = clean_env(TNT_RANK=r, TNT_SIZE=n, TNT_LOCAL_RANK=r, TNT_LOCAL_SIZE=n, TNT_JOB_ID=job,
                      **gpi2_env(cache, **env))
        cmd = [sys.executable, os.path.join(HERE, "rank_failures.py"), mode]
        if r == n - 1 and wrap_last:
            cmd = wrap_last + cmd
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    by_rank, text = {}, ""
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        text += out + err
        for line in out.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                by_rank.setdefault(rec["rank"], []).append(rec)
    return by_rank, text


@needs_gpi2
def test_killed_rank_is_named_on_every_other_rank(cache):
    by_rank, text = failures(cache, 3, "kill", {"TNT_TIMEOUT_S": 60})
    assert sorted(by_rank) == [0, 1], text[-3000:]
    for first, later in by_rank.values():
        assert first["error"] == "PeerLostError", first
        assert first["peer"] == 2 and "rank 2" in first["message"] and "died" in first["message"], first
        assert first["seconds"] < 5, first  # a local peer's pid is watched
        assert later["later"] == "PeerLostError" and later["seconds"] < 1.0, later


@needs_gpi2
@pytest.mark.skipif(not UNSHARE, reason="needs root and unshare(1) to put a rank in its own pid namespace")
def test_killed_rank_that_pids_cannot_see_is_named_by_gpi2(cache):
    # in its own pid namespace the victim's pid means nothing to the others, as
    # on another host: only GPI-2 can tell (its connection broke: the state
    # vector), long before 10 missed heartbeats (10 s) or TNT_TIMEOUT_S
    wrap = [UNSHARE, "--pid", "--fork", "sh", "-c", '"$@"; exit $?', "sh"]  # python is not the namespace's pid 1
    by_rank, text = failures(cache, 3, "kill", {"TNT_TIMEOUT_S": 60}, wrap_last=wrap)
    assert sorted(by_rank) == [0, 1], text[-3000:]
    for first, later in by_rank.values():
        assert first["error"] == "PeerLostError" and first["peer"] == 2, first
        # the state vector ("lost its connection") or a request to it that failed ("lost the
        # connection"), whichever GPI-2 reports first
        assert "rank 2" in first["message"] and re.search(r"GPI-2 lost (its|the) connection",
                                                           first["message"]), first
        assert first["seconds"] < 5, first
        assert later["later"] == "PeerLostError" and later["seconds"] < 1.0, later


@needs_gpi2
def test_aborting_rank_is_named_with_its_reason(cache):
    by_rank, text = failures(cache, 3, "exception", {"TNT_TIMEOUT_S": 60})
    assert sorted(by_rank) == [0, 1], text[-3000:]
    assert "ValueError: a bug in the user's script" in text
    for first, later in by_rank.values():
        assert first["error"] == "PeerLostError" and first["peer"] == 2, first
        # its abort, not its goodbye after it, reaches the others
        assert "ValueError: a bug in the user's script" in first["message"], first
        assert first["seconds"] < 10, first


@needs_gpi2
def test_frozen_rank_is_lost_after_missed_heartbeats(cache):
    # a stopped process is alive by its pid and its connections stay up: only
    # its silence tells; 10 missed heartbeats of 0.2 s, far inside TNT_TIMEOUT_S
    job, procs = spawn_ranks(2, "rank_failures.py", "stop",
                             env=gpi2_env(cache, TNT_TIMEOUT_S=60, TNT_GPI2_HEARTBEAT_S=0.2))
    try:
        line = procs[0].stdout.readline()
        first = json.loads(line) if line.startswith("{") else {"line": line, "err": procs[0].stderr.read()[-2000:]}
        assert first.get("error") == "PeerLostError" and first["peer"] == 1, first
        assert "sent nothing" in first["message"] and "is stopped" in first["message"], first
        assert 1.5 <= first["seconds"] < 15, first
    finally:
        os.kill(procs[1].pid, signal.SIGKILL)
        for p in procs:
            try:
                p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()


REINIT = textwrap.dedent("""
    import json, numpy as np, tarantella as tnt
    for cycle in range(4):  # GPI-2 starts once per process; every init makes a new segment
        tnt.init()
        rank, size = tnt.get_rank(), tnt.get_size()
        for n in (1000, 100_000):  # the exchange path, then the ring
            x = tnt.allreduce(np.full(n, rank + cycle, np.float32), name=f"cycle{cycle}-{n}")
            want = sum(q + cycle for q in range(size))
            assert x[0] == want and x[-1] == want, (cycle, n, x[0], want)
        tnt.barrier(name=f"cycle{cycle}-end")
        tnt.shutdown()
    print(json.dumps({"rank": rank, "ok": True}), flush=True)
""")


@needs_gpi2
def test_shutdown_and_init_again(cache, tmp_path):
    script = tmp_path / "reinit.py"
    script.write_text(REINIT)
    res = tntrun(2, str(script), runner_args=("--transport", "gpi2", "--output-on-all-devices"),
                 env=gpi2_env(cache, TNT_TIMEOUT_S=30), timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ok = sorted(obj["rank"] for obj in json_lines(res.stdout) if obj.get("ok"))
    assert ok == [0, 1], res.stdout


# ---- bad configuration: one process, refused before any peer is contacted ----

INIT = textwrap.dedent("""
    import json, tarantella as tnt
    try:
        tnt.init()
        print(json.dumps({"error": None}))
    except tnt.TarantellaError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
""")


def init_error(cache, **env):
    """What tnt.init() raises on rank 0 of a 2-rank job with TNT_TRANSPORT=gpi2."""
    e = clean_env(TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID="gpi2-error-paths", TNT_TRANSPORT="gpi2",
                  XDG_CACHE_HOME=cache, TNT_TIMEOUT_S=20)
    e.pop("GPI2_HOME", None)  # only where a test gives it
    e.update({k: str(v) for k, v in env.items()})
    res = subprocess.run([sys.executable, "-c", INIT], env=e, capture_output=True, text=True, timeout=120)
    out = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert out, res.stdout + res.stderr
    return out[0]


@pytest.mark.skipif(not CC, reason="needs a C compiler (cc) to build the gpi2 plugin")
def test_gpi2_home_without_gpi2_says_where_it_looked(cache, tmp_path):
    err = init_error(cache, GPI2_HOME=tmp_path)
    assert err["error"] == "InvalidUsageError", err
    assert f"GPI2_HOME={tmp_path} holds no GPI-2 library" in err["message"], err
    assert str(tmp_path / "lib64" / "libGPI2.so") in err["message"] and "--with-ethernet" in err["message"], err


@pytest.mark.skipif(not CC, reason="needs a C compiler (cc) to build the gpi2 plugin")
@pytest.mark.skipif(bool(ctypes.util.find_library("GPI2")), reason="GPI-2 is installed where the loader looks")
def test_no_gpi2_on_the_library_path_says_how_to_get_it(cache):
    err = init_error(cache, LD_LIBRARY_PATH="")
    assert err["error"] == "InvalidUsageError", err
    assert "GPI-2 not found" in err["message"] and "GPI2_HOME" in err["message"], err


def test_no_compiler_says_so(cache, tmp_path):
    err = init_error(cache, PATH=str(tmp_path), GPI2_HOME=tmp_path)
    assert err["error"] == "InvalidArgumentError", err
    assert "no C compiler" in err["message"] and "TNT_GPI2_PLUGIN" in err["message"], err


@needs_gpi2
@pytest.mark.parametrize("name,value,says", [
    ("TNT_GPI2_PORT", "80", "TNT_GPI2_PORT must be a port between 1024 and"),
    ("TNT_GPI2_PORT", "many", "TNT_GPI2_PORT must be a port between 1024 and"),
    ("TNT_GPI2_HEARTBEAT_S", "0", "TNT_GPI2_HEARTBEAT_S must be a number between 0.01 and 60"),
])
def test_bad_setting_is_named(cache, name, value, says):
    err = init_error(cache, GPI2_HOME=GPI2_HOME, **{name: value})
    assert err["error"] == "InvalidArgumentError", err
    assert says in err["message"] and f"Received: {name}={value}" in err["message"], err


@needs_gpi2
def test_port_in_use_is_named(cache):
    # GPI-2's ethernet device listens on fixed ports and says nothing when one
    # is taken; the transport checks its own range first
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        if port > 64000:
            pytest.skip("the free port the kernel gave is too high for a range")
        err = init_error(cache, GPI2_HOME=GPI2_HOME, TNT_GPI2_PORT=port)
    assert err["error"] == "InvalidUsageError", err
    assert f"cannot use port {port}" in err["message"] and "TNT_GPI2_PORT" in err["message"], err


@needs_gpi2
def test_ranks_on_several_hosts_need_gaspi_placement(cache):
    err = init_error(cache, GPI2_HOME=GPI2_HOME, TNT_LOCAL_RANK=0, TNT_LOCAL_SIZE=1)
    assert err["error"] == "InvalidUsageError", err
    assert "GASPI_RANK" in err["message"] and "gaspi_run" in err["message"], err


@needs_gpi2
def test_gaspi_placement_that_disagrees_is_refused(cache):
    err = init_error(cache, GPI2_HOME=GPI2_HOME, GASPI_RANK=1, GASPI_NRANKS=2, GASPI_MFILE="/dev/null")
    assert err["error"] == "InvalidUsageError", err
    assert "the placement disagrees with GPI-2's: GASPI_RANK=1" in err["message"], err
