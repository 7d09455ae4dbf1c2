"""The documentation site, built once per test session (helpers live in
doc_blocks.py, a unique module name, beside other suites' conftest.py files)."""
import os
import subprocess
import sys

import pytest

from doc_blocks import DOCS


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The folder of the built HTML site: `sphinx-build -W` (warnings are
    errors), as the README says, into a temporary folder."""
    for module, package in (("sphinx", "sphinx"), ("myst_parser", "myst-parser"),
                            ("sphinxarg", "sphinx-argparse")):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"{package} is not installed: pip install -e \".[docs]\"")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), DOCS, str(out / "html")],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, \
        f"sphinx-build failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return out / "html"
