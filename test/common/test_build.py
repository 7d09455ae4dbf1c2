"""The C extensions' build (setup.py), as pip runs it on a user's machine:
from the source distribution, which `python -m build` and an install from an
sdist build from."""
import os
import re
import subprocess
import sys
import tarfile

from tarantella.common import plugins

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, cwd, **env):
    result = subprocess.run([sys.executable, "setup.py", "-q", *map(str, args)], cwd=cwd,
                            env=dict(os.environ, **env), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_the_sdist_builds_also_under_an_old_c_standard_in_cflags(tmp_path):
    """The sdist holds every file the build reads (the core's headers, the
    transport plugins' sources shipped as tarantella/_plugin_src), and CFLAGS,
    which comes before each extension's own flags, cannot give code written
    for C11 an old -std (a site's environment, gcc's gnu89 of old): every
    extension names its standard."""
    _run(["sdist", "-d", tmp_path / "dist"], REPO)
    [sdist] = os.listdir(tmp_path / "dist")
    with tarfile.open(tmp_path / "dist" / sdist) as tar:
        tar.extractall(tmp_path / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    src = tmp_path / "src" / sdist[:-len(".tar.gz")]
    _run(["build", "-j", "2", "-b", tmp_path / "build"], src, CFLAGS="-std=gnu89")
    lib = next((tmp_path / "build").glob("lib*"))
    shipped = {os.path.relpath(os.path.join(d, f), lib / "tarantella" / "_plugin_src")
               for d, _, files in os.walk(lib / "tarantella" / "_plugin_src") for f in files}
    assert set(plugins.SOURCES) <= shipped, set(plugins.SOURCES) - shipped
    assert list(lib.glob("tarantella/_core*.so")) and list(lib.glob("tarantella/_fastpath*.so"))


def test_every_file_a_plugin_includes_is_shipped_and_digested():
    """A transport plugin is compiled at first use from the files plugins.SOURCES
    names (what an installed package ships as tarantella/_plugin_src), into a
    cache folder named by a digest of its source and plugins.HEADERS: a file
    that a plugin includes, directly or through another, and that either list
    lacks would be missing from an install, or changed without a rebuild."""
    core = os.path.join(REPO, "core")
    roots = (plugins._MPI_SOURCE, plugins._GPI2_SOURCE)
    seen, todo = set(), list(roots)
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        with open(os.path.join(core, rel)) as f:
            names = re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M)
        for name in names:  # as the compiler looks: beside the file, then -I include, -I src
            found = [c for c in (os.path.normpath(os.path.join(base, name)) for base in (os.path.dirname(rel),
                                                                                          "include", "src"))
                     if os.path.isfile(os.path.join(core, c))]
            assert found, f"{rel} includes {name}, which is in none of the folders the plugins are compiled with"
            todo.append(found[0])
    assert seen <= set(plugins.SOURCES), seen - set(plugins.SOURCES)
    assert seen - set(roots) <= set(plugins.HEADERS), seen - set(roots) - set(plugins.HEADERS)
