"""Bad input gets a clear error that says what was wrong and what to do.

Each check runs in a fresh interpreter (the core's state is per process)."""
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

from core_helpers import clean_env


def run(code, **env):
    prog = "import numpy as np\nimport tarantella as tnt\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], env=clean_env(**env), capture_output=True, text=True,
                          timeout=60)


def raises(code, exc, words, **env):
    res = run(f"""
        try:
{textwrap.indent(textwrap.dedent(code), "            ")}
            print("NO ERROR")
        except tnt.{exc} as e:
            print("MESSAGE:", e)
        """, **env)
    assert "MESSAGE:" in res.stdout, res.stdout + res.stderr
    for w in words:
        assert w in res.stdout, (w, res.stdout)


@pytest.mark.parametrize("dtype", ["np.complex64", "np.bool_", "np.uint8", "np.int16", "object"])
def test_unsupported_dtype(dtype):
    raises(f"tnt.allreduce(np.zeros(3, dtype={dtype}))", "InvalidArgumentError",
           ["is not supported", "float32", "astype"])


def test_non_contiguous_array():
    raises("tnt.allreduce(np.zeros((4, 4), np.float32)[:, 1])", "InvalidArgumentError",
           ["C-contiguous", "np.ascontiguousarray"])


def test_bad_input_to_a_running_core():
    # once the core runs, allreduce first tries its inline fast path: every bad
    # argument must still reach the general path's error, and nothing be reduced
    res = run("""
        tnt.init()
        x = np.ones(4, np.float32)
        nine = np.ones(9, np.float32)
        readonly = np.empty(4, np.float32)
        readonly.flags.writeable = False
        cases = {
            "non-contiguous": lambda: tnt.allreduce(np.zeros((4, 4), np.float32)[:, 1]),
            "fortran": lambda: tnt.allreduce(np.zeros((4, 3), np.float32, order="F")),
            "bool": lambda: tnt.allreduce(np.zeros(3, np.bool_)),
            "byte-swapped": lambda: tnt.allreduce(np.ones(3, np.dtype(np.float32).newbyteorder())),
            "op": lambda: tnt.allreduce(x, op="max"),
            "op-type": lambda: tnt.allreduce(x, op=["sum"]),
            "name": lambda: tnt.allreduce(x, name="x" * 300),
            "name-type": lambda: tnt.allreduce(x, name=7),
            "out-readonly": lambda: tnt.allreduce(x, out=readonly),
            "out-shape": lambda: tnt.allreduce(x, out=np.empty(5, np.float32)),
            "out-dtype": lambda: tnt.allreduce(x, out=np.empty(4, np.float64)),
            "out-strided": lambda: tnt.allreduce(x, out=np.empty(8, np.float32)[::2]),
            # out sharing bytes with the input without being it: a silent wrong sum if let through
            "out-overlaps": lambda: tnt.allreduce(nine[:-1], out=nine[1:]),
            "out-overlaps-broadcast": lambda: tnt.broadcast(nine[1:], out=nine[:-1]),
            # the core would read the masked values too, and the result would have no mask
            "masked": lambda: tnt.allreduce(np.ma.array([1.0, 2.0], mask=[0, 1])),
            "masked-broadcast": lambda: tnt.broadcast(np.ma.array([1.0, 2.0], mask=[0, 1])),
            "masked-allgather": lambda: tnt.allgather(np.ma.array([1.0, 2.0], mask=[0, 1])),
            "masked-leaf": lambda: tnt.allreduce({"a": np.ma.array([1.0, 2.0], mask=[0, 1])}),
            "masked-leaf-allgather": lambda: tnt.allgather([np.ma.array([1.0, 2.0], mask=[0, 1])]),
            # float("2") took a string; a whole number past 2**53 became the nearest double, and an
            # int64 sum was multiplied by 2**53 where 2**53 + 1 was given, without a word
            "prescale-str": lambda: tnt.allreduce(x, prescale="2"),
            "prescale-none": lambda: tnt.allreduce(x, prescale=None),
            "prescale-fraction": lambda: tnt.allreduce(np.ones(2, np.int64), prescale=0.5),
            "prescale-inexact": lambda: tnt.allreduce(np.ones(2, np.int64), prescale=2**53 + 1),
            "prescale-inexact-async": lambda: tnt.allreduce_async(np.ones(2, np.int64), prescale=np.int64(2**62 + 1)),
            # NumPy wraps these in an array of dtype object, which was refused as an unsupported dtype to cast
            "async-structure": lambda: tnt.allreduce_async({"a": x}),
            "async-structure-ragged": lambda: tnt.broadcast_async([x, nine]),
            "none": lambda: tnt.allreduce(None),
        }
        for label, call in cases.items():
            try:
                call()
                print(label, "NO ERROR")
            except tnt.InvalidArgumentError as e:
                print(label, "MESSAGE:", e)
        print("after:", tnt.allreduce(x, prescale=2.0).tolist(), tnt.allreduce(x, out=np.empty(4, np.float32)).tolist(),
              tnt.allreduce(nine[:4], out=nine[:4]).tolist(),  # in place is not an overlap
              tnt.allreduce(np.ones(1, np.int64), prescale=2**53).tolist(),  # whole numbers a double holds
              tnt.allreduce(np.ones(1, np.int64), prescale=np.int64(-3)).tolist())
        """)
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
    expected = {"non-contiguous": "C-contiguous", "fortran": "C-contiguous", "bool": "is not supported", "byte-swapped": "newbyteorder('=')",
                "op": '"sum" or "average"', "op-type": '"sum" or "average"', "name": "at most 255 bytes",
                "name-type": "non-empty string", "out-readonly": "Received: float32(4,), read-only", "out-shape": "float32(4,)",
                "out-dtype": "float32(4,)", "out-strided": "Received: float32(4,), not C-contiguous",
                "out-overlaps": "Received: out=float32(8,) starting +4 bytes from the input's start",
                "out-overlaps-broadcast": "Received: out=float32(8,) starting -4 bytes",
                "masked": "does not take masked arrays", "masked-broadcast": "does not take masked arrays",
                "masked-allgather": "does not take masked arrays", "masked-leaf": "does not take masked arrays",
                "masked-leaf-allgather": "does not take masked arrays",
                "prescale-str": "prescale must be a real number", "prescale-none": "Received: prescale=None",
                "prescale-fraction": "Received: prescale=0.5 for int64",
                "prescale-inexact": "prescale=9007199254740993 on an integer dtype",
                "prescale-inexact-async": "exactly only up to 2**53",
                "async-structure": "Received: dict (a nested structure: the blocking tnt.allreduce",
                "async-structure-ragged": "Received: list (a nested structure",
                "none": "expects a NumPy array. Received: NoneType"}
    for label, words in expected.items():
        assert lines.get(label, "").startswith("MESSAGE:") and words in lines[label], (label, res.stdout + res.stderr)
        # api.md, "Errors": an InvalidArgumentError's message ends with what was received
        assert "Received: " in lines[label], (label, lines[label])
    assert lines.get("after:") == "[2.0, 2.0, 2.0, 2.0] [1.0, 1.0, 1.0, 1.0] [1.0, 1.0, 1.0, 1.0] [9007199254740992] [-3]", \
        res.stdout + res.stderr


