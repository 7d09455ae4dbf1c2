"""thread_setting.set_in_thread: the frontend's per-thread marks (predict's
step, the stand-in sample, reduced gradients) hold inside their block only,
in their thread only, and come back after a raise and when nested."""
import threading

import pytest

from tarantella.common.thread_setting import set_in_thread


def test_the_mark_holds_in_its_block_and_thread_only():
    local = threading.local()
    seen_elsewhere = []
    with set_in_thread(local, "active", True, default=False) as value:
        assert value is True and local.active is True
        other = threading.Thread(target=lambda: seen_elsewhere.append(getattr(local, "active", False)))
        other.start()
        other.join()
    assert seen_elsewhere == [False]
    assert local.active is False  # the default, where it was never set


def test_nested_blocks_and_a_raise_give_back_what_was_before():
    local = threading.local()
    local.samples = 3
    with pytest.raises(RuntimeError):
        with set_in_thread(local, "samples", 5):
            with set_in_thread(local, "samples", 0):
                assert local.samples == 0
            assert local.samples == 5
            raise RuntimeError("a failed call")
    assert local.samples == 3


def test_a_fresh_value_per_block():
    local = threading.local()
    with set_in_thread(local, "calls", []) as calls:
        calls.append("apply")
        assert local.calls == ["apply"]
    assert local.calls is None
