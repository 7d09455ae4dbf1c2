"""`tntrun --version` lists the transports this machine can use and why not the others:
the core's own answer first, else what the machine has."""
import os

from tntrun_helpers import fake_bin, import_runner, run_tntrun, runner_env

import_runner()
from tarantella.runner import transports  # noqa: E402


class CoreWith:
    """A stand-in for the core's lib: tnt_transport_status(name) as the core would answer."""

    def __init__(self, answers):
        self.answers = answers

    def tnt_transport_status(self, name):
        return self.answers.get(name.decode())


def _by_name(rows):
    return {name: (ok, detail) for name, ok, detail in rows}


def test_the_core_answers_first():
    core = CoreWith({"shm": b"", "mpi": b"", "gpi2": b"libGPI2.so not found on LD_LIBRARY_PATH"})
    rows = _by_name(transports.status(environ={"PATH": ""}, lib=core))
    assert rows["shm"][0] and rows["mpi"][0] and rows["mpi"][1].startswith(transports.MPI)
    assert rows["gpi2"] == (False, "libGPI2.so not found on LD_LIBRARY_PATH")


def test_a_core_without_the_query_gets_the_machine_searched(tmp_path):
    home = tmp_path / "gpi2"
    (home / "lib64").mkdir(parents=True)
    (home / "lib64" / "libGPI2.so").write_bytes(b"")
    path = fake_bin(tmp_path, mpirun='echo "mpirun (Open MPI) 9.9.9"')
    rows = _by_name(transports.status(environ={"PATH": path, "GPI2_HOME": str(home)},
                                      lib=object()))
    assert rows["shm"] == (True, transports.SHM)
    ok, detail = rows["mpi"]  # a launcher but no mpicc: the plugin cannot be built
    assert not ok and "no mpicc" in detail and "mpirun (Open MPI) 9.9.9" in detail
    ok, detail = rows["gpi2"]  # GPI-2 but no C compiler on this PATH
    assert not ok and "no C compiler" in detail and str(home / "lib64") in detail
    path = fake_bin(tmp_path, mpicc="true", cc="true")
    rows = _by_name(transports.status(environ={"PATH": path, "GPI2_HOME": str(home)}, lib=object()))
    assert rows["mpi"][0] and "plugin built at first use with" in rows["mpi"][1]
    assert rows["gpi2"][0] and str(home / "lib64" / "libGPI2.so") in rows["gpi2"][1]
    # a core that does not know a transport (NULL) leaves it to the search as well
    rows = _by_name(transports.status(environ={"PATH": path}, lib=CoreWith({"shm": b""})))
    assert rows["gpi2"] == (False, f"GPI-2 not found: {transports.INSTALL_GPI2}")


def test_gpi2_home_without_the_library(tmp_path):
    rows = _by_name(transports.status(environ={"PATH": "", "GPI2_HOME": str(tmp_path)},
                                      lib=object()))
    assert rows["gpi2"][1].startswith(f"GPI2_HOME={tmp_path} holds no lib64/libGPI2.so")


def test_version_lists_transports(tmp_path):
    res = run_tntrun(["--version"])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Tarantella ")
    assert lines[2].startswith("  shm   available: ")
    assert lines[3].startswith("  mpi   ") and lines[4].startswith("  gpi2  ")
    assert run_tntrun(["--check-build"]).stdout == res.stdout


def test_an_unavailable_transport_is_a_warning(tmp_path, script):
    env = runner_env(PATH=str(tmp_path / "empty") + os.pathsep + "/usr/bin:/bin")
    env.pop("GPI2_HOME", None)  # a developer's GPI-2 (the gpi2 tests use it) would make it available
    res = run_tntrun(["-n", "1", "--transport", "gpi2", "--", script("print(os.environ['TNT_TRANSPORT'])")],
                     env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "gpi2\n"
    assert "WARNING: --transport gpi2 is not available on this host: GPI-2 not found" in res.stderr
