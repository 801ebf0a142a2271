"""The gang policy's job lifecycle and the `fifo` baseline as scenarios; the numbered
rules of docs/policy.md are tables in tests/test_policy_spec.py."""

from __future__ import annotations

from events.model import (
    JobCancelled,
    JobUnschedulable,
    NodeRemoved,
    PodsAllocated,
)
from tests.builders import World, job, node, queue


def allocated(decisions: list) -> dict[str, dict[str, str]]:  # type: ignore[type-arg]
    """job -> {pod: node} for every PodsAllocated among decisions."""
    return {
        d.job: {p.pod: p.node for p in d.placements}
        for d in decisions
        if isinstance(d, PodsAllocated)
    }


def reasons(decisions: list) -> dict[str, tuple[str, bool]]:  # type: ignore[type-arg]
    return {d.job: (d.reason, d.final) for d in decisions if isinstance(d, JobUnschedulable)}


# --------------------------------------------------------------------------- lifecycle


def test_cancel_releases_gpus_and_the_next_job_starts() -> None:
    w = World(node("n1"), queue("a"))
    w.at(1, job("x", "a", gpus=8), job("y", "a", gpus=8))
    got = w.at(2, JobCancelled(job="x"))
    assert list(allocated(got)) == ["y"]
    assert w.status("x") == "cancelled"


def test_gang_runs_when_min_members_started_and_finishes_when_all_pods_finish() -> None:
    w = World(node("n1"), queue("a"))
    w.at(1, job("g", "a", pods=2, gpus=2))
    w.start(2, "g")
    assert w.status("g") == "running" and w.state.jobs["g"].started_at == 2000
    w.finish(3, "g")
    assert w.status("g") == "succeeded" and w.gpus_of("a") == 0


def test_a_removed_node_sends_its_jobs_back_to_pending() -> None:
    w = World(node("n1"), node("n2"), queue("a"))
    w.at(1, job("g", "a", pods=2, gpus=8))
    got = w.at(2, NodeRemoved(node="n2"))
    assert w.status("g") == "pending" and w.gpus_of("a") == 0
    assert allocated(got) == {}


# --------------------------------------------------------------------------- fifo


def test_fifo_places_gang_pods_one_by_one_and_can_half_place_a_gang() -> None:
    w = World(node("n1"), node("n2"), queue("a"), policy="fifo")
    w.at(1, job("busy", "a", gpus=8))
    got = w.at(2, job("g", "a", pods=2, gpus=8))
    assert allocated(got) == {"g": {"g-0": "n2"}}  # half a gang, holding 8 GPUs idle
    assert w.status("g") == "pending"


def test_fifo_spreads_pods_and_takes_whole_gpus_for_fractions() -> None:
    w = World(node("n1"), node("n2"), queue("a"), policy="fifo")
    got = w.at(1, job("f1", "a", gpus=0.5), job("f2", "a", gpus=0.5))
    assert allocated(got) == {"f1": {"f1-0": "n1"}, "f2": {"f2-0": "n2"}}
    assert w.state.nodes["n1"].free_devices[0] == 0


def test_fifo_never_rejects_and_never_preempts() -> None:
    w = World(node("n1"), queue("a", deserved=0), queue("b", deserved=8), policy="fifo")
    w.at(0, job("a1", "a", gpus=8))
    got = w.at(1, job("b1", "b", gpus=8), job("huge", "b", gpus=64))
    assert got == []
