"""Reclaim beyond a job's deserved quota reads no victim when no victims could make room
within its lost-work budget (``Tuning.lost_floor``): two lower bounds decide that without
the victim order — what evictions must free before the gang fits
(``placement.least_to_free``) and what freeing it loses at the least
(``RunningIndex.lost_floor``). Each is checked against a brute force, and simulations
with the shortcut on and off must write the very same ledger."""

from __future__ import annotations

import itertools
import math
import random

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.cluster import packed as packed_cluster
from events.codec import encode_envelope
from replay.config import PolicyFile, WorkloadFile, policy_event
from scheduler.core import victims as victims_module
from scheduler.core.apply import lost_work
from scheduler.core.placement import least_to_free
from scheduler.core.running import NEVER, held_gpu
from scheduler.core.state import FreeIndex, Node
from scheduler.core.tuning import Tuning
from tests.simkit import simulate
from tests.test_node_by_node import KNOBS, Scenario, _over_quota, packed
from tests.test_running_index import time_passing


def _brute_least(frees: list[int], sizes: list[int]) -> int:
    """The least freed over every way to put the pods on the nodes (no node capacity:
    a relaxation, so the bound must stay below it too)."""
    best = NEVER
    for where in itertools.product(range(len(frees)), repeat=len(sizes)):
        on = [0] * len(frees)
        for node, size in zip(where, sizes, strict=True):
            on[node] += size
        best = min(best, sum(max(0, a - f) for a, f in zip(on, frees, strict=True)))
    return best


def _index(frees: list[int]) -> FreeIndex:
    return FreeIndex.of(
        {f"n{i}": Node(name=f"n{i}", gpus=8, cpu_milli=0, memory_mib=0, labels={},
                       free_gpu_milli=f) for i, f in enumerate(frees)}
    )  # fmt: skip


def _demand(sizes: list[int]) -> list[tuple[int, int]]:
    return [(s, sum(1 for x in sizes if x >= s)) for s in sorted(set(sizes))]


@example([3000, 2000, 1000, 0], [8000, 8000])
@example([7000, 7000], [4000, 4000, 4000])
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 32).map(lambda q: q * 250), min_size=1, max_size=4),
    st.lists(st.sampled_from([250, 500, 1000, 2000, 3000, 4000, 8000]), min_size=1, max_size=4),
)
def test_least_to_free_is_never_above_what_any_placement_frees(frees, sizes) -> None:  # type: ignore[no-untyped-def]
    least = least_to_free(_index(frees), _demand(sizes))
    assert 0 <= least <= _brute_least(frees, sizes)
    assert least >= sum(sizes) - sum(frees)


def test_least_to_free_of_whole_node_pods_on_fragmented_nodes() -> None:
    """Two 8-GPU pods where the nodes have 3, 2 and 1 GPUs free: 5 and 6 GPUs must be
    freed on the two emptiest-to-be nodes, though 6 GPUs are free in all."""
    assert least_to_free(_index([3000, 2000, 1000]), [(8000, 2)]) == 11000


