"""NumPy collectives over the core, mpi4py-style but PEP 8: arrays in, new arrays out.

Each blocking call is its `*_async` twin followed by `wait()`, but for the
allreduce of one array: that is one call into the core, which drives the
collective on the calling thread (the plain call is the fast call). Names identify a
request across ranks; without a name, each kind of collective numbers its calls
("allreduce.0", "allreduce.1", ...; in a thread other than the main one,
"allreduce.0@<thread name>", ...), which matches across ranks when every rank's
thread of each name makes the same calls in the same order.

Nested structures: allreduce, broadcast and allgather also take lists,
tuples (named tuples too) and dicts, nested, whose leaves are NumPy arrays,
Python or NumPy scalars, or anything with `.numpy()` or `__array__` (a
TensorFlow tensor, say). The call is fused: the leaves are flattened and
concatenated per dtype, one request per dtype (allgather: one more for the
leaves' row counts), and the result has the same structure, with arrays for
arrays and tensors and NumPy scalars for scalars (tarantella.tensorflow's
versions give tensors back for tensors). Dict entries are visited in sorted
key order; every rank passes the same structure, with leaves of the same
dtypes and shapes (for allgather, but for the first dimension). Any other
leaf type is a TypeError that names it.
"""
import collections
import functools
import hashlib
import math
import threading

import numpy as np

from tarantella import _fastpath
from tarantella.common import (codes, core, dtypes, errors, gone_arguments, master_only,
                               request_names, result_pool)
from tarantella.common.errors import InvalidArgumentError
from tarantella.common.request_names import auto_name

# A blocking wait() waits in slices of this many seconds so that Ctrl+C (which
# Python handles between C calls) interrupts a wait for a stuck peer.
_WAIT_SLICE_S = 0.25
_ALIGN = 64  # TensorFlow aliases (does not copy) a returned array only if it is 64-byte aligned
_unnamed_in_flight = {}  # name -> core handle of the last unnamed request of that name (request_names.py)


# Results smaller than this are plain NumPy arrays: TensorFlow copies an
# unaligned array instead of aliasing it, which costs less than aligning below it.
_ALIGN_FROM_BYTES = 64 * 1024

# Allgather results from this size on come from result_pool: fresh, they were
# new pages every call (one rank, 256 KB: 96 page faults and 427 us a call,
# 52 us pooled), which the allreduce's results of that size are not.
_GATHER_POOL_FROM_BYTES = 128 * 1024


def aligned_empty(shape, dtype, pooled=False):
    """An uninitialized array whose data is 64-byte aligned; with `pooled`, in
    memory that result_pool reuses once the array and its views are gone."""
    dtype = np.dtype(dtype)
    count = math.prod(shape) if isinstance(shape, tuple) else int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize + _ALIGN
    raw = result_pool.take(nbytes) if pooled else np.empty(nbytes, np.uint8)  # positional: 0.3 us less
    # the address through cffi: half the cost of __array_interface__, which builds a dict per call;
    # the array in one constructor: 1.5 us less than slicing, viewing and reshaping (64 KB: 5.3 -> 3.8 us)
    ffi = core.ffi()
    offset = -int(ffi.cast("uintptr_t", ffi.from_buffer(raw))) % _ALIGN
    return np.ndarray(shape, dtype, raw, offset)


def _result_like(array):
    """A fresh result array of the input's dtype and shape (aligned when large,
    in reused memory when larger: result_pool)."""
    if array.nbytes < _ALIGN_FROM_BYTES:
        return np.empty(array.shape, array.dtype)
    return aligned_empty(array.shape, array.dtype, pooled=array.nbytes >= result_pool.RESULT_POOL_FROM_BYTES)


_dtype_codes = {}  # NumPy dtype -> core code, filled on first use of each dtype


def _refuse_masked(array, what):
    """The core reads the data under a mask too: the masked values would be combined as
    if they were there, and the result would come back without a mask."""
    if isinstance(array, np.ma.MaskedArray):
        raise InvalidArgumentError(
            f"{what} does not take masked arrays: the masked values would be combined too. "
            "Fill them with what the collective should see (array.filled(0) for a sum), or "
            "combine the mask separately (e.g. an allreduce of (~array.mask).astype(np.int64) "
            f"to count the valid values). Received: a numpy.ma.MaskedArray, {array.dtype}{array.shape}")


def _as_input(array, what):
    if type(array) is np.ndarray and array.flags.c_contiguous:  # the common case, without a detour
        code = _dtype_codes.get(array.dtype)
        if code is None:
            code = _dtype_codes[array.dtype] = dtypes.core_dtype(array.dtype)
        return array, code
    if not isinstance(array, np.ndarray):
        given = array
        try:  # scalars, lists, and anything exposing the array interface
            array = np.asarray(array)
        except Exception:
            # a tf.function's tensor has no value while it is traced: the collective would run
            # once, at the trace, instead of at every call
            traced = type(array).__name__ == "SymbolicTensor" or hasattr(array, "graph")
            hint = (" (a tensor of a tf.function being traced: inside a tf.function use the "
                    "collectives of tarantella.tensorflow, which take tensors and run at every "
                    "call: `import tarantella.tensorflow as tnt_tf`, `tnt_tf.allreduce(t)`)"
                    if traced else _structure_hint(given))
            raise InvalidArgumentError(
                f"{what} expects a NumPy array. Received: {type(array).__name__}{hint}") from None
        if array.dtype == object and (_is_structure(given) or array.ndim == 0 and array[()] is given):
            # None, a dict (a nested structure given to an _async call), any object NumPy cannot read
            # numbers from: it wraps it in an array of dtype object, which was refused as an
            # unsupported dtype, with the advice to cast it (array.astype). (Strings, which NumPy does
            # read into an array of objects, keep that message.)
            raise InvalidArgumentError(
                f"{what} expects a NumPy array. Received: {type(given).__name__}{_structure_hint(given)}")
    _refuse_masked(array, what)
    if not array.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{what} needs a C-contiguous array; pass np.ascontiguousarray(array). "
            f"Received: an array with strides {array.strides} and shape {array.shape}")
    return array, dtypes.core_dtype(array.dtype)


