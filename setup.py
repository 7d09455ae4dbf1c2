"""Builds the C core (core/) into the cffi extension tarantella._core (API mode).

The package `tarantella.runner` lives in the top-level folder runner/.
"""
from setuptools import setup

setup(
    packages=[
        "tarantella",
        "tarantella.common",
        "tarantella.tensorflow",
        "tarantella.tensorflow.keras",
        "tarantella.tensorflow.keras.callbacks",
        "tarantella.runner",
    ],
    package_dir={"tarantella.runner": "runner"},
    include_package_data=True,
    package_data={"tarantella": ["include/*.h"]},
    cffi_modules=["tarantella/common/_build_core.py:ffibuilder"],
    zip_safe=False,
)
