"""NumPy dtype <-> core dtype. bfloat16 comes from ml_dtypes when it is installed
(TensorFlow depends on it); everything else is plain NumPy."""
import numpy as np

from tarantella.common import codes
from tarantella.common.errors import InvalidArgumentError

SUPPORTED = ("float16", "bfloat16", "float32", "float64", "int32", "int64")


def core_dtype(dtype):
    """The tnt_dtype_t code for a NumPy dtype, or InvalidArgumentError."""
    dtype = np.dtype(dtype)
    name = dtype.name
    if not dtype.isnative:  # '>f4' is named float32 too: the core would read its bytes as another number
        raise InvalidArgumentError(
            f"the core reduces numbers in this machine's byte order; this array's dtype {dtype.str} is "
            f"byte-swapped. Convert it with array.astype(array.dtype.newbyteorder('=')). Received: dtype={dtype.str}")
    try:
        return codes.DTYPES[name]
    except KeyError:
        raise InvalidArgumentError(
            f"dtype {name} is not supported by Tarantella collectives; use one of "
            f"{', '.join(SUPPORTED)} (cast with array.astype(...)). Received: dtype={name}"
        ) from None
