"""Run inside every rank (see test_threads.py): THREADS Python threads submit
their own named collectives (the names carry the thread's number, so the ranks
agree on them whatever the interleaving) and wait for them, while one more
thread submits its own and polls them with test() until they complete. With
MODE "shared", that thread also calls test() on the other threads' handles
while their owners wait for them. Every result is checked exactly (small
integers in every dtype: every partial sum is exact). The threads stop
together (an allreduce of "over BUDGET_S" every 16 iterations). Each worker
also makes one unnamed allreduce per iteration, of the same shape in every
thread. Then two living threads of one name make unnamed calls, and so do
pools of one and of two threads; with MODE "own", two threads drop the handles
of their async calls at once. Writes OUTDIR/rank<r>.json with the counts, the
errors seen, what the twins and the pools got, and how many dropped requests'
buffers were freed while in flight.

    rank_threads.py OUTDIR MODE THREADS BUDGET_S
"""
import concurrent.futures
import json
import multiprocessing.pool
import os
import random
import sys
import threading
import time
import weakref

import numpy as np

import tarantella as tnt
from tarantella.common import codes, core, request_names

outdir, mode, threads, budget_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rank, size = tnt.get_rank(), tnt.get_size()
DTYPES = [np.dtype(d) for d in (np.float16, np.float32, np.float64, np.int32, np.int64)]
lock = threading.Lock()
inflight = set()  # MODE shared: handles the poller tests while their owners wait for them
stats = {"checked": 0, "tests": 0, "tests_done": 0}
errors = []


def values(t, i, j, q, count, dtype):
    # in [-8, 8]: sums of a few ranks stay exact even in float16
    return ((np.arange(count, dtype=np.int64) * 5 + 3 * q + 7 * t + i + j) % 17 - 8).astype(dtype)


def start(plan, t, i, j):
    """Submit one collective; return (handle, expected result, label)."""
    kind = plan.choice(["allreduce", "allreduce", "broadcast", "allgather", "barrier"])
    name = f"thread{t}/iter{i}/{j}/{kind}"
    if kind == "barrier":
        return tnt.barrier_async(name=name), None, name
    dt = plan.choice(DTYPES)
    if kind == "allreduce":
        count = plan.choice([0, 1, plan.randrange(2, 4000), plan.randrange(4000, 200_000)])
        want = sum(values(t, i, j, q, count, np.int64) for q in range(size)).astype(dt)
        return tnt.allreduce_async(values(t, i, j, rank, count, dt), name=name), want, name
    if kind == "broadcast":
        count, root = plan.randrange(0, 100_000), plan.randrange(size)
        return tnt.broadcast_async(values(t, i, j, rank, count, dt), root=root, name=name), \
            values(t, i, j, root, count, dt), name
    rows = [plan.randrange(0, 300) for _ in range(size)]
    want = np.concatenate([values(t, i, j, q, 3 * rows[q], dt).reshape(-1, 3) for q in range(size)])
    return tnt.allgather_async(values(t, i, j, rank, 3 * rows[rank], dt).reshape(-1, 3), name=name), want, name


def check(got, want, label):
    with lock:
        stats["checked"] += 1
    ok = got is None if want is None else \
        got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
    if not ok:
        with lock:
            errors.append(f"rank {rank} {label}: got {got!r:.200}, want {want!r:.200}")


def stop_now(t, i):
    """Whether every rank's thread t is to stop (the same answer on every rank)."""
    over = np.array([time.monotonic() - begin > budget_s], np.int32)
    return i % 16 == 15 and tnt.allreduce(over, name=f"thread{t}/stop{i}")[0] > 0


def submit_some(t, i):
    """One to three requests in flight, submitted in this rank's own order."""
    js = list(range(random.Random(f"{t}-{i}").choice([1, 1, 2, 3])))  # the same on every rank
    started = {}
    for j in (js if rank % 2 == 0 else js[::-1]):
        started[j] = start(random.Random(f"{t}-{i}-{j}"), t, i, j)
    return [started[j] for j in (js[::-1] if (rank + i) % 2 else js)]


