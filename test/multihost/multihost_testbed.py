"""Several "hosts" on one machine, for testing what runs across hosts (mpirun, tntrun, srun).

Each host is a Linux network namespace with its own address on a private bridge and its own
host name (a UTS namespace entered for every command). Hosts reach each other through an
`ssh` stand-in (ssh_standin.py) that the test bed puts first on PATH: `ssh hostB CMD` runs
CMD inside hostB's namespaces, so launchers reach these hosts exactly as they reach real
ones (Open MPI's rsh launcher: `ssh -x hostB orted -mca ...`; gaspi_run likewise).

Layout (NAME = "tnttb-<pid>-<start time>-<n>": the process that made it and a counter, so that
concurrent test beds never collide and leftovers of a killed run are recognised as such):

    NAME-sw        the "switch": a bridge br0 and one port per host; no address
    NAME-<host>    eth0 (10.231.7.<i>/24, a veth whose peer is a port of br0) and lo;
                   /etc/netns/NAME-<host>/hosts maps every host name to its address
                   (`ip netns exec` mounts it over /etc/hosts)

Nothing is added to the machine's own network namespace: it has no address on the bridge
and no route to it, so the test bed's traffic cannot leave it, and two test beds (with the
same addresses) cannot see each other.

What the hosts share, unlike real hosts: the file system, /tmp and /dev/shm (one machine,
one mount of each). A program that wrongly used shared memory across hosts would work here
and fail on a cluster; tests of placement must check host names and local ranks, not that
a segment was reachable. Processes are visible to each other (one pid namespace).

Use:

    from multihost_testbed import Testbed
    with Testbed(["hostA", "hostB"]) as bed:        # needs root, `ip` and `unshare`
        bed.run("hostA", ["mpirun", ...], env=bed.env())

or the pytest fixture `multihost` (two hosts, hostA and hostB, one per test session), which
skips with the reason where namespaces cannot be made. slurm_cluster.py runs a Slurm cluster
on a test bed of its own (controller `slurmctl`, slurmd on hostA and hostB). Everything is removed on close(),
also when a test fails; a test bed whose process was killed is removed by the next one that
starts (cleanup_leftovers).
"""
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "tnttb"
NETNS_ETC = "/etc/netns"
SUBNET = "10.231.7"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-\d+-(.+)$")
_count = itertools.count()
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class TestbedUnavailable(Exception):
    """Namespaces cannot be made here (not root, no `ip`/`unshare`, no permission)."""
    __test__ = False  # not a test class, whatever pytest thinks of its name


def _start_time(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _ip(*args, check=True):
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip() or res.returncode}")
    return res


def _netns_list():
    res = _ip("netns", "list", check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _remove_namespace(ns):
    """Kill every process in namespace `ns` (found by the kernel's namespace id, so only
    processes inside it), then delete it and its /etc/netns folder."""
    for _ in range(50):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    _ip("netns", "delete", ns, check=False)
    shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)


def _rmdir_if_empty(path):
    try:
        os.rmdir(path)
    except OSError:
        pass


def cleanup_leftovers():
    """Remove the namespaces (and /etc/netns folders) of test beds whose process is gone:
    leftovers of a run that was killed before it could clean up. Live test beds of other
    processes are left alone. Returns the names removed."""
    removed = []
    names = set(_netns_list())
    if os.path.isdir(NETNS_ETC):
        names |= set(os.listdir(NETNS_ETC))
    for ns in sorted(names):
        if _orphaned(ns):
            _remove_namespace(ns)
            removed.append(ns)
    _rmdir_if_empty(NETNS_ETC)
    for entry in os.listdir("/etc"):  # a folder some hosts lack (multihost_helpers.python_missing_on)
        if _orphaned(entry):
            shutil.rmtree(os.path.join("/etc", entry), ignore_errors=True)
            removed.append(os.path.join("/etc", entry))
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):  # the temporary folder (ssh stand-in): NAME-<random>
        if _orphaned(entry):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
            removed.append(os.path.join(tmp, entry))
    return removed


def _orphaned(name):
    """True for a name made by a test bed whose process is gone."""
    match = _NAME.match(name)
    return bool(match) and _start_time(int(match.group(1))) != int(match.group(2))


