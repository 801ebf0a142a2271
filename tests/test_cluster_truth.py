"""The cluster is the truth for what runs, as scenarios of the pure core.

On a live ledger (``requeue_lost: false``) pods are API objects: a deleted pod frees what it
held, a gang left below its minimum is ended (``JobTerminated``) and its survivors keep
their GPUs until they are reported gone, a failed eviction holds the victim's GPUs again,
and nothing bound is ever placed a second time. Every scenario also checks the device
accounting against what the ledger says runs and is held.
"""

from __future__ import annotations

import random

import pytest

from events.model import (
    MILLI,
    BindFailed,
    Event,
    EvictionFailed,
    GpuSlot,
    JobPreempted,
    JobTerminated,
    NodeRegistered,
    NodeRemoved,
    PodBound,
    PodDeleted,
    PodEvicted,
    PodsAllocated,
    PodStarted,
)
from scheduler.core import State
from scheduler.core.state import ACTIVE
from tests.builders import World, job, node, queue

LIVE = {"requeue_lost": False}


def assert_books_balance(state: State) -> None:
    """Every device's free milli-GPUs equal its capacity less what active jobs and held
    pods take on it, and no device is taken beyond one GPU."""
    used: dict[tuple[str, int], int] = {}
    for j in state.jobs.values():
        if j.status not in ACTIVE:
            continue
        for p in j.live():
            for s in p.gpus:
                used[(p.node, s.device)] = used.get((p.node, s.device), 0) + s.milli
    for pods in state.held.values():
        for h in pods.values():
            for s in h.gpus:
                used[(h.node, s.device)] = used.get((h.node, s.device), 0) + s.milli
    for name, n in state.nodes.items():
        for d in range(n.gpus):
            taken = used.get((name, d), 0)
            assert taken <= MILLI, f"{name} device {d} taken {taken} milli-GPUs"
            assert n.free_devices[d] == MILLI - taken, (name, d, n.free_devices[d], taken)


def of(decisions: list[Event], kind: type) -> list:  # type: ignore[type-arg]
    return [d for d in decisions if isinstance(d, kind)]


def placed_nodes(decisions: list[Event], job_id: str) -> dict[str, str]:
    return {
        p.pod: p.node for d in of(decisions, PodsAllocated) if d.job == job_id for p in d.placements
    }


def running_gang(w: World, name: str = "g", gpus: int = 8, pods: int = 2) -> dict[str, str]:
    got = w.at(1, job(name, "a", pods=pods, gpus=gpus))
    where = placed_nodes(got, name)
    assert len(where) == pods
    w.start(2, name)
    return where


def test_deleting_one_member_ends_the_gang_and_holds_the_survivor_until_it_is_gone() -> None:
    w = World(node("n1"), node("n2"), queue("a"), **LIVE)
    where = running_gang(w)
    got = w.at(10, PodDeleted(job="g", pod="g-0"), job("next", "a", pods=2, gpus=8))
    ended = of(got, JobTerminated)
    assert [(t.job, t.pods) for t in ended] == [("g", ("g-1",))]
    assert "gang below its minimum (1 of 2)" in ended[0].reason
    # The survivor still holds its node: the next gang cannot take both nodes yet.
    assert not of(got, PodsAllocated)
    assert w.status("g") == "failed"
    assert set(w.state.held["g"]) == {"g-1"}
    assert_books_balance(w.state)
    got = w.at(11, PodEvicted(job="g", pod="g-1", node=where["g-1"]))
    assert sorted(placed_nodes(got, "next").values()) == ["n1", "n2"]
    assert not w.state.held
    assert_books_balance(w.state)


def test_a_gang_above_its_minimum_keeps_running_without_the_deleted_member() -> None:
    w = World(node("n1"), node("n2"), queue("a"), **LIVE)
    w.at(1, job("g", "a", pods=4, gpus=4, min_members=2))
    w.start(2, "g")
    got = w.at(3, PodDeleted(job="g", pod="g-3"))
    assert not of(got, JobTerminated)
    assert w.status("g") == "running"
    assert_books_balance(w.state)