@pytest.mark.parametrize("root", ["1", "-1", "'0'", "False", "True"])
def test_wrong_root(root):
    raises(f"tnt.broadcast(np.zeros(3, np.float32), root={root})", "InvalidArgumentError",
           ["root must be a rank between 0 and 0", f"root={root}"])


def test_bad_op_and_name():
    raises("tnt.allreduce(np.zeros(3, np.float32), op='max')", "InvalidArgumentError", ['"sum" or "average"'])
    raises("tnt.allreduce(np.zeros(3, np.float32), name='x' * 300)", "InvalidArgumentError", ["at most 255 bytes"])


def test_calls_after_shutdown():
    raises("tnt.init(); tnt.shutdown(); tnt.allreduce(np.zeros(3, np.float32))", "InvalidUsageError",
           ["shut down", "tnt.init()"])
    raises("tnt.init(); tnt.shutdown(); tnt.get_rank()", "InvalidUsageError", ["shut down"])


def test_init_again_after_shutdown_works():
    res = run("tnt.init(); tnt.shutdown(); tnt.init(); print(tnt.allreduce(np.ones(2, np.int32)).tolist())")
    assert "[1, 1]" in res.stdout, res.stderr


def test_core_calls_before_init():
    # the C API itself refuses; the Python API initializes on first use instead
    raises("""
        from tarantella.common import core
        lib, ffi = core.lib(), core.ffi()
        h = ffi.new("tnt_handle_t *")
        buf = np.zeros(3, np.float32)
        core.check(lib.tnt_allreduce_async(b"x", ffi.from_buffer(buf), ffi.from_buffer(buf), 3, 2, 0, 1.0, h))
        """, "InvalidUsageError", ["not initialized", "tnt_init"])


