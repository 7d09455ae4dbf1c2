"""The C extensions' build (setup.py), as pip runs it on a user's machine."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_extensions_build_under_an_old_c_standard_in_cflags(tmp_path):
    """CFLAGS comes before each extension's own flags: an old -std there (a
    site's environment, gcc's gnu89 of old) must not reach code written for
    C11, so every extension names its standard."""
    env = dict(os.environ, CFLAGS="-std=gnu89")
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "-j", "2", "-b", tmp_path / "lib",
                             "-t", tmp_path / "tmp"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
