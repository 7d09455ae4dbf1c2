"""The core's answer to "which transports can this machine use, and why not the others"
(tnt_transport_status, for `tntrun --version`): shm always; mpi when its plugin loads or,
not built yet, when an MPI compiler wrapper is found to build it; NULL for a name the core
does not know (the runner then searches the machine). Needs no tnt_init."""
import os
import subprocess
import sys

from core_helpers import clean_env

QUERY = ("from tarantella.common import core\n"
         "lib, ffi = core.lib(), core.ffi()\n"
         "for name in (b'shm', b'mpi', b'gpi2', b'nonsense'):\n"
         "    r = lib.tnt_transport_status(name)\n"
         "    print(name.decode(), '=', 'NULL' if r == ffi.NULL else repr(ffi.string(r).decode()))\n")


def status(**env):
    res = subprocess.run([sys.executable, "-c", QUERY], env=clean_env(**env), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return dict(line.split(" = ", 1) for line in res.stdout.splitlines())


def test_mpi_is_available_where_an_mpi_compiler_is_found(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mpicc").write_text("#!/bin/sh\nexit 0\n")
    (fake / "mpicc").chmod(0o755)
    got = status(PATH=str(fake))
    assert got == {"shm": "''", "mpi": "''", "gpi2": "NULL", "nonsense": "NULL"}


def test_without_an_mpi_it_says_what_to_install(tmp_path):
    got = status(PATH=str(tmp_path))
    assert "no MPI found" in got["mpi"] and "apt-get install openmpi-bin libopenmpi-dev" in got["mpi"]
    got = status(PATH=str(tmp_path), TNT_MPICC=str(tmp_path / "my-mpicc --showme"))
    assert f"the MPI compiler wrapper {tmp_path / 'my-mpicc'} (TNT_MPICC or MPICC) was not found" in got["mpi"]


def test_a_plugin_that_cannot_be_loaded_is_named(tmp_path):
    broken = tmp_path / "libtnt-transport-mpi.so"
    broken.write_bytes(b"not a library")
    got = status(PATH=os.environ.get("PATH", ""), TNT_MPI_PLUGIN=str(broken))
    assert str(broken) in got["mpi"], got
