"""Several hosts: the engine command (--dry-run) for Open MPI, MPICH/Hydra, gaspi_run and
Slurm, with fake engines on PATH (tiny scripts), and what happens when the engine is missing."""
import os
import shlex
import socket
import sys

import pytest
from tntrun_helpers import fake_bin, import_runner, run_tntrun, runner_env

import_runner()
from tarantella.runner import multi  # noqa: E402
from tarantella.runner import rank as rank_wrapper  # noqa: E402
from tarantella.common import engine_ranks  # noqa: E402

OPENMPI = 'echo "mpirun (Open MPI) 4.1.4"'
MPICH = 'echo "HYDRA build details:"; echo "    Version:  4.0.2"'


def _hosts(tmp_path, text="# two nodes\nnode1\nnode2\n"):
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def _command_line(stdout):
    """The last line of a dry run: VAR=value ... engine args."""
    return shlex.split(stdout.strip().splitlines()[-1])


ROOT = os.geteuid() == 0


def _without_root_flag(argv):
    """Open MPI's argv without --allow-run-as-root, which tntrun adds exactly when root."""
    assert ("--allow-run-as-root" in argv) == ROOT
    return [w for w in argv if w != "--allow-run-as-root"]


def test_openmpi(tmp_path):
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=OPENMPI) + os.pathsep + os.environ["PATH"],
                     MY_SETTING="1", TNT_TIMEOUT_S="9", OMPI_MCA_btl="tcp,self", OLDPWD="/x")
    res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), "--n-per-node", "2",
                      "-x", "A=1", "-x", "B=2", "--fusion-threshold", "64", "--", "train.py", "--e", "1"],
                     env=env)
    assert res.returncode == 0, res.stderr
    words = _command_line(res.stdout)
    assert "A=1" in words and "TNT_FUSION_THRESHOLD_KB=64" in words
    start = next(i for i, w in enumerate(words) if w.endswith("/mpirun"))
    argv = _without_root_flag(words[start:])
    assert argv[1:7] == ["-np", "4", "--host", "node1:2,node2:2", "-npernode", "2"]
    joined = " ".join(argv)
    assert "-x TNT_JOB_ID" in joined and "-x TNT_FUSION_THRESHOLD_KB" in joined
    assert joined.index("-x A") < joined.index("-x B")
    # tntrun's whole environment reaches the ranks on other hosts, as it does those on this
    # one, but for the session's and the engine's own variables (mpirun reads OMPI_MCA_*)
    assert "-x MY_SETTING" in joined and "-x TNT_TIMEOUT_S" in joined and "-x PATH" in joined
    assert "-x OMPI_MCA_btl" not in joined and "-x OLDPWD" not in joined
    tail = argv[argv.index("-m"):]
    assert tail[:6] == ["-m", "tarantella.runner.rank", "--report", "--size=4", "--per-node=2", "--"]
    assert "python" in os.path.basename(tail[6]) and tail[7:] == ["train.py", "--e", "1"]
    assert "through mpirun (Open MPI)" in res.stdout


def test_n_per_node_cpu_counts_the_cores_tntrun_may_run_on(tmp_path):
    # confined to one CPU (as by taskset, a cpuset or Slurm's binding) on a machine of any
    # size: one rank per host, as the ranks themselves would count their cores
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=OPENMPI) + os.pathsep + os.environ["PATH"])
    one = {min(os.sched_getaffinity(0))}
    res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), "--n-per-node", "cpu", "--no-gpu", "--", "t.py"],
                     env=env, preexec_fn=lambda: os.sched_setaffinity(0, one))
    assert res.returncode == 0, res.stderr
    argv = _without_root_flag(_command_line(res.stdout))
    start = next(i for i, w in enumerate(argv) if w.endswith("/mpirun"))
    assert argv[start + 1:start + 7] == ["-np", "2", "--host", "node1:1,node2:1", "-npernode", "1"]


