"""NumPy dtype <-> core dtype. bfloat16 comes from ml_dtypes when it is installed
(TensorFlow depends on it); everything else is plain NumPy."""
import numpy as np

from tarantella.common.errors import InvalidArgumentError

# values of tnt_dtype_t in core/include/tarantella.h
_CORE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3, "int32": 4, "int64": 5}
SUPPORTED = tuple(_CORE_CODES)


def core_dtype(dtype):
    """The tnt_dtype_t code for a NumPy dtype, or InvalidArgumentError."""
    name = np.dtype(dtype).name
    try:
        return _CORE_CODES[name]
    except KeyError:
        raise InvalidArgumentError(
            f"dtype {name} is not supported by Tarantella collectives; use one of "
            f"{', '.join(SUPPORTED)} (cast with array.astype(...)). Received: dtype={name}"
        ) from None
