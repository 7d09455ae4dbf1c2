"""Names of requests: the caller's, checked, or one made for an unnamed call.

The k-th unnamed call of a kind is "<kind>.<k mod 60>" on every rank (in a
thread other than the main one, "<kind>.<k mod 60>@<thread name>"). Counting
per kind pairs the k-th calls across ranks, so a rank that calls with another
shape or dtype gets a MismatchError at once; reusing 60 names lets a loop of
unnamed calls (whose pattern repeats with a period dividing 60) be served
from the core's response cache, one bit per call, instead of a full
announcement of a fresh name each time. A name still in flight from 60 calls
earlier is waited for first (collectives._settle_before): in a program every
rank runs alike, that older call depends only on calls before it, so the wait
always ends.
"""
import hashlib
import threading
import weakref

from tarantella.common.errors import InvalidArgumentError, InvalidUsageError

NAME_WINDOW = 60
# kind (the main thread's sequence) or (kind, sequence) -> its count: the core's counter of the
# sequence (tnt_sequence_counter, iterated by _fastpath.Counter), from which the compiled
# TensorFlow ops take the numbers of the unnamed calls traced in that sequence too
_counters = {}
_counter_lock = threading.Lock()
_unnamed_names = {}  # kind -> the main thread's NAME_WINDOW names, made once (no cost on the hot path)


# A nested structure's requests are named "<name>" (the first) and "<name>.<dtype>"
# (collectives.py): its name leaves room for the longest suffix.
STRUCTURE_SUFFIX_BYTES = len(".bfloat16")


def auto_name(kind, name, room=0):
    """(name as bytes, True if it was made here for an unnamed call). `room`:
    bytes the caller appends to the name (STRUCTURE_SUFFIX_BYTES), which a name
    given must leave free of the core's 255."""
    if name is not None:
        try:
            encoded = name.encode() if isinstance(name, str) else None
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): not UTF-8, so no name the core can take
            encoded = None
        if not encoded or len(encoded) > 255 - room or b"\0" in encoded:
            most = f"{255 - room} bytes (this call names its requests after it, adding up to {room} bytes, " \
                "such as '.float32')" if room else "255 bytes"
            raise InvalidArgumentError(
                f"name must be a non-empty string of at most {most}, in UTF-8, without NUL characters. "
                f"Received: name={name!r:.300}" + (f" ({len(encoded)} bytes)" if encoded else ""))
        return encoded, False
    thread = threading.current_thread()
    if thread is _MAIN_THREAD or isinstance(thread, _FOREIGN_THREAD):
        counter, names = unnamed_window(kind)
    else:
        counter, names = _thread_window(kind, thread)
    # next() on a counter is one atomic step (_fastpath.Counter): no lock needed for two threads to get two names
    return names[next(counter) % NAME_WINDOW], True


def unnamed_name(kind):
    """The next unnamed `kind` call's name in the calling thread's sequence, for the fast path (which
    numbers the main thread's calls itself, and takes this as functools.partial(unnamed_name, kind))."""
    return auto_name(kind, None)[0]


def unnamed_window(kind):
    """(counter, names) of a kind's unnamed calls in the main thread's sequence, made on first use."""
    names = _unnamed_names.get(kind)
    if names is None:
        counter = unnamed_counter(kind, None)
        with _counter_lock:
            if kind not in _unnamed_names:
                _unnamed_names[kind] = tuple(_sequence_name(kind, k, None) for k in range(NAME_WINDOW))
        names = _unnamed_names[kind]
        return counter, names
    return _counters[kind], names


def unnamed_counter(kind, sequence):
    """The count of a kind's unnamed calls in `sequence` (None: the main thread's), made on first
    use: the core's counter of counter_key(kind, sequence), which the compiled TensorFlow ops
    (tnt_ops.cc) take their unnamed calls' numbers from too. Iterated as itertools.count was
    (next(): the next number), each number taken atomically, with the GIL or without."""
    key = kind if sequence is None else (kind, sequence)
    counter = _counters.get(key)
    if counter is None:
        from tarantella import _fastpath
        from tarantella.common import core

        with _counter_lock:
            counter = _counters.get(key)
            if counter is None:
                lib, ffi = core.lib(), core.ffi()
                address = lib.tnt_sequence_counter(counter_key(kind, sequence).encode())
                if address == ffi.NULL:
                    raise MemoryError("no memory left for the count of unnamed collective calls")
                counter = _counters[key] = _fastpath.Counter(int(ffi.cast("uintptr_t", address)))
    return counter