def _structure_hint(given):
    """What to do with a nested structure where one array is expected (the _async calls)."""
    if not _is_structure(given):
        return ""
    return (" (a nested structure: the blocking tnt.allreduce, tnt.broadcast and tnt.allgather take one; "
            "the _async calls take one array each, so start one per array)")


def _slice_until(deadline):
    """How long the next wait of a sliced wait may take: _WAIT_SLICE_S, or less before `deadline`
    (core.clock()'s, which does not count the time the process was stopped; None: no deadline)."""
    if deadline is None:
        return _WAIT_SLICE_S
    return max(0.0, min(_WAIT_SLICE_S, deadline - core.clock()))


class Handle:
    """A request in flight. `wait()` returns the result array; `test()` says
    whether it is complete. The input array must not change until then.

    Several threads may wait on or test one handle: the first to see the request
    complete takes the result and releases the core's handle, under a lock; the
    others get the same result (or the same error)."""

    _done = True  # until __init__ runs: a Handle that a signal's exception left unbuilt owns nothing

    def __init__(self, handle, finish, keepalive):
        self._handle = handle
        self._finish = finish
        self._keepalive = keepalive  # buffers the core reads/writes until completion
        self._result = None
        self._error = None
        self._done = False
        self._lock = threading.Lock()

    def test(self):
        if not self._done:
            result = core.lib().tnt_test(self._handle)
            if result == codes.IN_PROGRESS and not self._done:
                return False
            self._complete(result)
        return True

    def wait(self, timeout=None):
        """Block (without the GIL) until completion; `timeout` in seconds, None
        (or, as for the core, negative, NaN or infinite) for the core's own bound
        (TNT_TIMEOUT_S after a stall). Either way in slices, so that Ctrl+C ends it:
        one call into the core for a whole timeout of the caller's let it run on."""
        if not self._done:
            lib = core.lib()
            bound = None if timeout is None else float(timeout)
            # on the core's clock: ranks stopped together (Ctrl+Z, kill -STOP) for longer than the
            # bound and continued must not find it passed, as the core's own bounds do not
            deadline = core.clock() + bound if bound is not None and 0 <= bound < 1e9 else None
            result = lib.tnt_wait(self._handle, _slice_until(deadline))
            while result == codes.ERR_TIMEOUT and not self._done:  # our slice, or the core's own bound?
                result = lib.tnt_test(self._handle)
                if result != codes.IN_PROGRESS:
                    break
                if deadline is not None and core.clock() >= deadline:
                    # the request stays pending: not the job's timeout, whose message (advice on
                    # TNT_TIMEOUT_S and ranks that differ) core.check would append
                    raise errors.TimeoutError(
                        f"wait(timeout={timeout!r}) ended before the request completed: it is still pending, and "
                        "wait() or test() may be called again (the job is not broken: that would be "
                        "TNT_TIMEOUT_S, which fails the request)")
                result = lib.tnt_wait(self._handle, _slice_until(deadline))
            self._complete(result)
        return self._outcome()

    def _outcome(self):
        if self._error is not None:
            raise self._error
        return self._result

    def _complete(self, result):
        if result == codes.ERR_INVALID_USAGE and not core.is_initialized():
            # the core is down (tnt.shutdown()): raised, not kept. Kept, a wait after tnt.init()
            # raised it again ("... finalized on this rank: call tnt.init() again first", after
            # init), where a handle not waited on meanwhile raises the InvalidArgumentError of a
            # request made before the shutdown (api.md); now both do
            core.check(result)
        with self._lock:
            if self._done:  # another thread took the result (and released the handle) first
                return self._outcome()
            try:
                core.check(result)
                self._result = self._finish(self._handle)
            except Exception as exc:
                self._error = exc
            finally:
                self._done = True
                core.lib().tnt_release(self._handle)
                self._keepalive = None
        return self._outcome()

    def __del__(self):
        # What it needs comes from the class, not from the module's globals: a Handle that
        # Python's teardown frees late (held by another module, or in a reference cycle, with
        # TensorFlow imported) ran after this module's globals were cleared, and printed
        # "Exception ignored in: <function Handle.__del__> ... 'NoneType' object has no
        # attribute 'is_initialized'" at every such exit. The core is shut down by then (the
        # exit handler): nothing is left to keep alive.
        if not self._done and self._core_up():
            # The core still reads/writes these buffers: keep them alive until the
            # request completes. Never wait here: a dropped request that no other
            # rank submits would block the garbage collector.
            self._orphans.append((self._handle, self._keepalive))

    @staticmethod
    def _core_up():
        try:
            return core.is_initialized()
        except Exception:  # noqa: BLE001 - the interpreter is tearing the modules down: the core is gone
            return False


_orphans = []  # (core handle, buffers) of dropped, unfinished requests
Handle._orphans = _orphans  # the same list, reachable from __del__ at teardown


def _reap_orphans():
    """Release the dropped requests that completed. Any thread may reap while
    others reap or drop handles, and tnt_test lets them run (it releases the
    GIL): each entry is taken out with one pop() and the pending ones put back,
    so that an entry is always in the list or in one reaper's hands. Rebuilding
    the list (`_orphans[:] = still`) lost the entries that other threads added
    or put back meanwhile, and with them the buffers of requests still in flight,
    which the core then wrote into after they were freed (two threads dropping
    async handles: heap corruption within a few hundred calls)."""
    lib = core.lib()
    taken = []
    while _orphans:
        try:
            taken.append(_orphans.pop())
        except IndexError:  # another reaper took the last one
            break
    for handle, keepalive in taken:
        if lib.tnt_test(handle) == codes.IN_PROGRESS:
            _orphans.append((handle, keepalive))
        else:
            lib.tnt_release(handle)


