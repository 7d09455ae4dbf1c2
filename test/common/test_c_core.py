"""The C core on its own: builds core/ with its Makefile (as a user without
Python would) and runs the C test program."""
import os
import shutil
import subprocess

import pytest

from core_helpers import clean_env

CORE = os.path.join(os.path.dirname(__file__), "..", "..", "core")


@pytest.mark.skipif(not shutil.which("make") or not shutil.which("cc"), reason="needs make and a C compiler")
def test_c_core_program(tmp_path):
    build = subprocess.run(["make", "-C", CORE, f"BUILD={tmp_path}", f"{tmp_path}/test_core",
                            f"{tmp_path}/libtarantella.so"], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run([str(tmp_path / "test_core")], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith("0 failed")