def counter_key(kind, sequence):
    """The key of a kind's count of unnamed calls in `sequence` in the core (tnt_sequence_counter):
    "allreduce", "allreduce@worker" (the sequence as its names end, sequence_suffix)."""
    return kind + sequence_suffix(kind, sequence)


def sequence_suffix(kind, sequence):
    """What a sequence's names end with after "<kind>.<k>": "" for the main thread's, "@<thread
    name>" for a thread's, "@<digest>" where the thread's name cannot be in a request name (too
    long for a name of the longest k, with a NUL, or not UTF-8). One suffix for every k, so that
    the compiled ops make the names as Python does: "<kind>.<k mod NAME_WINDOW><suffix>"."""
    if sequence is None:
        return ""
    suffix = _utf8(f"@{sequence}")
    longest = len(f"{kind}.{NAME_WINDOW - 1}".encode())
    if suffix is None or longest + len(suffix) > 240 or b"\0" in suffix:
        return f"@{_digest(sequence)}"
    return suffix.decode()


# Threads: the k-th unnamed call of a kind made by a thread pairs with the k-th
# made by the thread of the same name on the other ranks. One sequence for the
# whole process let two threads' calls take each other's numbers in an order
# that differs between ranks, and calls of one shape then summed one thread's
# arrays on one rank with the other thread's on another, without a word. The
# main thread keeps the plain names ("allreduce.3"), and so do threads Python
# did not start (TensorFlow's executor threads): Python names those "Dummy-N"
# in the order they first call into it, which differs between ranks.
_MAIN_THREAD = threading.main_thread()
_FOREIGN_THREAD = getattr(threading, "_DummyThread", ())
_sequence_threads = {}  # thread name -> weak reference to the thread that numbers its unnamed calls
_thread_windows = threading.local()  # by_kind: {kind: (counter, names)} of this thread's sequence,
# made in context `generation`
_generation = 0  # contexts started (restart): a thread's windows of an earlier one are stale


def restart():
    """Number every sequence's unnamed calls from 0 again, as a new context starts (tnt.init, also
    after tnt.shutdown): every rank's sequences then start alike, whatever calls the ranks made in
    an earlier context. Kept, a rank that had made one unnamed call more there (one that failed at
    its shutdown) named the k-th call of the new context after the others' (k+1)-th, and the two
    were summed together without a word. Which thread owns which sequence stays known."""
    global _generation
    with _counter_lock:
        _counters.clear()
        _unnamed_names.clear()
        _generation += 1
        from tarantella.common import core

        core.lib().tnt_sequence_restart()  # the counters the compiled TensorFlow ops hold too


def thread_sequence():
    """The name of the calling thread's sequence of unnamed calls: None in the
    main thread and in threads Python did not start, else the thread's name
    (refused as for an unnamed call: a pool's worker thread, two living
    threads of one name)."""
    thread = threading.current_thread()
    if thread is _MAIN_THREAD or isinstance(thread, _FOREIGN_THREAD):
        return None
    return _sequence_of(thread)


def next_in_sequence(kind, sequence):
    """The next unnamed `kind` call's name (bytes) in the sequence `sequence` (thread_sequence() of
    the thread that made the call; None: the main thread's), for a call made on that thread's
    behalf in another thread (a traced collective that TensorFlow runs in a thread of its own). It
    shares the sequence's count with the thread's own unnamed calls, so that one rank that runs a
    step eagerly and another that runs it traced name its calls alike."""
    if sequence is None:
        counter, names = unnamed_window(kind)
        return names[next(counter) % NAME_WINDOW]
    return _sequence_name(kind, next(unnamed_counter(kind, sequence)) % NAME_WINDOW, sequence)


