"""`tntrun --version`'s TensorFlow lines: whether the compiled ops are built,
would be built at first use, or why not (runner/frontend_info.py, which never
imports TensorFlow)."""
import importlib.util
import os
import shutil
import subprocess

import pytest

from tarantella.runner import frontend_info
from tntrun_helpers import run_tntrun

needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TNT_TF_OPS", raising=False)
    return tmp_path / "tarantella" / "plugins"


def _folder(cache, name="tfops-tf{v}-cxx11abi1-0123456789ab", sources="these"):
    """A build folder of this TensorFlow, stamped as built from this release's sources
    (sources="these"), from other sources (a digest), or not stamped (None)."""
    version = frontend_info._tensorflow(os.environ)[0]
    folder = cache / name.format(v=version)
    folder.mkdir(parents=True)
    if sources == "these":
        sources = frontend_info.build_cache.sources_digest(frontend_info.build_cache.tf_ops_sources())
    if sources is not None:
        (folder / frontend_info.build_cache.SOURCES_STAMP).write_text(sources + "\n")
    return folder


def test_numpy_mode_says_so(cache):
    assert frontend_info.ops_status({"TNT_TF_OPS": "numpy"}) == (False, "not used: TNT_TF_OPS=numpy")



def test_a_bad_mode_is_reported_as_the_ranks_would_fail(cache):
    """A rank refuses TNT_TF_OPS=fast (and an empty value) at its first
    tf.function with a collective: --version says so instead of 'available'."""
    for value in ("fast", ""):
        ok, why = frontend_info.ops_status({"TNT_TF_OPS": value})
        assert not ok and "TNT_TF_OPS must be auto | compiled | numpy" in why, why
    assert frontend_info.ops_status({"TNT_TF_OPS": " NumPy "}) == (False, "not used: TNT_TF_OPS=numpy")

@needs_tf
def test_a_built_library_for_this_tensorflow_is_reported(cache):
    lib = _folder(cache) / "libtnt-tf-ops.so"
    lib.write_bytes(b"")
    ok, why = frontend_info.ops_status({})
    assert ok and why.endswith(str(lib))


@needs_tf
def test_a_library_of_other_sources_is_not_reported_as_built(cache, monkeypatch):
    # a library an older release built for this TensorFlow (another digest in its folder's
    # name) is not the one a rank loads: it builds its own at first use. --version said
    # "built" for any library of this TensorFlow version
    monkeypatch.setenv("CXX", "g++")
    if not frontend_info.build_cache.shutil.which("g++"):
        pytest.skip("no g++")
    for name, sources in (("tfops-tf{v}-cxx11abi1-aaaaaaaaaaaa", "0123456789ab"),
                          ("tfops-tf{v}-cxx11abi1-bbbbbbbbbbbb", None)):
        (_folder(cache, name, sources) / "libtnt-tf-ops.so").write_bytes(b"")
    (_folder(cache, "tfops-tf{v}-cxx11abi1-cccccccccccc", "0123456789ab") / "build.failed").write_text("old failure")
    ok, why = frontend_info.ops_status({})
    assert ok and why.startswith("built at first use for TensorFlow "), why
    lib = _folder(cache) / "libtnt-tf-ops.so"
    lib.write_bytes(b"")
    assert frontend_info.ops_status({}) == (True, f"built for TensorFlow {frontend_info._tensorflow(os.environ)[0]}: {lib}")


@needs_tf
def test_a_remembered_failure_is_reported(cache):
    failure = "building Tarantella's TensorFlow ops with g++ failed (exit status 1)"
    (_folder(cache) / "build.failed").write_text(failure)
    ok, why = frontend_info.ops_status({})
    assert not ok and why == f"the last build failed: {failure}"


@needs_tf
def test_no_compiler_is_reported(cache, tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    ok, why = frontend_info.ops_status({})
    assert not ok and why.startswith("no C++ compiler found")


@needs_tf
def test_otherwise_built_at_first_use(cache, monkeypatch):
    monkeypatch.setenv("CXX", "g++")
    if not frontend_info.build_cache.shutil.which("g++"):
        pytest.skip("no g++")
    ok, why = frontend_info.ops_status({})
    assert ok and why.startswith("built at first use for TensorFlow ") and " with g++ " in why


def test_version_ends_with_the_frontend(cache):
    res = run_tntrun(["--version"], env={**os.environ, "TNT_TF_OPS": "numpy"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[-5] == "TensorFlow frontend (TNT_TF_OPS):"
    assert lines[-4] == "  compiled ops  not available (tf.numpy_function is used): not used: TNT_TF_OPS=numpy"
    assert lines[-3].startswith("  GPUs          ")
    assert lines[-2].startswith("  CUDA runtime  found: ") or lines[-2].startswith("  CUDA runtime  not found: ")
    assert lines[-1].startswith("  NCCL          ")
    # the runtime TNT_CUDART_LIBRARY names is the only one the core tries: a wrong path is said, not the wheel's
    res = run_tntrun(["--version"], env={**os.environ, "TNT_TF_OPS": "numpy",
                                         "TNT_CUDART_LIBRARY": "/nonexistent/libcudart.so.12"})
    assert "  CUDA runtime  not found: TNT_CUDART_LIBRARY=/nonexistent/libcudart.so.12 does not exist" in res.stdout


CORE = os.path.join(os.path.dirname(__file__), "..", "..", "core")


def test_nccl_line_says_why_not_or_available(tmp_path):
    """Each answer in its own process: the core loads NCCL once per process."""
    missing = run_tntrun(["--version"], env={**os.environ, "TNT_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"})
    assert missing.returncode == 0, missing.stderr
    assert ("  NCCL          not available: NCCL cannot be loaded from /nonexistent/libnccl.so.2"
            in missing.stdout), missing.stdout
    assert "pip install nvidia-nccl-cu12" in missing.stdout
    cc = shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler to build the stand-in NCCL")
    standin = tmp_path / "libnccl.so.2"
    subprocess.run(
        [cc, "-shared", "-fPIC", os.path.join(CORE, "test", "nccl_standin.c"), "-o", str(standin)], check=True)
    found = run_tntrun(["--version"], env={**os.environ, "TNT_NCCL_LIBRARY": str(standin)})
    assert "  NCCL          available" in found.stdout, found.stdout
