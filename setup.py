"""Builds the C core (core/) into the cffi extension tarantella._core (API mode).

The package `tarantella.runner` lives in the top-level folder runner/.
"""
from setuptools import find_packages, setup

# tarantella/ and its sub-packages, plus runner/ (and its sub-packages) as tarantella.runner
PACKAGES = find_packages(include=["tarantella", "tarantella.*"]) + [
    "tarantella.runner" + p[len("runner"):] for p in find_packages(include=["runner", "runner.*"])
]

setup(
    packages=PACKAGES,
    package_dir={"tarantella.runner": "runner"},
    include_package_data=True,
    package_data={"tarantella": ["include/*.h"]},
    cffi_modules=["tarantella/common/_build_core.py:ffibuilder"],
    zip_safe=False,
)