def unavailable_reason():
    """Why namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (it makes network namespaces)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if not shutil.which(tool):
            return f"the multi-host test bed needs `{tool}` (package {package})"
    return None


class Testbed:
    """Hosts as network namespaces on a private bridge; see the module's docstring."""
    __test__ = False

    def __init__(self, hosts=("hostA", "hostB"), subnet=SUBNET):
        if len(hosts) > 250 or len(set(hosts)) != len(hosts):
            raise ValueError(f"host names must be distinct, at most 250. Received: {hosts}")
        for host in hosts:
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,62}", host):
                raise ValueError(f"not a valid host name: {host!r}")
        self.hosts = list(hosts)
        self.subnet = subnet
        self.name = f"{PREFIX}-{os.getpid()}-{_start_time(os.getpid())}-{next(_count)}"
        self.addresses = {h: f"{subnet}.{i + 1}" for i, h in enumerate(self.hosts)}
        self.dir = None       # temporary folder: the ssh stand-in, its map and its log
        self.ssh_dir = None   # put first on PATH
        self._made = []       # namespaces made so far, for close()
        self._open = False

    # -- making and removing ----------------------------------------------------------------
    def netns(self, host):
        return f"{self.name}-{host}"

    def start(self):
        reason = unavailable_reason()
        if reason:
            raise TestbedUnavailable(reason)
        cleanup_leftovers()
        self._open = True
        try:
            self._make()
        except BaseException as exc:
            self.close()
            if isinstance(exc, (RuntimeError, OSError, subprocess.SubprocessError)):
                raise TestbedUnavailable(f"cannot make the test bed's namespaces: {exc}") from exc
            raise
        return self

    def _add_netns(self, ns):
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _make(self):
        switch = f"{self.name}-sw"
        self._add_netns(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{self.addresses[h]} {h}\n" for h in self.hosts)
        for i, host in enumerate(self.hosts):
            ns = self.netns(host)
            self._add_netns(ns)
            port = f"p{i}"
            _ip("link", "add", "name", "eth0", "netns", ns, "type", "veth",
                "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            for _ in range(5):  # another test bed may remove an empty /etc/netns meanwhile
                try:
                    os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
                    with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
                        f.write(hosts_file)
                    break
                except FileNotFoundError:
                    continue
            # no IPv6: its link-local addresses only slow launchers down (duplicate
            # address detection); ignored where the kernel has no IPv6
            subprocess.run(["ip", "netns", "exec", ns, "sh", "-c",
                            "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"],
                           capture_output=True, timeout=30)
        self.dir = tempfile.mkdtemp(prefix=f"{self.name}-")
        self.ssh_dir = os.path.join(self.dir, "bin")
        os.mkdir(self.ssh_dir)
        self.log = os.path.join(self.dir, "ssh.log")
        open(self.log, "w").close()
        map_file = os.path.join(self.dir, "hosts.json")
        with open(map_file, "w") as f:
            json.dump({"hosts": {h: {"netns": self.netns(h), "address": self.addresses[h]}
                                 for h in self.hosts},
                       "log": self.log, "path": self.ssh_dir + os.pathsep + DEFAULT_PATH,
                       "ip": shutil.which("ip"), "unshare": shutil.which("unshare")}, f)
        ssh = os.path.join(self.ssh_dir, "ssh")
        with open(ssh, "w") as f:
            f.write(f'#!/bin/sh\nexec "{sys.executable}" "{os.path.join(HERE, "ssh_standin.py")}" '
                    f'"{map_file}" "$@"\n')
        os.chmod(ssh, 0o755)

    def close(self):
        """Remove everything: processes in the namespaces, the namespaces, /etc/netns
        folders, the temporary folder. Safe to call twice."""
        if not self._open:
            return
        self._open = False
        for ns in reversed(self._made):
            _remove_namespace(ns)
        self._made = []
        _rmdir_if_empty(NETNS_ETC)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- using ------------------------------------------------------------------------------
    def env(self, base=None, **extra):
        """An environment for commands on the hosts: `base` (default: this process's) with
        the ssh stand-in first on PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = self.ssh_dir + os.pathsep + env.get("PATH", DEFAULT_PATH)
        env.update(extra)
        return env

    def command(self, host, argv):
        """The argv that runs `argv` on `host` (its namespace and host name), in the
        current directory and with the caller's environment, as a user logged in there."""
        return ["ip", "netns", "exec", self.netns(host), "unshare", "--uts", "/bin/sh", "-c",
                'hostname "$0" || exit 255; exec "$@"', host, *argv]

    def run(self, host, argv, env=None, timeout=120, **kwargs):
        """subprocess.run of `argv` on `host` (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(host, argv), env=self.env() if env is None else env,
                              timeout=timeout, **kwargs)

    def popen(self, host, argv, env=None, **kwargs):
        return subprocess.Popen(self.command(host, argv), env=self.env() if env is None else env,
                                **kwargs)

    def pids(self, host):
        """Processes running on `host` now."""
        return [int(p) for p in _ip("netns", "pids", self.netns(host), check=False).stdout.split()]

    def ssh_calls(self):
        """[{"host", "command", "argv"}] of every ssh call so far."""
        with open(self.log) as f:
            return [json.loads(line) for line in f if line.strip()]

    def clear_ssh_log(self):
        open(self.log, "w").close()


# -- pytest --------------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # used without pytest (bench/)
    pytest = None

def _fixture_bed(hosts):
    """A started Testbed of `hosts` for a fixture (skips where namespaces cannot be made,
    saying why), closed when the fixture ends."""
    bed = Testbed(hosts)
    try:
        bed.start()
    except TestbedUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield bed
    finally:
        bed.close()


if pytest is not None:
    @pytest.fixture(scope="session")
    def multihost():
        """A Testbed with hosts hostA and hostB for the whole session."""
        yield from _fixture_bed(["hostA", "hostB"])

    @pytest.fixture(scope="module")
    def multihost3():
        """A Testbed with hosts hostA, hostB and hostC, for the tests of one module."""
        yield from _fixture_bed(["hostA", "hostB", "hostC"])
