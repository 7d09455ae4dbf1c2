"""Tarantella's compiled TensorFlow ops, or why they are not used.

TNT_TF_OPS chooses the path of the gradient allreduce and of the TF-level
collectives inside a `tf.function`:
- auto (default): the compiled ops (tnt_ops.cc), built at first use; when
  they cannot be had (no compiler, no TensorFlow headers, a build error), the
  `tf.numpy_function` path, with one WARNING that says why;
- compiled: the compiled ops, and an error when they cannot be had;
- numpy: the `tf.numpy_function` path.

`get()` answers None for the numpy_function path. Both paths submit the same
gradient requests (same names, sizes, prescale) to the same core, so they give
bitwise the same gradients (bench/grad_op.py checks it); the TF-level collectives take
the compiled ops for a call of one tensor or of a structure (tensor_collectives._run), which
make the same requests on both paths: under its name, or, unnamed, under the next name of its
sequence, taken when the op runs from the core's count that the Python API's calls take theirs
from (tnt_sequence_counter); a structure's one per dtype with its digest (CompiledOps.structure).
"""
import ctypes
import os
import re
import threading

import numpy as np
import tensorflow as tf

from tarantella.common import collectives, config, core, errors
from tarantella.common.logging import get_logger
from tarantella.common.startup_log import mark

MODES = ("auto", "compiled", "numpy")
# The collectives have no gradient, on every path: eagerly their results come from NumPy (the tape
# sees nothing), on the numpy_function path a PyFunc (no gradient either), and tape.gradient through
# the compiled ops raised "LookupError: gradient registry has no entry for: TntCollectiveWait"
# where the same step eagerly, or unnamed, gave None (docs/api.md).
tf.no_gradient("TntCollectiveStart")
tf.no_gradient("TntCollectiveWait")
_lock = threading.Lock()
_state = {}  # "ops": the bound ops or None; "why": why not


class CompiledOps:
    """The two ops of tnt_ops.cc, bound to this process's core."""

    def __init__(self, path):
        self.path = path
        self._module = tf.load_op_library(path)
        err = ctypes.create_string_buffer(1024)
        binder = ctypes.CDLL(path).tnt_tfop_bind
        binder.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
        if binder(core.library_path().encode(), err, len(err)) != 0:
            raise errors.InternalError(f"Tarantella's TensorFlow ops ({path}): {err.value.decode()}")
        self._unreleased = ctypes.CDLL(path).tnt_tfop_unreleased
        self._unreleased.restype = ctypes.c_int64

    def unreleased(self):
        """Requests a Start submitted that are not released yet: waited for by no Wait so far, or
        orphaned (their Wait will never run) and still in flight in the core (tnt_ops.cc)."""
        return int(self._unreleased())

    def start(self, kind, tensors, names, scale=1.0, op="sum", root=0, sequence=False):
        """A token for `kind` requests of `tensors`, one per tensor, in flight. `sequence`: not
        False for an unnamed call of one tensor (names None), named when the op runs, the next of
        the sequence `sequence` (request_names.thread_sequence(); None: the main thread's), from
        the core's counter that the Python API's unnamed calls of that sequence take theirs from."""
        from tarantella.common import codes, request_names

        if op not in codes.OPS:
            raise errors.InvalidArgumentError(f'op must be "sum" or "average". Received: op={op!r}')
        unnamed = sequence is not False
        if unnamed:
            request_names.unnamed_counter(kind, sequence)  # made now, as the Python API would make it
            names = [request_names.sequence_suffix(kind, sequence)]
        return self._module.tnt_collective_start(
            list(tensors), _scale(scale, tensors), kind=kind, names=list(names),
            reduce_op=int(codes.OPS[op]), root=int(root), unnamed=unnamed, window=request_names.NAME_WINDOW)

    def structure(self, kind, tensors, groups, names, layout, scale=1.0, op="sum", root=0, sequence=False):
        """The results (one per leaf) of a structure's call, made as the NumPy API makes it
        (collectives._structure_collective, _allgather_structure): `tensors`, the leaves in
        flatten's order, go in one flat request per dtype (leaf i in the request of group
        groups[i], groups numbered in the order their dtypes first appear), an allgather's after
        one of the leaves' row counts, each carrying `layout` (the structure's digest; an
        allgather's data requests their shape layout, 0), the first submitted by the Start, the
        others by the Wait once the first has completed. `names`: the requests' names; unnamed
        (`sequence` as in start()), the suffixes of the requests after the first (".int64"),
        appended to the name the op makes when it runs."""
        from tarantella.common import codes, request_names

        if op not in codes.OPS:
            raise errors.InvalidArgumentError(f'op must be "sum" or "average". Received: op={op!r}')
        unnamed = sequence is not False
        if unnamed:
            request_names.unnamed_counter(kind, sequence)  # made now, as the Python API would make it
            names = [request_names.sequence_suffix(kind, sequence)] + list(names)
        token = self._module.tnt_collective_start(
            list(tensors), _scale(scale, tensors), kind=kind, names=list(names), reduce_op=int(codes.OPS[op]),
            root=int(root), unnamed=unnamed, window=request_names.NAME_WINDOW,
            layout=layout - (1 << 64) if layout >= 1 << 63 else layout, leaf_groups=list(groups))
        return self.wait([token], tensors, gathered=kind == "allgather")

    def wait(self, tokens, tensors, gathered=False, block=False):
        """The results of the requests of `tokens` (one wait for all): tensors
        of the dtypes and shapes of `tensors`, the inputs of those requests in
        order (allgather: a first dimension of the gathered size). `block`:
        wait in TensorFlow's thread (for the wait that ends a step)."""
        out = self._module.tnt_collective_wait(list(tokens), T=[t.dtype for t in tensors], block=block)
        for o, t in zip(out, tensors):
            o.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]) if gathered else t.shape)
        return list(out)

    def run(self, kind, tensors, names, **kw):
        return self.wait([self.start(kind, tensors, names, **kw)], tensors, gathered=kind == "allgather")


