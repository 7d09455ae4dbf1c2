"""Keras serial equivalence across hosts: test/tensorflow/scenarios.py (every training
scenario of test_serial_equivalence.py) on 2 hosts x 2 ranks of the test bed, through
tntrun -H with TNT_TRANSPORT=auto (shm within each host, mpi between them, the hierarchical
allreduce), ends where serial Keras ends, with bitwise the same results on every rank. One
launch: TensorFlow takes seconds per process to start."""
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TF_TESTS = os.path.join(HERE, "..", "tensorflow")
sys.path.insert(0, TF_TESTS)

pytest.importorskip("tensorflow", reason="needs TensorFlow (the Keras frontend)")

import test_serial_equivalence as serial  # noqa: E402
from multihost_helpers import nothing_left  # noqa: E402
from tf_helpers import clean_env, serial_reference  # noqa: E402


def _openmpi():
    mpirun = shutil.which("mpirun")
    if not (mpirun and shutil.which("mpicc")):
        return False
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    return "Open MPI" in out.stdout + out.stderr


@pytest.mark.skipif(not _openmpi(), reason="needs Open MPI (mpirun, mpicc): the transport between hosts is mpi")
def test_keras_across_two_hosts_of_two_ranks_is_serial_keras(multihost, tmp_path_factory):
    ref = serial_reference(tmp_path_factory)  # test_serial_equivalence.py's, when it ran first
    out = tmp_path_factory.mktemp("multihost")
    env = clean_env(TNT_LOG_LEVEL="INFO")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:2,hostB:2", "--no-gpu", "--", sys.executable,
                                  os.path.join(TF_TESTS, "scenarios.py"), "--out", str(out)],
                        env=multihost.env(base=env), cwd=str(out), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "allreduce: hierarchical, 2 hosts x 2 ranks" in res.stderr, res.stderr[-3000:]
    serial.assert_same_as_serial(serial._load(ref), serial._load(str(out)), 4)
    assert nothing_left(multihost, multihost.hosts)


@pytest.mark.skipif(not _openmpi(), reason="needs Open MPI (mpirun, mpicc): the transport between hosts is mpi")
def test_checkpoint_saves_of_every_rank_of_two_hosts_into_one_shared_folder_take_turns(multihost, tmp_path):
    # a custom loop's tf.train.Checkpoint saves on every rank, as a serial script makes them, into a
    # folder both hosts share. The ranks of a host took turns (a lock in the host's /tmp), but ranks
    # of two hosts wrote at once: TensorFlow's merge of <prefix>_temp found it gone or half-made
    # ("MergeV2Checkpoints ... did not exist"; each of two runs of 8 saves failed so). A job of
    # several hosts now also locks a file in the folder itself (checkpoint_writes.py)
    folder = tmp_path / "shared" / "run"  # not there yet: the first saves make it
    env = clean_env()
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    res = multihost.run("hostA", ["tntrun", "-H", "hostA:2,hostB:2", "--no-gpu", "--output-on-all-devices", "--",
                                  sys.executable, os.path.join(HERE, "rank_checkpoints.py"), str(folder), "12"],
                        env=multihost.env(base=env), cwd=str(tmp_path), timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    said = [json.loads(line.split("CHECKPOINTS ", 1)[1]) for line in res.stdout.splitlines() if "CHECKPOINTS " in line]
    assert sorted(s["rank"] for s in said) == [0, 1, 2, 3], res.stdout[-3000:]
    assert all(not s["failed"] for s in said), said
    # what serial saves leave: the manager's last two, its state file, the fixed prefix, and the lock
    assert sorted(os.listdir(folder)) == [".tnt-checkpoint.lock", "checkpoint", "ckpt-11.data-00000-of-00001",
                                          "ckpt-11.index", "ckpt-12.data-00000-of-00001", "ckpt-12.index",
                                          "fixed.data-00000-of-00001", "fixed.index"]
