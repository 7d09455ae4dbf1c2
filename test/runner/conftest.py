"""Fixtures of the runner tests (helpers live in tntrun_helpers.py, a unique module name,
so that this suite sits beside other suites' conftest.py files)."""
import pytest

from tntrun_helpers import make_script_factory


@pytest.fixture
def script(tmp_path):
    """script(body) -> path of a Python file that the ranks run (plain Python: no core)."""
    return make_script_factory(tmp_path)