def _settle_before(name, unnamed):
    """Before a request named `name` is submitted: release the dropped requests
    that completed, and wait (interruptibly) until the unnamed request of the
    same name, request_names.NAME_WINDOW calls earlier, completes (its owner takes the result)."""
    lib = core.lib()
    if _orphans:
        _reap_orphans()
    earlier = _unnamed_in_flight.pop(name, None) if unnamed else None
    if earlier is not None:
        try:
            while lib.tnt_test(earlier) == codes.IN_PROGRESS:
                lib.tnt_wait(earlier, _WAIT_SLICE_S)
        except BaseException:
            # Ctrl+C in the wait: the earlier call is still in flight, and the
            # name's next use must still wait for it (popped for good, that use
            # was submitted beside it and the core refused the name as in use)
            _unnamed_in_flight.setdefault(name, earlier)
            raise


def next_unnamed(kind, sequence):
    """The name (str) of the next unnamed `kind` call of the thread sequence `sequence`
    (request_names.next_in_sequence), to make it under that name from another thread; the unnamed
    request of the name NAME_WINDOW calls earlier is waited for first, as for an unnamed call."""
    name = request_names.next_in_sequence(kind, sequence)
    if _orphans or _unnamed_in_flight:
        _settle_before(name, True)
    return name.decode()


def _submit(fn, name, args, finish, keepalive):
    """Submit `fn(name, *args, &handle)` (`name` from request_names.auto_name) and
    return its Handle, which keeps `keepalive` (the buffers) until completion."""
    name, unnamed = name
    if _orphans or unnamed and _unnamed_in_flight:
        _settle_before(name, unnamed)
    handle = core.ffi().new("tnt_handle_t *")  # 0, never a handle, until the core fills it
    try:
        core.check(fn(name, *args, handle))
        if unnamed:
            _unnamed_in_flight[name] = handle[0]
        return Handle(handle[0], finish, keepalive)
    except BaseException:
        _orphan_raised(handle[0], keepalive, name, unnamed)
        raise


def _orphan_raised(handle, keepalive, name, unnamed):
    """A call raised after the core took its request, before a Handle owned it: a
    signal's exception (Ctrl+C) is raised as the core's call returns, or as the
    Python that takes over a slow request is entered. The request then goes to
    the orphans with its buffers, as a dropped Handle's does: else the core wrote
    the result into memory that Python had freed and given to other arrays, and
    crashed. A request that a Handle had taken (and released, or will orphan
    itself) is refused as stale when reaped, which is harmless. An unnamed one
    is also the name's request in flight, which its next use waits for."""
    if handle:
        _orphans.append((handle, keepalive))
        if unnamed:
            _unnamed_in_flight.setdefault(name, handle)


def _described(out):
    """`out` in an error: its dtype and shape, and what else disqualifies it."""
    if not isinstance(out, np.ndarray):
        return type(out).__name__
    flaws = [flaw for flaw, bad in (("not C-contiguous", not out.flags.c_contiguous),
                                    ("read-only", not out.flags.writeable)) if bad]
    return f"{out.dtype}{out.shape}" + "".join(f", {flaw}" for flaw in flaws)


def _output(out, array, what):
    """A fresh result array (64-byte aligned when large), or the caller's `out` after checking it."""
    if out is None:
        return _result_like(array)
    if not isinstance(out, np.ndarray) or out.dtype != array.dtype or out.shape != array.shape \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgumentError(
            f"{what}: out must be a writeable C-contiguous array of the input's dtype and shape "
            f"{array.dtype}{array.shape}. Received: {_described(out)}")
    # every algorithm reads parts of the input after writing parts of the result: a silent wrong sum.
    # The bounds test first (0.7 us); the addresses (5 us through .ctypes) only for arrays that share bytes.
    if out is not array and np.may_share_memory(array, out):
        offset = out.ctypes.data - array.ctypes.data
        if offset:
            raise InvalidArgumentError(
                f"{what}: out overlaps the input without being it. Pass out=<the input itself> to work "
                f"in place, or an array of its own. Received: out={_described(out)} starting "
                f"{offset:+d} bytes from the input's start")
    return out


def _prescale(prescale, array):
    """`prescale` as the core takes it (a double), or InvalidArgumentError. A string
    ("2") was converted by float() and taken; and a whole number beyond 2**53 became the
    nearest double, so an integer array was multiplied by another number than the one
    given (ones in int64, prescale=2**53 + 1: 2**53 per rank) without a word."""
    if type(prescale) is float:  # the common case
        return prescale
    if isinstance(prescale, (str, bytes, bytearray)):
        scale = None
    else:
        try:
            scale = float(prescale)
        except (TypeError, ValueError):
            scale = None
    if scale is None:
        raise InvalidArgumentError(
            f"allreduce: prescale must be a real number (a float, or an int for integer arrays). "
            f"Received: prescale={prescale!r:.100} of type {type(prescale).__name__}")
    if array.dtype.kind == "i" and isinstance(prescale, (int, np.integer)) and int(prescale) != scale:
        raise InvalidArgumentError(
            f"allreduce: prescale={int(prescale)} on an integer dtype is passed to the core as a 64-bit float, "
            f"which holds whole numbers exactly only up to 2**53 in magnitude: it would multiply by {scale:.0f} "
            "instead. Scale the integers yourself (array * factor) and pass prescale=1. "
            f"Received: prescale={int(prescale)}")
    return scale


def _op_code(op):
    code = codes.OPS.get(op) if isinstance(op, str) else None
    if code is None:
        raise InvalidArgumentError(f'op must be "sum" or "average". Received: op={op!r}')
    return code


def allreduce_async(array, op="sum", name=None, prescale=1.0, out=None):
    """Start an allreduce; see allreduce()."""
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.allreduce_async")
    return _allreduce_async(array, op, name, prescale, out)


def _allreduce_async(array, op, name, prescale, out, layout=0):
    """allreduce_async; `layout`: a structure's digest (_layout), which every rank must match;
    0 for one array: its _shape_layout then."""
    lib = core.ensure_initialized()
    _op_code(op)
    array, dt = _as_input(array, "allreduce")
    scale = _prescale(prescale, array)
    out = _output(out, array, "allreduce")
    ffi = core.ffi()
    return _submit(lib.tnt_allreduce_layout_async, auto_name("allreduce", name),
                   (ffi.from_buffer(array), ffi.from_buffer(out), array.size, dt, codes.OPS[op], scale,
                    layout or _shape_layout(array.shape)), lambda h: out, (array, out))