def test_removing_a_node_ends_its_gangs_and_never_places_bound_pods_again() -> None:
    w = World(node("n1"), node("n2"), node("n3"), queue("a"), **LIVE)
    where = running_gang(w)
    gone = where["g-0"]
    got = w.at(10, NodeRemoved(node=gone))
    ended = of(got, JobTerminated)
    assert len(ended) == 1 and set(ended[0].pods) == {"g-0", "g-1"}
    assert not of(got, PodsAllocated), "a bound pod is never placed a second time"
    assert w.status("g") == "failed"
    assert_books_balance(w.state)
    # Nothing more happens until the survivor is reported gone.
    assert not of(w.at(11), PodsAllocated)
    w.at(12, PodDeleted(job="g", pod="g-1", node=where["g-1"]))
    assert not w.state.held
    assert_books_balance(w.state)


def test_a_single_pod_on_a_removed_node_ends_and_is_deleted() -> None:
    w = World(node("n1"), node("n2"), queue("a"), **LIVE)
    got = w.at(1, job("solo", "a", gpus=2))
    w.start(2, "solo")
    at = placed_nodes(got, "solo")["solo-0"]
    got = w.at(3, NodeRemoved(node=at))
    assert w.status("solo") == "failed"
    assert not of(got, PodsAllocated)
    # Its pod object is still bound to the node that left: the binder deletes it.
    assert [(t.pods, t.reason) for t in of(got, JobTerminated)] == [
        (("solo-0",), f"node {at} was removed")
    ]


def test_the_simulator_keeps_re_placing_jobs_of_a_removed_node() -> None:
    w = World(node("n1"), node("n2"), node("n3"), queue("a"))  # requeue_lost: true
    where = running_gang(w)
    got = w.at(10, NodeRemoved(node=where["g-0"]))
    assert not of(got, JobTerminated)
    assert len(placed_nodes(got, "g")) == 2


def test_a_failed_eviction_holds_the_victims_gpus_until_it_is_gone() -> None:
    w = World(node("n1"), queue("a", deserved=8), queue("b", deserved=0), **LIVE)
    w.at(1, job("low", "b", gpus=8))
    w.start(2, "low")
    got = w.at(3, job("high", "a", gpus=8))
    assert [(d.job, d.rule) for d in of(got, JobPreempted)] == [("low", "reclaim")]
    assert w.status("low") == "failed", "live: a preempted job's pods are gone, it ends"
    slots = next(iter(w.state.jobs["high"].placements.values())).gpus
    # The binder did not bind high (its victim stayed) and reports the eviction failure.
    got = w.at(
        4,
        BindFailed(job="high", pod="high-0", node="n1", reason="victim still running"),
        EvictionFailed(job="low", pod="low-0", node="n1", reason="PDB", gpus=slots),
    )
    assert not of(got, PodsAllocated), "nothing placed on the victim's GPUs"
    assert w.state.nodes["n1"].free_gpu_milli == 0
    assert_books_balance(w.state)
    got = w.at(5, PodEvicted(job="low", pod="low-0", node="n1"))
    assert placed_nodes(got, "high") == {"high-0": "n1"}
    assert_books_balance(w.state)


def test_a_failed_eviction_arriving_after_the_slots_were_given_away_wins_them_back() -> None:
    w = World(node("n1"), queue("a", deserved=8), queue("b", deserved=0), **LIVE)
    w.at(1, job("low", "b", gpus=8))
    w.start(2, "low")
    w.at(3, job("high", "a", gpus=8))
    slots = next(iter(w.state.jobs["high"].placements.values())).gpus
    # The outcome came alone: high still holds the slots in the ledger when it arrives.
    w.at(4, EvictionFailed(job="low", pod="low-0", node="n1", reason="PDB", gpus=slots))
    assert w.status("high") == "pending"
    assert_books_balance(w.state)


def test_a_pod_bound_elsewhere_is_never_bound_again() -> None:
    w = World(node("n1"), node("n2"), queue("a"), **LIVE)
    got = w.at(1, job("g", "a", pods=2, gpus=8))
    where = placed_nodes(got, "g")
    got = w.at(
        2,
        PodBound(job="g", pod="g-0", node=where["g-0"]),
        BindFailed(
            job="g", pod="g-1", node=where["g-1"], reason="already bound", bound_node="other"
        ),
    )
    assert [t.pods for t in of(got, JobTerminated)] == [("g-0",)]
    assert not of(got, PodsAllocated)
    assert_books_balance(w.state)


def test_deleting_a_pod_of_a_pending_job_cancels_it() -> None:
    w = World(node("n1"), queue("a"), **LIVE)
    w.at(1, job("hog", "a", gpus=8))
    w.at(2, job("waits", "a", gpus=8))
    assert w.status("waits") == "pending"
    w.at(3, PodDeleted(job="waits", pod="waits-0"))
    assert w.status("waits") == "cancelled"


