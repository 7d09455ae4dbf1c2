"""The C core's enums, read from the compiled extension.

core/include/tarantella.h is the one copy of the C/Python contract: result
codes, reduce ops and dtype codes come from the cffi lib, never from literals.
"""
import functools


@functools.lru_cache(maxsize=None)
def _lib():
    try:
        from tarantella._core import lib
    except ImportError as exc:  # pragma: no cover - only on a broken install
        raise ImportError(
            "the compiled core tarantella._core is missing: reinstall with `pip install .` from the "
            f"source tree ({exc})") from exc
    return lib


_ENUMS = {
    "SUCCESS": "TNT_SUCCESS",
    "ERR_INVALID_ARGUMENT": "TNT_ERR_INVALID_ARGUMENT",
    "ERR_INVALID_USAGE": "TNT_ERR_INVALID_USAGE",
    "ERR_MISMATCH": "TNT_ERR_MISMATCH",
    "ERR_PEER_LOST": "TNT_ERR_PEER_LOST",
    "ERR_TIMEOUT": "TNT_ERR_TIMEOUT",
    "ERR_SYSTEM": "TNT_ERR_SYSTEM",
    "ERR_INTERNAL": "TNT_ERR_INTERNAL",
    "IN_PROGRESS": "TNT_IN_PROGRESS",
}
_OPS = {"sum": "TNT_SUM", "average": "TNT_AVERAGE"}
_DTYPES = {"float16": "TNT_FLOAT16", "bfloat16": "TNT_BFLOAT16", "float32": "TNT_FLOAT32",
           "float64": "TNT_FLOAT64", "int32": "TNT_INT32", "int64": "TNT_INT64"}


def __getattr__(name):
    # PEP 562: `import tarantella` must not load the extension; the first use does
    if name in _ENUMS:
        value = getattr(_lib(), _ENUMS[name])
    elif name == "OPS":
        value = {k: getattr(_lib(), v) for k, v in _OPS.items()}
    elif name == "DTYPES":
        value = {k: getattr(_lib(), v) for k, v in _DTYPES.items()}
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