def test_python_api_initializes_on_first_use():
    res = run("print(tnt.is_initialized()); tnt.get_size(); print(tnt.is_initialized())")
    assert res.stdout.split() == ["False", "True"], res.stdout + res.stderr


@pytest.mark.parametrize("var,value,words", [
    ("TNT_TIMEOUT_S", "soon", ["TNT_TIMEOUT_S must be a number", "TNT_TIMEOUT_S=soon"]),
    ("TNT_FUSION_THRESHOLD_KB", "-5", ["TNT_FUSION_THRESHOLD_KB must be a whole number between 0 and 4194304"]),
    ("TNT_TRANSPORT", "carrier-pigeon", ["TNT_TRANSPORT must be one of auto, shm, mpi, gpi2"]),
    ("TNT_STREAM_MIN_KB", "8M", ["TNT_STREAM_MIN_KB must be a whole number between 0 and 1000000000000",
                                 "TNT_STREAM_MIN_KB=8M"]),
    ("TNT_SHM_DIRECT", "yes", ["TNT_SHM_DIRECT must be a whole number between 0 and 1", "TNT_SHM_DIRECT=yes"]),
    ("TNT_NET_SPIN_US", "-1", ["TNT_NET_SPIN_US must be a number between 0 and 1000000", "TNT_NET_SPIN_US=-1"]),
    ("TNT_MPI_PAIR_PIECE_KB", "0", ["TNT_MPI_PAIR_PIECE_KB must be a whole number between 4 and 2097152",
                                    "TNT_MPI_PAIR_PIECE_KB=0"]),
    ("TNT_SHM_PLACEMENT", "far", ["TNT_SHM_PLACEMENT must be a whole number between 0 and 2", "1: taken as near",
                                  "TNT_SHM_PLACEMENT=far"]),
])
def test_bad_environment_values(var, value, words):
    raises("tnt.init()", "InvalidArgumentError", words, **{var: value})


def test_log_level_aliases_are_taken_as_tntrun_takes_them():
    # TNT_LOG_LEVEL=WARN (the original Tarantella's own default value) failed init and every
    # config read, while `tntrun --log-level WARN` and the core's logger took it
    res = run("from tarantella.common import config; print(config.get('TNT_LOG_LEVEL')); tnt.init(); "
              "print('up')", TNT_LOG_LEVEL="warn")
    assert res.returncode == 0 and res.stdout.split() == ["WARNING", "up"], res.stderr
    for alias, level in (("TRACE", "DEBUG"), ("FATAL", "ERROR")):
        res = run("from tarantella.common import config; print(config.get('TNT_LOG_LEVEL')); tnt.init()",
                  TNT_LOG_LEVEL=alias)
        assert res.returncode == 0 and res.stdout.split() == [level], res.stderr


