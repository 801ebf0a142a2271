"""``scheduler.fold.heap.gc_paused`` pauses the cyclic collector for a block (or a
decorated function) and leaves it as it found it, even when the block raises."""

from __future__ import annotations

import gc

import pytest

from scheduler.fold.heap import gc_paused


@gc_paused()
def _collecting() -> bool:
    return gc.isenabled()


def test_the_collector_is_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert _collecting() is False
    assert _collecting() is False  # a decorated function pauses on every call
    assert gc.isenabled()


def test_a_raising_block_restores_it_and_a_paused_one_stays_paused() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was paused before: not turned on behind the caller
    finally:
        gc.enable()