def unnamed_call(t, i, jitter):
    """An unnamed allreduce of one shape in every thread, after a pause of this
    rank's own: the threads' calls interleave differently on each rank, and
    each pairs with the same thread's on the other ranks all the same."""
    time.sleep(jitter.random() * 0.001)
    got = tnt.allreduce(np.full(3, 100 * t + rank + i, np.int64))
    check(got, np.full(3, size * (100 * t + i) + size * (size - 1) // 2, np.int64), f"thread{t}/unnamed{i}")


def worker(t):
    try:
        i = 0
        jitter = random.Random(f"{rank}-{t}")
        while not stop_now(t, i):
            unnamed_call(t, i, jitter)
            started = submit_some(t, i)
            if mode == "shared":
                with lock:
                    inflight.update(h for h, _, _ in started)
            for handle, want, label in started:
                got = handle.wait()
                with lock:
                    inflight.discard(handle)
                check(got, want, label)
            i += 1
    except Exception as exc:  # a thread's exception would otherwise only be printed
        with lock:
            errors.append(f"rank {rank} thread {t}: {type(exc).__name__}: {exc}")


def test_others():
    """MODE shared: test() every other thread's handle in flight."""
    if mode == "shared":
        with lock:
            others = list(inflight)
        for h in others:
            h.test()
        with lock:
            stats["tests"] += len(others)


def poller(t, workers_done):
    """Thread t: polls its own requests to completion with test() alone."""
    try:
        i = 0
        while not stop_now(t, i):
            started = submit_some(t, i)
            pending = [h for h, _, _ in started]
            while pending:
                test_others()
                still = [h for h in pending if not h.test()]
                with lock:
                    stats["tests"] += len(pending)
                    stats["tests_done"] += len(pending) - len(still)
                pending = still
                time.sleep(0.0002)
            for handle, want, label in started:
                check(handle.wait(), want, label)  # complete already: returns at once
            i += 1
        while mode == "shared" and not workers_done.is_set():
            test_others()
            time.sleep(0.0002)
    except Exception as exc:
        with lock:
            errors.append(f"rank {rank} poller: {type(exc).__name__}: {exc}")


tnt.init()
begin = time.monotonic()
workers_done = threading.Event()
poll = threading.Thread(target=poller, args=(threads, workers_done))
poll.start()
workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
workers_done.set()
poll.join()


def twins():
    """Two living threads of one name: the second's unnamed call is refused
    before anything is submitted (the two would number their calls in a race)."""
    called, release, refused = threading.Event(), threading.Event(), []

    def first():
        check(tnt.allreduce(np.ones(2, np.int64)), np.full(2, size, np.int64), "twin/first")
        called.set()
        release.wait()

    def second():
        try:
            tnt.allreduce(np.ones(2, np.int64))
        except tnt.InvalidUsageError as exc:
            refused.append(str(exc))

    a = threading.Thread(target=first, name="twin")
    a.start()
    called.wait()
    b = threading.Thread(target=second, name="twin")
    b.start()
    b.join()
    release.set()
    a.join()
    return refused


def pools():
    """Unnamed calls in a pool's tasks: refused in a pool of two threads (they
    take the tasks in an order of their own on each rank); a pool of one runs
    them in order, and they pair."""
    outcome = []
    with concurrent.futures.ThreadPoolExecutor(1) as one:
        got = one.submit(lambda: tnt.allreduce(np.full(2, rank, np.int64))).result()
        outcome.append(got.tolist())
    with concurrent.futures.ThreadPoolExecutor(2) as two:
        try:
            two.submit(lambda: tnt.allreduce(np.ones(2, np.int64))).result()
        except tnt.InvalidUsageError as exc:
            outcome.append(str(exc))
    with multiprocessing.pool.ThreadPool(2) as threads:
        try:
            threads.apply(lambda: tnt.allreduce(np.ones(2, np.int64)))
        except tnt.InvalidUsageError as exc:
            outcome.append(str(exc))
    # the names Tarantella gives its own requests (a DistributedOptimizer's): a pool's tasks
    # keep them (one task at a time pairs alike), a thread of its own adds its name
    with concurrent.futures.ThreadPoolExecutor(2) as two:
        outcome.append(two.submit(request_names.in_thread, "tnt.grads").result())
    named = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainer")
    outcome.append(named.submit(request_names.in_thread, "tnt.grads").result())
    named.shutdown()
    own = threading.Thread(target=lambda: outcome.append(request_names.in_thread("tnt.grads")), name="trainer")
    own.start()
    own.join()
    return outcome


def dropped(per_thread=500):
    """Two threads drop the handles of their async calls at once while the peers
    complete them: each submission reaps the dropped requests that completed, and
    tnt_test lets the other thread run meanwhile. Returns how many out= arrays
    were freed while their request was still in flight (each reaper rebuilt the
    list of dropped requests, losing what the other added: heap corruption)."""
    lib, freed_early, refs = core.lib(), [], []

    def freed(number):
        if lib.tnt_test(number) == codes.IN_PROGRESS:
            freed_early.append(number)

    def drop(t):
        for i in range(per_thread):
            out = np.empty(1000)
            number = tnt.allreduce_async(np.ones(1000), name=f"dropped{t}/{i}", out=out)._handle
            refs.append(weakref.ref(out, lambda _, number=number: freed(number)))
            if rank and i % 7 == 0:
                time.sleep(0.0005)  # the peer completes some while rank 0 drops more

    both = [threading.Thread(target=drop, args=(t,), name=f"dropper{t}") for t in range(2)]
    for t in both:
        t.start()
    for t in both:
        t.join()
    tnt.barrier(name="dropped")
    return len(freed_early)


def undecodable_name():
    """A thread whose name is not UTF-8 (os.fsdecode's of a file name's undecodable bytes: a lone
    surrogate) makes unnamed calls and takes a default name (request_names.in_thread): its name
    goes into theirs as a digest, as a name too long does (it raised UnicodeEncodeError)."""
    outcome = []

    def run():
        try:
            outcome.append(tnt.allreduce(np.full(3, rank + 1.0)).tolist())
            outcome.append(tnt.allgather(np.full((1, 2), rank)).tolist())
            outcome.append(request_names.in_thread("tnt.grads"))
        except Exception as exc:  # noqa: BLE001 - reported
            outcome.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name=os.fsdecode(b"data-\xff"))
    thread.start()
    thread.join()
    return outcome


twin_refused = twins()
pooled = pools()
undecodable = undecodable_name()
freed_in_flight = dropped() if mode == "own" else 0
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, **stats, "errors": errors[:20], "seconds": time.monotonic() - begin,
               "twin_refused": twin_refused, "pools": pooled, "freed_in_flight": freed_in_flight,
               "undecodable": undecodable}, f)
print(f"rank {rank}: {stats['checked']} collectives checked from {threads + 1} threads, {stats['tests']} test() "
      f"calls ({stats['tests_done']} found their request complete), {len(errors)} errors in "
      f"{time.monotonic() - begin:.1f} s")
sys.exit(1 if errors else 0)