def test_a_timeline_path_too_long_for_the_core_is_refused(tmp_path):
    # the core holds TNT_TIMELINE in 1024 bytes: a longer path was cut without a word, and the
    # trace written to the cut name (here a file beside the one asked for)
    folder = tmp_path
    while len(str(folder)) < 900:
        folder = folder / ("d" * 100)
    folder.mkdir(parents=True)
    path = str(folder / ("trace-" + "x" * (1100 - len(str(folder))) + ".json"))
    raises("tnt.init()", "InvalidArgumentError", ["TNT_TIMELINE", f"({len(path)} characters)", "at most 1023"],
           TNT_TIMELINE=path)
    assert os.listdir(folder) == []


def test_settings_tarantella_does_not_read_are_named_once():
    """A misspelled setting has no effect: init says so, with what it meant."""
    res = run("tnt.init(); tnt.init(); print('up')", TNT_TIMOUT_S="5", TNT_GPUS_PER_NODE="4", TNT_FRobNICATE="1",
              TNT_TIMEOUT_S="30", TNT_FUSION_THRESHOLD="65536")
    assert res.returncode == 0 and "up" in res.stdout, res.stderr
    warned = [line for line in res.stderr.splitlines() if "is not one Tarantella reads" in line]
    assert len(warned) == 4, res.stderr
    # the original's setting in bytes: "did you mean TNT_FUSION_THRESHOLD_KB?" invited 65536 KiB
    assert ("TNT_FUSION_THRESHOLD is not one Tarantella reads (the original Tarantella's, in bytes: "
            "set TNT_FUSION_THRESHOLD_KB, in KiB" in res.stderr), res.stderr
    assert "TNT_TIMOUT_S is not one Tarantella reads (did you mean TNT_TIMEOUT_S?)" in res.stderr
    assert "TNT_GPUS_PER_NODE is not one Tarantella reads (tntrun counts each host's GPUs" in res.stderr
    assert "TNT_FRobNICATE is not one Tarantella reads (docs/environment.md lists the settings)" in res.stderr


def test_bad_placement():
    raises("tnt.init()", "InvalidArgumentError", ["TNT_RANK=5", "0 <= rank < size"], TNT_RANK=5, TNT_SIZE=2)
    raises("tnt.init()", "InvalidArgumentError", ["TNT_JOB_ID is unset", "tntrun"], TNT_RANK=0, TNT_SIZE=2)
    # set but empty (TNT_RANK=$RANK TNT_SIZE=$WORLD with those unset): every process was a serial rank 0 of 1,
    # each training alone without a word
    raises("tnt.init()", "InvalidArgumentError", ["Received: TNT_RANK=, TNT_SIZE="], TNT_RANK="", TNT_SIZE="")
    raises("tnt.init()", "InvalidArgumentError", ["Received: TNT_RANK=, TNT_SIZE=(unset)"], TNT_RANK="")
    # a local placement alone was ignored (mpirun -x TNT_LOCAL_SIZE=1 took OpenMPI's; serially local 0 of 1)
    raises("tnt.init()", "InvalidArgumentError", ["set without TNT_RANK and TNT_SIZE, where it has no effect",
                                                  "Received: TNT_LOCAL_RANK=(unset), TNT_LOCAL_SIZE=1"],
           TNT_LOCAL_SIZE=1)
    # cut to 100 characters, ids alike in those named one job's shared memory: the second job
    # was told "two jobs were started with the same TNT_JOB_ID"
    raises("tnt.init()", "InvalidArgumentError", ["TNT_JOB_ID may be at most 100 characters long",
                                                  "(101 characters)"],
           TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID="a" * 101, TNT_TIMEOUT_S=2)
    # beyond a C int: TNT_SIZE=4294967297 was cut to 1 (a serial "rank 0 of 1", without a
    # word), 4294967298 to 2 (waiting for a rank 1), 2147483648 to a negative size
    for size in ("4294967297", "2147483648"):
        raises("tnt.init()", "InvalidArgumentError", [f"TNT_SIZE={size}", "0 <= rank < size"],
               TNT_RANK=0, TNT_SIZE=size, TNT_JOB_ID="x", TNT_TIMEOUT_S=2)
    # the local placement too (it picks the transport and the GPU): a bad value was taken
    # silently as the global one (TNT_LOCAL_SIZE=two: "local 0 of 2"), a local rank
    # beyond the local size was kept (TNT_LOCAL_RANK=5: "local 5 of 2")
    # a job of its own: a rank failing on its local placement leaves the job's mark (the others fail at once)
    job = dict(TNT_SIZE=2, TNT_JOB_ID=secrets.token_hex(8), TNT_TIMEOUT_S=2)
    for bad, words in ((dict(TNT_RANK=0, TNT_LOCAL_RANK="x"), ["TNT_LOCAL_RANK=x"]),
                       (dict(TNT_RANK=0, TNT_LOCAL_RANK=""), ["TNT_LOCAL_RANK=, TNT_LOCAL_SIZE=(unset)"]),
                       (dict(TNT_RANK=0, TNT_LOCAL_SIZE="two"), ["TNT_LOCAL_SIZE=two"]),
                       (dict(TNT_RANK=0, TNT_LOCAL_SIZE="0"), ["TNT_LOCAL_SIZE=0"]),
                       (dict(TNT_RANK=0, TNT_LOCAL_SIZE="4294967298"), ["TNT_LOCAL_SIZE=4294967298"]),
                       (dict(TNT_RANK=1, TNT_LOCAL_RANK="5"), ["TNT_LOCAL_RANK=5", "TNT_LOCAL_SIZE=(unset)"]),
                       (dict(TNT_RANK=0, TNT_LOCAL_RANK="2", TNT_LOCAL_SIZE="2"), ["TNT_LOCAL_RANK=2"]),
                       (dict(TNT_RANK=0, TNT_LOCAL_SIZE="3"), ["TNT_LOCAL_SIZE=3", "TNT_SIZE=2"])):
        raises("tnt.init()", "InvalidArgumentError", words + ["0 <= local rank < local size <= size"],
               **job, **bad)
    assert os.path.exists(f"/dev/shm/tnt-{job['TNT_JOB_ID']}-void")
    os.unlink(f"/dev/shm/tnt-{job['TNT_JOB_ID']}-void")