def _shape_layout(shape):
    """The layout every rank's request of one array of `shape` carries: the
    core's tnt_shape_layout (one definition for this module, the fast path
    and the TensorFlow ops), 0 below 2 dimensions (the count says it all).
    Equal counts do not make two shapes alike: (2, 3) would be summed into
    (3, 2) element by element. Allgather passes its rows' shape (shape[1:])."""
    return core.lib().tnt_shape_layout(len(shape), shape) if len(shape) >= 2 else 0


# Python and NumPy scalars: converted before the fast path (np.asarray, as the
# general path converts them), so that `tnt.allreduce(loss)` costs what an
# array does (2 ranks: 20-27 us through the general path, bench/allreduce.py).
_SCALARS = (float, int, np.generic)


def allreduce(array, op="sum", name=None, prescale=1.0, out=None):
    """Element-wise sum (or average) of `array` over all ranks, as a new array of
    the same dtype and shape. `prescale` multiplies this rank's contribution
    before the sum, so a weighted average needs one pass. With `out=`, the
    result goes into that array (which may be `array` itself) and no memory is
    allocated: mpi4py's `Allreduce(sendbuf, recvbuf)`.

    `array` may also be a nested structure (lists, tuples, dicts) of arrays,
    scalars and tensors (see the module docstring)."""
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.allreduce")
    if isinstance(array, _SCALARS):  # a loss or a metric: the 0-d array the general path makes of it
        array = np.asarray(array)
    result = _fastpath.allreduce(array, op, name, prescale, out)  # the common call, in C
    if result is not NotImplemented:
        return result
    if _is_structure(array):
        _no_out(out, "allreduce")
        return _structure_collective(
            array, "allreduce", name, lambda a, n, layout: _allreduce_async(a, op, n, prescale, None, layout),
            now=lambda a, n, layout: _allreduce_now(a, op, n, prescale, None, layout))
    return _allreduce_now(array, op, name, prescale, out)


def _allreduce_now(array, op, name, prescale, out, layout=0):
    """The blocking allreduce of one array, every argument checked (the errors
    a caller sees come from here); `layout` as in _allreduce_async."""
    lib = core.ensure_initialized()
    opcode = _op_code(op)
    array, dt = _as_input(array, "allreduce")
    scale = _prescale(prescale, array)
    out = _output(out, array, "allreduce")
    ffi = core.ffi()
    _bind_fastpath(lib, ffi)
    return _blocking(lib.tnt_allreduce_layout, auto_name("allreduce", name),
                     (ffi.from_buffer(array), ffi.from_buffer(out), array.size, dt, opcode, scale,
                      layout or _shape_layout(array.shape)), lambda h: out, (array, out))


def _blocking(fn, name, args, finish, keepalive, keep=False):
    """The blocking form of a collective: `fn(name, *args, slice, &handle)`
    (tnt_allreduce, tnt_broadcast, tnt_allgather_into, tnt_barrier) submits
    it and drives it on this thread, so that no other thread of this rank
    wakes up (the plain call is the fast call: no Handle object unless a peer
    is late); then `finish(handle)` makes the result. `keep`: the core keeps a
    successful request for `finish` to read (an allgather's result)."""
    name, unnamed = name
    if _orphans or unnamed and _unnamed_in_flight:
        _settle_before(name, unnamed)
    handle = core.ffi().new("tnt_handle_t *")  # 0, never a handle, until the core fills it
    try:
        result = fn(name, *args, _WAIT_SLICE_S, handle)
        if result == codes.IN_PROGRESS:
            return _wait_in_slices(handle[0], name, unnamed, finish, keepalive)
    except BaseException:  # Ctrl+C as the call returned, or while waiting for a slow peer
        _orphan_raised(handle[0], keepalive, name, unnamed)
        raise
    core.check(result)
    if not keep:
        return finish(None)
    try:
        return finish(handle[0])
    finally:
        core.lib().tnt_release(handle[0])


def _wait_in_slices(handle, name, unnamed, finish, keepalive):
    """A blocking collective not done within one slice (a slow peer): wait on
    its handle in slices, interruptibly; `keepalive` holds its buffers until then."""
    if unnamed:
        _unnamed_in_flight[name] = handle
    return Handle(handle, finish, keepalive).wait()


def _finish_in_progress(handle, name, unnamed, source, out):
    """_wait_in_slices for the fast path's allreduce (tarantella._fastpath)."""
    return _wait_in_slices(handle, name, unnamed, lambda h: out, (source, out))


_fastpath_bound = False


def _bind_fastpath(lib, ffi):
    """Connect tarantella._fastpath to the running core and to this module's
    state, which both paths share (the unnamed names and their counter, the
    requests in flight, the dtype codes). Once per process (the general paths
    call it; later calls return at once): the fast path asks whether the core
    runs here (core._running) on every call."""
    global _fastpath_bound
    if _fastpath_bound:
        return

    def address(function):
        return int(ffi.cast("uintptr_t", ffi.addressof(lib, function)))

    def thread_name(kind):  # another thread's next unnamed name of this kind
        return functools.partial(request_names.unnamed_name, kind)

    _fastpath.bind(address("tnt_allreduce_layout"), core, np.ndarray, np.empty,
                   aligned_empty, _dtype_codes, codes.OPS, *request_names.unnamed_window("allreduce"),
                   _unnamed_in_flight, _orphans, _settle_before, _finish_in_progress, core.check,
                   thread_name("allreduce"), _ALIGN_FROM_BYTES, result_pool.RESULT_POOL_FROM_BYTES, _ALIGN,
                   _WAIT_SLICE_S, threading.main_thread().ident, address("tnt_shape_layout"))
    _fastpath.bind_broadcast(address("tnt_broadcast_layout"), address("tnt_size"),
                             *request_names.unnamed_window("broadcast"), thread_name("broadcast"))
    _fastpath.bind_allgather(address("tnt_allgather_into_layout"), address("tnt_result_count"),
                             address("tnt_release"),
                             *request_names.unnamed_window("allgather"), thread_name("allgather"),
                             _gather_uneven, _finish_gather_in_progress, _GATHER_POOL_FROM_BYTES)
    _fastpath_bound = True


