"""Run inside each of 3 ranks by test_hardening.py: the numbers, names, fork
and lifecycle checks of the core's hardening, in one launch. Prints one line
"ok <check>" per check that passed; any failure raises (and fails the job)."""
import atexit
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import errors

# workers this rank starts before tnt.init(), for "workers-started-before-init-are-not-ranks":
# a fork pool's worker and a fresh interpreter (as a spawn pool's), which asks for its rank when told
early_pool = multiprocessing.get_context("fork").Pool(1)
EARLY = ("import sys\nimport tarantella as tnt\nsys.stdin.readline()\ntry:\n    print('joined as rank', tnt.get_rank())\n"
         "except tnt.InvalidUsageError as exc:\n    print('refused:', exc)\n")
early_spawned = subprocess.Popen([sys.executable, "-c", EARLY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def ok(check):
    print(f"ok {check}", flush=True)


# an exit handler registered after `import tarantella` but before the first call makes a last
# collective: Tarantella's own (its shutdown), registered at the core's first use, ran before
# it, and its allreduce failed with "tnt.shutdown() was called" (Python ignored it: exit 0)
main_pid = os.getpid()


def last_collective():
    if os.getpid() == main_pid:  # not in the forked child below
        assert (tnt.allreduce(np.ones(2), name="in-an-exit-handler") == tnt.get_size()).all()
        ok("collective-in-an-exit-handler-registered-before-the-first-call")


atexit.register(last_collective)

rank, size = tnt.get_rank(), tnt.get_size()


def expect(error, fn, *words):
    try:
        fn()
    except error as exc:
        for w in words:
            assert w in str(exc), (w, str(exc))
        return exc
    raise AssertionError(f"{fn} did not raise {error.__name__}")


# float16 average of large values: scaled by 1/N before the sum, no overflow
x16 = np.full(1000, 30000, np.float16)  # 3 x 30000 > 65504, the float16 maximum
avg16 = tnt.allreduce(x16, op="average", name="f16-average")
assert np.isfinite(avg16).all() and np.allclose(avg16.astype(np.float32), 30000, rtol=1e-3), avg16[:4]
ok("float16-average-no-overflow")

# integer average: the exact floor of the mean, near the limits and negative
for dt in (np.int32, np.int64):
    info = np.iinfo(dt)
    mine = np.array([info.max - rank, info.min + rank, -7 - rank, 5 + 2 * rank, -1, 0], dt)
    every = np.stack([np.array([info.max - r, info.min + r, -7 - r, 5 + 2 * r, -1, 0], dt) for r in range(size)])
    want = np.array([sum(int(v) for v in col) // size for col in every.T], dt)  # exact, Python ints
    got = tnt.allreduce(mine, op="average", name=f"int-average-{np.dtype(dt).name}")
    assert (got == want).all(), (dt, got, want)
    small = np.array([-7 - rank, 5 + 2 * rank, 1], dt)  # a whole prescale applies before the average
    got3 = tnt.allreduce(small, op="average", prescale=-3, name=f"int-average-prescaled-{np.dtype(dt).name}")
    want3 = np.array([sum(-3 * int(v) for v in col) // size for col in
                      np.stack([np.array([-7 - r, 5 + 2 * r, 1]) for r in range(size)]).T], dt)
    assert (got3 == want3).all(), (dt, got3, want3)
    expect(errors.InvalidArgumentError, lambda: tnt.allreduce(mine, prescale=0.5, name="int-prescale"), "integer")
    # a whole factor past int64's range was refused as if it were a fraction ("must be a whole number")
    expect(errors.InvalidArgumentError, lambda: tnt.allreduce(mine, prescale=2.0 ** 63, name="int-prescale"),
           "below 9.2e18")
ok("integer-average-exact")

# a name with a NUL byte would be cut at the NUL and paired with another name
expect(errors.InvalidArgumentError, lambda: tnt.allreduce(np.ones(2), name="a\0b"), "NUL")
# a lone surrogate is no UTF-8 (it raised UnicodeEncodeError); a structure's name of
# 247-255 bytes was refused only at its second request, naming that request's suffixed name
expect(errors.InvalidArgumentError, lambda: tnt.allreduce(np.ones(2), name="\ud800"), "UTF-8")
mixed = {"a": np.ones(2, np.float32), "b": np.ones(2, np.int32)}
expect(errors.InvalidArgumentError, lambda: tnt.allreduce(mixed, name="n" * 250), "at most 246 bytes")
assert tnt.allreduce(mixed, name="n" * 246)["b"].tolist() == [size, size]
ok("nul-name-refused")

# fusion never changes the bits: one tensor's result, alone and fused behind
# tensors of other sizes, is the same (3 ranks: the order of additions matters)
rng = np.random.default_rng(1234 + rank)
target = rng.standard_normal(10_007).astype(np.float32)
alone = tnt.allreduce(target, name="target-alone")
for variant, lead in enumerate([1, 3, 1000, 5001, 40_000, 300_000]):
    handles = [tnt.allreduce_async(rng.standard_normal(lead).astype(np.float32), name=f"lead-{variant}"),
               tnt.allreduce_async(target, name=f"target-{variant}")]
    fused = [h.wait() for h in handles][1]
    assert fused.tobytes() == alone.tobytes(), (variant, np.flatnonzero(fused != alone)[:5])
small = rng.standard_normal(5).astype(np.float32)  # the one-exchange path must add in the ring's order too
small_alone = tnt.allreduce(small, name="small-alone")
handles = [tnt.allreduce_async(np.ones(1 << 16, np.float32), name="big-lead"),
           tnt.allreduce_async(small, name="small-fused")]
assert [h.wait() for h in handles][1].tobytes() == small_alone.tobytes()
ok("fusion-independent-bits")

# unnamed calls in a steady loop are served from the response cache (one bit
# each), not announced afresh; more unnamed requests in flight than names in the
# window still pair correctly; an unnamed call of another shape still fails at once
from tarantella.common import core  # noqa: E402

before = core.stats()
one = np.ones(1, np.float32)
for i in range(300):
    assert tnt.allreduce(one)[0] == size
after = core.stats()
announced, hits = after["announcements"] - before["announcements"], after["cache_hits"] - before["cache_hits"]
assert announced <= 70 and hits >= 230, (announced, hits)
many = [tnt.allreduce_async(np.full(3, i, np.int64)) for i in range(75)]
assert [int(h.wait()[0]) for h in many] == [i * size for i in range(75)]
expect(errors.MismatchError, lambda: tnt.allreduce(np.ones(3 + rank, np.float32)), "allreduce")
assert tnt.allreduce(one)[0] == size  # a mismatch fails that call only
ok("unnamed-calls-hit-the-cache")

# nested structures fused into one request per dtype: ranks whose structures
# differ (keys, leaf shapes, dtypes) fail on every rank, even where each
# dtype's count agrees; before, {"a": 2, "b": 3 values} summed with {"a": 3, "b": 2}
one_f, ten_f = np.ones(2 + (rank > 0), np.float32), np.full(3 - (rank > 0), 10, np.float32)
expect(errors.MismatchError, lambda: tnt.allreduce({"a": one_f, "b": ten_f}), "structure")
expect(errors.MismatchError, lambda: tnt.allreduce({"a": one, "b" if rank else "c": one}), "structure")
expect(errors.MismatchError, lambda: tnt.broadcast({"a": one_f, "b": ten_f}), "structure")
expect(errors.MismatchError, lambda: tnt.allgather({"a": np.zeros((2, 2 + (rank > 0)), np.float32),
                                                     "b": np.zeros((1, 3 - (rank > 0)), np.float32)}), "structure")
extra = {"n": np.ones(4, np.int32)} if rank == 0 else {}  # a dtype only rank 0 has: its request has no partner
expect(errors.MismatchError, lambda: tnt.allreduce({"a": one, **extra}), "structure")
expect(errors.MismatchError, lambda: tnt.broadcast([one, *extra.values()]), "structure")
alike = tnt.allreduce({"a": np.ones(2, np.float32), "b": np.full(3, 10, np.float32), "n": np.ones(4, np.int32)})
assert (alike["a"] == size).all() and (alike["b"] == 10 * size).all() and (alike["n"] == size).all(), alike
# the first request of a structure has one name whatever its dtype: where the ranks' only
# leaves differ in dtype, or one rank's structure is empty, the others used to wait for a
# request with no partner until TNT_TIMEOUT_S
expect(errors.MismatchError, lambda: tnt.allreduce({"a": np.ones(2, np.int32 if rank else np.float32)}),
       "structure")
expect(errors.MismatchError, lambda: tnt.allreduce({} if rank == 0 else {"a": one}), "structure")
expect(errors.MismatchError, lambda: tnt.broadcast([] if rank == 1 else [one]), "structure")
expect(errors.MismatchError, lambda: tnt.allgather({} if rank == 2 else {"a": np.ones((1, 2), np.float32)}),
       "structure")
# a structure of two dtypes against one array of the first: the array's rank takes no part in anything
# more than that one request
expect(errors.MismatchError, lambda: tnt.allreduce({"a": one, "n": np.ones(3, np.int32)} if rank == 0 else one),
       "structure")
# an allgather of a structure against one of an array: the structure's first request had a name of its own
# ("allgather.<k>.rows"), so neither had a partner and both waited until TNT_TIMEOUT_S
expect(errors.MismatchError, lambda: tnt.allgather({"a": np.ones((1, 2))} if rank == 1 else np.ones((1, 2))),
       "structure")
assert tnt.allreduce({}) == {} and tnt.broadcast(()) == () and tnt.allgather([]) == []
# ... and they leave no request in flight: the request of a dtype that only some ranks had (the int32
# above, rank 0's; the float32 data of the allgather that rank 2 had none of) had no partner, and its
# TimeoutError at TNT_TIMEOUT_S broke the whole job (every later collective failed), where the
# MismatchError was to fail that one call
from tarantella.common import codes, collectives  # noqa: E402

collectives._reap_orphans()
pending = [h for h, _ in collectives._orphans if core.lib().tnt_test(h) == codes.IN_PROGRESS]
assert not pending, f"{len(pending)} requests of the structures that differ are still in flight"
ok("nested-structures-that-differ-fail")

# arrays of other shapes but the same number of elements fail on every rank, on
# every path (the fast path in C, the general path in Python, the async calls),
# with both shapes in the message; before, they were combined element by element
# ((2, 3) summed into (3, 2)). 0-d against a 1-element vector stays accepted.
six = np.arange(6, dtype=np.float32)
mine = (2, 3) if rank == 0 else (3, 2)
shown = ("shape (2, 3)", "shape (3, 2)")
unchecked = []
for path, call in (
        ("allreduce", lambda: tnt.allreduce(six.reshape(mine), name="shape-allreduce")),
        ("allreduce unnamed", lambda: tnt.allreduce(six.reshape(mine))),
        ("allreduce general path", lambda: tnt.allreduce(six.reshape(mine), prescale=1, name="shape-general")),
        ("allreduce_async", lambda: tnt.allreduce_async(six.reshape(mine), name="shape-allreduce-async").wait()),
        ("broadcast", lambda: tnt.broadcast(six.reshape(mine), name="shape-broadcast")),
        ("broadcast out=", lambda: tnt.broadcast(six.reshape(mine), out=np.empty(mine, np.float32), name="shape-out")),
        ("broadcast_async", lambda: tnt.broadcast_async(six.reshape(mine), name="shape-broadcast-async").wait()),
        ("allgather", lambda: tnt.allgather(six.reshape((1,) + mine), name="shape-allgather")),
        ("allgather_async", lambda: tnt.allgather_async(six.reshape((1,) + mine), name="shape-gather-async").wait()),
        ("allgather of no rows", lambda: tnt.allgather(six.reshape((1, 1) + mine)[:0], name="shape-allgather-none")),
        ("allgather of empty rows",
         lambda: tnt.allgather(np.zeros((2,) + ((0, 3) if rank == 0 else (3, 0))), name="shape-empty-rows"))):
    try:
        expect(errors.MismatchError, call, "shape")
    except AssertionError as exc:
        unchecked.append(f"{path}: {exc}")
assert not unchecked, unchecked
expect(errors.MismatchError, lambda: tnt.allreduce(six.reshape(mine), name="shape-words"), *shown)
expect(errors.MismatchError, lambda: tnt.allgather(six.reshape((1,) + mine), name="shape-rows-words"), *shown)
# a 2-d array against a 1-d one of its elements (ndim 2 carries its shape)
expect(errors.MismatchError, lambda: tnt.allreduce(six.reshape(1, 6) if rank == 0 else six, name="shape-1-6"),
       "shape (1, 6)")
# the same shapes still work, the names that failed too; an allgather's first dimension may differ
assert (tnt.allreduce(six.reshape(2, 3), name="shape-allreduce") == size * six.reshape(2, 3)).all()
assert (tnt.allreduce(six.reshape(2, 3)) == size * six.reshape(2, 3)).all()
assert (tnt.broadcast(six.reshape(3, 2) + rank, name="shape-broadcast") == six.reshape(3, 2)).all()
rows = tnt.allgather(np.full((rank + 1, 2, 3), rank, np.int32), name="shape-allgather")
assert rows.shape == (size * (size + 1) // 2, 2, 3) and rows[-1, 0, 0] == size - 1, rows.shape
# a scalar (0-d) and a 1-element vector: one value each, accepted as before
scalar_or_vector = np.float32(rank) if rank == 0 else np.full(1, rank, np.float32)
summed = tnt.allreduce(scalar_or_vector, name="shape-0d")
assert np.shape(summed) == np.shape(scalar_or_vector) and np.asarray(summed).item() == sum(range(size)), summed
sent = tnt.broadcast(np.asarray(scalar_or_vector) + 1, root=1, name="shape-0d-b")
assert sent.shape == np.shape(scalar_or_vector) and sent.item() == 2, sent
assert tnt.allgather(np.asarray(scalar_or_vector), name="shape-0d-g").tolist() == list(range(size))
ok("shapes-that-differ-fail")

# Ctrl+C while a blocking call waits for late peers: the KeyboardInterrupt is
# raised as the Python that takes over the wait is entered, before a Handle owns
# the request. The request must keep its buffers (the orphans hold them) until the
# core has written the result: they were freed, and the sum landed in memory that
# other arrays had taken. The peers submit only after rank 0's interrupt.
import signal  # noqa: E402

from tarantella.common import codes, collectives  # noqa: E402


def interrupt(*_):
    raise KeyboardInterrupt


for path, prescale in (("fast", 1.0), ("general", 1)):  # an int prescale takes the Python path
    name = f"interrupted-{path}"
    if rank == 0:
        signal.signal(signal.SIGALRM, interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # within the call's first 0.25 s slice
        expect(KeyboardInterrupt, lambda: tnt.allreduce(np.ones(20_000), name=name, prescale=prescale))
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        kept = [(h, k) for h, k in collectives._orphans if k and k[1].shape == (20_000,)]
        assert len(kept) == 1, (path, collectives._orphans)
    tnt.barrier(name=f"{name}-caught")
    if rank:
        tnt.allreduce(np.ones(20_000), name=name, prescale=prescale)
    else:
        assert core.lib().tnt_wait(kept[0][0], 60.0) == codes.SUCCESS
        assert (kept[0][1][1] == size).all(), (path, kept[0][1][1][:4])  # the result, written into a live array
        del kept
ok("ctrl-c-in-a-blocking-call-keeps-its-buffers")

# workers started before tnt.init() (at the top of this file) inherited TNT_RANK and TNT_JOB_ID
# before this rank had anything to mark them with: their get_rank() found the job's segment name
# gone (removed once every rank has attached) and made a second job under the job's id, which
# paired the ranks' workers without a word (or waited TNT_TIMEOUT_S where one rank had none).
# They are refused, naming this rank's process, as workers started after tnt.init() are.
try:
    got = early_pool.apply(tnt.get_rank)
except errors.InvalidUsageError as exc:
    assert f"started by pid {os.getpid()}," in str(exc), str(exc)
else:
    raise AssertionError(f"a fork pool's worker made before tnt.init() got rank {got}")
early_pool.close()
early_pool.join()
said, _ = early_spawned.communicate("go\n", timeout=120)
assert said.startswith("refused:") and f"started by pid {os.getpid()}," in said, said
assert (tnt.allreduce(np.ones(3), name="after-early-workers") == size).all()
ok("workers-started-before-init-are-not-ranks")

# fork(): the child is not a rank. Its collectives fail clearly; its exit
# (atexit, shutdown) leaves the parent's job untouched.
pid = os.fork()
if pid == 0:
    code = 0
    try:
        expect(errors.InvalidUsageError, lambda: tnt.allreduce(np.ones(2), name="from-child"), "forked child")
        expect(errors.InvalidUsageError, lambda: tnt.get_rank(), "forked child")
    except AssertionError as exc:
        print(f"child: {exc}", file=sys.stderr, flush=True)
        code = 3
    sys.exit(code)  # a normal exit: atexit handlers run in the child
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert (tnt.allreduce(np.ones(3), name="after-fork") == size).all()
ok("fork-child-is-not-a-rank")


# a wait with a bound of the caller's ends with a TimeoutError that says the request
# is still pending (it used to carry the advice of the job's TNT_TIMEOUT_S), and the
# request completes later; the peers submit only after rank 0's bounded wait
if rank == 0:
    bounded = tnt.allreduce_async(np.ones(2), name="bounded-wait")
    expect(errors.TimeoutError, lambda: bounded.wait(timeout=0), "still pending", "may be called again")
tnt.barrier(name="after-bounded-wait")
if rank:
    bounded = tnt.allreduce_async(np.ones(2), name="bounded-wait")
assert (bounded.wait() == size).all()
ok("bounded-wait-says-still-pending")

# Ctrl+C in a wait with a timeout of the caller's ends it, as in a wait without one: the wait was one
# call into the core for the whole timeout, and the KeyboardInterrupt came only once the request
# completed or the timeout ended. Here the peers submit only after rank 0's interrupt, and the timeout
# is beyond TNT_TIMEOUT_S: an interrupt that does not end the wait leaves the job to time out.
if rank == 0:
    interrupted = tnt.allreduce_async(np.ones(2), name="interrupted-bounded-wait")
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    expect(KeyboardInterrupt, lambda: interrupted.wait(timeout=600))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
tnt.barrier(name="after-interrupted-bounded-wait")
if rank:
    interrupted = tnt.allreduce_async(np.ones(2), name="interrupted-bounded-wait")
assert (interrupted.wait(timeout=60) == size).all()
ok("ctrl-c-ends-a-wait-with-a-timeout")

# an unnamed structure has the name of the unnamed call of its kind 60 calls earlier, as an array has:
# it waits for that call where it is still in flight. It was submitted at once, refused on rank 0 as a
# name in flight twice (InvalidUsageError), and the others waited for it until TNT_TIMEOUT_S. Here the
# others start their calls once rank 0 has submitted its 60, so rank 0's first is still pending.
from tarantella.common import request_names  # noqa: E402

for kind in ("allreduce", "broadcast"):
    start_async = getattr(tnt, f"{kind}_async")
    if rank == 0:
        early = [start_async(np.full(2, 1.0 + rank)) for _ in range(request_names.NAME_WINDOW)]
        gate = tnt.barrier_async(name=f"structure-window-{kind}")
    else:
        tnt.barrier(name=f"structure-window-{kind}")
        early = [start_async(np.full(2, 1.0 + rank)) for _ in range(request_names.NAME_WINDOW)]
    late = getattr(tnt, kind)({"a": np.full(3, 1.0 + rank)})
    want = sum(1.0 + r for r in range(size)) if kind == "allreduce" else 1.0
    assert (late["a"] == want).all() and all((h.wait() == want).all() for h in early), (kind, late)
    if rank == 0:
        gate.wait()
ok("unnamed-structure-waits-for-its-name")

# Ctrl+C while an unnamed call waits for its name's call 60 calls earlier: the earlier call, still in
# flight, was taken out of the names in flight before the wait, so the name's next use went to the core
# beside it (refused there as a name in flight twice). It stays the name's call in flight. The others
# submit their calls only after rank 0's interrupt; rank 0 then makes its interrupted call by name.
if rank == 0:
    window = [tnt.allreduce_async(np.ones(2)) for _ in range(request_names.NAME_WINDOW)]
    first_name = next(n for n, h in collectives._unnamed_in_flight.items() if h == window[0]._handle)
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    expect(KeyboardInterrupt, lambda: tnt.allreduce(np.ones(2)))  # waits for window[0]: the others are not there
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert collectives._unnamed_in_flight.get(first_name) == window[0]._handle, first_name
    gate = tnt.barrier_async(name="interrupted-settle")
    assert all((h.wait() == size).all() for h in window)
    assert (tnt.allreduce(np.ones(2), name=first_name.decode()) == size).all()
    gate.wait()
else:
    tnt.barrier(name="interrupted-settle")
    window = [tnt.allreduce_async(np.ones(2)) for _ in range(request_names.NAME_WINDOW)]
    assert (tnt.allreduce(np.ones(2)) == size).all()
    assert all((h.wait() == size).all() for h in window)
ok("ctrl-c-in-the-wait-for-a-names-earlier-call-keeps-it")

# an allgather of rows of no elements is one request: its row counts were a second collective, made in
# whichever test() or wait() first saw the first request complete, a moment that differs between ranks.
# Here the others' test() runs before rank 0 has submitted (False), rank 0's wait() after: rank 0 then
# waited in the row counts' gather while the others waited in their next collective, until TNT_TIMEOUT_S
if rank == 0:
    tnt.barrier(name="rows-of-nothing-gate")
    nothing = tnt.allgather_async(np.zeros((rank + 1, 0)), name="rows-of-nothing")
    gathered = nothing.wait()
    tnt.allreduce(np.ones(2), name="rows-of-nothing-after")
else:
    nothing = tnt.allgather_async(np.zeros((rank + 1, 0)), name="rows-of-nothing")
    assert not nothing.test()  # rank 0 has not submitted it yet
    tnt.barrier(name="rows-of-nothing-gate")
    tnt.allreduce(np.ones(2), name="rows-of-nothing-after")
    gathered = nothing.wait()
assert gathered.shape == (sum(q + 1 for q in range(size)), 0), gathered.shape
ok("rows-of-no-elements-are-one-request")

# a handle waited for after shutdown raises instead of returning None
tnt.barrier(name="before-shutdown")
h = tnt.allreduce_async(np.ones(2), name="never-completes" if rank == 0 else "other-name")
if rank == 0:  # one unnamed call more than the others make: "unnamed-calls-numbered-afresh-after-init"
    extra = tnt.allreduce_async(np.ones(2))
tnt.shutdown()
expect(errors.InvalidUsageError, h.wait)
if rank == 0:
    expect(errors.InvalidUsageError, extra.wait)
ok("wait-after-shutdown-raises")

# a handle kept across shutdown and init names no request of the new context:
# generations restarted at 1, so the first request of the new context had the
# stale handle's number, whose wait returned its never-written result
tnt.init()
# ... also one waited for after the shutdown: its wait kept the shutdown's error, and raised it again
# ("finalized on this rank: call tnt.init() again first") after tnt.init()
expect(errors.InvalidArgumentError, h.wait, "before tnt_finalize")
stale = tnt.allreduce_async(np.ones(2), name=f"pending-at-shutdown-{rank}")  # the context's first request
if rank:
    # ... and rank 0 shuts down first: the others' engines fail their pending request (PeerLostError,
    # the job's failure) before their own shutdown, which the program never saw (nobody waits for it
    # in this context). The job's exit reported that failure as "caught" now and then (1 run in 3):
    # a failure counts once a call of the program's got it
    time.sleep(1)
tnt.shutdown()
tnt.init()
fresh = tnt.allreduce_async(np.full(2, 1.0 + rank), name="first-after-init")
expect(errors.InvalidArgumentError, stale.wait, "before tnt_finalize")
assert (fresh.wait() == sum(1.0 + r for r in range(size))).all()
ok("handle-from-before-shutdown-refused-after-init")

# unnamed calls pair by their number in each rank's sequence: a new context numbers them from 0 on
# every rank, whatever the ranks' earlier contexts made. Rank 0 made one unnamed call more before the
# first shutdown above (it failed there), and the k-th call of a new context on rank 0 was named after
# the others' (k+1)-th: its sum took their second arrays for their first, without a word
calls = [tnt.allreduce_async(np.full(2, 10.0 * k + rank)) for k in range(2)]
for k, handle in enumerate(calls):
    got = handle.wait()
    assert (got == sum(10.0 * k + r for r in range(size))).all(), (k, got)
# the fast path's blocking call takes its number from the same new count (it holds the counter)
assert (tnt.allreduce(np.full(2, 0.5 + rank)) == sum(0.5 + r for r in range(size))).all()
assert (tnt.allreduce_async(np.full(2, 1.0 + rank)).wait() == sum(1.0 + r for r in range(size))).all()
ok("unnamed-calls-numbered-afresh-after-init")
