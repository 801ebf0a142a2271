"""The service's heap tidying (``SchedulerService._tidy_heap``), without a broker."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from events.kafka_admin import KafkaSettings
from scheduler.runtime.service import SchedulerService, ServiceConfig


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def service() -> Iterator[SchedulerService]:
    svc = SchedulerService(ServiceConfig(settings=KafkaSettings(prefix="heap"), domain="default"))
    svc._full_gc_at = 1e18  # no full collection unless a test asks for one
    yield svc
    gc.unfreeze()


def test_tidy_collects_new_cyclic_garbage_then_freezes_the_survivors(
    service: SchedulerService,
) -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: only the collector can free it
    gone = weakref.ref(a)
    kept = [_Node()]
    del a, b
    frozen_before = gc.get_freeze_count()
    service._since_tidy = 5
    service._tidy_heap()
    assert gone() is None, "the cycle was collected before the freeze"
    assert gc.get_freeze_count() > frozen_before
    assert service._since_tidy == 0
    assert kept[0] is not None


def test_frozen_cycles_wait_for_the_full_collection(service: SchedulerService) -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    gc.freeze()  # as after a take-over or an earlier tidying
    del a, b
    service._tidy_heap()
    assert gone() is not None, "frozen objects are not walked by the tidying"
    service._full_gc_at = 0.0  # heap_full_every_s has passed
    service._tidy_heap()
    assert gone() is None
