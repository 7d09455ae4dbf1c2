"""Whether the TensorFlow frontend's compiled ops can be used here, and GPUs
(`tntrun --version`, `python -m tarantella.runner.frontend_info`).

The runner never imports TensorFlow (seconds, and a GPU context): the answer
comes from what is on disk, the way a rank would find it. TNT_TF_OPS, the
installed TensorFlow's version and headers, the C++ compiler, and the build
cache: a library built for this TensorFlow version from this release's sources
(the folder's SOURCES_STAMP), or a remembered failed build of them. (A rank also
keys the cache on the compiler and TensorFlow's flags, which only TensorFlow
itself can tell.)
"""
import glob
import importlib.metadata
import importlib.util
import os

from tarantella.common import build_cache, config, errors

_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly",
                  "tf-nightly-cpu")
_HEADER = os.path.join("include", "tensorflow", "core", "framework", "op_kernel.h")


def _tensorflow(environ):
    """(version, package folder), or (None, why)."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None, "TensorFlow is not installed (pip install tensorflow): only the NumPy collectives work"
    for dist in _DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist), list(spec.submodule_search_locations)[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown", list(spec.submodule_search_locations)[0]


def ops_status(environ=None):
    """(available, detail) of the compiled ops, without TensorFlow and without building."""
    environ = os.environ if environ is None else environ
    try:
        mode = config.get("TNT_TF_OPS", environ)  # as a rank reads it: a bad value fails there
    except errors.InvalidArgumentError as exc:
        return False, str(exc)
    if mode == "numpy":
        return False, "not used: TNT_TF_OPS=numpy"
    version, folder = _tensorflow(environ)
    if version is None:
        return False, folder
    def ours(name):
        """The files `name` of this TensorFlow's build folders for these sources, newest last:
        a library an older release built is not the one a rank loads (another digest)."""
        try:
            sources = build_cache.sources_digest(build_cache.tf_ops_sources())
        except (OSError, errors.TarantellaError):
            sources = None
        found = glob.glob(os.path.join(glob.escape(build_cache.cache_root()), f"tfops-tf{glob.escape(version)}-*", name))
        return sorted((p for p in found if build_cache.stamped(os.path.dirname(p), sources)), key=os.path.getmtime)

    built = ours("libtnt-tf-ops.so")
    if built:
        return True, f"built for TensorFlow {version}: {built[-1]}"
    failed = ours(build_cache.FAILED)
    if failed:
        with open(failed[-1]) as f:
            return False, f"the last build failed: {f.read().strip()}"
    if not os.path.isfile(os.path.join(folder, _HEADER)):
        return False, f"TensorFlow {version} has no C++ headers ({os.path.join(folder, _HEADER)} is missing)"
    try:
        cxx = build_cache.find_cxx()
    except errors.TarantellaError as exc:
        return False, str(exc)
    return True, f"built at first use for TensorFlow {version} with {cxx[0]} (about 10-20 s, once)"


def describe(environ=None):
    from tarantella.runner import gpus

    ok, why = ops_status(environ)
    count = len(gpus.detect(environ))
    return "\n".join([
        "TensorFlow frontend (TNT_TF_OPS):",
        f"  compiled ops  {'available' if ok else 'not available (tf.numpy_function is used)'}: {why}",
        f"  GPUs          {count} on this host" + (
            ": the ops have CPU kernels only, so TensorFlow copies GPU gradients to the host and back "
            "(no CUDA kernel in this release; NCCL is loaded and checked, not used yet)" if count else ""),
        f"  CUDA runtime  {cuda_line()}",
        f"  NCCL          {nccl_line()}",
    ])


def cuda_line():
    from tarantella.common import nccl

    found, where = nccl.cuda_runtime()
    return f"found: {where}" if found else f"not found: {where}"


def nccl_line():
    """Whether the core can load NCCL here (it is not used for collectives yet: docs/gpus.md)."""
    try:
        from tarantella.common import nccl

        ok, why = nccl.status()
    except Exception as exc:  # noqa: BLE001 - an info command reports, it does not fail
        return f"not checked ({exc})"
    return "available" if ok else f"not available: {why}"


if __name__ == "__main__":
    print(describe())