def test_unknown_transport_is_refused_naming_the_choices():
    # (mpi and gpi2 are available where their engines are: test_mpi_transport.py,
    # test_gpi2_transport.py)
    raises("tnt.init()", "InvalidArgumentError", ["TNT_TRANSPORT must be one of auto, shm, mpi, gpi2",
                                                  "TNT_TRANSPORT=nccl"],
           TNT_RANK=0, TNT_SIZE=2, TNT_JOB_ID="x", TNT_TRANSPORT="nccl")


def test_plain_python_is_rank_0_of_1():
    res = run("""
        print(tnt.get_rank(), tnt.get_size(), tnt.get_local_rank(), tnt.get_master_rank(), tnt.is_master_rank())
        x = np.arange(6, dtype=np.float64).reshape(2, 3)
        assert (tnt.allreduce(x, op="average") == x).all() and (tnt.broadcast(x) == x).all()
        assert (tnt.allgather(x) == x).all(); tnt.barrier(); print("local ok")
        """)
    assert res.stdout.split("\n")[:2] == ["0 1 0 0 True", "local ok"], res.stdout + res.stderr


def test_log_lines_before_init_carry_the_engines_rank():
    # under a bare mpirun or srun (no TNT_RANK), lines logged before init() said "rank 0" on
    # every rank, and every rank showed them as the master's
    code = "from tarantella.common.logging import get_logger; get_logger().warning('early')"
    for env, shown in (({"OMPI_COMM_WORLD_RANK": "1"}, ""),
                       ({"OMPI_COMM_WORLD_RANK": "1", "TNT_LOG_ON_ALL_DEVICES": "1"}, "rank 1"),
                       ({"SLURM_PROCID": "3", "TNT_LOG_ON_ALL_DEVICES": "1"}, "rank 3"),
                       ({"TNT_RANK": "2", "OMPI_COMM_WORLD_RANK": "1", "TNT_LOG_ON_ALL_DEVICES": "1"}, "rank 2"),
                       ({}, "rank 0")):
        res = subprocess.run([sys.executable, "-c", code], env=clean_env(**env), capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        assert res.stderr == (f"[TNT WARNING {shown}] early\n" if shown else ""), (env, res.stderr)
    # the core's lines of init() too: "placement from tntrun" read "rank 0" on every rank (and
    # showed, as the master's, without TNT_LOG_ON_ALL_DEVICES); rank 0 is missing, so init
    # times out after a second
    for everywhere in ("1", ""):
        res = run("tnt.init()", TNT_RANK="1", TNT_SIZE="2", TNT_JOB_ID=f"lonely-{secrets.token_hex(4)}",
                  TNT_TIMEOUT_S="1", TNT_LOG_LEVEL="INFO", TNT_LOG_ON_ALL_DEVICES=everywhere)
        assert "TimeoutError" in res.stderr and "[TNT INFO rank 0]" not in res.stderr, res.stderr
        assert ("[TNT INFO rank 1]" in res.stderr and "placement from tntrun: rank 1 of 2" in res.stderr) == bool(everywhere)



@pytest.mark.parametrize("env, placement", [
    # `mpirun python train.py` (Open MPI) and `mpiexec` (MPICH/Hydra) in an sbatch script of
    # `-N1 --ntasks-per-node=2`: the ranks inherit the script's SLURM_PROCID=0 and
    # SLURM_NTASKS, which were read first, so that both ranks took rank 0 ("shm_open ...
    # File exists" on one of them)
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "OpenMPI: rank 1 of 2 (local 1 of 2)"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
     "PMI: rank 1 of 2 (local 1 of 2)"),
    # a bare `srun -n 2` in `salloc -N1 --ntasks-per-node=4`: its tasks inherit the
    # allocation's SLURM_NTASKS_PER_NODE=4, which was read as the local size: "the 2 ranks of
    # this job are on several hosts (4 on this one)"
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
      "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_TASKS_PER_NODE": "2",
      "SLURM_TASKS_PER_NODE": "4"}, "Slurm: rank 1 of 2 (local 1 of 2)"),
])
def test_an_engines_placement_inside_a_slurm_job(env, placement):
    batch = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2"}
    res = run("tnt.init()", **{**batch, **env}, TNT_JOB_ID=f"lonely-{secrets.token_hex(4)}", TNT_TIMEOUT_S="1",
              TNT_LOG_LEVEL="INFO", TNT_LOG_ON_ALL_DEVICES="1")
    # rank 0 is missing: init times out after a second, having read its placement
    assert "TimeoutError" in res.stderr and f"placement from {placement}" in res.stderr, res.stderr