def test_a_host_list_without_gpus_runs_one_rank_per_host_and_says_so(tmp_path):
    # as on one host, and as the original `tarantella --hostfile` documented: a WARNING,
    # unless --no-gpu asked for the CPU (no warning was given with a host list)
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=OPENMPI) + os.pathsep + os.environ["PATH"])
    for flags, warned in (([], True), (["--no-gpu"], False), (["--n-per-node", "1"], False)):
        res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), *flags, "--", "t.py"], env=env)
        assert res.returncode == 0, res.stderr
        argv = _without_root_flag(_command_line(res.stdout))
        start = next(i for i, w in enumerate(argv) if w.endswith("/mpirun"))
        assert argv[start + 1:start + 5] == ["-np", "2", "--host", "node1:1,node2:1"], flags
        assert ("WARNING: no GPU found on this host: running 1 rank per host" in res.stderr) == warned, (
            flags, res.stderr)


def test_a_host_list_puts_ranks_per_gpu_on_each_gpu_of_a_host(tmp_path):
    """--ranks-per-gpu K places K ranks on each GPU of every host, as on one host: it placed one per GPU, and
    the rank wrapper put a host's 2 ranks both on GPU 0, its other GPU idle, without a word."""
    listing = tmp_path / "nvidia-smi-L.txt"
    listing.write_text("GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n")
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=OPENMPI) + os.pathsep + os.environ["PATH"],
                     TNT_GPU_LISTING=str(listing))
    for flags, per in (([], 2), (["--ranks-per-gpu", "2"], 4), (["--ranks-per-gpu", "2", "--n-per-node", "gpu"], 4),
                       (["--ranks-per-gpu", "2", "--no-gpu"], 1)):
        res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), *flags, "--", "t.py"], env=env)
        assert res.returncode == 0, res.stderr
        argv = _without_root_flag(_command_line(res.stdout))
        start = next(i for i, w in enumerate(argv) if w.endswith("/mpirun"))
        assert argv[start + 1:start + 5] == ["-np", str(2 * per), "--host", f"node1:{per},node2:{per}"], (flags, argv)


def test_openmpi_hosts_flag_and_slots(tmp_path):
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=OPENMPI) + os.pathsep + os.environ["PATH"])
    res = run_tntrun(["--dry-run", "-H", "a:1,b:3", "--output-on-all-devices", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    argv = " ".join(_without_root_flag(_command_line(res.stdout)))
    assert "-np 4 --host a:1,b:3 --bind-to none --tag-output" in argv
    assert "-npernode" not in argv and "--output-all" in argv


def test_mpich_style(tmp_path):
    bin_dir = fake_bin(tmp_path, mpiexec=MPICH)
    env = runner_env(PATH=bin_dir + os.pathsep + "/usr/bin:/bin")
    if any(os.path.exists(os.path.join(d, "mpirun")) for d in ("/usr/bin", "/bin")):
        # a real mpirun would be found first: hide it behind a fake Hydra mpirun
        bin_dir = fake_bin(tmp_path, mpiexec=MPICH, mpirun=MPICH)
    res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path, "node1 slots=2\nnode2 slots=2\n"),
                      "-x", "A=x y", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    argv = _command_line(res.stdout)
    start = next(i for i, w in enumerate(argv) if w.endswith(("/mpiexec", "/mpirun")))
    argv = argv[start:]
    assert argv[1:3] == ["-n", "4"] and argv[3] == "-f" and argv[5:7] == ["-ppn", "2"]
    assert "-genv" in argv and argv[argv.index("A") - 1] == "-genv" and argv[argv.index("A") + 1] == "x y"
    assert "node1:2" in res.stdout and "node2:2" in res.stdout  # the machinefile is shown
    assert "MPICH/Hydra" in res.stdout


def test_gaspi_run(tmp_path):
    env = runner_env(PATH=fake_bin(tmp_path, gaspi_run="exit 0") + os.pathsep + os.environ["PATH"],
                     MY_SETTING="a b", SLURM_PROCID="0")
    res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), "--n-per-node", "2",
                      "--transport", "gpi2", "-x", "K=v", "--", "t.py"], env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    argv = _command_line(res.stdout)
    start = next(i for i, w in enumerate(argv) if w.endswith("/gaspi_run"))
    assert argv[start + 1:start + 4] == ["-n", "4", "-m"]
    out = res.stdout
    # machinefile: each host once per rank, in order; the script exports the environment
    assert "#   node1\n#   node1\n#   node2\n#   node2\n" in out
    assert "#   export K=v" in out and "#   export TNT_TRANSPORT=gpi2" in out
    # (the session's SLURM_PROCID is not exported; the wrapper's bootstrap names the variable)
    assert "#   export MY_SETTING='a b'" in out and "SLURM_PROCID=" not in out
    assert out.count("#   export PATH=") == 1
    assert "tarantella.runner.rank" in out
    # the script stays (gaspi_run's clean-up kills it by name on every host), its wrapper
    # stopping the program when it dies
    assert "--die-with-script" in out and "#   export TNT_RANK_SCRIPT_PID=$$" in out
    assert out.split("export TNT_RANK_SCRIPT_PID=$$\n")[1].startswith("#   /")  # not exec'd
    # gaspi_run's mktemp notes its /tmp files for tntrun (and --cleanup) to remove
    assert "/mktemp:\n" in out and "engine-temp-files" in out
    assert not list(tmp_path.glob(".tnt-*"))  # a dry run writes nothing


