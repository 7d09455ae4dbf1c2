"""The C core on its own: builds core/ with its Makefile (as a user without
Python would) and runs the C test programs, the multi-rank one also under
valgrind where it is installed (leaks, invalid accesses, uninitialized reads
in the engine, the negotiation and the shm transport)."""
import os
import shutil
import subprocess

import pytest

from core_helpers import clean_env

CORE = os.path.join(os.path.dirname(__file__), "..", "..", "core")
pytestmark = pytest.mark.skipif(not shutil.which("make") or not shutil.which("cc"),
                                reason="needs make and a C compiler")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("core-build")
    res = subprocess.run(["make", "-C", CORE, f"BUILD={out}", f"{out}/test_core", f"{out}/test_ranks",
                          f"{out}/libtarantella.so"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def run(cmd):
    res = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def test_c_core_program(build):
    assert run([str(build / "test_core")]).stdout.strip().endswith("0 failed")


@pytest.mark.parametrize("n", [2, 3])
def test_c_ranks_program(build, n):
    assert run([str(build / "test_ranks"), str(n)]).stdout.strip() == f"{n} passed, 0 failed"


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind is not installed")
def test_c_ranks_program_under_valgrind(build):
    res = run(["valgrind", "-q", "--leak-check=full", "--errors-for-leak-kinds=definite",
               "--error-exitcode=3", "--trace-children=yes", str(build / "test_ranks"), "2"])
    assert res.stdout.strip() == "2 passed, 0 failed"
    assert "==" not in res.stderr, res.stderr  # valgrind -q prints nothing unless it found something