def _cheapest(items: list[tuple[int, int]], need: int) -> int:
    """The least total lost work of a set of (held, lost) items holding ``need``
    together (NEVER: none does), by a knapsack over held in units of their gcd."""
    unit = math.gcd(need, *(h for h, _ in items))
    want = -(-need // unit)
    best = [0] + [NEVER] * want
    for held, lost in items:
        step = held // unit
        for have in range(want, 0, -1):
            before = best[max(0, have - step)]
            if before < NEVER and before + lost < best[have]:
                best[have] = before + lost
    return best[want]


def test_lost_floor_is_never_above_what_any_set_of_victims_loses() -> None:
    """On a packed cluster as time passes (jobs checkpointing or not, started or only
    placed), for random leaves, needs and budgets: ``lost_floor`` is at most the least
    work any set of the leaves' victims, each within the budget, loses holding the need,
    and above the budget where no such set exists."""
    state = packed_cluster(12, 240, 10, "gpuledger", seed=3)
    rng = random.Random(3)
    leaves = [q.name for q in state.leaf_queues()]
    checked = pruned = 0
    gaps = (1, 1000, 60_000, 600_000, 3_600_000)
    for now in time_passing(state, rng, 30, gaps, (250, 1000, 8000)):
        index = state.running_index()
        for _ in range(6):
            chosen = rng.sample(leaves, rng.randint(1, 6))
            need = rng.choice((250, 1000, 4000, 8000, 16000))
            budget = rng.choice((0, 10_000, 1_000_000, 30_000_000, 300_000_000))
            items = [
                (held_gpu(job), lost_work(job, now)[0])
                for leaf in chosen
                for job in (state.jobs[j] for j in state.queues[leaf].active)
                if job.preemptible and held_gpu(job) > 0
            ]
            least = _cheapest([(h, lost) for h, lost in items if lost <= budget], need)
            floor = index.lost_floor(state, chosen, need, budget)
            assert floor <= least, (now, chosen, need, budget)
            assert least < NEVER or floor > budget  # where none could, the search ends
            checked += 1
            pruned += floor > budget
    assert checked == 180 and 0 < pruned < checked  # both outcomes were exercised


def _ledger(scenario: Scenario, knobs: PolicyFile, checkpoint: int, on: bool) -> list[bytes]:
    cluster, queues, workload = scenario
    if checkpoint:
        jobs = [msgspec.structs.replace(j, checkpoint_interval_s=checkpoint) for j in workload.jobs]
        workload = WorkloadFile(jobs=jobs)
    policy = policy_event("gpuledger", knobs)
    _, ledger = simulate(cluster, queues, workload, policy, Tuning(lost_floor=on))
    return [encode_envelope(env) for env in ledger.records]


@example(_over_quota(), PolicyFile(), 0)
@example(_over_quota(), PolicyFile(), 60)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packed(), KNOBS, st.sampled_from([0, 0, 60, 600]))
def test_the_lost_floor_shortcut_writes_the_same_ledger(scenario, knobs, checkpoint) -> None:  # type: ignore[no-untyped-def]
    assert _ledger(scenario, knobs, checkpoint, True) == _ledger(scenario, knobs, checkpoint, False)


def _read(on: bool, checkpoint: int | None) -> tuple[int, int, list[bytes]]:
    """Victims the victim order yielded and searches the floor ended, on ``_over_quota``
    with its small jobs checkpointing every ``checkpoint`` seconds (None: never): every
    job the gang could take has lost minutes of work, and its budget grows from
    nothing."""
    cluster, queues, workload = _over_quota()
    jobs = [
        msgspec.structs.replace(j, checkpoint_interval_s=checkpoint if j.name[0] != "g" else None)
        for j in workload.jobs
    ]
    counted = {"read": 0, "ended": 0}
    real_ordered, real_beyond = victims_module._Take._ordered, victims_module._beyond_budget

    def ordered(*args, **kwargs):  # type: ignore[no-untyped-def]
        for row in real_ordered(*args, **kwargs):
            counted["read"] += 1
            yield row

    def beyond(*args, **kwargs):  # type: ignore[no-untyped-def]
        found = real_beyond(*args, **kwargs)
        counted["ended"] += found
        return found

    victims_module._Take._ordered = ordered  # type: ignore[method-assign]
    victims_module._beyond_budget = beyond  # type: ignore[assignment]
    try:
        policy = policy_event("gpuledger", PolicyFile())
        _, ledger = simulate(
            cluster, queues, WorkloadFile(jobs=jobs), policy, Tuning(lost_floor=on)
        )
    finally:
        victims_module._Take._ordered = real_ordered  # type: ignore[method-assign]
        victims_module._beyond_budget = real_beyond  # type: ignore[assignment]
    return counted["read"], counted["ended"], [encode_envelope(e) for e in ledger.records]


@pytest.mark.parametrize("checkpoint", [None, 600])
def test_a_search_beyond_the_budget_reads_no_victim(checkpoint: int | None) -> None:
    read_on, ended_on, ledger_on = _read(True, checkpoint)
    read_off, ended_off, ledger_off = _read(False, checkpoint)
    assert ended_on > 0 and ended_off == 0
    assert read_on < read_off
    assert ledger_on == ledger_off
