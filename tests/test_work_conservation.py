"""Work conservation: after every cycle of the gang policy, no pending job that may start
(no limit or quota rule holds it, not backing off) fits on the free capacity outside the
nodes live reservations hold — however many jobs wait behind blocked queue heads."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.memlog import MemoryLedger
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
from replay.sim import Simulation
from scheduler.core.admission import admission_reason
from scheduler.core.allocate import _score_for
from scheduler.core.fairshare import fair_shares
from scheduler.core.placement import Statement
from scheduler.core.running import NEVER
from scheduler.core.state import State
from tests.test_properties import scenarios


def fitting_but_waiting(state: State) -> list[str]:
    """Pending jobs that may start and would fit outside live reservations now."""
    now = state.now
    skip = {n: None for n, start in state.reserved.items() if start > now or start == NEVER}
    shares = fair_shares(state)
    found: list[str] = []
    for _, _, job_id in state.pending:
        job = state.jobs[job_id]
        queue = state.queues.get(job.queue)
        if queue is None or job.placements or job.backoff_until > now:
            continue
        if admission_reason(state, queue, job, shares) is not None:
            continue
        score = _score_for(state, queue, job)
        with Statement(state.nodes, score=score, index=state.free_index()) as stmt:
            if stmt.place_gang(job, skip=skip or None) is not None:
                found.append(job_id)
    return found


def run_checked(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    knobs: PolicyFile | None = None,
) -> int:
    cycles = 0

    def observe(state: State, now: int) -> None:
        nonlocal cycles
        cycles += 1
        waiting = fitting_but_waiting(state)
        assert not waiting, f"t={now / 1000:.1f}s: {waiting[:5]} fit free capacity but wait"

    policy = policy_event("gpuledger", knobs or PolicyFile())
    Simulation(cluster, queues, workload, policy, MemoryLedger()).run(observe=observe)
    return cycles


@st.composite
def with_estimates(draw: st.DrawFn) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """``scenarios`` where some jobs say how long they will run (so reservations get a
    start time and jobs that end before it may use the reserved nodes)."""
    cluster, queues, workload = draw(scenarios())
    jobs = [
        msgspec.structs.replace(j, expected_runtime_s=j.runtime_s) if draw(st.booleans()) else j
        for j in workload.jobs
    ]
    return cluster, queues, msgspec.structs.replace(workload, jobs=jobs)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    with_estimates(),
    st.builds(
        PolicyFile,
        consolidation=st.booleans(),
        placement=st.sampled_from(["binpack", "spread"]),
        half_life_s=st.sampled_from([0, 600]),
        victim_order=st.sampled_from(["gpuledger", "kai"]),
        queue_order=st.sampled_from(["gpuledger", "kai"]),
        reservations=st.booleans(),
        share_rounding=st.sampled_from(["milli", "whole"]),
    ),
)
def test_no_job_that_may_start_and_fits_is_left_waiting(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    assert run_checked(*scenario, knobs) > 0


def flood(
    blocked_heads: int, big_behind: int, small_behind: int
) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """Two 8-GPU nodes, 4 and 6 of their GPUs busy for an hour. In each of
    ``blocked_heads`` queues an 8-GPU job heads the queue (it reserves a node), then
    ``big_behind`` 8-GPU jobs that cannot fit, then ``small_behind`` 1-GPU jobs that fit
    the 2 GPUs free outside the reservation."""
    cluster = ClusterFile(nodes=[NodeGroup(name="n", count=2, gpus=8)])
    names = [f"t{i}" for i in range(blocked_heads)]
    queues = QueuesFile(
        queues=[QueueSpec(name=n, deserved_gpus=16 // blocked_heads) for n in names]
    )
    jobs = [
        JobSpec(name="busy-a", queue=names[0], at_s=0, runtime_s=3600, gpus_per_pod=4),
        JobSpec(name="busy-b", queue=names[0], at_s=0, runtime_s=3600, gpus_per_pod=6),
    ]
    for n in names:
        jobs.append(JobSpec(name=f"{n}-head", queue=n, at_s=10, runtime_s=600, gpus_per_pod=8))
        jobs += [
            JobSpec(name=f"{n}-big{k:04d}", queue=n, at_s=20, runtime_s=600, gpus_per_pod=8)
            for k in range(big_behind)
        ]
        jobs += [
            JobSpec(name=f"{n}-small{k:04d}", queue=n, at_s=30, runtime_s=60, gpus_per_pod=1)
            for k in range(small_behind)
        ]
    return cluster, queues, WorkloadFile(jobs=jobs, horizon_s=100_000)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(0, 120), st.integers(0, 12))
def test_any_flood_behind_blocked_heads_leaves_nothing_that_fits(heads, big, small) -> None:  # type: ignore[no-untyped-def]
    assert run_checked(*flood(heads, big, small)) > 0


def test_small_jobs_behind_hundreds_of_blocked_ones_still_fill_the_gap() -> None:
    cluster, queues, workload = flood(blocked_heads=3, big_behind=300, small_behind=40)
    assert run_checked(cluster, queues, workload) > 0