def new_context():
    """A context started (tnt.init): unnamed calls are numbered from 0 again (request_names.restart),
    in the fast path too, which holds the main thread's counters and is bound to the new ones."""
    global _fastpath_bound
    request_names.restart()
    if _fastpath_bound:
        _fastpath_bound = False
        _bind_fastpath(core.lib(), core.ffi())


def check_root(root, size):
    """Refuse a root that is not a rank of `size` (a bool too: root=True broadcast rank 1's array
    without a word)."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise InvalidArgumentError(
            f"root must be a rank between 0 and {size - 1}. Received: root={root!r} (ranks={size})")


def broadcast_async(array, root=0, name=None, out=None):
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.broadcast_async")
    return _broadcast(array, root, name, out, blocking=False)


def _broadcast(array, root, name, out, blocking, layout=0):
    """broadcast_async's Handle, or (blocking) broadcast's result; `layout`
    as in _allreduce_async."""
    lib = core.ensure_initialized()
    check_root(root, lib.tnt_size())
    array, dt = _as_input(array, "broadcast")
    out = _output(out, array, "broadcast")
    ffi = core.ffi()
    _bind_fastpath(lib, ffi)
    args = (ffi.from_buffer(array), ffi.from_buffer(out), array.size, dt, int(root),
            layout or _shape_layout(array.shape))
    if blocking:
        return _blocking(lib.tnt_broadcast_layout, auto_name("broadcast", name), args, lambda h: out, (array, out))
    return _submit(lib.tnt_broadcast_layout_async, auto_name("broadcast", name), args, lambda h: out, (array, out))


def broadcast(array, root=0, name=None, out=None):
    """`root`'s array on every rank (every rank passes an array of the same dtype
    and shape). `out=` receives the result in place of a new array. `array`
    may be a nested structure (every rank passes the same structure)."""
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.broadcast")
    if _is_structure(array):
        _no_out(out, "broadcast")
        return _structure_collective(array, "broadcast", name,
                                     lambda a, n, layout: _broadcast(a, root, n, None, False, layout))
    result = _fastpath.broadcast(array, root, name, out)  # the common call, in C
    if result is not NotImplemented:
        return result
    return _broadcast(array, root, name, out, blocking=True)


def allgather_async(array, name=None):
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.allgather_async")
    return _allgather(array, name, blocking=False)


def _allgather(array, name, blocking, layout=0):
    """allgather_async's Handle, or (blocking) allgather's result; `layout`
    as in _allreduce_async (one array's: the _shape_layout of its rows)."""
    lib = core.ensure_initialized()
    array, dt = _as_input(array, "allgather")
    if array.ndim == 0:
        array = array.reshape(1)
    row_shape = array.shape[1:]
    row_elems = math.prod(row_shape)
    layout = layout or _shape_layout(row_shape)
    if row_elems == 0:
        return _allgather_empty_rows(lib, array, dt, name, blocking, layout)
    ffi = core.ffi()
    # The result as it is when every rank gives as many rows as this one (the
    # common case): the core writes straight into it, with no copy out of its
    # own buffer; any other size is copied out of the handle as before.
    guess = _gather_result((array.shape[0] * lib.tnt_size(),) + row_shape, array.dtype)
    args = (ffi.from_buffer(array), array.size, row_elems, dt, ffi.from_buffer(guess) if guess.size else ffi.NULL,
            guess.size, layout)
    _bind_fastpath(lib, ffi)

    def finish(h):
        return _gather_finish(h, array, guess)

    if blocking:
        return _blocking(lib.tnt_allgather_into_layout, auto_name("allgather", name), args, finish, (array, guess),
                         keep=True)
    return _submit(lib.tnt_allgather_into_layout_async, auto_name("allgather", name), args, finish, (array, guess))


def _allgather_empty_rows(lib, array, dt, name, blocking, layout):
    """The allgather of rows of no elements (a (5, 0) array): their data is no
    bytes, which cannot say how many rows each rank has. So each rank sends its
    row count instead, as one row of 8 bytes in the array's dtype, under a layout
    of its own (_empty_rows_layout) that carries the rows' shape: ranks with rows
    of another shape, or with elements, fail with a MismatchError as for any
    other allgather. One request, as any collective: the counts used to be a
    second collective ("<name>.rows") made once the first request was seen
    complete, in whichever test() or wait() first saw it, a moment that differs
    between ranks: a rank whose test() saw it entered that gather while another,
    whose test() had not yet, went on to its next collective, and the two waited
    for each other until TNT_TIMEOUT_S. (`layout`, the rows' shape layout, is
    replaced by _empty_rows_layout.)"""
    per_rank = _COUNT_BYTES // array.dtype.itemsize
    counts = np.array([array.shape[0]], np.int64).view(array.dtype)
    guess = np.empty(per_rank * lib.tnt_size(), array.dtype)
    ffi = core.ffi()
    args = (ffi.from_buffer(counts), per_rank, per_rank, dt, ffi.from_buffer(guess), guess.size,
            _empty_rows_layout(array.shape[1:]))

    def finish(h):
        rows = _gather_finish(h, counts, guess).view(np.int64)  # each rank's row count
        return np.empty((int(rows.sum()),) + array.shape[1:], array.dtype)

    if blocking:
        return _blocking(lib.tnt_allgather_into_layout, auto_name("allgather", name), args, finish, (counts, guess),
                         keep=True)
    return _submit(lib.tnt_allgather_into_layout_async, auto_name("allgather", name), args, finish, (counts, guess))


_COUNT_BYTES = 8  # a row count (int64) in the bytes of 1, 2 or 4 elements of the array's dtype


def _empty_rows_layout(row_shape):
    """The layout of an allgather of rows of no elements, `row_shape` each: the core's
    tnt_empty_rows_layout (one definition for this module and the TensorFlow ops), odd, as a
    structure's digest (_layout), so never 0 nor an array's shape layout, whose requests
    (rows of elements) it must not pair with, and one per row shape."""
    return core.lib().tnt_empty_rows_layout(len(row_shape), list(row_shape))


def _gather_finish(h, array, guess):
    """The result of the complete allgather `h` of `array` (at least 1-d), whose
    core wrote into `guess` if the ranks' rows added up to its size; else
    copied out of the handle (the caller releases it)."""
    lib, ffi = core.lib(), core.ffi()
    count = ffi.new("int64_t *")
    core.check(lib.tnt_result_count(h, count))
    if guess.size and count[0] == guess.size:
        return guess
    row_shape = array.shape[1:]
    row_elems = math.prod(row_shape)
    rows = count[0] // row_elems if row_elems else 0
    out = _gather_result((rows,) + row_shape, array.dtype)
    if out.size:
        core.check(lib.tnt_result_copy(h, ffi.from_buffer(out)))
    return out


def _gather_uneven(handle, array, guess):
    """For the fast path's allgather (tarantella._fastpath): ranks gave other
    row counts than this one, so the result is copied out of the handle."""
    try:
        return _gather_finish(handle, array, guess)
    finally:
        core.lib().tnt_release(handle)


def _finish_gather_in_progress(handle, name, unnamed, array, guess):
    """_wait_in_slices for the fast path's allgather."""
    return _wait_in_slices(handle, name, unnamed, lambda h: _gather_finish(h, array, guess), (array, guess))


def _gather_result(shape, dtype):
    """A fresh allgather result: as an allreduce's (_result_like), but pooled
    from _GATHER_POOL_FROM_BYTES."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _ALIGN_FROM_BYTES:
        return np.empty(shape, dtype)
    return aligned_empty(shape, dtype, pooled=nbytes >= _GATHER_POOL_FROM_BYTES)


def allgather(array, name=None):
    """Every rank's array concatenated along the first axis, in rank order. The
    first dimension may differ between ranks; the other dimensions must agree.
    `array` may be a nested structure: each leaf is gathered so (a scalar or
    0-d leaf as one row, giving a 1-d array of one value per rank)."""
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.allgather")
    if _is_structure(array):
        return _allgather_structure(array, name)
    result = _fastpath.allgather(array, name)  # the common call, in C
    if result is not NotImplemented:
        return result
    return _allgather(array, name, blocking=True)


def barrier_async(name=None):
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.barrier_async")
    lib = core.ensure_initialized()
    return _submit(lib.tnt_barrier_async, auto_name("barrier", name), (), lambda h: None, ())


def barrier(name=None):
    """Return once every rank has entered the barrier."""
    if master_only.open_sections:  # on the master only: refused, the others never call it
        master_only.refuse("tnt.barrier")
    lib = core.ensure_initialized()
    _blocking(lib.tnt_barrier, auto_name("barrier", name), (), lambda h: None, ())


# ---- nested structures (see the module docstring) ----------------------------------------------


def _is_structure(x):
    return isinstance(x, (list, tuple, dict))


def flatten(structure):
    """(leaves, rebuild): the leaves of a nested structure in a fixed order,
    and a function that puts new leaves into the same structure."""
    if isinstance(structure, dict):
        try:
            keys = sorted(structure)
        except TypeError:
            raise TypeError(
                "a dict in a collective's structure needs keys that sort (its entries are visited in sorted "
                "key order, alike on every rank): all strings, say, or all numbers. Received keys of types "
                f"{', '.join(sorted({type(k).__name__ for k in structure}))}") from None
        parts = [flatten(structure[k]) for k in keys]

        def rebuild(values):
            built, i = {}, 0
            for k, (leaves, sub) in zip(keys, parts):
                built[k] = sub(values[i:i + len(leaves)])
                i += len(leaves)
            built = {k: built[k] for k in structure}  # the caller's key order
            return built if type(structure) is dict else _dict_like(structure, built)
    elif isinstance(structure, (list, tuple)):
        parts = [flatten(item) for item in structure]

        def rebuild(values):
            items, i = [], 0
            for leaves, sub in parts:
                items.append(sub(values[i:i + len(leaves)]))
                i += len(leaves)
            if isinstance(structure, list):
                return items
            return type(structure)(*items) if hasattr(structure, "_fields") else type(structure)(items)
    else:
        return [structure], lambda values: values[0]
    return [leaf for leaves, _ in parts for leaf in leaves], rebuild


def _dict_like(structure, items):
    """`items` (a dict) as the type of `structure`, a dict subclass: the result has the
    caller's structure, as a named tuple's has. An OrderedDict came back a plain dict, and
    a defaultdict without its default factory (a later `result[new_key]` raised KeyError).
    A subclass that cannot be made from a dict of items stays a plain dict."""
    try:
        if isinstance(structure, collections.defaultdict):
            return type(structure)(structure.default_factory, items)
        return type(structure)(items)
    except Exception:  # noqa: BLE001 - a constructor of its own: the items as a dict
        return items


def _leaf_array(leaf, what):
    """(array, is_scalar) for one leaf, or a TypeError naming its type."""
    if isinstance(leaf, np.ndarray):
        _refuse_masked(leaf, what)
        return leaf, False
    if isinstance(leaf, (int, float, np.number, np.bool_)):
        return np.asarray(leaf), True
    composite = composite_leaf_error(leaf, what)
    if composite is not None:  # NumPy read its rows as objects: "dtype object ... cast it"
        raise composite
    if hasattr(leaf, "numpy") or hasattr(leaf, "__array__"):  # a framework's tensor, say
        try:
            return np.asarray(leaf.numpy() if hasattr(leaf, "numpy") else leaf), False
        except Exception:
            raise TypeError(
                f"{what}: a tensor without a value (a symbolic tensor, in a traced function) "
                "cannot go through the NumPy collectives: call them eagerly, or use the "
                "framework frontend's collectives (tarantella.<frontend>.allreduce, ...). "
                f"Received: a leaf of type {type(leaf).__name__}") from None
    raise TypeError(
        f"{what} takes nested lists, tuples and dicts of arrays, scalars and tensors. "
        f"Received: a leaf of type {type(leaf).__name__}")


def composite_leaf_error(leaf, what):
    """The TypeError for a leaf that is a ragged or sparse tensor (tf.RaggedTensor,
    tf.SparseTensor, tf.IndexedSlices: an Embedding's gradient), known by its attributes (this
    module imports no framework), naming its type and what to pass instead; None for any other
    leaf. The NumPy collectives and tarantella.tensorflow's (eager and traced) both refuse them
    with it."""
    if hasattr(leaf, "flat_values"):
        instead = "rt.to_tensor() (padded), or rt.flat_values and rt.row_lengths()"
    elif hasattr(leaf, "indices") and hasattr(leaf, "dense_shape"):
        instead = ("tf.convert_to_tensor(g) (a gradient of an Embedding or tf.gather), or g.values and g.indices"
                   if type(leaf).__name__ == "IndexedSlices" else
                   "tf.sparse.to_dense(st), or st.values and st.indices")
    else:
        return None
    return TypeError(
        f"{what} takes dense arrays and tensors: a ragged or sparse tensor has no dense array of "
        f"numbers to send; pass its dense form or its components as leaves of their own: {instead}. "
        f"Received: a leaf of type {type(leaf).__name__}")


def _no_out(out, what):
    if out is not None:
        raise InvalidArgumentError(f"{what}: out= takes one array, not a structure. Received: out={type(out).__name__}")


def _groups(arrays):
    """{dtype: [leaf indices]} in the order the dtypes first appear."""
    groups = {}
    for i, a in enumerate(arrays):
        dtypes.core_dtype(a.dtype)  # an unsupported dtype is refused before any request
        groups.setdefault(a.dtype, []).append(i)
    return groups


class _Done:
    """The outcome of a blocking call where a handle is expected."""

    def __init__(self, value):
        self._value = value

    def wait(self):
        return self._value


def _layout(structure, arrays, gather=False):
    """The digest every rank's request of a fused structure carries (the core's
    `layout`): its skeleton (keys, list or tuple), each leaf's dtype and shape
    (gather: but the first dimension). Equal per-dtype counts do not make two
    structures alike: {"a": 2 values, "b": 3} against {"a": 3, "b": 2} would sum
    one rank's "b" into another's "a" without it. Odd, so never 0 (a 1-d array's)
    nor one array's _shape_layout (whose lowest bits are binary 10)."""
    return structure_layout(structure, [(a.dtype.str, a.shape[1:] if gather else a.shape) for a in arrays])


def structure_layout(structure, specs):
    """_layout from each leaf's (dtype.str, shape as a tuple of ints; gather: but the first
    dimension): what the compiled TensorFlow ops compute from the static shapes of a traced call,
    so that their requests carry the digest an eager call's carry."""
    text = f"{_skeleton(structure)}|{specs}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") | 1