def test_gaspi_run_from_a_folder_it_cannot_write(tmp_path):
    # gaspi_run's machine file and script go into the current folder: where none can be made
    # there (/proc, even for root) tntrun ended with a FileNotFoundError traceback
    env = runner_env(PATH=fake_bin(tmp_path, gaspi_run="exit 0") + os.pathsep + os.environ["PATH"])
    res = run_tntrun(["-H", "node1:1,node2:1", "--transport", "gpi2", "--", "t.py"], env=env, cwd="/proc")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert "tntrun: error: cannot write /proc/.tnt-" in res.stderr and "writable shared folder" in res.stderr


def test_slurm(tmp_path):
    env = runner_env(PATH=fake_bin(tmp_path, srun="exit 0") + os.pathsep + os.environ["PATH"],
                     SLURM_JOB_ID="1234", SLURM_JOB_NUM_NODES="3")
    res = run_tntrun(["--dry-run", "--n-per-node", "4", "--output-on-all-devices", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    argv = " ".join(_command_line(res.stdout))
    assert "/srun --ntasks=12 --ntasks-per-node=4 --nodes=3 --export=ALL --kill-on-bad-exit=1 --disable-status --label" in argv
    res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), "--n-per-node", "1", "--", "t.py"],
                     env=env)
    argv = " ".join(_command_line(res.stdout))
    assert "--ntasks=2 --ntasks-per-node=1 --nodes=2 --nodelist=node1,node2" in argv


@pytest.mark.parametrize("transport, missing, package", [
    ("mpi", "mpirun", "apt-get install openmpi-bin"),
    ("gpi2", "gaspi_run", "GPI-2"),
])
def test_engine_missing(tmp_path, transport, missing, package):
    env = runner_env(PATH=str(tmp_path / "empty"))
    res = run_tntrun(["--hostfile", _hosts(tmp_path), "--transport", transport, "--", "t.py"], env=env)
    assert res.returncode == 127
    assert f"{missing} not found" in res.stderr and package in res.stderr


