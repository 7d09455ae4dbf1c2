"""Small allreduces and broadcasts in one round: in a steady loop the payload
rides with the readiness bit of the negotiation (counted by
core.stats()['one_round'], not timed), every rank adds in the small path's
order (the same bits everywhere), a broadcast copies its root's and an
allgather every rank's, other cases
take the usual paths, and a mismatch on that path fails on every rank."""

import os

import pytest

from core_helpers import rank_reports


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    return rank_reports(tmp_path_factory.mktemp("one_round"), 3, "rank_one_round.py")


def test_a_loop_of_plain_calls_is_served_from_the_cache_in_one_round(observed):
    for o in observed:
        assert o["loop_ok"]
        assert o["loop"]["announcements"] == 0, o["loop"]
        assert o["loop"]["cache_hits"] == 120, o["loop"]
        assert o["loop"]["one_round"] == 120, o["loop"]
        assert o["loop"]["cycles"] >= 120, o["loop"]


@pytest.mark.skipif((os.cpu_count() or 1) >= 3, reason="needs more ranks (3) than cores: this machine has "
                    f"{os.cpu_count()}")
def test_ranks_that_outnumber_the_cores_yield_them_instead_of_spinning(observed):
    # 3 ranks on 2 cores: nobody spins (a spinner would hold the core of the
    # rank it waits for), waits poll with sched_yield before they sleep
    assert all(o["loop"]["waits_spun"] == 0 for o in observed), [o["loop"] for o in observed]
    assert sum(o["loop"]["waits_yielded"] for o in observed) > 0, [o["loop"] for o in observed]


def test_a_loop_of_metrics_dicts_is_served_in_one_round(observed):
    assert all(o["metrics"] == 30 and o["metrics_ok"] for o in observed)


def test_a_loop_of_small_broadcasts_rides_with_the_roots_payload(observed):
    for o in observed:
        assert o["bcast_ok"]
        assert o["bcast_one_round"] == 120, o["bcast_one_round"]
        assert o["bcast_big_one_round"] == 0


def test_a_loop_of_small_allgathers_rides_with_every_ranks_rows(observed):
    for rank, o in enumerate(observed):
        assert o["gather_ok"]
        assert o["gather_one_round"] == 120, o["gather_one_round"]
        # rank 0's rows changed: it announced the name again (the others'
        # requests follow the eviction), then one round again
        assert o["gather_rows"] == [1 if rank == 0 else 0, 2], (rank, o["gather_rows"])
        assert o["gather_big_one_round"] == 0


def test_48_kb_broadcasts_and_allgathers_ride_where_an_allreduce_would_not(observed):
    # their limit with 3 ranks is 64 KiB, an allreduce's 24 KiB (tnt_one_round_bytes)
    assert all(o["mid_bcast_gather"] == [10, True] for o in observed), [o["mid_bcast_gather"] for o in observed]


def test_one_round_adds_in_the_small_paths_order_on_every_rank(observed):
    assert all(o["bits_one_round"] == 4 for o in observed)
    assert all(o["bits"] for o in observed)
    assert all(o["avg_close"] for o in observed)
    assert len({o["avg_hex"] for o in observed}) == 1


def test_24_kb_rides_in_one_round_with_three_ranks_in_the_same_order(observed):
    # 100 "mid" calls, and most "mid-check" calls (its first is negotiated in full)
    assert all(o["mid_one_round"] >= 100 + 99 and o["mid"] for o in observed), [o["mid_one_round"] for o in observed]


def test_larger_allreduces_read_in_place_add_in_the_rings_order(observed):
    for o in observed:
        assert o["direct"] == {"100003": True, "300007": True, "70001": True, "fused": True}, o["direct"]


def test_integer_average_and_large_payloads_take_their_own_paths(observed):
    assert all(o["other_paths"] == 0 and o["other_ok"] for o in observed)


def test_a_late_peer_is_waited_for(observed):
    assert all(o["late_ok"] for o in observed)
    assert all(o["late_others"] == {"barrier": True, "broadcast": True, "allgather": True} for o in observed), \
        [o["late_others"] for o in observed]


@pytest.mark.parametrize("label,words", [
    ("size", ["'hot'", "float32[5]", "float32[4]", "rank 0", "ranks 1, 2"]),
    ("kind", ["'hot-kind'", "allreduce", "broadcast"]),
])
def test_mismatch_on_the_one_round_path_fails_on_every_rank(observed, label, words):
    for o in observed:
        for w in words:
            assert w in o[label], (w, o[label])
    assert all(o["after"] == [True, True, True] for o in observed)