def _skeleton(structure):
    """The structure with "*" for its leaves, dict keys in flatten's (sorted) order."""
    if isinstance(structure, dict):
        return "{" + ",".join(f"{k!r}:{_skeleton(structure[k])}" for k in sorted(structure)) + "}"
    if isinstance(structure, (list, tuple)):
        items = ",".join(_skeleton(item) for item in structure)
        return f"[{items}]" if isinstance(structure, list) else f"{type(structure).__name__}({items})"
    return "*"


def _wait_all(handles):
    """Each handle's result, in order. The first error any of them meets is
    raised as soon as it is known, whichever handle meets it."""
    lib = core.lib()
    while True:
        waiting = [h for h in handles if not isinstance(h, _Done) and not h.test()]  # test() raises an error met
        if not waiting:
            return [h.wait() for h in handles]
        lib.tnt_wait(waiting[0]._handle, _WAIT_SLICE_S)


def _structure_name(kind, name):
    """(name as bytes, unnamed) of a structure's first request, made by auto_name. An unnamed
    one has the name of the unnamed call of its kind NAME_WINDOW calls earlier, which may still
    be in flight (an async one): it is waited for first, as an array call's twin is (_submit).
    Submitted at once, the request was refused as in flight twice on the ranks where the earlier
    one was still pending, and the others waited for it until TNT_TIMEOUT_S."""
    base_name, unnamed = auto_name(kind, name, request_names.STRUCTURE_SUFFIX_BYTES)
    if unnamed and (_orphans or _unnamed_in_flight):
        _settle_before(base_name, True)
    return base_name, unnamed


