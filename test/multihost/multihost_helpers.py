"""Helpers of the multi-host tests (a unique module name, like multihost_testbed)."""
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

from multihost_testbed import NETNS_ETC

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")
WIDTH = 72


def job_env(tmp_path, environ=None):
    """This process's environment without the variables of an engine or of tntrun (the test
    may itself run under one), with a private job registry for tntrun, and probe.py copied
    into tmp_path (the jobs' working directory)."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items()
           if not k.startswith(("TNT_", "SLURM_", "OMPI_", "PMI_"))}
    env["TNT_STATE_DIR"] = tempfile.mkdtemp(prefix="tnt-mh-state-", dir=str(tmp_path))
    shutil.copy(PROBE, os.path.join(str(tmp_path), "probe.py"))
    return env


def probes(stderr):
    """The probes' lines, as dicts, by rank."""
    seen = [json.loads(line.split("PROBE ", 1)[1]) for line in stderr.splitlines()
            if "PROBE " in line]
    return sorted(seen, key=lambda p: int(p["rank"]))


def placement(stderr):
    """[(rank, host, local rank, local size, size)] of the probes."""
    return [(p["rank"], p["host"], p["local_rank"], p["local_size"], p["size"])
            for p in probes(stderr)]


def root_cause(stderr):
    """The root-cause section of tntrun's failure report."""
    report = stderr[stderr.index(" FAILED\n"):]
    root = report.split("Root cause (first failure not caused by another rank):\n", 1)[1]
    return root.split("-" * WIDTH, 1)[0]


def nothing_left(bed, hosts, keep=()):
    """True once no process runs on `hosts` but those in `keep` (daemons of the cluster):
    engines' daemons and job steps end on their own, shortly after the job (up to 20 s)."""
    for _ in range(100):
        if not any(set(bed.pids(h)) - set(keep) for h in hosts):
            return True
        time.sleep(0.2)
    return False


def next_json(proc, timeout):
    """The next JSON line of `proc`'s stdout within `timeout` seconds (None: none came)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            return None
        if line.startswith("{"):
            return json.loads(line)
    return None


@contextlib.contextmanager
def cut_off(bed, host):
    """`host`'s link taken down for the block, and up again after it whatever happened (the
    test bed is the session's): its TCP connections stay open and its processes alive, as
    when a cable is pulled; only silence tells."""
    link = ["ip", "-n", bed.netns(host), "link", "set", "eth0"]
    subprocess.run(link + ["down"], check=True)
    try:
        yield time.monotonic()
    finally:
        subprocess.run(link + ["up"], check=False)


# a sitecustomize (first on PYTHONPATH) that makes Tarantella unimportable on hostB alone
NO_TARANTELLA_ON_HOSTB = """
import os, socket, sys
if socket.gethostname() == "hostB":  # Tarantella is not installed there
    sys.modules["tarantella"] = None
else:  # the sitecustomize this one shadows, if any, still runs
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize")  # put back after: the import of this one ends by taking it
    saved, sys.path[:] = sys.path[:], [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        pass
    sys.path[:] = saved
    sys.modules["sitecustomize"] = me
"""


def without_tarantella_on_hostB(tmp_path, env):
    """`env` for a job in which hostB's Python cannot import Tarantella, as where it is not
    installed for that Python there (PYTHONPATH reaches every host's ranks)."""
    site = os.path.join(str(tmp_path), "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(NO_TARANTELLA_ON_HOSTB)
    return dict(env, PYTHONPATH=os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p))


@contextlib.contextmanager
def python_missing_on(bed, host):
    """The path of a Python (this one, through a symlink) that every host of `bed` has but
    `host`, for the block. The hosts share the file system; only /etc differs: `ip netns
    exec` puts each entry of /etc/netns/NAMESPACE over /etc/ENTRY, and `host`'s is an empty
    folder. (A run killed meanwhile leaves the folder to the next test bed's clean-up.)"""
    folder = f"/etc/{bed.name}-python"
    os.makedirs(folder)
    try:
        os.symlink(sys.executable, os.path.join(folder, "python"))
        os.makedirs(os.path.join(NETNS_ETC, bed.netns(host), os.path.basename(folder)))
        yield os.path.join(folder, "python")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(os.path.join(NETNS_ETC, bed.netns(host), os.path.basename(folder)), ignore_errors=True)
