"""The binder's overlapping cycles, against a fake Kubernetes API (no cluster): outcomes
land in ledger order with the position after them, and an eviction never overtakes a bind
of an earlier cycle."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from events.codec import decode_event, wrap
from events.filelog import FileLedger, LedgerDirReader
from events.model import (
    CycleCompleted,
    Event,
    JobPreempted,
    JobSubmitted,
    PodBound,
    PodEvicted,
    PodPlacement,
    PodsAllocated,
    PodSpec,
)
from scheduler.kube.bind import Binder


class _Answer:
    def read(self) -> bytes:
        return b"{}"

    def release_conn(self) -> None:
        pass


class FakeCore:
    """Records calls in the order they complete; binds of pods in ``slow`` take 0.3 s."""

    def __init__(self, slow: set[str]) -> None:
        self.slow = slow
        self.done: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def _record(self, what: str, pod: str) -> _Answer:
        with self.lock:
            self.done.append((what, pod))
        return _Answer()

    def post(self, path: str, body: Any) -> None:
        """The binder's ``Poster``: bindings and Events."""
        if path.endswith("/binding"):
            name = body["metadata"]["name"]
            time.sleep(0.3 if name in self.slow else 0.01)  # intentional: the API's latency
            self._record("bind", name)

    def create_namespaced_pod_eviction(self, name: str, ns: str, body: Any, **_: Any) -> _Answer:
        return self._record("evict", name)

    def create_namespaced_event(self, ns: str, body: Any, **_: Any) -> _Answer:
        return _Answer()


def _alloc(job: str, node: str = "n1") -> PodsAllocated:
    return PodsAllocated(job=job, queue="q", placements=(PodPlacement(pod=job, node=node),))


def test_overlapping_cycles_land_in_ledger_order_and_evictions_wait(tmp_path: Path) -> None:
    ledger_dir, intake = tmp_path / "ledger", tmp_path / "intake"
    jobs = [f"j{i}" for i in range(6)]
    cycles: list[list[Event]] = [
        [JobSubmitted(job=j, queue="q", pods=(PodSpec(name=j),)) for j in jobs],
        [_alloc("j0"), _alloc("j1")],  # slow binds
        [_alloc("j2")],  # fast: done before the cycle above, saved after it
        [_alloc("j3")],
        # Evicts j2, bound two cycles up: must wait for every bind before it.
        [
            JobPreempted(
                job="j2",
                queue="q",
                pods=("j2",),
                preemptor="j4",
                preemptor_queue="q",
                rule="preempt",
                lost_gpu_ms=0,
            ),
            _alloc("j4"),
        ],
        [_alloc("j5")],
    ]
    with FileLedger.open(ledger_dir) as w:
        for i, batch in enumerate(cycles):
            w.append([wrap(e, i) for e in [*batch, CycleCompleted()]])
        end = w.end_offset()
    fake = FakeCore(slow={"j0", "j1"})
    binder = Binder(client.ApiClient(client.Configuration()), str(ledger_dir), str(intake))
    binder.core = fake  # type: ignore[assignment]  # the fake answers the calls made
    binder.post = fake.post
    try:
        binder.run(lambda: binder.next >= end, poll_s=0.01)
    finally:
        binder.close()
    outcomes = [decode_event(env, off) for off, env in LedgerDirReader(intake / "binder").read()]
    # Every pod bound, j2 evicted; outcomes in ledger order although j2, j3 bound first.
    assert [(type(o).__name__, getattr(o, "pod", "")) for o in outcomes] == [
        ("PodBound", "j0"), ("PodBound", "j1"), ("PodBound", "j2"), ("PodBound", "j3"),
        ("PodBound", "j4"), ("PodEvicted", "j2"), ("PodBound", "j5"),
    ]  # fmt: skip
    assert all(isinstance(o, PodBound | PodEvicted) for o in outcomes)
    # The overlap: the fast binds of later cycles completed while j0 and j1 were under way.
    order = [pod for what, pod in fake.done if what == "bind"]
    assert order.index("j2") < order.index("j0") and order.index("j3") < order.index("j1")
    # The eviction came after every bind of the cycles before it.
    evict_at = fake.done.index(("evict", "j2"))
    assert {p for w, p in fake.done[:evict_at] if w == "bind"} >= {"j0", "j1", "j2", "j3"}
    assert binder.next == end
