"""--pin-to-socket / --pin-memory-to-socket, with a fake NUMA layout."""
import os

import pytest
from tntrun_helpers import fake_bin, run_tntrun, runner_env


def _nodes(tmp_path, layout=("0-3", "4-7")):
    d = tmp_path / "node"
    for i, cpus in enumerate(layout):
        (d / f"node{i}").mkdir(parents=True)
        (d / f"node{i}" / "cpulist").write_text(cpus + "\n")
    return str(d)


def _env(tmp_path, **programs):
    path = fake_bin(tmp_path, **programs)
    return runner_env(TNT_SYSFS_NODE_DIR=_nodes(tmp_path), PATH=path + os.pathsep + "/usr/bin:/bin")


def test_pin_to_socket_round_robin(tmp_path):
    env = _env(tmp_path, numactl='exec "$@"')
    res = run_tntrun(["--dry-run", "-n", "3", "--pin-to-socket", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert "numactl --cpunodebind=0 --preferred=0" in lines[0]
    assert "numactl --cpunodebind=1 --preferred=1" in lines[1]
    assert "numactl --cpunodebind=0 --preferred=0" in lines[2]


def test_pin_memory_to_socket(tmp_path):
    env = _env(tmp_path, numactl='exec "$@"')
    res = run_tntrun(["--dry-run", "-n", "2", "--pin-to-socket", "--pin-memory-to-socket", "--", "t.py"],
                     env=env)
    assert "numactl --cpunodebind=1 --membind=1" in res.stdout
    res = run_tntrun(["--dry-run", "-n", "2", "--bind-to", "socket", "--", "t.py"], env=env)
    assert "--cpunodebind=1 --preferred=1" in res.stdout


def test_pinned_ranks_run(script, tmp_path):
    # a fake numactl that records its arguments and runs the rank
    env = _env(tmp_path, numactl='echo "numactl $1 $2" >&2; shift 2; exec "$@"')
    path = script("print('pinned rank', os.environ['TNT_RANK'])\n")
    res = run_tntrun(["-n", "2", "--output-on-all-devices", "--pin-to-socket", "--", path], env=env)
    assert res.returncode == 0, res.stderr
    assert "[1] numactl --cpunodebind=1 --preferred=1" in res.stderr
    assert "[1] pinned rank 1" in res.stdout


def test_memory_pinning_without_numactl_is_an_error(script, tmp_path):
    env = runner_env(TNT_SYSFS_NODE_DIR=_nodes(tmp_path), PATH=str(tmp_path / "empty"))
    # a script that exists: tntrun names a missing one first (exit 127)
    res = run_tntrun(["-n", "2", "--pin-memory-to-socket", "--", script("pass\n")], env=env)
    assert res.returncode == 2
    assert "--pin-memory-to-socket needs numactl" in res.stderr and "apt-get install numactl" in res.stderr


def test_cpu_pinning_falls_back_to_taskset(tmp_path):
    env = runner_env(TNT_SYSFS_NODE_DIR=_nodes(tmp_path),
                     PATH=fake_bin(tmp_path, taskset='exec "$@"'))
    res = run_tntrun(["--dry-run", "-n", "2", "--pin-to-socket", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert "taskset -c 4-7" in res.stdout


def test_pinning_stays_within_the_cpus_tntrun_may_run_on(tmp_path):
    # tntrun confined to one CPU (taskset, a cgroup cpuset, Slurm's binding): the node
    # without an allowed CPU is skipped and every rank is bound to the allowed CPU of the
    # other, not to the whole node (which would leave the affinity, or fail in a cpuset)
    cpu = min(os.sched_getaffinity(0))
    env = runner_env(TNT_SYSFS_NODE_DIR=_nodes(tmp_path, (f"{cpu}-{cpu + 3}", f"{cpu + 4}-{cpu + 7}")),
                     PATH=fake_bin(tmp_path, numactl='exec "$@"') + os.pathsep + "/usr/bin:/bin")
    res = run_tntrun(["--dry-run", "-n", "2", "--pin-to-socket", "--", "t.py"], env=env,
                     preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert all(f"numactl --physcpubind={cpu} --preferred=0" in ln for ln in lines[:2]), lines
    assert "cpunodebind" not in res.stdout


def test_cpulists_read_and_written_as_the_kernel_does():
    from tarantella.runner import pinning

    assert pinning.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert pinning.format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    nodes = {0: "0-3", 1: "4-7"}
    assert pinning.usable_nodes(nodes, None) == {0: ("0-3", True), 1: ("4-7", True)}


def test_pinning_with_no_node_holding_an_allowed_cpu_is_a_clear_error():
    # a layout (sysfs, or TNT_SYSFS_NODE_DIR) whose nodes hold only CPUs tntrun may not use
    from tarantella.runner import pinning
    from tarantella.runner.environment import UsageError

    online = sorted(pinning.online_cpus())
    if len(online) < 2:
        pytest.skip("needs 2 online CPUs: one allowed, one in the layout")
    with pytest.raises(UsageError, match=r"no NUMA node of this host holds a CPU that tntrun may run on .*"
                                         rf"affinity: {online[0]}; the nodes: 0: {online[1]}\); run without pinning"):
        pinning.usable_nodes({0: str(online[1])}, {online[0]})
