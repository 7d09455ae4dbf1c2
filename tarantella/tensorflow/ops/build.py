"""Compiles tnt_ops.cc against the TensorFlow installed now, once per user.

`pip install` never sees TensorFlow (its build is isolated), so the ops are
built at first use: with $CXX (else c++ or g++ on PATH) and TensorFlow's own
flags (`tf.sysconfig.get_compile_flags()` / `get_link_flags()`), into the
build cache of tarantella.common.build_cache, in a folder named after the
TensorFlow version, its C++ ABI and a digest of the source, the core's header,
the compiler and the flags. A failed build is remembered there, so the ranks
of later runs do not each compile again to fail again.
"""
import os
import shutil

import tensorflow as tf

from tarantella.common import build_cache, errors, plugins

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "tnt_ops.cc")
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


def plan():
    """(folder, compile command) for the TensorFlow and compiler found now; raises
    a TarantellaError saying why when the ops cannot be built here."""
    cxx = compiler()
    cflags, lflags = tf_flags()
    include = os.path.join(plugins.source_dir(), "include")
    cmd = command(cxx, cflags, lflags, include)
    parts = [open(SOURCE, "rb").read(), open(os.path.join(include, "tarantella.h"), "rb").read(),
             os.path.realpath(shutil.which(cxx[0])), *cmd]
    name = f"tfops-tf{tf.__version__}-{_abi(cflags)}-{build_cache.digest(*parts)}"
    return os.path.join(build_cache.cache_root(), name), cmd


def cached():
    """The path of an already built library for this TensorFlow, or None (never builds)."""
    folder, _ = plan()
    path = os.path.join(folder, LIBRARY)
    return path if os.path.isfile(path) else None


def library():
    """The path of the ops' library, built if needed; raises a TarantellaError
    that says why when there can be none."""
    folder, cmd = plan()
    build_cache.private_dir(folder, "Tarantella's TensorFlow ops", "TNT_TF_OPS=numpy")
    path = build_cache.build_once(folder, LIBRARY, cmd, f"building Tarantella's TensorFlow ops with {cmd[0]} failed",
                                  log_note=f"TensorFlow {tf.__version__}", remember_failure=True)
    build_cache.check_owned(path)
    return path
