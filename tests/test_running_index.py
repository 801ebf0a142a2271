"""The running index (``scheduler/core/running.py``) is what a fresh look would give
(and so is the pending demand kept per queue, ``State.wanted``).

``apply`` keeps the index current job by job across cycles; these tests fold random
inputs (starts, finishes, failed binds, cancels, node and queue churn, policy switches)
and check, after every event, that it holds exactly what building it from scratch holds,
that its two orders are the plain sorts they replace, and that a core which throws the
index away before every cycle decides the very same bytes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from bench.cluster import packed
from events.codec import encode
from events.model import JobSubmitted, PodFinished, PodSpec, PodStarted, QueueConfigured
from scheduler.core import State, apply, cycle
from scheduler.core.running import NEVER, RunningIndex, held_gpu, victim_key
from scheduler.core.state import ACTIVE
from tests.test_ended_jobs import _World


def _plain_ends(state: State, gpus_only: bool) -> list[tuple[int, int, str]]:
    """Expected ends as the policy defines them: sorted afresh. A job counts from its
    start, placed but not started from its placement, and held only in part from now."""
    now = state.now
    found = []
    for leaf in state.leaf_queues():
        for job_id in leaf.active:
            job = state.jobs[job_id]
            if gpus_only and not job.request[0]:
                continue
            runtime = job.expected_runtime_ms
            if runtime is None:
                end = NEVER
            else:
                began = job.started_at if job.started_at is not None else job.allocated_at
                if began is None:
                    began = now
                end = max(now, began + runtime - job.checkpointed_ms)
            found.append((end, job.seq, job_id))
    return sorted(found)


def _plain_victims(state: State, leaves: list[str]) -> list[tuple[int, int, int, str]]:
    """Victim order as the policy defines it: every preemptible active job keyed, sorted."""
    keys = []
    for leaf in leaves:
        for job_id in state.queues[leaf].active:
            job = state.jobs[job_id]
            if job.preemptible:
                keys.append(victim_key(job, state.now, held_gpu(job)))
    return sorted(keys)


def _check(state: State) -> None:
    if state.wanted_cache is not None:
        wanted = dict(state.wanted_cache)
        state.wanted_cache = None
        assert {q.name: state.wanted(q) for q in state.queues.values()} == {
            q.name: wanted.get(q.name, [0, 0, 0, 0]) for q in state.queues.values()
        }
    index = state.running_cache
    if index is None:
        return
    assert index.content(state.now) == RunningIndex.of(state).content(state.now)
    for gpus_only in (False, True):
        assert list(index.ends(state, gpus_only)) == _plain_ends(state, gpus_only)
    leaves = [q.name for q in state.leaf_queues()]
    got = [item[:4] for item in index.victim_order(state, leaves)]
    assert got == _plain_victims(state, leaves)


@pytest.mark.parametrize("seed", range(12))
def test_the_index_kept_by_apply_is_the_index_built_afresh(seed: int) -> None:
    world = _World(seed)
    state = State()
    now = 0
    for step in range(160):
        events = world.setup() if step == 0 else world.inputs(state)
        now += world.rng.choice((1, 500, 1000, 4000))
        for event in events:
            apply(state, event, now)
            _check(state)
        state.running_index()  # built now if a queue event dropped it
        cycle(state, now)
        _check(state)


@pytest.mark.parametrize("seed", range(12))
def test_a_core_that_rebuilds_the_index_every_cycle_decides_the_same(seed: int) -> None:
    world, fresh_world = _World(seed), _World(seed)
    state, fresh = State(), State()
    now = 0
    for step in range(160):
        events = world.setup() if step == 0 else world.inputs(state)
        assert events == (fresh_world.setup() if step == 0 else fresh_world.inputs(fresh))
        now += world.rng.choice((1, 500, 1000, 4000))
        fresh_world.rng.choice((1, 500, 1000, 4000))
        for event in events:
            apply(state, event, now)
            apply(fresh, event, now)
        fresh.running_cache = None
        decided = [encode(d, now) for d in cycle(state, now)]
        assert decided == [encode(d, now) for d in cycle(fresh, now)], f"step {step}"


def time_passing(
    state: State, rng: random.Random, steps: int, gaps: tuple[int, ...], gpus: tuple[int, ...]
) -> Iterator[int]:
    """A packed cluster as time passes, one step after another (``now`` after each): a
    few jobs finish a pod, one job of ``gpus`` milli-GPUs (checkpointing or not) arrives,
    a cycle runs, and about half the jobs it placed start."""
    leaves = [q.name for q in state.leaf_queues()]
    now = state.now
    for i in range(steps):
        now += rng.choice(gaps)
        live = sorted(j.job for j in state.jobs.values() if j.status in ACTIVE)
        for job_id in rng.sample(live, min(3, len(live))):
            job = state.jobs[job_id]
            apply(state, PodFinished(job=job_id, pod=job.live()[0].pod), now)
        pod = PodSpec(name=f"x{i}-0", gpu_milli=rng.choice(gpus), cpu_milli=100)
        apply(
            state,
            JobSubmitted(
                job=f"x{i}", queue=rng.choice(leaves), pods=(pod,),
                expected_runtime_ms=rng.choice((None, 60_000, 7_200_000)),
                checkpoint_interval_ms=rng.choice((None, 300_000)),
            ),
            now,
        )  # fmt: skip
        cycle(state, now)
        for job in sorted(state.jobs.values(), key=lambda j: j.seq):
            if job.status == "allocated" and rng.random() < 0.5:
                for name in list(job.placements):
                    apply(state, PodStarted(job=job.job, pod=name), now)
        yield now


def test_orders_on_a_packed_cluster_as_time_passes() -> None:
    """Jobs of every kind (whole-node gangs, fractions, CPU-only; checkpointing or not;
    started or only allocated) at several times: the index reads as the plain sorts."""
    state = packed(30, 700, 20, "gpuledger", seed=5)
    rng = random.Random(5)
    leaves = [q.name for q in state.leaf_queues()]
    state.running_index()
    for _ in time_passing(state, rng, 40, (1, 1000, 600_000, 3_600_000), (0, 250, 1000)):
        _check(state)
    now = state.now
    apply(state, QueueConfigured(queue=leaves[0], deserved_gpu_percent=5), now)
    assert state.running_cache is None  # the tree may have changed: built afresh
    state.running_index()
    _check(state)
