"""cffi builder (API mode): compiles the C files of core/src into tarantella._core
(all but the transport plugins of core/src/transport/plugins/).

The cdef is the block of core/include/tarantella.h between TNT_CDEF_BEGIN and
TNT_CDEF_END, so the header stays the single description of the C API.
"""
import glob
import os

import cffi

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_CORE = os.path.join(_ROOT, "core")
_HEADER = os.path.join(_CORE, "include", "tarantella.h")


def _cdef_from_header(path):
    with open(path) as f:
        text = f.read()
    begin = text.index("/* TNT_CDEF_BEGIN */") + len("/* TNT_CDEF_BEGIN */")
    end = text.index("/* TNT_CDEF_END */")
    return text[begin:end]


def _core_sources():
    # transports under src/transport/plugins/ are separate libraries, built
    # against their engine (tarantella/common/plugins.py), never into the core
    plugins = os.path.join(_CORE, "src", "transport", "plugins") + os.sep
    sources = sorted(s for s in glob.glob(os.path.join(_CORE, "src", "**", "*.c"), recursive=True)
                     if not s.startswith(plugins))
    # setuptools wants paths relative to setup.py
    return [os.path.relpath(s, _ROOT) for s in sources]


ffibuilder = cffi.FFI()
ffibuilder.cdef(_cdef_from_header(_HEADER))
ffibuilder.set_source(
    "tarantella._core",
    '#include "tarantella.h"',
    sources=_core_sources(),
    include_dirs=[os.path.relpath(os.path.join(_CORE, "include"), _ROOT),
                  os.path.relpath(os.path.join(_CORE, "src"), _ROOT)],
    extra_compile_args=["-std=gnu11", "-O3", "-ffp-contract=off", "-Wall", "-fvisibility=default"],  # no FMA contraction: the same roundings on every build
    libraries=["rt", "pthread", "m", "dl"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
