"""Run inside every rank: small allreduces in one round (the payload rides with
the negotiation; core.stats()['one_round'] counts them), their bits, their
fallbacks, and mismatches on that path. Writes OUTDIR/rank<r>.json."""
import json
import os
import sys
import time

import numpy as np

import tarantella as tnt
from tarantella.common import core

outdir = sys.argv[1]
rank, size = tnt.get_rank(), tnt.get_size()
seen = {}


def delta(before):
    after = core.stats()
    return {k: after[k] - before[k] for k in after}


# 1. a user's loop of plain unnamed calls: once the 60 unnamed names are known,
#    every call is a cache hit served in one round (no announcement, no data round)
x = np.arange(3, dtype=np.float32) + rank
for _ in range(60):
    tnt.allreduce(x)
before = core.stats()
results = [tnt.allreduce(x) for _ in range(120)]
seen["loop"] = delta(before)
seen["loop_ok"] = all((r == np.arange(3) * size + sum(range(size))).all() for r in results)

# 1b. a metrics dict of one dtype (a custom loop's loss and accuracy) is one
#     blocking request: one round too
for _ in range(60):
    tnt.allreduce({"loss": 0.5, "acc": 1.0})
before = core.stats()
metrics = [tnt.allreduce({"loss": 0.5 * rank, "acc": 1.0}) for _ in range(30)]
seen["metrics"] = delta(before)["one_round"]
seen["metrics_ok"] = all(m == {"loss": 0.5 * sum(range(size)), "acc": float(size)} for m in metrics)

# 1c. small broadcasts ride with their root's payload: a loop of unnamed calls
#     from two roots, every call a different value (a stale payload would show),
#     the root broadcasting in place (out=its input) among them; a broadcast
#     beyond the one-round limit takes the ring (not counted)
roots = (size - 1, 0)
for i in range(60):
    tnt.broadcast(np.full(5, rank, np.float64), root=roots[i % 2])
before = core.stats()
bcast_ok = True
for i in range(120):
    root = roots[i % 2]
    mine = np.full(5, 1000 * rank + i, np.float64)
    got = tnt.broadcast(mine, root=root, out=mine if rank == root and i % 3 == 0 else None)
    bcast_ok &= bool((got == 1000 * root + i).all())
seen["bcast_one_round"] = delta(before)["one_round"]
big_b = np.full(40000, rank, np.float32)  # 160 KB: beyond every one-round limit
for _ in range(2):
    tnt.broadcast(big_b, root=0, name="big-bcast")
before = core.stats()
bcast_ok &= bool((tnt.broadcast(big_b, root=0, name="big-bcast") == 0).all())
seen["bcast_big_one_round"] = delta(before)["one_round"]
seen["bcast_ok"] = bcast_ok

# 1d. small allgathers too, every rank giving its own number of rows (rank + 1)
#     and a different value every call; the rows of one rank changing is a new
#     announcement, then one round again; beyond the limit, the ring
for _ in range(60):
    tnt.allgather(np.zeros((rank + 1, 2), np.int64))
before = core.stats()
gather_ok = True
for i in range(120):
    got = tnt.allgather(np.full((rank + 1, 2), 100 * rank + i, np.int64))
    gather_ok &= got.tobytes() == np.concatenate([np.full((q + 1, 2), 100 * q + i, np.int64)
                                                  for q in range(size)]).tobytes()
seen["gather_one_round"] = delta(before)["one_round"]
rows = {q: 3 if q == 0 else 1 for q in range(size)}  # rank 0 changes its rows: announced again
for _ in range(3):
    got = tnt.allgather(np.full((rows[rank], 2), rank, np.int64), name="gather-rows")
    gather_ok &= got.tobytes() == np.concatenate([np.full((rows[q], 2), q, np.int64) for q in range(size)]).tobytes()
rows[0] = 2
before = core.stats()
for _ in range(3):
    got = tnt.allgather(np.full((rows[rank], 2), rank, np.int64), name="gather-rows")
    gather_ok &= got.tobytes() == np.concatenate([np.full((rows[q], 2), q, np.int64) for q in range(size)]).tobytes()
d = delta(before)
seen["gather_rows"] = (d["announcements"], d["one_round"])
big_g = np.full(20000, rank, np.float32)  # 80 KB from every rank: beyond every one-round limit
for _ in range(2):
    tnt.allgather(big_g, name="big-gather")
