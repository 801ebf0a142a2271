"""``backfill.uniform_gangs`` reads an index kept across cycles (``State.uniform_cache``):
it must name the same gang sizes as a walk through every leaf's pending order, whatever
was submitted, placed, cancelled or re-queued since it was built."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from events.model import (
    GpuSlot,
    JobCancelled,
    JobSubmitted,
    NodeRegistered,
    PodPlacement,
    PodsAllocated,
    PodSpec,
    PolicyConfigured,
    QueueConfigured,
    Resources,
)
from scheduler.core.apply import apply
from scheduler.core.backfill import uniform_gangs
from scheduler.core.placement import job_shape
from scheduler.core.state import State


def _walked(state: State, size: int) -> set[int]:
    """The gang sizes a walk through every leaf's pending order finds."""
    found = set()
    for leaf in state.leaf_queues():
        for _, _, job_id in leaf.pending:
            job = state.jobs[job_id]
            if job_shape(state.shape_cache, job).uniform == size and not job.placements:
                found.add(len(job.pods))
    return found


def _state() -> State:
    state = State()
    apply(state, PolicyConfigured(policy="gpuledger"), 0)
    apply(state, QueueConfigured(queue="a", deserved=Resources(gpu_milli=8000)), 0)
    apply(state, QueueConfigured(queue="b", deserved=Resources(gpu_milli=8000)), 0)
    apply(state, NodeRegistered(node="n0", gpus=8), 0)
    return state


STEP = st.one_of(
    st.tuples(
        st.just("submit"), st.sampled_from((500, 1000, 2000)), st.integers(1, 4), st.booleans()
    ),
    st.tuples(st.just("cancel"), st.integers(0, 30), st.just(0), st.just(False)),
    st.tuples(st.just("place"), st.integers(0, 30), st.just(0), st.just(False)),
    st.tuples(st.just("read"), st.sampled_from((500, 1000, 2000)), st.just(0), st.just(False)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=40))
def test_the_index_names_what_a_walk_of_the_pending_orders_finds(steps: list) -> None:
    state = _state()
    submitted: list[JobSubmitted] = []
    at = 1
    for kind, a, b, flag in steps:
        at += 1
        if kind == "submit":
            job = JobSubmitted(
                job=f"j{len(submitted)}",
                queue="a" if flag else "b",
                # a CPU request makes a gang no plain one: the index must leave it out
                pods=tuple(
                    PodSpec(name=f"j{len(submitted)}-{k}", gpu_milli=a, cpu_milli=100 * (a == 2000))
                    for k in range(b)
                ),
            )
            submitted.append(job)
            apply(state, job, at)
        elif kind in ("cancel", "place") and submitted:
            job = submitted[a % len(submitted)]
            live = state.jobs.get(job.job)
            if live is None or live.status != "pending":
                continue
            if kind == "cancel":
                apply(state, JobCancelled(job=job.job), at)
            else:
                pod = job.pods[0]
                slot = (GpuSlot(0, min(pod.gpu_milli, 1000)),)
                placements = (PodPlacement(pod=pod.name, node="n0", gpus=slot),)
                apply(state, PodsAllocated(job=job.job, queue=job.queue, placements=placements), at)
        if kind == "read":  # changes pile up between reads
            assert set(uniform_gangs(state, a)) == _walked(state, a)
    for size in (500, 1000, 2000):
        assert set(uniform_gangs(state, size)) == _walked(state, size)
