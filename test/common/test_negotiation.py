"""Negotiation: any submission order, the steady-state cache, renegotiation,
and mismatches that fail the request on every rank (never a hang or a wrong sum)."""

import pytest

from core_helpers import rank_reports


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    return rank_reports(tmp_path_factory.mktemp("negotiation"), 3, "rank_negotiation.py")


def test_names_in_a_different_order_on_every_rank(observed):
    assert all(o["reordered"] for o in observed)


def test_changed_size_under_a_cached_name_is_renegotiated(observed):
    assert all(o["renegotiated"] for o in observed)


@pytest.mark.parametrize("label,tensor,words", [
    ("dtype", "mm-dtype", ["float32", "float64", "rank 0", "ranks 1, 2"]),
    ("count", "mm-count", ["float32[4]", "float32[5]", "ranks 0, 1", "rank 2"]),
    ("op", "mm-op", ["average", "sum"]),
    ("root", "mm-root", ["root 0", "root 1"]),
    ("kind", "mm-kind", ["allreduce", "broadcast"]),
    ("rows", "mm-rows", ["rows of 4", "rows of 3"]),
    ("cached", "cached", ["float32[9]", "float32[8]"]),
])
def test_mismatch_fails_on_every_rank_naming_tensor_and_ranks(observed, label, tensor, words):
    for o in observed:
        msg = o[label]
        assert f"'{tensor}'" in msg, msg
        for w in words:
            assert w in msg, (w, msg)


def test_context_survives_mismatches(observed):
    assert all(o["after"] for o in observed)


def test_duplicate_name_in_flight_is_refused(observed):
    assert "'twice' is already in flight on rank 0" in observed[0]["duplicate"]
    assert all(o["twice"] for o in observed)  # the first request still completes


def test_dropped_handle_does_not_block_and_is_reaped(observed):
    assert all(o["orphans"] == 0 for o in observed)
