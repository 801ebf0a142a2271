"""A statement leaves no trace: whatever an action tries in its ``with`` block (placing
gangs, evicting running jobs, rolling back to checkpoints, failing half-way), the nodes
and the free-capacity index are as they were when the block ends."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.placement import Statement
from scheduler.core.state import ACTIVE, FreeIndex, State
from tests.builders import World, job, node, queue


def _snapshot(state: State, index: FreeIndex) -> object:
    nodes = {
        n.name: (
            list(n.free_devices), n.free_gpu_milli, n.free_whole, n.free_cpu, n.free_memory,
            dict(n.pods),
        )
        for n in state.nodes.values()
    }  # fmt: skip
    return nodes, {k: list(v) for k, v in index.buckets.items()}, list(index.keys)


class AbandonedError(Exception):
    """An action failing half-way through its statement."""


OPS = st.lists(
    st.tuples(st.sampled_from(["place", "evict", "checkpoint", "rollback"]), st.integers(0, 9)),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4),
    jobs=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([0.5, 1, 2, 4])), min_size=1, max_size=8
    ),
    ops=OPS,
    fail=st.booleans(),
)
def test_a_statement_rolls_everything_back_when_its_block_ends(
    gpus: list[int], jobs: list[tuple[int, float]], ops: list[tuple[str, int]], fail: bool
) -> None:
    w = World(*(node(f"n{i}", gpus=g) for i, g in enumerate(gpus)), queue("a"))
    w.at(1, *(job(f"j{k}", "a", pods=p, gpus=g) for k, (p, g) in enumerate(jobs)))
    state = w.state
    index = state.free_index()
    pending = [j for j in state.jobs.values() if not j.placements]
    running = [j for j in state.jobs.values() if j.placements and j.status in ACTIVE]
    before = _snapshot(state, index)
    expected = pytest.raises(AbandonedError) if fail else nullcontext()
    with expected, Statement(state.nodes, index=index) as stmt:
        points = [stmt.checkpoint()]
        for op, k in ops:
            if op == "place" and pending:
                stmt.place_gang(pending[k % len(pending)])
            elif op == "evict" and running:
                victim = running[k % len(running)]
                if victim.job not in stmt.evicted:
                    stmt.evict(victim)
            elif op == "checkpoint":
                points.append(stmt.checkpoint())
            elif op == "rollback":
                stmt.rollback(points[k % len(points)])
        if fail:
            raise AbandonedError
    assert _snapshot(state, index) == before
    assert (stmt.steps, stmt.evicted) == ([], [])