def _structure_collective(structure, kind, name, start, now=None):
    """allreduce or broadcast of a structure: one request per dtype (the first
    through the blocking `now` where there is one), each carrying the
    structure's _layout; the others once the first has completed."""
    leaves, rebuild = flatten(structure)
    converted = [_leaf_array(leaf, kind) for leaf in leaves]
    arrays = [a for a, _ in converted]
    base_name, unnamed = _structure_name(kind, name)
    base = base_name.decode()
    layout = _layout(structure, arrays)
    # The first request is named `base` whatever its dtype, so that every rank has it and the
    # core compares it: ranks whose only leaves differ in dtype, or an empty structure (one
    # request of no values) against leaves, fail with the mismatch instead of waiting for
    # requests that have no partner until TNT_TIMEOUT_S.
    groups = _groups(arrays) or {np.dtype(np.float32): []}
    flats = [np.concatenate([np.ascontiguousarray(arrays[i]).reshape(-1) for i in idx] or [np.empty(0, dtype)])
             for dtype, idx in groups.items()]
    if now:  # the blocking call: metrics and losses in a loop
        first = _Done(now(flats[0], base, layout))
    else:
        first = start(flats[0], base, layout)
        if unnamed:
            _unnamed_in_flight[base_name] = first._handle  # for the call NAME_WINDOW calls later
    # The requests of the other dtypes only once the first has completed: it carries the structure's
    # digest and fails with a MismatchError on every rank where the ranks' structures differ. Submitted
    # with it, a request of a dtype that only some ranks had stayed in flight without a partner, and its
    # TimeoutError at TNT_TIMEOUT_S broke the whole job, where the mismatch was to fail this one call.
    # (One more round, for structures of several dtypes only.)
    first = first.wait()
    rest = [start(flat, f"{base}.{dtype.name}", layout) for dtype, flat in list(zip(groups, flats))[1:]]
    flats = [first] + _wait_all(rest)
    results = [None] * len(arrays)
    for idx, flat in zip(groups.values(), flats):
        offset = 0
        for i in idx:
            n = arrays[i].size
            value = flat[offset:offset + n].reshape(arrays[i].shape)
            results[i] = value[()] if converted[i][1] else value
            offset += n
    return rebuild(results)


