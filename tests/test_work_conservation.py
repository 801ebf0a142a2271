"""Work conservation: after every cycle of the gang policy, no pending job that may start
(no limit or quota rule holds it, not backing off) fits on the free capacity outside the
nodes live reservations hold — however many jobs wait behind blocked queue heads."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.memlog import MemoryLedger
from events.model import GpuSlot, PodPlacement, PodsAllocated
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
from scheduler.core import fitting_job_waits, fitting_jobs, live_reservations
from scheduler.core.admission import admission_reason
from scheduler.core.apply import apply
from scheduler.core.fairshare import fair_shares
from scheduler.core.state import State
from scheduler.core.tuning import DEFAULT, Tuning
from tests.builders import job, node, queue
from tests.test_properties import scenarios


def fitting_but_waiting(state: State) -> list[str]:
    """Pending jobs that may start and would fit outside live reservations now."""
    shares = fair_shares(state)
    return [
        job.job
        for job in fitting_jobs(state, live_reservations(state))
        if (queue := state.queues.get(job.queue)) is not None
        and admission_reason(state, queue, job, shares) is None
    ]


def run_checked(
    cluster: ClusterFile,
    queues: QueuesFile,
    workload: WorkloadFile,
    knobs: PolicyFile | None = None,
    tuning: Tuning = DEFAULT,
) -> int:
    cycles = 0

    def observe(state: State, now: int) -> None:
        nonlocal cycles
        cycles += 1
        waiting = fitting_but_waiting(state)
        assert not waiting, f"t={now / 1000:.1f}s: {waiting[:5]} fit free capacity but wait"

    policy = policy_event("gpuledger", knobs or PolicyFile())
    Simulation(cluster, queues, workload, policy, MemoryLedger(), tuning=tuning).run(
        observe=observe
    )
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
        lost_work_ratio=st.sampled_from([0.0, 0.1]),
        backfill_give_way_s=st.sampled_from([None, 0, 1800]),
    ),
)
def test_no_job_that_may_start_and_fits_is_left_waiting(scenario, knobs) -> None:  # type: ignore[no-untyped-def]
    assert run_checked(*scenario, knobs) > 0


def flood(
    blocked_heads: int,
    big_behind: int,
    small_behind: int,
    big_cpu: float = 0,
    cpu_step: float = 0,
) -> tuple[ClusterFile, QueuesFile, WorkloadFile]:
    """Two 8-GPU nodes, 4 and 6 of their GPUs busy for an hour. In each of
    ``blocked_heads`` queues an 8-GPU job heads the queue (it reserves a node), then
    ``big_behind`` 8-GPU jobs that cannot fit, then ``small_behind`` 1-GPU jobs that fit
    the 2 GPUs free outside the reservation. With ``big_cpu`` the big jobs are gangs of
    two 4-GPU pods asking that many cores each (as a trace's sweep of identical
    multi-node jobs with CPU requests), on nodes of 64 cores; with ``cpu_step`` too, the
    k-th asks ``k * cpu_step`` cores more (each gang a shape of its own)."""
    cluster = ClusterFile(nodes=[NodeGroup(name="n", count=2, gpus=8, cpu=64 if big_cpu else 0)])
    big = {"pods": 2, "gpus_per_pod": 4} if big_cpu else {"gpus_per_pod": 8}
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
            JobSpec(
                name=f"{n}-big{k:04d}",
                queue=n,
                at_s=20,
                runtime_s=600,
                cpu_per_pod=big_cpu + k * cpu_step,
                **big,
            )
            for k in range(big_behind)
        ]
        jobs += [
            JobSpec(name=f"{n}-small{k:04d}", queue=n, at_s=30, runtime_s=60, gpus_per_pod=1)
            for k in range(small_behind)
        ]
    return cluster, queues, WorkloadFile(jobs=jobs, horizon_s=100_000)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(0, 120), st.integers(0, 12), st.sampled_from([0, 0, 8]))
def test_any_flood_behind_blocked_heads_leaves_nothing_that_fits(heads, big, small, cpu) -> None:  # type: ignore[no-untyped-def]
    assert run_checked(*flood(heads, big, small, cpu)) > 0


@pytest.mark.parametrize("cpu_step", [0, 0.01], ids=["identical", "ever-more-cpu"])
def test_a_sweep_of_gangs_with_cpu_does_not_use_up_the_backfill_tries(cpu_step: float) -> None:
    """100 2-pod gangs asking for CPU wait behind a blocked head — identical, or each asking
    a little more CPU than the one before (as a trace's ``cpu_num`` varies job by job) —
    then 1-GPU jobs that fit: the first failure rules out every gang of like pods asking
    no less (``FailedShapes``), so the small jobs start in the same cycle. Before revision
    12 each gang was tried and counted towards ``Tuning.backfill_tries``, and after 64 the queue
    was done for the cycle with the small jobs left waiting on idle GPUs."""
    scenario = flood(blocked_heads=1, big_behind=100, small_behind=4, big_cpu=8, cpu_step=cpu_step)
    assert run_checked(*scenario) > 0
    with pytest.raises(AssertionError, match="fit"):
        run_checked(*scenario, tuning=Tuning(exact_gangs=False))


def test_small_jobs_behind_hundreds_of_blocked_ones_still_fill_the_gap() -> None:
    cluster, queues, workload = flood(blocked_heads=3, big_behind=300, small_behind=40)
    assert run_checked(cluster, queues, workload) > 0


def test_jobs_held_back_by_quota_do_not_use_up_the_backfill_tries() -> None:
    """Queue ``ls`` deserves 2 of 8 GPUs and its non-preemptible work holds them. Its head
    and the 100 jobs behind it each ask for a GPU beyond that quota (each a different
    request, so no two are passed over as alike), then a CPU-only job comes that the quota
    rule does not hold and 6 idle GPUs' worth of node fits: it starts, although more than
    ``Tuning.backfill_tries`` jobs stand before it."""
    cluster = ClusterFile(nodes=[NodeGroup(name="n", count=1, gpus=8, cpu=64, memory_gib=256)])
    queues = QueuesFile(
        queues=[QueueSpec(name="ls", deserved_gpus=2), QueueSpec(name="batch", deserved_gpus=6)]
    )
    infer = {"priority_class": "inference", "runtime_s": 3600}
    jobs = [JobSpec(name=f"svc{i}", queue="ls", at_s=0, **infer) for i in range(2)]
    jobs += [
        JobSpec(name=f"held{i:03d}", queue="ls", at_s=10, cpu_per_pod=1 + i / 1000, **infer)
        for i in range(101)
    ]
    jobs.append(
        JobSpec(name="cpu-only", queue="ls", at_s=20, gpus_per_pod=0, cpu_per_pod=4, **infer)
    )
    assert run_checked(cluster, queues, WorkloadFile(jobs=jobs, horizon_s=600)) > 0


def _one_then_two(placement: str) -> State:
    """Nodes a and b of 2 GPUs, one of a's taken; pending, a gang of a 1-GPU pod then a
    2-GPU pod, placed by ``placement``."""
    state = State()
    gang = job("g", "q", pods=2, placement=placement)
    pods = (gang.pods[0], msgspec.structs.replace(gang.pods[1], gpu_milli=2000))
    for event in (
        node("a", gpus=2),
        node("b", gpus=2),
        queue("q", deserved=4),
        job("filler", "q"),
        PodsAllocated(
            job="filler",
            queue="q",
            placements=(PodPlacement(pod="filler-0", node="a", gpus=(GpuSlot(0, 1000),)),),
        ),
        msgspec.structs.replace(gang, pods=pods),
    ):
        apply(state, event, 0)
    return state


def test_fitting_jobs_place_as_allocate_scores_nodes() -> None:
    # Packed, the 1-GPU pod takes a's last GPU and the 2-GPU pod fits b; spread, the 1-GPU
    # pod goes to b and neither node has 2 GPUs left: the gang fits only as packed.
    packed = _one_then_two("binpack")
    assert [j.job for j in fitting_jobs(packed, live_reservations(packed))] == ["g"]
    spread = _one_then_two("spread")
    assert [j.job for j in fitting_jobs(spread, live_reservations(spread))] == []


def _waits_by_definition(state: State) -> tuple[bool, int, bool]:
    """What the conservation monitor reports, by its definition: every job that fits, each
    asked whether a rule holds it back."""
    skip = live_reservations(state)
    idle = sum(
        n.free_gpu_milli for n in state.nodes.values() if not n.cordoned and n.name not in skip
    )
    fitting = list(fitting_jobs(state, skip))
    if not fitting:
        return (False, idle, False)
    if state.policy not in ("gpuledger", "kai"):
        return (True, idle, False)
    shares = fair_shares(state)
    held = [
        (queue := state.queues.get(j.queue)) is not None
        and admission_reason(state, queue, j, shares) is not None
        for j in fitting
    ]
    return (True, idle, all(held))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_estimates(), st.sampled_from(["gpuledger", "kai", "drf"]))
def test_the_monitor_tries_free_jobs_first_and_reports_as_defined(scenario, policy) -> None:  # type: ignore[no-untyped-def]
    seen: list[bool] = []

    def observe(state: State, now: int) -> None:
        got = fitting_job_waits(state)
        assert got == _waits_by_definition(state), f"t={now / 1000:.1f}s"
        seen.append(got[2])

    Simulation(*scenario, policy_event(policy, PolicyFile()), MemoryLedger()).run(observe=observe)
    assert seen


def test_the_monitor_reports_capacity_that_only_held_jobs_fit() -> None:
    # ls deserves 2 of 8 GPUs and its non-preemptible work holds them; 20 more of its jobs
    # fit the 6 idle GPUs but the quota rule holds them all back
    cluster = ClusterFile(nodes=[NodeGroup(name="n", count=1, gpus=8, cpu=64, memory_gib=256)])
    queues = QueuesFile(
        queues=[QueueSpec(name="ls", deserved_gpus=2), QueueSpec(name="batch", deserved_gpus=6)]
    )
    infer = {"priority_class": "inference", "runtime_s": 3600}
    jobs = [JobSpec(name=f"svc{i}", queue="ls", at_s=0, **infer) for i in range(2)]
    jobs += [JobSpec(name=f"held{i:02d}", queue="ls", at_s=10, **infer) for i in range(20)]
    seen: list[tuple[bool, int, bool]] = []

    def observe(state: State, now: int) -> None:
        got = fitting_job_waits(state)
        assert got == _waits_by_definition(state)
        seen.append(got)

    workload = WorkloadFile(jobs=jobs, horizon_s=600)
    Simulation(cluster, queues, workload, policy_event("gpuledger", PolicyFile()),
               MemoryLedger()).run(observe=observe)  # fmt: skip
    assert (True, 6000, True) in seen, "idle GPUs that only held jobs fit, counted as by rule"
