"""Builds the C core (core/) into the cffi extension tarantella._core (API mode),
and tnt.allreduce's fast path into tarantella._fastpath.

The package `tarantella.runner` lives in the top-level folder runner/.
"""
import ast
import os
import shutil

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def plugin_sources():
    """The files of core/ that the transport plugins are compiled from at first
    use, against the MPI found then: SOURCES in tarantella/common/plugins.py."""
    with open(os.path.join(HERE, "tarantella", "common", "plugins.py")) as f:
        for node in ast.parse(f.read()).body:
            if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["SOURCES"]:
                return ast.literal_eval(node.value)
    raise RuntimeError("SOURCES not found in tarantella/common/plugins.py")


class BuildPyWithPluginSources(build_py):
    """Ships the plugin sources as tarantella/_plugin_src/ (an editable install
    reads them from core/ instead)."""

    def run(self):
        super().run()
        for rel in plugin_sources():
            dst = os.path.join(self.build_lib, "tarantella", "_plugin_src", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(HERE, "core", rel), dst)


# tarantella/ and its sub-packages, plus runner/ (and its sub-packages) as tarantella.runner
PACKAGES = find_packages(include=["tarantella", "tarantella.*"]) + [
    "tarantella.runner" + p[len("runner"):] for p in find_packages(include=["runner", "runner.*"])
]

setup(
    packages=PACKAGES,
    package_dir={"tarantella.runner": "runner"},
    include_package_data=True,
    # tensorflow/ops/*.cc: the TensorFlow ops, compiled at first use (tarantella/tensorflow/ops/build.py)
    package_data={"tarantella": ["include/*.h", "tensorflow/ops/*.cc"]},
    cffi_modules=["tarantella/common/_build_core.py:ffibuilder"],
    # tnt.allreduce's common call in C (tarantella/common/_fastpath.c): it takes
    # Python objects, which a cffi function cannot
    ext_modules=[Extension("tarantella._fastpath", ["tarantella/common/_fastpath.c"], include_dirs=["core/include"],
                           # its own -std, as the core's (_build_core.py): these come after CFLAGS
                           extra_compile_args=["-std=gnu11", "-O2", "-Wall"])],
    cmdclass={"build_py": BuildPyWithPluginSources},
    zip_safe=False,
)
