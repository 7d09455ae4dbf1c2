"""The test bed itself: hosts with their own names and addresses, reached through the ssh
stand-in as Open MPI reaches real hosts, and nothing left behind."""
import os
import shutil
import subprocess

import pytest

import multihost_testbed
from multihost_testbed import Testbed, TestbedUnavailable


def test_hosts_have_their_own_name_and_address(multihost):
    for host in ("hostA", "hostB"):
        res = multihost.run(host, ["sh", "-c", "hostname; ip -4 -o addr show dev eth0"])
        assert res.returncode == 0, res.stderr
        name, addr = res.stdout.splitlines()
        assert name == host
        assert f"inet {multihost.addresses[host]}/24" in addr
    # a host reaches the other by name: hostB's address answers (connection refused: no
    # server there, but a reply) where no route would fail with "unreachable"
    probe = ("import socket, sys; s = socket.socket(); s.settimeout(10)\n"
             "try: s.connect(('hostB', 9))\nexcept ConnectionRefusedError: print('refused')\n")
    res = multihost.run("hostA", [sys_python(), "-c", probe])
    assert res.stdout.strip() == "refused", res.stderr


def sys_python():
    import sys
    return sys.executable


def test_ssh_standin(multihost):
    # quoting is the remote shell's, as with ssh: the words are joined, then parsed there
    res = multihost.run("hostA", ["ssh", "-x", "-o", "BatchMode=yes", "hostB",
                                  "echo", '"a  b"', "$(hostname)", "'$HOME'", ";", "exit 3"])
    assert res.returncode == 3, res.stderr
    assert res.stdout == "a  b hostB $HOME\n"
    # a fresh login environment: nothing of the caller's crosses
    res = multihost.run("hostA", ["ssh", "hostB", "echo ${TNT_SECRET-unset} $PWD"],
                        env=multihost.env(TNT_SECRET="1"))
    assert res.stdout.split() == ["unset", os.path.expanduser("~")]
    res = multihost.run("hostA", ["ssh", "nosuchhost", "true"])
    assert res.returncode == 255 and "Could not resolve hostname nosuchhost" in res.stderr
    calls = multihost.ssh_calls()
    assert calls[-1]["host"] == "hostB" and calls[-1]["command"].startswith("echo ${TNT_SECRET")


def _openmpi():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    return mpirun if "Open MPI" in out.stdout + out.stderr else None


@pytest.mark.skipif(not _openmpi(), reason="needs Open MPI's mpirun (apt-get install openmpi-bin)")
def test_openmpi_reaches_both_hosts_through_ssh(multihost):
    multihost.clear_ssh_log()
    res = multihost.run("hostA", ["mpirun", "--allow-run-as-root", "-np", "4",
                                  "--host", "hostA:2,hostB:2", "hostname"], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split()) == ["hostA", "hostA", "hostB", "hostB"]
    calls = multihost.ssh_calls()
    assert [c["host"] for c in calls] == ["hostB"]  # hostA is local to mpirun
    assert "orted" in calls[0]["command"]


def test_everything_is_removed(tmp_path):
    reason = multihost_testbed.unavailable_reason()
    if reason:
        pytest.skip(reason)
    bed = Testbed(["h1", "h2", "h3"])
    try:
        bed.start()
    except TestbedUnavailable as exc:
        pytest.skip(str(exc))
    try:
        namespaces = [bed.netns(h) for h in bed.hosts] + [f"{bed.name}-sw"]
        assert set(namespaces) <= set(multihost_testbed._netns_list())
        sleeper = bed.popen("h2", ["sh", "-c", "echo up; exec sleep 600"],
                            stdout=subprocess.PIPE, text=True)
        assert sleeper.stdout.readline() == "up\n"  # inside h2 now
        assert sleeper.pid in bed.pids("h2")
    finally:
        bed.close()
    assert sleeper.wait(timeout=30) == -9  # killed with its host
    assert not set(namespaces) & set(multihost_testbed._netns_list())
    assert not any(os.path.exists(os.path.join("/etc/netns", ns)) for ns in namespaces)
    assert not os.path.exists(bed.dir)


def test_leftovers_of_a_killed_run_are_removed():
    reason = multihost_testbed.unavailable_reason()
    if reason:
        pytest.skip(reason)
    # a test bed made by a process that is then SIGKILLed, so that it cannot clean up
    code = ("import sys, os; sys.path.insert(0, %r)\n"
            "from multihost_testbed import Testbed\n"
            "from multihost_helpers import python_missing_on\n"
            "bed = Testbed(['x1']).start(); held = python_missing_on(bed, 'x1'); held.__enter__()\n"
            "print(bed.name, flush=True); os.kill(os.getpid(), 9)\n"
            % os.path.dirname(os.path.abspath(multihost_testbed.__file__)))
    res = subprocess.run([sys_python(), "-c", code], capture_output=True, text=True, timeout=60)
    name = res.stdout.strip()
    assert res.returncode == -9 and name.startswith("tnttb-"), res.stderr
    assert f"{name}-x1" in multihost_testbed._netns_list()
    removed = multihost_testbed.cleanup_leftovers()
    assert f"{name}-x1" in removed and f"{name}-sw" in removed
    assert f"/etc/{name}-python" in removed and not os.path.exists(f"/etc/{name}-python")  # python_missing_on's
    assert not [ns for ns in multihost_testbed._netns_list() if ns.startswith(name)]