before = core.stats()
gather_ok &= bool((tnt.allgather(big_g, name="big-gather") == np.repeat(np.arange(size), 20000)).all())
seen["gather_big_one_round"] = delta(before)["one_round"]
seen["gather_ok"] = bool(gather_ok)
# ... and of 48 KB, above an allreduce's one-round limit with more than 2 ranks
# but not theirs: theirs has no additions that the direct path would share out
mid_b, mid_g = np.full(12288, rank + 0.5, np.float32), np.full(12288, rank, np.float32)
for _ in range(2):
    tnt.broadcast(mid_b, root=size - 1, name="mid-bcast")
    tnt.allgather(mid_g, name="mid-gather")
before = core.stats()
mid_ok = True
for i in range(5):
    mid_ok &= bool((tnt.broadcast(mid_b + i, root=size - 1, name="mid-bcast") == size - 0.5 + i).all())
    mid_ok &= bool((tnt.allgather(mid_g + i, name="mid-gather") == np.repeat(np.arange(size), 12288) + i).all())
seen["mid_bcast_gather"] = (delta(before)["one_round"], bool(mid_ok))

# 2. the same bits as the small path's order: segment j of the result is
#    c_j + c_(j+1) + ... + c_(j+N-1) (indices mod N), added left to right in
#    the dtype, segment j being the tensor's even split n*j/N
def ring_order(contribs):
    n = len(contribs[0])
    out = np.empty_like(contribs[0])
    for j in range(size):
        lo, hi = n * j // size, n * (j + 1) // size
        acc = contribs[j][lo:hi].copy()
        for k in range(1, size):
            acc = acc + contribs[(j + k) % size][lo:hi]
        out[lo:hi] = acc
    return out


contrib = [np.random.default_rng(q).standard_normal(1000).astype(np.float32) * 3.7 for q in range(size)]
expected = ring_order(contrib)
tnt.allreduce(contrib[rank], name="bits")  # negotiated in full; the next ones are cached
before = core.stats()
got = [tnt.allreduce(contrib[rank], name="bits") for _ in range(3)]
got.append(tnt.allreduce(contrib[rank], name="bits", out=np.empty(1000, np.float32)))
seen["bits_one_round"] = delta(before)["one_round"]
seen["bits"] = all(g.tobytes() == expected.tobytes() for g in got)
avg = tnt.allreduce(contrib[rank], name="bits-avg", op="average", prescale=2.0)
avg = tnt.allreduce(contrib[rank], name="bits-avg", op="average", prescale=2.0)
seen["avg_close"] = bool(np.allclose(avg, 2.0 * sum(contrib) / size, rtol=1e-5, atol=1e-5))
seen["avg_hex"] = avg.tobytes().hex()  # compared across ranks by the test

# 2b. 24 KB rides too with more than 2 ranks on one host (read in place from
#     the shared exchange buffers), in the same order; and in a cycle that also
#     runs a small allreduce of its own exchange (a fresh name), which must not
#     let the peers overwrite the payloads before they are added
mid = [np.random.default_rng(10 + q).standard_normal(6144).astype(np.float32) for q in range(size)]
mid_expected = ring_order(mid)
for _ in range(2):  # cached in this order: the integer average's slot comes first in a cycle's responses
    tnt.allreduce(np.full(3, rank, np.int32), op="average", name="mid-int")
    tnt.allreduce(mid[rank], name="mid")
