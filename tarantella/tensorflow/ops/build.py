"""Compiles tnt_ops.cc against the TensorFlow installed now, once per user.

`pip install` never sees TensorFlow (its build is isolated), so the ops are
built at first use: with $CXX (else c++ or g++ on PATH) and TensorFlow's own
flags (`tf.sysconfig.get_compile_flags()` / `get_link_flags()`), into the
build cache of tarantella.common.build_cache, in a folder named after the
TensorFlow version, its C++ ABI, a digest of the source, the core's header and
the flags, and a digest of the compiler. A failed build is remembered there, so
the ranks of later runs do not each compile again to fail again. A host
without a compiler loads what another compiler built for the same rest.
"""
import glob
import os
import shutil

import tensorflow as tf

from tarantella.common import build_cache, errors

SOURCE, HEADER = build_cache.tf_ops_sources()  # tnt_ops.cc, the core's tarantella.h
LIBRARY = "libtnt-tf-ops.so"
_HEADER = "tensorflow/core/framework/op_kernel.h"


def compiler():
    """The C++ compiler as an argument list, or raise saying why there is none."""
    return build_cache.find_cxx()


def tf_flags():
    """(compile flags, link flags) of the installed TensorFlow, or raise when its headers are missing."""
    cflags, lflags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
    include = tf.sysconfig.get_include()
    if not os.path.isfile(os.path.join(include, _HEADER)):
        raise errors.SystemError(
            f"TensorFlow {tf.__version__} has no C++ headers ({os.path.join(include, _HEADER)} is missing): "
            "reinstall it from a wheel that ships them (pip install --force-reinstall tensorflow)")
    return cflags, lflags


def _abi(cflags):
    for flag in cflags:
        if flag.startswith("-D_GLIBCXX_USE_CXX11_ABI="):
            return "cxx11abi" + flag.split("=", 1)[1]
    return "cxx11abi-unset"


def command(cxx, cflags, lflags, include, out="{out}"):
    return [*cxx, "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wno-deprecated-declarations",
            "-I", include, SOURCE, "-o", out, *cflags, *lflags, "-ldl", "-pthread"]


def _base():
    """(folder name without the compiler's part, compile command without the
    compiler): what the library depends on but the compiler."""
    cflags, lflags = tf_flags()
    include = os.path.dirname(HEADER)
    args = command([], cflags, lflags, include)
    parts = [open(SOURCE, "rb").read(), open(HEADER, "rb").read(), *args]
    return f"tfops-tf{tf.__version__}-{_abi(cflags)}-{build_cache.digest(*parts)}", args


def plan():
    """(folder, compile command) for the TensorFlow and compiler found now; raises
    a TarantellaError saying why when the ops cannot be built here."""
    base, args = _base()
    cxx = compiler()
    name = f"{base}-{build_cache.digest(os.path.realpath(shutil.which(cxx[0])), *cxx[1:])}"
    return os.path.join(build_cache.cache_root(), name), [*cxx, *args]


def built_by_any_compiler():
    """A library built from this source for this TensorFlow, by whichever
    compiler (the newest), or None: a host without a compiler (an HPC compute
    node) uses what a login node sharing the home built."""
    found = glob.glob(os.path.join(glob.escape(build_cache.cache_root()), glob.escape(_base()[0]) + "-*", LIBRARY))
    return max(found, key=os.path.getmtime) if found else None


def cached():
    """The path of an already built library for this TensorFlow, or None (never builds)."""
    try:
        folder, _ = plan()
    except errors.TarantellaError:  # no compiler here: one built elsewhere is used
        return built_by_any_compiler()
    path = os.path.join(folder, LIBRARY)
    return path if os.path.isfile(path) else None


def library():
    """The path of the ops' library, built if needed; raises a TarantellaError
    that says why when there can be none."""
    try:
        folder, cmd = plan()
    except errors.TarantellaError:
        path = built_by_any_compiler()
        if path is None:
            raise
        build_cache.private_dir(os.path.dirname(path), "Tarantella's TensorFlow ops", "TNT_TF_OPS=numpy")
        build_cache.check_owned(path)
        build_cache.stamp_sources(os.path.dirname(path), build_cache.sources_digest((SOURCE, HEADER)))
        return path
    build_cache.private_dir(folder, "Tarantella's TensorFlow ops", "TNT_TF_OPS=numpy")
    # the folder's name holds the sources' digest: say it in the folder too, for tntrun --version
    build_cache.stamp_sources(folder, build_cache.sources_digest((SOURCE, HEADER)))
    path = build_cache.build_once(folder, LIBRARY, cmd, f"building Tarantella's TensorFlow ops with {cmd[0]} failed",
                                  log_note=f"TensorFlow {tf.__version__}", remember_failure=True)
    build_cache.check_owned(path)
    return path
