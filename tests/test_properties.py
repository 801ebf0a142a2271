"""Invariants of the gang policy over random clusters, queue trees and workloads.

Each run is checked against an independent fold of its ledger (not the core's own state):
no node or device over-committed, no gang partially bound, no queue above its limit,
non-preemptible work never evicted, no reclaim from a queue at or below its deserved
quota; and the ledger replays with zero mismatches.
"""

from __future__ import annotations

from functools import partial

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.codec import decode_event
from events.model import (
    JobPreempted,
    JobSubmitted,
    NodeRegistered,
    PodFinished,
    PodsAllocated,
    QueueConfigured,
)
from replay.config import (
    ClusterFile,
    JobSpec,
    NodeGroup,
    PolicyFile,
    QueuesFile,
    QueueSpec,
    WorkloadFile,
    policy_event,
)
from scheduler.fold.verify import run as replay
from tests.simkit import simulate

GPU_SIZES = [0.25, 0.5, 1, 2, 4, 8]
CLASSES = ["train", "build-preemptible", "build", "inference"]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    groups = [
        NodeGroup(
            name=f"g{i}", count=draw(st.integers(1, 3)), gpus=draw(st.sampled_from([1, 2, 4, 8]))
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    capacity = sum(g.count * g.gpus for g in groups)
    n_top = draw(st.integers(1, 3))
    queues: list[QueueSpec] = []
    left = capacity
    leaves: list[str] = []
    for i in range(n_top):
        deserved = draw(st.integers(0, left))
        left -= deserved
        limit = draw(st.one_of(st.none(), st.integers(1, capacity)))
        name = f"q{i}"
        if draw(st.booleans()):
            queues.append(QueueSpec(name=name, deserved_gpus=deserved, limit_gpus=limit))
            kid_left = deserved
            for k in range(2):
                kid = draw(st.integers(0, kid_left))
                kid_left -= kid
                queues.append(
                    QueueSpec(
                        name=f"{name}-{k}",
                        parent=name,
                        deserved_gpus=kid,
                        over_quota_weight=draw(st.integers(0, 3)),
                    )
                )
                leaves.append(f"{name}-{k}")
        else:
            queues.append(
                QueueSpec(
                    name=name,
                    deserved_gpus=deserved,
                    limit_gpus=limit,
                    over_quota_weight=draw(st.integers(0, 3)),
                    priority=draw(st.integers(0, 1)),
                )
            )
            leaves.append(name)
    jobs = [
        JobSpec(
            name=f"j{i:03d}",
            queue=draw(st.sampled_from(leaves)),
            at_s=draw(st.integers(0, 1500)),
            runtime_s=draw(st.integers(10, 3000)),
            pods=draw(st.integers(1, 4)),
            gpus_per_pod=draw(st.sampled_from(GPU_SIZES)),
            priority_class=draw(st.sampled_from(CLASSES)),
            checkpoint_interval_s=draw(st.one_of(st.none(), st.integers(60, 600))),
        )
        for i in range(draw(st.integers(1, 25)))
    ]
    return ClusterFile(nodes=groups), QueuesFile(queues=queues), WorkloadFile(jobs=jobs)


def check_invariants(ledger_records: list, gang: bool) -> dict[str, int]:  # type: ignore[type-arg]
    free: dict[str, list[int]] = {}
    jobs: dict[str, JobSubmitted] = {}
    parent: dict[str, str] = {}
    limit: dict[str, int] = {}
    deserved: dict[str, int] = {}
    queue_gpu: dict[str, int] = {}
    holding: dict[str, dict[str, tuple[str, tuple]]] = {}  # type: ignore[type-arg]
    cycle_start: dict[str, int] | None = None
    counts = {"allocations": 0, "preemptions": 0}

    def chain(q: str) -> list[str]:
        out = []
        while q:
            out.append(q)
            q = parent.get(q, "")
        return out

    def release(job_id: str, pod: str) -> None:
        node, slots = holding[job_id].pop(pod)
        for slot in slots:
            free[node][slot.device] += slot.milli
        for q in chain(jobs[job_id].queue):
            queue_gpu[q] -= sum(s.milli for s in slots)

    for env in ledger_records:
        event = decode_event(env)
        match event:
            case NodeRegistered(node=name, gpus=gpus):
                free[name] = [1000] * gpus
            case QueueConfigured(queue=q, parent=p):
                parent[q] = p
                limit[q] = event.limit.gpu_milli
                deserved[q] = event.deserved.gpu_milli
                queue_gpu.setdefault(q, 0)
            case JobSubmitted(job=j):
                jobs[j] = event
                holding[j] = {}
            case PodsAllocated(job=j, placements=placements):
                counts["allocations"] += 1
                if cycle_start is None:
                    cycle_start = dict(queue_gpu)
                spec = jobs[j]
                if gang and not holding[j]:
                    required = spec.min_members or len(spec.pods)
                    assert len(placements) >= required, f"{j}: gang partially bound"
                for p in placements:
                    for slot in p.gpus:
                        free[p.node][slot.device] -= slot.milli
                        assert free[p.node][slot.device] >= 0, (
                            f"{p.node} GPU {slot.device} over-committed"
                        )
                    holding[j][p.pod] = (p.node, p.gpus)
                    for q in chain(spec.queue):
                        queue_gpu[q] += sum(s.milli for s in p.gpus)
                        if gang and limit.get(q, -1) >= 0:
                            assert queue_gpu[q] <= limit[q], f"queue {q} above its limit"
            case JobPreempted(job=j, rule=rule):
                counts["preemptions"] += 1
                if cycle_start is None:
                    cycle_start = dict(queue_gpu)
                spec = jobs[j]
                if rule != "stale-gang":  # a broken gang is evicted whatever its class
                    assert spec.preemptible is not False
                    assert spec.priority_class in ("train", "build-preemptible"), (
                        f"{j} ({spec.priority_class}) is non-preemptible but was evicted"
                    )
                if rule == "reclaim":
                    q = spec.queue
                    assert cycle_start[q] > deserved[q], f"reclaimed from {q} at/below deserved"
                for pod in list(holding[j]):
                    release(j, pod)
            case PodFinished(job=j, pod=pod):
                if pod in holding[j]:
                    release(j, pod)
            case _:
                if env.type == "cycle_completed":
                    cycle_start = None
    return counts


def _borrow_then_reclaim() -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """Found by this test: q1 borrowed in a cycle and lost an older job to reclaim in it."""

    def j(
        name: str, queue: str, at: int, run: int, pods: int, gpus: float, cls: str = "train"
    ) -> JobSpec:
        return JobSpec(name=name, queue=queue, at_s=at, runtime_s=run, pods=pods,
                       gpus_per_pod=gpus, priority_class=cls)  # fmt: skip

    small = [j(f"s{i:02d}", "q0", 0, 10, 1, 0.25) for i in range(12)]
    return (
        ClusterFile(
            nodes=[
                NodeGroup(name="g0", count=1, gpus=4),
                NodeGroup(name="g1", count=1, gpus=8),
                NodeGroup(name="g2", count=1, gpus=4),
            ]
        ),
        QueuesFile(
            queues=[
                QueueSpec(name="q0", deserved_gpus=8, over_quota_weight=0),
                QueueSpec(name="q1", deserved_gpus=1, over_quota_weight=0),
            ]
        ),
        WorkloadFile(
            jobs=[
                j("j000", "q1", 1, 10, 2, 4),
                j("j001", "q0", 0, 1265, 1, 4),
                j("j002", "q0", 0, 1265, 1, 4),
                *small,
                j("j011", "q1", 0, 1277, 1, 0.25),
                j("j012", "q0", 556, 709, 1, 4),
                j("j017", "q0", 1267, 10, 1, 4, "build-preemptible"),
            ]
        ),
    )


@example(_borrow_then_reclaim(), PolicyFile(backfill=True, stale_gang_eviction=False))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenarios(),
    st.builds(
        PolicyFile,
        backfill=st.booleans(),
        consolidation=st.booleans(),
        stale_gang_eviction=st.booleans(),
        placement=st.sampled_from(["binpack", "spread"]),
        half_life_s=st.sampled_from([0, 600]),
        backfill_give_way_s=st.sampled_from([None, 0, 1800]),
    ),
)
def test_gang_policy_invariants_hold_and_the_ledger_replays(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    cluster, queues, workload = scenario
    _, ledger = simulate(cluster, queues, workload, policy_event("gpuledger", knobs))
    check_invariants(ledger.records, gang=True)
    result = replay(ledger)
    assert result.ok, result.mismatch and result.mismatch.diff()
    check_state(result.state)


def check_state(state) -> None:  # type: ignore[no-untyped-def]
    """The core's own bookkeeping agrees with itself after a whole run."""
    from scheduler.core.state import FreeIndex

    for node in state.nodes.values():
        assert all(0 <= d <= 1000 for d in node.free_devices), node
        assert node.free_gpu_milli == sum(node.free_devices), node
        assert node.free_whole == sum(1 for d in node.free_devices if d == 1000), node
    if state.free_index_cache is not None:
        assert state.free_index_cache == FreeIndex.of(state.nodes)
    if state.running_cache is not None:
        from scheduler.core.running import RunningIndex

        fresh = RunningIndex.of(state).content(state.now)
        assert state.running_cache.content(state.now) == fresh
    for name, blocks in state.blocks_cache.items():
        from scheduler.core.allocate import skip_id
        from scheduler.core.pendingblocks import summarise

        pending = state.queues[name].pending
        assert sum(blocks.counts) == len(pending), name
        start = 0
        for b, count in enumerate(blocks.counts):
            assert count > 0
            assert all(key >= blocks.starts[b] for key in pending[start : start + count])
            summary = blocks.summaries[b]
            if summary is not None:
                # (a summary grown by added jobs lists its requests without a key in
                # another order: the order decides nothing)
                whole = summarise(
                    pending, start, start + count, state.jobs, partial(skip_id, state)
                )
                assert sorted(summary.unkeyed) == sorted(whole.unkeyed)
                assert (summary.preemptible, summary.fixed, summary.backoff, summary.keys) == (
                    whole.preemptible,
                    whole.fixed,
                    whole.backoff,
                    whole.keys,
                )
            start += count


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fifo_never_over_commits_and_replays(scenario) -> None:  # type: ignore[no-untyped-def]
    cluster, queues, workload = scenario
    _, ledger = simulate(cluster, queues, workload, "fifo")
    check_invariants(ledger.records, gang=False)
    assert replay(ledger).ok


def test_the_checker_catches_a_partial_gang() -> None:
    """The invariant check itself must be able to fail."""
    from events.codec import wrap
    from events.model import GpuSlot, PodPlacement, PodSpec

    records = [
        wrap(NodeRegistered(node="n", gpus=2), 0),
        wrap(QueueConfigured(queue="a"), 0),
        wrap(
            JobSubmitted(
                job="g",
                queue="a",
                pods=(PodSpec(name="p0", gpu_milli=1000), PodSpec(name="p1", gpu_milli=1000)),
            ),
            0,
        ),
        wrap(
            PodsAllocated(
                job="g",
                queue="a",
                placements=(PodPlacement(pod="p0", node="n", gpus=(GpuSlot(0, 1000),)),),
            ),
            0,
        ),
    ]
    with pytest.raises(AssertionError, match="partially bound"):
        check_invariants(records, gang=True)