def check_scale(scale, tensors):
    """Refuse a bad prescale while a tf.function traces, on either path (see _scale)."""
    _scale(scale, tensors)


def _scale(scale, tensors):
    """`scale` (an allreduce's prescale) as the op's float64 scalar input, refused as the NumPy
    API refuses it (collectives._prescale): a string or None, an integer beyond 2**53 for integer
    tensors (a float64 cannot hold it: `2**53 + 1` multiplied by 2**53 without a word), and a
    tensor or array of another shape than a scalar's. Passed on, a string failed at run time
    with an UnimplementedError, and a tensor of 2 or 0 elements aborted the whole process (a
    failed CHECK in TensorFlow's Tensor::scalar())."""
    if isinstance(scale, (tf.Tensor, tf.Variable)):
        if scale.shape.rank not in (0, None):
            raise errors.InvalidArgumentError(
                f"allreduce: prescale must be a scalar. Received: a tensor of shape {scale.shape}")
        if not (scale.dtype.is_floating or scale.dtype.is_integer):
            raise errors.InvalidArgumentError(
                f"allreduce: prescale must be a real number. Received: a tensor of dtype {scale.dtype.name}")
        return tf.cast(scale, tf.float64)  # a shape unknown until run time: the kernel checks it
    for t in tensors:  # as the NumPy API checks it, against each tensor's dtype
        collectives._prescale(scale, np.empty(0, t.dtype.as_numpy_dtype))
    return tf.constant(collectives._prescale(scale, np.empty(0)), tf.float64)


# the end of a kernel's error message (tnt_ops.cc, CoreError)
_CORE_ERROR = re.compile(r"Tarantella [^:\n]*: (.*?) \[TNT_(ERR_[A-Z_]+)(?:, rank (\d+))?\]", re.S)