def test_ranks_of_a_bare_mpirun_that_see_several_gpus_are_warned(tmp_path):
    """`mpirun -n 2 python train.py` on a host of 2 GPUs, without tntrun: nothing gives each rank its own
    GPU, and TensorFlow put both on the first without a word. Now rank 0 says so; not where each rank sees
    one (tntrun's placement, or the user's own CUDA_VISIBLE_DEVICES per rank)."""
    listing = tmp_path / "nvidia-smi-L.txt"
    listing.write_text("GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n")
    prog = "import tarantella as tnt\ntnt.init()\ntnt.barrier()\n"

    def start(rank, job, **env):
        return subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=clean_env(
                                    OMPI_COMM_WORLD_RANK=rank, OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_LOCAL_RANK=rank,
                                    OMPI_COMM_WORLD_LOCAL_SIZE=2, TNT_JOB_ID=job, TNT_TIMEOUT_S=60,
                                    TNT_GPU_LISTING=listing, **env))

    bare, shared, own = (f"gpus-{what}-{secrets.token_hex(4)}" for what in ("bare", "shared", "own"))
    procs = {("bare", r): start(r, bare) for r in (0, 1)}
    procs.update({("shared", r): start(r, shared, CUDA_VISIBLE_DEVICES="1,0") for r in (0, 1)})
    procs.update({("own", r): start(r, own, CUDA_VISIBLE_DEVICES=r) for r in (0, 1)})
    errs = {}
    for key, proc in procs.items():
        _, errs[key] = proc.communicate(timeout=120)
        assert proc.returncode == 0, (key, errs[key][-2000:])
    assert ("each of the 2 ranks of this host sees 2 GPUs (CUDA_VISIBLE_DEVICES unset): TensorFlow puts a rank's "
            "work on the first it sees, so they share one unless your program picks one per rank "
            "(tf.config.set_visible_devices). Start the job with tntrun") in errs["bare", 0], errs["bare", 0]
    assert "sees 2 GPUs (CUDA_VISIBLE_DEVICES '1,0')" in errs["shared", 0], errs["shared", 0]
    assert "GPU" not in errs["own", 0] + errs["bare", 1] + errs["shared", 1], errs  # one rank's, once


