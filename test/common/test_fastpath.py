"""tnt.allreduce's common call is served by the C fast path
(tarantella/common/_fastpath.c): counted by how often the general Python path
runs, not timed. Its results are the general path's bits, on every rank, also
when unnamed requests of other kinds are in flight and when a peer is slow."""

import pytest

from core_helpers import rank_reports


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    return rank_reports(tmp_path_factory.mktemp("fastpath"), 3, "rank_fastpath.py")


def test_common_calls_never_take_the_general_path(observed):
    # 5 dtypes x 5 sizes x 3 salts x 4 forms, and 15 averages: 315 calls after a barrier and a broadcast
    assert all(o["general_calls"] == 0 for o in observed), [o["general_calls"] for o in observed]


def test_common_calls_give_exact_results_in_every_form(observed):
    # plain, named, out=, out= the input, average; large plain results 64-byte aligned
    assert all(o["common_calls_bad"] == [] for o in observed), [o["common_calls_bad"] for o in observed]


def test_a_slow_peer_hands_over_to_the_python_wait(observed):
    assert all(o["slow_ok"] for o in observed)


def test_other_calls_take_the_general_path(observed):
    assert all(o["fallbacks"] == 3 and o["fallbacks_ok"] for o in observed), observed


def test_small_results_are_handed_out_again_only_when_nothing_refers_to_them(observed):
    # a loop that drops each result reuses it (no numpy.empty: the plain call costs what
    # out= does); kept results, views (of an aligned result too), read-only or retyped results are never reused
    assert all(o["recycled"] for o in observed), [o["recycled"] for o in observed]
    assert all(o["recycling_bad"] == [] for o in observed), [o["recycling_bad"] for o in observed]


def test_scalars_take_the_fast_path_with_the_general_paths_results(observed):
    # tnt.allreduce(loss) with a Python or NumPy scalar cost 20-27 us through the general path
    n = len(observed)
    want = [["ndarray", [], "float64", 1.5 * n], ["ndarray", [], "int64", 2 * n],
            ["ndarray", [], "float32", 0.5 * n], ["ndarray", [], "int32", 3 * n],
            ["ndarray", [], "float64", float(sum(range(n)))]]
    assert all(o["scalars"] == want for o in observed), [o["scalars"] for o in observed]
    assert all(o["scalar_general_calls"] == 0 for o in observed), observed


def test_broadcasts_common_call_takes_the_fast_path(observed):
    # 5 dtypes x 3 sizes x 2 roots x 4 forms: the root's bits, none through the general path
    assert all(o["broadcast_bad"] == [] for o in observed), [o["broadcast_bad"] for o in observed]
    assert all(o["broadcast_general_calls"] == 0 for o in observed), observed
    n = len(observed)
    for o in observed:  # a root out of range: the general path's error
        assert o["bad_root"] == ["InvalidArgumentError", f"root must be a rank between 0 and {n - 1}. "
                                 f"Received: root={n} (ranks={n})"], o["bad_root"]
        assert o["bad_root_general_calls"] == 1


def test_allgathers_common_call_takes_the_fast_path(observed):
    # 5 dtypes x 3 shapes, as many rows or not, plain and named, and a slow peer: the
    # general path's bits, none through it; larger results too, 64-byte aligned as there
    assert all(o["gather_bad"] == [] for o in observed), [o["gather_bad"] for o in observed]
    assert all(o["gather_general_calls"] == 0 for o in observed), observed
    assert all(o["gather_big_general_calls"] == 0 and o["gather_big_ok"] for o in observed), observed