before = core.stats()
mid_ok = True
for i in range(100):
    shift = np.float32(i)  # a different sum every call: a stale payload would show
    h_int = tnt.allreduce_async(np.full(3, rank + i, np.int32), op="average", name="mid-int")  # an exchange of its own
    h_mid = tnt.allreduce_async(mid[rank] + shift, name="mid")
    h_new = tnt.allreduce_async(np.full(7, rank + i, np.float32), name=f"fresh-{i}")
    got_int, got_mid, got_new = h_int.wait(), h_mid.wait(), h_new.wait()
    exact = tnt.allreduce(mid[rank] + shift, name="mid-check")  # the same contributions, the same order
    mid_ok &= got_mid.tobytes() == exact.tobytes() and bool((got_new == size * i + sum(range(size))).all())
    mid_ok &= bool((got_int == i + sum(range(size)) // size).all())
    mid_ok &= bool(np.allclose(got_mid, mid_expected + size * shift, rtol=1e-5, atol=1e-4))
seen["mid_one_round"] = delta(before)["one_round"]
got = tnt.allreduce(mid[rank], name="mid")
seen["mid"] = mid_ok and got.tobytes() == mid_expected.tobytes()

# 2c. beyond the one-round limit, more than 2 ranks on one host add every
#     rank's chunk in place (TNT_SHM_DIRECT; two exchange rounds per MiB): the
#     ring's order of additions, bit for bit, across chunks (1.2 MB is two) and
#     for tensors fused into one buffer (each keeps its own segments)
direct_ok = {}
for count, dtype in ((100003, np.float32), (300007, np.float32), (70001, np.float16)):
    parts = [(np.random.default_rng(100 + q).standard_normal(count) * 5).astype(dtype) for q in range(size)]
    want = ring_order(parts)
    got = [tnt.allreduce(parts[rank], name=f"direct-{count}") for _ in range(2)]
    direct_ok[f"{count}"] = all(g.tobytes() == want.tobytes() for g in got)
# 1 + 1e8 - 1e8 in float32 is 0 or 1 by the order of the additions: the result
# shows in which segment each element was added (fused: not an even split)
reveal = (1.0, 1e8, -1e8) + (0.0,) * size
fused = [[np.full(n, reveal[q], np.float32) for q in range(size)] for n in (50002, 30002)]
lead, fused_ok = np.ones(1 << 21, np.float32), True
for _ in range(6):  # submitted while an 8 MB allreduce runs, they wait for the next cycle together: fused
    h_lead = tnt.allreduce_async(lead, name="direct-lead")
    time.sleep(0.002)
    hs = [tnt.allreduce_async(parts_t[rank], name=f"direct-fused-{t}") for t, parts_t in enumerate(fused)]
    got = [h.wait() for h in hs]
    fused_ok &= bool((h_lead.wait() == size).all())
    fused_ok &= all(g.tobytes() == ring_order(parts_t).tobytes() for g, parts_t in zip(got, fused))
direct_ok["fused"] = fused_ok
seen["direct"] = direct_ok

# 3. not one round: an integer average (its own two-part sum) and a payload
#    beyond the one-round limit of an allreduce (24 KiB with more than 2 ranks); still exact
ints, big = np.full(5, 7 * rank, np.int64), np.ones(6145, np.float32)  # 24 KiB + 4 B
for _ in range(2):
    r_int = tnt.allreduce(ints, op="average", name="int-avg")
    r_big = tnt.allreduce(big, name="big")
before = core.stats()
r_int = tnt.allreduce(ints, op="average", name="int-avg")
r_big = tnt.allreduce(big, name="big")
seen["other_paths"] = delta(before)["one_round"]
seen["other_ok"] = bool((r_int == 7 * sum(range(size)) // size).all() and (r_big == size).all())

# 4. a peer that comes late: the calling thread's slice ends, the wait goes on
#    through a handle, and the result is the same
tnt.allreduce(x, name="late")
if rank == size - 1:
    time.sleep(0.7)
seen["late_ok"] = bool((tnt.allreduce(x, name="late") == np.arange(3) * size + sum(range(size))).all())
# ... and so for the other blocking calls (tnt_barrier, tnt_broadcast,
# tnt_allgather_into return TNT_IN_PROGRESS after one slice of 0.25 s)
late = {}
for kind, call in (("barrier", lambda: tnt.barrier(name="late-b") is None),
                   ("broadcast", lambda: bool((tnt.broadcast(np.full(3, rank + 5.0), root=0, name="late-c") == 5).all())),
                   ("allgather", lambda: tnt.allgather(np.full((rank + 1, 2), rank), name="late-g").tobytes() ==
                    np.concatenate([np.full((q + 1, 2), q) for q in range(size)]).tobytes())):
    call()  # cached, then late
    if rank == size - 1:
        time.sleep(0.4)
    late[kind] = call()
seen["late_others"] = late


# 5. mismatches on the one-round path: a cached name called with another size,
#    or as another collective, fails on every rank; the next calls work
def expect_mismatch(label, fn):
    try:
        fn()
        seen[label] = "no error"
    except tnt.MismatchError as exc:
        seen[label] = str(exc)


for _ in range(3):
    tnt.allreduce(np.ones(4, np.float32), name="hot")
    tnt.allreduce(np.ones(4, np.float32), name="hot-kind")
expect_mismatch("size", lambda: tnt.allreduce(np.ones(4 + (rank == 0), np.float32), name="hot"))
expect_mismatch("kind", lambda: (tnt.allreduce if rank == 0 else tnt.broadcast)(np.ones(4, np.float32),
                                                                                 name="hot-kind"))
seen["after"] = [bool((tnt.allreduce(np.ones(4, np.float32), name="hot") == size).all()) for _ in range(3)]
tnt.barrier()
with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