def test_re_registering_a_node_keeps_its_held_pods_charged() -> None:
    w = World(node("n1"), node("n2"), queue("a"), **LIVE)
    running_gang(w)
    w.at(3, PodDeleted(job="g", pod="g-0"))
    held = w.state.held["g"]["g-1"]
    w.at(4, NodeRegistered(node=held.node, gpus=8, cpu_milli=64_000, memory_mib=512_000))
    assert_books_balance(w.state)


@pytest.mark.parametrize("seed", range(12))
def test_books_balance_under_random_churn(seed: int) -> None:
    """Random submissions, starts, deletions, node removals and re-additions, binder
    outcomes: after every cycle the devices add up and nothing is taken twice."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(4)]
    w = World(*(node(n) for n in names), queue("a"), queue("b"), **LIVE)
    t = 1
    for step in range(80):
        t += 1
        events: list[Event] = []
        roll = rng.random()
        state = w.state
        active = [j for j in state.jobs.values() if j.status in ACTIVE]
        if roll < 0.35:
            pods = rng.choice([1, 1, 2, 3])
            events.append(
                job(f"j{step}", rng.choice("ab"), pods=pods, gpus=rng.choice([1, 2, 4, 8]))
            )
        elif roll < 0.5 and active:
            j = rng.choice(active)
            events += [PodStarted(job=j.job, pod=p) for p in j.placements]
        elif roll < 0.65 and active:
            j = rng.choice(active)
            pod = rng.choice(sorted(j.placements))
            events.append(PodDeleted(job=j.job, pod=pod))
        elif roll < 0.72:
            gone = rng.choice(names)
            if gone in state.nodes:
                events.append(NodeRemoved(node=gone))
            else:
                events.append(
                    NodeRegistered(node=gone, gpus=8, cpu_milli=64_000, memory_mib=512_000)
                )
        elif roll < 0.85 and state.held:
            j_id = rng.choice(sorted(state.held))
            pod = rng.choice(sorted(state.held[j_id]))
            events.append(PodEvicted(job=j_id, pod=pod, node=state.held[j_id][pod].node))
        elif active:
            j = rng.choice(active)
            pod, p = rng.choice(sorted(j.placements.items()))
            events.append(
                EvictionFailed(
                    job=j.job, pod=pod, node=p.node, reason="x", gpus=(GpuSlot(0, 1000),)
                )
            )
        w.at(t, *events)
        assert_books_balance(w.state)


def _api_pod(name: str, job: str, node: str, slots: str, uid: str = "u") -> dict:  # type: ignore[type-arg]
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "annotations": {"gpuledger.io/job": job, "gpuledger.io/gpu-slots": slots},
        },
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running"},
    }


def test_reconcile_finds_pods_the_ledger_misplaces_or_forgets() -> None:
    from scheduler.kube.reconcile import Reconciler, differences

    w = World(node("n1"), node("n2"), queue("a"), **LIVE)
    got = w.at(1, job("x", "a", gpus=2), job("y", "a", gpus=2))
    where = {**placed_nodes(got, "x"), **placed_nodes(got, "y")}
    other = "n2" if where["x-0"] == "n1" else "n1"
    pods = [
        _api_pod("x-0", "x", other, "0:1000,1:1000"),  # bound elsewhere than placed
        _api_pod("y-0", "y", where["y-0"], "0:1000,1:1000"),  # as the ledger says
        _api_pod("z-0", "x", "n1", "5:1000"),  # a pod the ledger never placed for x
    ]
    found = differences(w.state, pods)
    assert set(found) == {("bound", "x", "x-0"), ("running", "x", "z-0")}
    bound = found[("bound", "x", "x-0")]
    assert isinstance(bound, BindFailed) and bound.bound_node == other
    running = found[("running", "x", "z-0")]
    assert isinstance(running, EvictionFailed) and running.gpus == (GpuSlot(5, 1000),)

    class Nothing:  # a ledger reader with no records
        def read(self, start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def]
            return iter(())

        def end_offset(self) -> int:
            return 0

        def close(self) -> None:
            pass

    r = Reconciler(Nothing())  # type: ignore[arg-type]
    r.state = w.state
    assert r.compare(pods) == [], "a difference is reported only when seen twice"
    assert {type(e).__name__ for e in r.compare(pods)} == {"BindFailed", "EvictionFailed"}
    assert r.compare([pods[1]]) == [], "gone by the next look: nothing to report"