def in_thread(name):
    """A name Tarantella gives requests of its own when the caller gives none
    (a DistributedOptimizer's "tnt.grads.<digest>", a DistributedGradientTape's
    "tnt.tape", broadcast_variables' "tnt.bcast"): as it is in the main thread
    and in threads Python did not start, "<name>@<thread name>" in another
    thread (refused for two living threads of one name). Threads that each
    train a model of their own then pair with their namesakes on the other
    ranks, as their unnamed calls do. (Before, one name for every thread
    paired one thread's gradients on rank 0 with another thread's on rank 1
    whenever the two models' shapes agreed, without a word, or refused the
    name as in flight twice.) A pool's worker thread keeps the name as it is:
    its name says nothing of the task, and training in a pool one task at a
    time (`executor.submit(train).result()`) pairs alike on every rank."""
    thread = threading.current_thread()
    if thread is _MAIN_THREAD or isinstance(thread, _FOREIGN_THREAD) or _pool_of(thread):
        return name
    sequence = _sequence_of(thread)
    scoped = f"{name}@{sequence}"
    encoded = _utf8(scoped)
    # room for the callers' suffixes (".b0.12", ".s0.values")
    if encoded is None or len(encoded) > 200 or "\0" in scoped:
        scoped = f"{name}@{_digest(sequence)}"
    return scoped


def _thread_window(kind, thread):
    """(counter, names) of a kind's unnamed calls in a thread other than the main one. The count
    lives on with the thread's name (a later thread of the name goes on with it); the names live in
    the thread's own storage and go with it (a program that starts a thread per task keeps no 60
    names per thread)."""
    windows = getattr(_thread_windows, "by_kind", None)
    if windows is None or _thread_windows.generation != _generation:
        windows = _thread_windows.by_kind = {}
        _thread_windows.generation = _generation
    window = windows.get(kind)
    if window is None:
        sequence = _sequence_of(thread)  # may refuse: then nothing is kept, and every call refuses
        counter = unnamed_counter(kind, sequence)
        window = windows[kind] = (counter, tuple(_sequence_name(kind, k, sequence) for k in range(NAME_WINDOW)))
    return window


def _sequence_of(thread):
    """The name of a thread's sequence of unnamed calls: its own, which no other
    living thread may share (the two would number their calls in a race)."""
    name = thread.name
    known = _sequence_threads.get(name)
    if known is None or known() is not thread:
        pool = _pool_of(thread)
        if pool:
            raise InvalidUsageError(
                f"an unnamed collective call in a worker thread of a {pool}: its threads take the tasks in an "
                "order that differs between ranks, so their unnamed calls would pair wrongly across ranks. Name "
                "the calls after the task (name=f\"grads.{task}\"), or make them outside the pool")
        with _counter_lock:
            known = _sequence_threads.get(name)
            other = known() if known is not None else None
            if other is not None and other is not thread and other.is_alive():
                raise InvalidUsageError(
                    f"two threads named {name!r} make unnamed collective calls: each thread's unnamed calls pair "
                    "with those of the thread of the same name on the other ranks, so threads that make them "
                    "need names of their own (threading.Thread(name=...)), or the calls need names (name=...)")
            _sequence_threads[name] = weakref.ref(thread)  # a later thread of the name goes on with its count
    return name


def _pool_of(thread):
    """What pool `thread` works for ("" if none, or a pool of one thread: its
    tasks run in the order they were submitted). Read from the thread's target:
    the pools' own private attributes, so anything unexpected means no pool."""
    try:
        module = getattr(getattr(thread, "_target", None), "__module__", None)
        if module == "concurrent.futures.thread":
            executor = thread._args[0]()  # the worker holds its executor by a weak reference
            return "" if executor is not None and executor._max_workers == 1 else "ThreadPoolExecutor"
        if module == "multiprocessing.pool":
            return "multiprocessing ThreadPool"
    except Exception:  # noqa: BLE001 - another Python's internals: no verdict
        pass
    return ""


def _sequence_name(kind, k, sequence):
    """The k-th name of a sequence: "allreduce.3", or "allreduce.3@worker" in thread "worker"
    (a thread name too long for a request name, with a NUL or not UTF-8, is replaced by its digest; a
    structure's requests add up to 9 bytes, ".bfloat16", to the 255 a name may have)."""
    return f"{kind}.{k}{sequence_suffix(kind, sequence)}".encode()


def _utf8(text):
    """`text` in UTF-8, or None where it is not (a lone surrogate: os.fsdecode's of a file name's
    undecodable bytes, which a thread may be named after)."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return None


def _digest(sequence):
    """What stands for a thread's name in a request name where the name cannot: too long, with a NUL,
    or not UTF-8 (its lone surrogates are digested as they are, alike on every rank)."""
    return hashlib.blake2b(sequence.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
