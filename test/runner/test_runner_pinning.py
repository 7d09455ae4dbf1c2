"""--pin-to-socket / --pin-memory-to-socket, with a fake NUMA layout."""
import os

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


def test_memory_pinning_without_numactl_is_an_error(tmp_path):
    env = runner_env(TNT_SYSFS_NODE_DIR=_nodes(tmp_path), PATH=str(tmp_path / "empty"))
    res = run_tntrun(["-n", "2", "--pin-memory-to-socket", "--", "t.py"], env=env)
    assert res.returncode == 2
    assert "--pin-memory-to-socket needs numactl" in res.stderr and "apt-get install numactl" in res.stderr


def test_cpu_pinning_falls_back_to_taskset(tmp_path):
    env = runner_env(TNT_SYSFS_NODE_DIR=_nodes(tmp_path),
                     PATH=fake_bin(tmp_path, taskset='exec "$@"'))
    res = run_tntrun(["--dry-run", "-n", "2", "--pin-to-socket", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert "taskset -c 4-7" in res.stdout
