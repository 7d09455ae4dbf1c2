"""Large fresh results live in reused memory (tarantella/common/result_pool.py):
a result, or any view of it, that is still referenced is never handed out
again; one that is gone is reused; the pool stays bounded."""
import gc
import threading

import numpy as np
import pytest

from tarantella.common import collectives, result_pool


@pytest.fixture(autouse=True)
def empty_pool():
    result_pool.clear()
    yield
    result_pool.clear()


def address(a):
    return a.__array_interface__["data"][0]


def fresh(nbytes=4 << 20, dtype=np.float32):
    return collectives._result_like(np.empty(nbytes // np.dtype(dtype).itemsize, dtype))


def test_a_result_still_held_is_never_handed_out_again():
    held = [fresh() for _ in range(3)]
    for k, a in enumerate(held):
        a[:] = k
    later = [fresh() for _ in range(3)]
    for a in later:
        assert not any(np.shares_memory(a, h) for h in held)
        a[:] = -1
    for k, a in enumerate(held):
        assert (a == k).all()


def test_a_dropped_result_is_reused():
    a = fresh()
    del a
    b = fresh()
    # the same block (its pages already mapped: none fresh for this call), not a second one
    assert len(result_pool._blocks) == 1 and b.base is result_pool._blocks[0]
    assert address(b) % 64 == 0


def test_the_block_dropped_last_is_reused_first():
    # the most recently written block may still be in the cache: a loop that drops each result
    # before its next call (`tnt.allreduce(x).sum()`) keeps getting it, not an older free one
    a, b = fresh(), fresh()
    del a
    c = fresh()  # a's block, the only free one
    c_at, b_at = address(c), address(b)
    del b
    del c  # both free now; c's (a's) block was used last
    d = fresh()
    assert address(d) == c_at != b_at
    e = fresh()
    assert not np.shares_memory(d, e)


def test_a_view_keeps_its_block_alive():
    a = fresh()
    at = address(a)
    tail = a[-10:]
    tail[:] = 7
    del a
    b = fresh()
    assert not np.shares_memory(b, tail)
    b[:] = 0
    assert (tail == 7).all()
    blocks = {at, address(b)}
    del tail, b
    gc.collect()
    assert address(fresh()) in blocks  # both free again: one of them serves, no third block
    assert len(result_pool._blocks) == 2


def test_small_results_are_plain_arrays():
    small = collectives._result_like(np.empty(1000, np.float32))
    assert small.base is None  # a NumPy array of its own, not a pooled block's view
    assert not result_pool._blocks


def test_other_sizes_and_dtypes_get_their_own_blocks():
    a = fresh(4 << 20, np.float32)
    b = fresh(8 << 20, np.float64)
    assert a.dtype == np.float32 and b.dtype == np.float64 and b.nbytes == 8 << 20
    assert not np.shares_memory(a, b)


def test_the_pool_is_bounded():
    held = [fresh(1 << 20) for _ in range(result_pool.MAX_BLOCKS + 4)]
    assert len(result_pool._blocks) <= result_pool.MAX_BLOCKS
    for k, a in enumerate(held):  # blocks the pool let go stay with their arrays
        a[:] = k
    for k, a in enumerate(held):
        assert (a == k).all()


def test_threads_never_share_a_block():
    results, errors = [], []

    def work(k):
        try:
            for _ in range(50):
                a = fresh(1 << 20)
                a[:] = k
                results.append(a)
                if len(results) > 8:
                    results.pop(0)
                assert (a == k).all()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("shape,dtype", [((16384,), np.float32), ((300, 257), np.float64), ((5, 0, 3), np.int32),
                                         ((1 << 19,), np.float16)])
@pytest.mark.parametrize("pooled", [False, True])
def test_aligned_results_are_64_byte_aligned_writable_arrays_of_their_own_shape(shape, dtype, pooled):
    # TensorFlow aliases a returned array only at 64-byte alignment
    a = collectives.aligned_empty(shape, dtype, pooled=pooled)
    assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
    assert address(a) % 64 == 0
    a[...] = 1
    assert (a == 1).all()
