"""Where NCCL is and whether the core can use it (the core loads it at run time:
core/src/gpu/nccl.c), and where the CUDA runtime beside it is. `tensorflow[and-cuda]`
installs both as NVIDIA wheels (nvidia/nccl/lib/libnccl.so.2,
nvidia/cuda_runtime/lib/libcudart.so.12), which are not on the library path: the
core is pointed at NCCL through TNT_NCCL_LIBRARY unless the user set it."""
import importlib.util
import os


def _wheel_file(package, name):
    """lib/<name> of an NVIDIA wheel's package (nvidia.nccl, nvidia.cuda_runtime), or None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "lib", name)
        if os.path.exists(path):
            return path
    return None


def wheel_library():
    """The libnccl.so.2 of the nvidia-nccl-cu12 wheel, or None."""
    return _wheel_file("nvidia.nccl", "libnccl.so.2")


def cuda_runtime():
    """(found, where or why not) of the CUDA runtime a GPU path would load: the one
    TNT_CUDART_LIBRARY names (the core tries no other: gpu/cuda_rt.c), else the
    nvidia-cuda-runtime-cu12 wheel's (tensorflow[and-cuda]), else the system's. It said
    "found" for the wheel's where TNT_CUDART_LIBRARY named a file that does not exist."""
    import ctypes.util

    named = os.environ.get("TNT_CUDART_LIBRARY")
    if named:
        if os.path.exists(named):
            return True, f"{named} (TNT_CUDART_LIBRARY)"
        return False, f"TNT_CUDART_LIBRARY={named} does not exist"
    path = _wheel_file("nvidia.cuda_runtime", "libcudart.so.12") or ctypes.util.find_library("cudart")
    if path:
        return True, path
    return False, ("libcudart not found: pip install 'tensorflow[and-cuda]' (it brings "
                   "nvidia-cuda-runtime-cu12), or install the CUDA toolkit")


def point_core_at_wheel(environ=None):
    """Set TNT_NCCL_LIBRARY to the wheel's library when the user has not chosen one."""
    environ = os.environ if environ is None else environ
    if not environ.get("TNT_NCCL_LIBRARY"):
        path = wheel_library()
        if path:
            environ["TNT_NCCL_LIBRARY"] = path


def status():
    """(available, why not): what the core says of NCCL on this machine (no GPU needed to ask)."""
    from tarantella.common import core

    point_core_at_wheel()
    lib, ffi = core.lib(), core.ffi()
    why = ffi.string(lib.tnt_nccl_status()).decode("utf-8", "replace")
    return not why, why