def test_the_mpi_plugin_is_made_ready_for_ranks_on_several_nodes_of_a_slurm_job():
    # `mpirun` in an sbatch script of 2 nodes starts its daemon on the second node with srun,
    # whose ranks there inherit the daemon's SLURM_NTASKS=1: read first, "one host", and the
    # mpi plugin was not built for them ("libtnt-transport-mpi.so does not exist")
    from tarantella.common import plugins

    daemon = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
              "SLURM_NTASKS_PER_NODE": "1"}
    assert plugins.spans_hosts({**daemon, "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert plugins.spans_hosts({**daemon, "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"})
    assert not plugins.spans_hosts({**daemon, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    # a bare `srun -N 2 -n 2` in `salloc -N 2 --ntasks-per-node=2`: one task per node, though
    # the allocation's SLURM_NTASKS_PER_NODE=2 says 2 (the core counts the step's tasks)
    step = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "1",
            "SLURM_NTASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert plugins.spans_hosts(step)
    assert not plugins.spans_hosts({**step, "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"})

def test_import_is_cheap():
    res = subprocess.run([sys.executable, "-c", "import sys, tarantella; "
                          "print('tensorflow' in sys.modules, 'tarantella._core' in sys.modules)"],
                         env=clean_env(), capture_output=True, text=True)
    assert res.stdout.split() == ["False", "False"], res.stdout + res.stderr


def test_one_settings_table_rules_the_core_python_and_tntrun():
    # the same value is refused by the core at init, by Python's config and by tntrun
    for name, bad in (("TNT_FUSION_THRESHOLD_KB", "-5"), ("TNT_FUSION_THRESHOLD_KB", "1.5"),
                      ("TNT_SHM_SLOTS", "9999"), ("TNT_LOG_LEVEL", "LOUD")):
        res = run("tnt.init()", **{name: bad})
        assert res.returncode != 0 and f"{name}" in res.stderr and f"Received: {name}={bad}" in res.stderr, res.stderr
        res = run(f"from tarantella.common import config; config.get({name!r})", **{name: bad})
        assert res.returncode != 0 and f"Received: {name}={bad}" in res.stderr, res.stderr
    res = subprocess.run(["tntrun", "-n", "2", "--fusion-threshold", "9999999", "--", "never_started.py"],
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "TNT_FUSION_THRESHOLD_KB" in res.stderr and "4194304" in res.stderr, res.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare(1) for a private, tiny /dev/shm")
def test_a_dev_shm_too_small_for_the_job_says_how_to_get_more():
    # a container's /dev/shm (Docker gives 64 MB) may hold fewer ranks than the
    # job has: rank 0 cannot reserve the segment and says why and what to do
    prog = ("import tarantella as tnt\ntry:\n    tnt.init()\n    print('NO ERROR')\n"
            "except tnt.TarantellaError as e:\n    print('MESSAGE:', e)\n")
    shell = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {shlex.quote(sys.executable)} -c {shlex.quote(prog)}"
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                         env=clean_env(TNT_RANK=0, TNT_SIZE=4, TNT_LOCAL_RANK=0, TNT_LOCAL_SIZE=4,
                                       TNT_JOB_ID=secrets.token_hex(16)),
                         capture_output=True, text=True, timeout=60)
    for w in ("MESSAGE:", "cannot reserve", "in /dev/shm for 4 ranks", "--shm-size", "TNT_SHM_SLOTS"):
        assert w in res.stdout, (w, res.stdout + res.stderr)


def test_every_error_about_the_environment_ends_with_what_was_received(tmp_path):
    """The errors about a TNT_* setting end with "Received: NAME=value" (config.get, params.c); some did
    not: the placement's ("bad placement from tntrun: ... unset them to run serially"), a missing
    TNT_JOB_ID, shm for ranks on several hosts, a missing plugin, no mpicc for TNT_TRANSPORT=mpi (which
    also said TNT_TRANSPORT=mpi under auto), an unwritable TNT_TIMELINE."""
    job = dict(TNT_SIZE=2, TNT_JOB_ID="x", TNT_TIMEOUT_S=2)
    cases = [(dict(TNT_RANK=5, TNT_SIZE=2), "Received: TNT_RANK=5, TNT_SIZE=2"),
             (dict(TNT_RANK=0, TNT_SIZE=2), "Received: TNT_SIZE=2, TNT_JOB_ID=(unset)"),
             (dict(TNT_RANK=1, TNT_LOCAL_RANK="5", **job), "Received: TNT_LOCAL_RANK=5, TNT_LOCAL_SIZE=(unset)"),
             (dict(TNT_RANK=0, TNT_LOCAL_SIZE="1", TNT_TRANSPORT="shm", **job),
              "Received: TNT_TRANSPORT=shm, 1 of 2 ranks on this host"),
             (dict(TNT_RANK=0, TNT_TRANSPORT="mpi", TNT_MPI_PLUGIN="/nonexistent/p.so", **job),
              "Received: TNT_MPI_PLUGIN=/nonexistent/p.so"),
             (dict(TNT_RANK=0, TNT_TRANSPORT="mpi", PATH=str(tmp_path), **job), f"Received: TNT_TRANSPORT=mpi, PATH={tmp_path}"),
             (dict(TNT_RANK=0, TNT_LOCAL_SIZE="1", PATH=str(tmp_path), **job),
              f"Received: TNT_TRANSPORT=auto, PATH={tmp_path}"),
             (dict(TNT_TIMELINE=str(tmp_path / "no" / "t.json")), f"Received: TNT_TIMELINE={tmp_path}/no/t.json")]
    said = {}
    for env, ending in cases:
        res = run("""
            try:
                tnt.init()
                print("NO ERROR")
            except tnt.InvalidArgumentError as e:
                print("MESSAGE:", e)
            """, **env)
        assert "MESSAGE:" in res.stdout, (env, res.stdout + res.stderr[-2000:])
        assert res.stdout.strip().endswith(ending), (ending, res.stdout)
        said[ending] = res.stdout
    # no mpicc under auto across hosts: it said "TNT_TRANSPORT=mpi, but no MPI was found"
    assert "TNT_TRANSPORT=auto needs the mpi transport between hosts" in said[f"Received: TNT_TRANSPORT=auto, PATH={tmp_path}"]


def test_a_bad_tnt_rank_is_still_written_to_the_error_file(tmp_path):
    """An uncaught error about TNT_RANK itself (TNT_RANK=abc) left no error file: writing the record read
    TNT_RANK, which raised in turn, and the hook ignores its own failures."""
    path = tmp_path / "error.json"
    res = subprocess.run([sys.executable, "-c", "import tarantella as tnt; tnt.init()"], capture_output=True, text=True,
                         timeout=60, env=clean_env(TNT_RANK="abc", TNT_SIZE=2, TNT_JOB_ID="x", TNT_ERROR_FILE=path))
    assert res.returncode != 0 and "TNT_RANK=abc" in res.stderr, res.stderr[-2000:]
    record = json.loads(path.read_text())
    assert "TNT_RANK=abc" in record["message"] and record["rank"] == "abc", record
