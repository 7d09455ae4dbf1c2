"""Memory for large fresh results, reused once nothing references it.

A plain `tnt.allreduce(x)` returns a new array. For a large one, NumPy's
allocation maps fresh pages from the kernel, and the collective then faults
every page in as it writes the result: measured on 2 ranks (bench/allreduce.py,
2026-11-24), 64 MB plain calls ran at 4.1 GB/s against 5.9 GB/s with `out=`,
16 MB at 5.0 against 6.4. A loop that drops each result before the next call
(`y = tnt.allreduce(x)`) would map and fault the same amount again every time.

So results of RESULT_POOL_FROM_BYTES or more are views of blocks kept here.
A block is reused only when nothing but this pool refers to it: every NumPy
view of it (the result, and any array made from the result) holds a reference
to the block, so its reference count says whether a user can still reach it.
A result that is still alive is never handed out again; TensorFlow, when it
aliases a returned array, keeps that array alive, and so the block.

The free block used last is handed out first: its lines may still be in the
cache. 4 ranks on 2 cores, 1 MB allreduces, 3 runs (2026-11-27): a loop that
drops each result before its next call ran 1.2-1.25x faster than one that
keeps it (`y = tnt.allreduce(x)`: two blocks take turns), where with the least
recently used free block first both ran alike.

Bounded: at most MAX_BLOCKS blocks and MAX_BYTES in all. When either is
exceeded, the least recently used blocks are let go; a block in use is then
simply freed by NumPy when its last view dies.
"""
import sys
import threading

import numpy as np

RESULT_POOL_FROM_BYTES = 1 << 20
MAX_BLOCKS = 8
MAX_BYTES = 1 << 30

_lock = threading.Lock()
_blocks = []  # uint8 arrays that own their memory, least recently used first


def _count_when_free():
    """sys.getrefcount of a block that only the pool's list and take()'s loop
    variable refer to (the loop below is take()'s, so the counts match)."""
    blocks = [np.empty(1, np.uint8)]
    for i in range(len(blocks)):
        raw = blocks[i]
        return sys.getrefcount(raw)


_FREE_REFS = _count_when_free()


def take(nbytes):
    """A uint8 block of exactly `nbytes` that no live array uses: reused, or new."""
    with _lock:
        for i in range(len(_blocks) - 1, -1, -1):  # the most recently used first: its lines may still be cached
            raw = _blocks[i]
            if raw.nbytes == nbytes and sys.getrefcount(raw) == _FREE_REFS:
                _blocks.append(_blocks.pop(i))  # most recently used last
                return raw
        raw = np.empty(nbytes, np.uint8)
        _blocks.append(raw)
        total = sum(b.nbytes for b in _blocks)
        while len(_blocks) > MAX_BLOCKS or (total > MAX_BYTES and len(_blocks) > 1):
            total -= _blocks.pop(0).nbytes
        return raw


def clear():
    """Let every block go (the ones in use live on in their arrays)."""
    with _lock:
        _blocks.clear()