@pytest.mark.parametrize("transport, engine", [("mpi", "mpirun"), ("gpi2", "gaspi_run")])
def test_dry_run_without_the_engine_prints_the_command(tmp_path, transport, engine):
    env = runner_env(PATH=str(tmp_path / "empty"))
    res = run_tntrun(["--dry-run", "--hostfile", _hosts(tmp_path), "--transport", transport,
                      "--", "t.py"], env=env, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    argv = _command_line(res.stdout)
    start = argv.index(engine)  # the bare name: there is no path to it
    if engine == "mpirun":
        argv = _without_root_flag(argv)
    assert argv[start + 1:start + 3] == ["-n" if engine == "gaspi_run" else "-np", "2"]
    assert f"WARNING: {engine} not found on PATH" in res.stderr and "dry run" in res.stderr
    assert not list(tmp_path.glob(".tnt-*"))  # a dry run writes nothing


def test_shm_refused_across_hosts(tmp_path):
    res = run_tntrun(["--hostfile", _hosts(tmp_path), "--transport", "shm", "--", "t.py"])
    assert res.returncode == 2 and "shm works on one host only" in res.stderr


def test_shm_on_the_one_host_named_is_not_refused():
    # -H localhost:2 is one host: shm was refused with "works on one host only"
    res = run_tntrun(["-H", "localhost:2", "--transport", "shm", "--dry-run", "--", "t.py"])
    assert res.returncode == 0, res.stderr
    assert "TNT_TRANSPORT=shm" in res.stdout and "-np 2 --host localhost:2" in res.stdout
    res = run_tntrun(["-H", "a,b", "--dry-run", "--", "t.py"],
                     env=runner_env(TNT_TRANSPORT="shm"))
    assert res.returncode == 2
    assert "TNT_TRANSPORT=shm works on one host only, and the job has 2 (a, b)" in res.stderr


def test_one_machine_under_two_names_is_refused_naming_both():
    # localhost and 127.0.0.1 (or a host's name and its address): mpirun took them for one
    # node and refused the job ("more processes than the ppr for this topology can support")
    res = run_tntrun(["-H", "localhost:1,127.0.0.1:1", "--dry-run", "--", "t.py"])
    assert res.returncode == 2, res.stderr
    assert "--hosts names one machine twice: 'localhost' and '127.0.0.1' are both this machine" in res.stderr
    assert "List each machine once, with the slots of all its ranks (localhost:N)" in res.stderr
    # names that do not resolve are the engine's to judge, as before
    assert run_tntrun(["-H", "a,b", "--dry-run", "--", "t.py"]).returncode == 0


def test_two_machines_are_not_taken_for_one_where_any_address_can_be_bound(monkeypatch):
    # "this machine" was an address that bind() accepts: with net.ipv4.ip_nonlocal_bind=1
    # (hosts of keepalived or HAProxy, some Kubernetes nodes) the kernel accepts any, and
    # every job on two hosts was refused ("'node1' and 'node2' are both this machine").
    # Such a kernel's bind() is what the patch below does
    from tarantella.runner import hostfile

    monkeypatch.setattr(socket.socket, "bind", lambda self, address: None)
    assert hostfile.same_machine(["198.51.100.1", "198.51.100.2"]) is None  # TEST-NET-2: no host of ours
    assert hostfile.same_machine(["localhost", "127.0.0.1"])[2].startswith("are both this machine")
    assert hostfile.same_machine(["198.51.100.1", "localhost", "127.0.0.1"])[:2] == ("localhost", "127.0.0.1")


def test_two_host_names_of_one_address_are_left_to_the_engine(monkeypatch):
    # A wildcard DNS record answers with one address for names that are not in DNS (ssh aliases
    # that ~/.ssh/config maps to machines of their own): two such names were refused as
    # "resolve to one address", a job the engine would have run, with no way around. Refused
    # only where one of the names is the address itself
    from tarantella.runner import hostfile

    wildcard = "198.51.100.7"  # TEST-NET-2: no host of ours
    real = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if host in ("node-a", "node-b"):
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (wildcard, 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert hostfile.same_machine(["node-a", "node-b"]) is None
    assert hostfile.same_machine(["node-a", wildcard]) == ("node-a", wildcard, f"resolve to one address, {wildcard}")
    assert hostfile.same_machine([wildcard, "node-b"])[:2] == (wildcard, "node-b")


def test_engine_failure_is_reported(tmp_path):
    fake = 'echo "rank 3 on node2 died" >&2; exit 9'
    env = runner_env(PATH=fake_bin(tmp_path, mpirun=fake) + os.pathsep + os.environ["PATH"])
    res = run_tntrun(["--hostfile", _hosts(tmp_path), "--transport", "mpi", "--", "t.py"], env=env)
    assert res.returncode == 9
    assert "Root cause" in res.stderr and "rank 3 on node2 died" in res.stderr


# An engine that starts the one rank it is given (rank 1 of 2, by the engine's own variables)
# where Tarantella is not installed: the rank command of its argv run with `tarantella`
# blocked (sys.modules), as on a host whose Python lacks it
FAKE_ENGINE = """
import os, sys
args = sys.argv[1:]
if args == ["--version"]:
    sys.exit(print(VERSION))
at = next(i for i, a in enumerate(args) if i and a in ("-c", "-m")) - 1  # PYTHON -c|-m ...
blocked = os.path.join(os.path.dirname(os.path.abspath(__file__)), "blocked")
os.makedirs(blocked, exist_ok=True)
with open(os.path.join(blocked, "sitecustomize.py"), "w") as f:
    f.write("import sys\\nsys.modules['tarantella'] = None\\n")
os.execve(args[at], args[at:], dict(os.environ, PYTHONPATH=blocked, **RANK))
"""


@pytest.mark.parametrize("engine, version, rank_vars, extra", [
    ("mpirun", "mpirun (Open MPI) 4.1.4", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, {}),
    ("mpirun", "HYDRA build details:", {"PMI_RANK": "1", "MPI_LOCALRANKID": "0"}, {}),  # MPICH's
    ("srun", "", {"SLURM_PROCID": "1", "SLURM_LOCALID": "0"}, {"SLURM_JOB_ID": "77"}),
], ids=["openmpi", "mpich", "srun"])
def test_a_host_without_tarantella_is_named_with_its_rank(tmp_path, engine, version, rank_vars, extra):
    # under mpirun, mpiexec (MPICH) and srun the rank wrapper could not be imported there, and
    # the report named the engine alone, with Python's "No module named ..." (whose rank? which
    # host?). The wrapper's bootstrap now sends the record of a rank that did not start; the
    # dry run still shows the readable `-m tarantella.runner.rank`
    (tmp_path / "engine.py").write_text(f"RANK, VERSION = {rank_vars!r}, {version!r}\n" + FAKE_ENGINE)
    bin_dir = fake_bin(tmp_path, **{engine: f'exec "{sys.executable}" "{tmp_path / "engine.py"}" "$@"'})
    env = runner_env(PATH=bin_dir + os.pathsep + "/usr/bin:/bin", **extra)
    args = ["-H", "node1:1,node2:1", "--n-per-node", "1", "--transport", "mpi", "--", "t.py"]
    dry = run_tntrun(["--dry-run", *args], env=env)
    assert dry.returncode == 0, dry.stderr
    assert " -m tarantella.runner.rank --report --size=2 " in dry.stdout.splitlines()[-1], dry.stdout
    res = run_tntrun(args, env=env)
    assert res.returncode == 127, res.stdout + res.stderr
    root = res.stderr.split("Root cause")[1].split("-" * 72)[0]
    host = socket.gethostname()
    assert root.startswith(f" (first failure not caused by another rank):\n  rank:    1 (local_rank 0)\n"
                           f"  host:    {host}\n  pid:     not started\n"), res.stderr
    assert f"NotStartedError: rank 1 could not start on {host}: " in root, root
    assert "cannot import tarantella.runner.rank" in root, root
    assert "\x1e" not in res.stderr


@pytest.mark.parametrize("environ, expected", [
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (5, 8, 1, 4)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, (2, 4, 0, 2)),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3"}, (7, 8, 3, 4)),
    # uneven steps: the local size is this node's count in the step's layout
    ({"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
      "SLURM_STEP_TASKS_PER_NODE": "3(x2),1"}, (6, 7, 0, 1)),
    ({"GASPI_RANK": "6"}, (6, 8, 2, 4)),
    ({}, (0, 8, 0, 4)),
])
def test_rank_wrapper_reads_engine_placement(environ, expected):
    assert rank_wrapper.placement(environ, per_node=4, size=8) == expected


def _real_openmpi():
    import shutil
    import subprocess

    mpirun = shutil.which("mpirun")
    if not mpirun or not shutil.which("tntrun"):  # the rank wrapper needs the installed package
        return False
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    return "Open MPI" in out.stdout + out.stderr


@pytest.mark.skipif(not _real_openmpi(), reason="needs Open MPI's mpirun and an installed tntrun")
def test_real_openmpi_on_localhost(script):
    # root in containers: Open MPI refuses to run as root without these
    env = runner_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                     OMPI_MCA_plm_rsh_agent="false")
    path = script("""
        print("rank", os.environ["TNT_RANK"], os.environ["TNT_SIZE"], os.environ["TNT_LOCAL_RANK"],
              os.environ.get("A"), flush=True)
        if os.environ["TNT_RANK"] == "1" and "fail" in sys.argv:
            sys.exit(3)
    """)
    res = run_tntrun(["-H", "localhost:2", "--transport", "mpi", "-x", "A=5", "--", path], env=env,
                     timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["rank 0 2 0 5"]  # rank 1's stdout hidden by the wrapper
    res = run_tntrun(["-H", "localhost:2", "--transport", "mpi", "--", path, "fail"], env=env, timeout=60)
    assert res.returncode == 3 and "FAILED" in res.stderr
    # -n N --transport mpi on one host: mpirun starts the ranks too (the mpi transport takes
    # its ranks from MPI: ranks that tntrun started on its own were refused)
    summed = script("""
        import numpy as np
        import tarantella as tnt
        total = tnt.allreduce(np.ones(3, np.float32))
        print("sum", total.tolist(), tnt.get_size(), os.environ.get("A"), flush=True)
    """)
    res = run_tntrun(["-n", "2", "--transport", "mpi", "-x", "A=6", "--", summed], env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["sum [2.0, 2.0, 2.0] 2 6"], res.stdout


ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}


@pytest.mark.parametrize("extra, args, expected", [
    # salloc -N 2: one rank per node (no GPU here)
    ({"SLURM_TASKS_PER_NODE": "1(x2)"}, [], "--ntasks=2 --ntasks-per-node=1 --nodes=2 "),
    # salloc -N 2 --ntasks-per-node=2, or -n 4: the tasks asked for
    ({"SLURM_NTASKS_PER_NODE": "2"}, [], "--ntasks=4 --ntasks-per-node=2 --nodes=2 "),
    ({"SLURM_NTASKS": "5", "SLURM_TASKS_PER_NODE": "3,2"}, [], "--ntasks=5 --nodes=2 "),
    # -n: the total, spread over every node as srun spreads it
    ({}, ["-n", "3"], "--ntasks=3 --nodes=2 "),
    ({}, ["-n", "1"], "--ntasks=1 --ntasks-per-node=1 --nodes=1 "),
])
def test_plain_tntrun_in_an_allocation_uses_its_nodes(tmp_path, extra, args, expected):
    env = runner_env(PATH=fake_bin(tmp_path, srun="exit 0") + os.pathsep + os.environ["PATH"],
                     **ALLOCATION, **extra)
    res = run_tntrun(["--dry-run", *args, "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert "/srun " + expected + "--export=ALL --kill-on-bad-exit=1 " in res.stdout
    assert "through srun" in res.stdout and "node1:" in res.stdout


def test_one_node_allocation_runs_here(tmp_path):
    # on the allocation's node (a batch script, a step: Slurm sets SLURMD_NODENAME there)
    env = runner_env(SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1",
                     SLURMD_NODENAME="node1")
    res = run_tntrun(["--dry-run", "-n", "2", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert "# rank 1" in res.stdout and "srun" not in res.stdout
    # in salloc's shell on the login node, which is not node1: the ranks ran here, outside
    # the allocation; they go to node1 through srun
    env = runner_env(PATH=fake_bin(tmp_path, srun="exit 0") + os.pathsep + os.environ["PATH"],
                     SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1")
    res = run_tntrun(["--dry-run", "-n", "2", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert "2 rank(s) on node1:2 through srun" in res.stdout, res.stdout



def test_an_allocation_with_fewer_cpus_than_ranks_says_how_to_fix_it(tmp_path):
    # `salloc -N 1` holds one CPU: `tntrun -n 2` ended with srun's bare "More processors
    # requested than permitted". tntrun now adds what to change, after srun's line (in
    # pieces: srun's words may come in two writes)
    fake = ("printf 'srun: error: Unable to create step for job 77: More proc' >&2; sleep 0.2; "
            "printf 'essors requested than permitted\\n' >&2; exit 1")
    env = runner_env(PATH=fake_bin(tmp_path, srun=fake) + os.pathsep + os.environ["PATH"],
                     SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1",
                     SLURM_JOB_CPUS_PER_NODE="1")
    res = run_tntrun(["-n", "2", "--", "t.py"], env=env)
    assert res.returncode == 1, res.stderr
    advice = ("tntrun: srun needs a CPU of the allocation per rank, and it holds fewer than the 2 rank(s) "
              "asked for (SLURM_JOB_CPUS_PER_NODE=1): allocate a task per rank (salloc -N 1 -n 2, the "
              "same options for sbatch), or run fewer ranks (tntrun -n)\n")
    assert "More processors requested than permitted\n" + advice in res.stderr, res.stderr
    assert res.stderr.count(advice) == 2, res.stderr  # as it came, and in the report's stderr tail

def test_tntrun_as_the_one_task_of_a_step_lets_the_ranks_step_overlap(tmp_path):
    # `srun -N1 -n1 tntrun` holds a CPU of the allocation: the ranks' step must share it
    env = runner_env(PATH=fake_bin(tmp_path, srun="exit 0") + os.pathsep + os.environ["PATH"],
                     **ALLOCATION, SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="1")
    res = run_tntrun(["--dry-run", "-n", "2", "--", "t.py"], env=env)
    assert res.returncode == 0, res.stderr
    assert "/srun --ntasks=2 --ntasks-per-node=1 --nodes=2 --export=ALL --kill-on-bad-exit=1 --disable-status --overlap " in res.stdout


def test_tntrun_as_one_of_many_step_tasks_is_refused(tmp_path):
    env = runner_env(**ALLOCATION, SLURM_STEP_ID="0", SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="4")
    res = run_tntrun(["--", "t.py"], env=env)
    assert res.returncode == 2
    assert "one of 4 tasks of a Slurm job step" in res.stderr and "srun -n 4 python" in res.stderr


@pytest.mark.parametrize("text, names", [
    ("node[1-3,7],gpu01", ["node1", "node2", "node3", "node7", "gpu01"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("hostA,hostB", ["hostA", "hostB"]),
    ("bad[x-y]", None),
    ("rack[1-2]-node[01-02]", None),
    ("a,,b", None),
    ("", None),
])
def test_slurm_node_lists(text, names):
    assert multi.expand_nodelist(text) == names


def test_slurm_task_counts():
    assert engine_ranks.slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert engine_ranks.slurm_tasks_per_node("4") == [4]
    assert engine_ranks.slurm_tasks_per_node("2(x") is None