def _allgather_structure(structure, name):
    """Every leaf gathered along its first axis, fused: one request for the
    leaves' row counts, one per dtype for the data (flat)."""
    leaves, rebuild = flatten(structure)
    arrays = [_leaf_array(leaf, "allgather")[0] for leaf in leaves]
    arrays = [a.reshape(1) if a.ndim == 0 else a for a in arrays]
    base = _structure_name("allgather", name)[0].decode()
    groups = _groups(arrays)
    # The rows' request carries the layout, under the call's own name: it is the one request every
    # rank has, whatever its leaves' dtypes, even an empty structure (one 0), which then fails against
    # leaves instead of leaving the others waiting; and against one array that another rank gathers
    # under the name, which it pairs with and fails against. (Named "<name>.rows", it had no partner
    # there, nor the array's request: both ranks waited until TNT_TIMEOUT_S.) The data's requests only
    # once it has completed, for the reason _structure_collective's other requests wait for its first.
    rows = _allgather(np.array([a.shape[0] for a in arrays] or [0], np.int64), base, True,
                      _layout(structure, arrays, gather=True))
    if not arrays:
        return rebuild([])
    data = [(idx, allgather_async(np.concatenate([np.ascontiguousarray(arrays[i]).reshape(-1)
                                                  for i in idx]), f"{base}.{dtype.name}"))
            for dtype, idx in groups.items()]
    rows = rows.reshape(-1, len(arrays))  # rows[q][i]: rank q's rows of leaf i
    results = [None] * len(arrays)
    for idx, handle in data:
        flat, offset, parts = handle.wait(), 0, {i: [] for i in idx}
        row_elems = {i: int(np.prod(arrays[i].shape[1:], dtype=np.int64)) for i in idx}
        for q in range(rows.shape[0]):
            for i in idx:
                n = int(rows[q][i]) * row_elems[i]
                parts[i].append(flat[offset:offset + n].reshape((int(rows[q][i]),) + arrays[i].shape[1:]))
                offset += n
        for i in idx:
            results[i] = np.concatenate(parts[i])
    return rebuild(results)


# ---- the original Tarantella's names ----------------------------------------------------------
class TensorAllreducer:
    """The original Tarantella's allreducer: `TensorAllreducer(inputs).allreduce(x)`
    is `allreduce(x)` (a sum over ranks, of an array, a scalar or a nested
    structure). `inputs` only gives the structure that `allreduce` expects."""

    _allreduce = staticmethod(allreduce)

    def __init__(self, inputs, **original):
        gone_arguments.refuse(f"tnt.{type(self).__name__}", original, gone_arguments.GROUP)
        self._count = len(flatten(inputs)[0])

    def allreduce(self, x):
        _check_like(x, self._count, "TensorAllreducer.allreduce")
        return _scalar_for_scalar(x, self._allreduce(x))


class TensorBroadcaster:
    """The original Tarantella's broadcaster: `TensorBroadcaster(inputs,
    root_rank).broadcast(x)` is `broadcast(x, root=root_rank)`. Ranks other
    than the root may call `broadcast()` without an argument: `inputs` then
    gives the structure, dtypes and shapes to receive."""

    _broadcast = staticmethod(broadcast)

    def __init__(self, inputs, root_rank=0, **original):
        gone_arguments.refuse(f"tnt.{type(self).__name__}", original, gone_arguments.GROUP)
        self._inputs = inputs
        self._count = len(flatten(inputs)[0])
        self.root_rank = root_rank

    def broadcast(self, x=None):
        x = self._inputs if x is None else x
        _check_like(x, self._count, "TensorBroadcaster.broadcast")
        return _scalar_for_scalar(x, self._broadcast(x, root=self.root_rank))


class TensorAllgatherer:
    """The original Tarantella's allgatherer: `TensorAllgatherer(inputs).allgather(x)`
    is `allgather(x)` (each leaf concatenated along its first axis, in rank order)."""

    _allgather = staticmethod(allgather)

    def __init__(self, inputs, **original):
        gone_arguments.refuse(f"tnt.{type(self).__name__}", original, gone_arguments.GROUP)
        self._count = len(flatten(inputs)[0])

    def allgather(self, x):
        _check_like(x, self._count, "TensorAllgatherer.allgather")
        return self._allgather(x)


def _scalar_for_scalar(x, result):
    """A NumPy scalar where `x` is a Python or NumPy scalar, as the original's
    TensorAllreducer and TensorBroadcaster returned (and as a scalar inside a
    structure comes back): `tnt.allreduce(1.5)` gives a 0-d array (docs/api.md),
    which json.dumps refuses, isinstance(v, float) denies and a dict or set
    cannot hold as a key, in a script written for the original."""
    if isinstance(x, (bool, int, float, complex, np.generic)) and isinstance(result, np.ndarray) \
            and result.ndim == 0:
        return result[()]
    return result


def _check_like(x, count, what):
    if len(flatten(x)[0]) != count:
        raise InvalidArgumentError(
            f"{what} takes a structure like the inputs it was made with ({count} leaves). "
            f"Received: {len(flatten(x)[0])} leaves")