def tarantella_error(op_error):
    """The TarantellaError (PeerLostError naming the rank, ...) that a compiled
    op's failure stands for, or None for another error."""
    found = _CORE_ERROR.search(op_error.message or "")
    if found is None:
        return None
    from tarantella.common import codes

    text, code, rank = found.groups()
    return errors.error_for_code(getattr(codes, code, codes.ERR_INTERNAL), text,
                                 rank=int(rank) if rank else None)


def mode():
    return config.get("TNT_TF_OPS")


@tf.autograph.experimental.do_not_convert  # called while a tf.function traces: plain Python
def get():
    """The compiled ops, or None for the numpy_function path (see the module docstring)."""
    core.ensure_initialized()  # the ops run on the core as the NumPy collectives do: started on first use
    if "ops" in _state:
        return _state["ops"]
    with _lock:
        if "ops" not in _state:
            mark("compiled ops: load begin")
            _state["ops"], _state["why"] = _load(mode())
            mark("compiled ops: loaded" if _state["ops"] else "compiled ops: none")
    return _state["ops"]


def _load(chosen):
    compiled, why = _try(chosen)
    compiled, why = _agreed(compiled, why)
    if compiled is None and chosen == "compiled":
        raise errors.SystemError(f"TNT_TF_OPS=compiled, but Tarantella's TensorFlow ops cannot be used: {why}")
    if compiled is None and chosen == "auto":
        get_logger().warning(
            "Tarantella's compiled TensorFlow ops cannot be used, so collectives inside tf.function go through "
            "tf.numpy_function (correct, but slower; set TNT_TF_OPS=numpy to silence this): %s", why)
    return compiled, why


def _try(chosen):
    """(this rank's compiled ops or None, why not)."""
    if chosen == "numpy":
        return None, "TNT_TF_OPS=numpy"
    try:
        from tarantella.tensorflow.ops import build

        return CompiledOps(build.library()), ""
    except Exception as exc:  # noqa: BLE001 - any failure to build or load selects the fallback
        return None, str(exc) if isinstance(exc, errors.TarantellaError) else f"{type(exc).__name__}: {exc}"


def _agreed(compiled, why):
    """Every rank's choice, the same on all: the compiled ops only where every
    rank has them. A rank on the compiled ops named its TF-level requests
    otherwise than one on tf.numpy_function (one per leaf, not one per dtype), so
    a mix of the two (a host without a compiler, a rank with TNT_TF_OPS=numpy)
    waited for partners that never came until TNT_TIMEOUT_S; both now make the
    requests of the eager call (tensor_collectives._run), and the one choice
    keeps every rank's costs alike. `why` then says which ranks could not, and why."""
    if core.get_size() == 1:
        return compiled, why
    # the reasons travel as int32 code units (the collectives carry no bytes)
    mine = np.frombuffer(b"" if compiled else (why or "unknown").encode()[:4000], np.uint8).astype(np.int32)
    lengths = collectives.allgather(np.array([mine.size], np.int64), name="tnt.tf_ops.agree")
    if not lengths.any():
        return compiled, why
    text = collectives.allgather(mine, name="tnt.tf_ops.why").astype(np.uint8).tobytes()
    reasons, offset = {}, 0
    for rank, n in enumerate(lengths.tolist()):
        if n:
            reasons.setdefault(text[offset:offset + n].decode(errors="replace"), []).append(rank)
        offset += n
    return None, "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {reason}"
                           for reason, r in reasons.items())


def status():
    """(available, detail) without building anything (tntrun --version asks
    runner/frontend_info.py, which answers without TensorFlow)."""
    if mode() == "numpy":
        return False, "not used: TNT_TF_OPS=numpy"
    try:
        from tarantella.tensorflow.ops import build

        path = build.cached()
        if path:
            return True, f"built for TensorFlow {tf.__version__}: {path}"
        folder, cmd = build.plan()
        failed = os.path.join(folder, build.build_cache.FAILED)
        if os.path.isfile(failed):
            with open(failed) as f:
                return False, f.read().strip()
        return True, f"built at first use for TensorFlow {tf.__version__} with {cmd[0]} into {folder}"
    except errors.TarantellaError as exc:
        return False, str(exc)
