"""A queue's pending order in blocks (``scheduler.core.pendingblocks``): the blocks follow
the order through any insertions and removals, and a block's summary says "every job held
back" exactly when admission holds back each of its jobs and none backs off, and "every
job passed over" exactly when each is held back or of a skip key skipped already."""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.headroom import admission_held
from scheduler.core.pendingblocks import PendingBlocks, minimal
from scheduler.core.running import NEVER
from scheduler.core.tuning import DEFAULT


@dataclass
class FakeJob:
    request: tuple[int, int, int]
    preemptible: bool
    backoff_until: int = 0


requests = st.tuples(
    st.sampled_from([0, 250, 500, 1000, 2000]),
    st.sampled_from([0, 1000, 4000]),
    st.sampled_from([0, 4096, 16384]),
)
"""Requests from ``GPUS``, ``CPUS`` and ``MEMORY`` (below)."""
jobs_st = st.builds(FakeJob, requests, st.booleans(), st.sampled_from([0, 0, 0, 50, 150]))
headroom = st.tuples(
    *(st.one_of(st.just(NEVER), st.integers(-1000, 5000)) for _ in range(2)),
    st.one_of(st.just(NEVER), st.integers(-1000, 20000)),
    st.one_of(st.just(NEVER), st.integers(-1000, 3000)),
)


def consistent(blocks: PendingBlocks, pending: list[tuple[int, int, str]]) -> None:
    """Every block holds as many keys as its count says, none is empty, and the blocks
    cover the whole order."""
    assert sum(blocks.counts) == len(pending)
    assert all(blocks.counts)
    assert blocks.starts == sorted(blocks.starts)
    lo = 0
    for b, start in enumerate(blocks.starts):
        hi = bisect_left(pending, blocks.starts[b + 1]) if b + 1 < len(blocks.starts) else None
        end = len(pending) if hi is None else hi
        assert bisect_left(pending, start) == lo
        assert end - lo == blocks.counts[b]
        lo = end
    assert lo == len(pending)


@pytest.mark.parametrize("size", [1, 2, DEFAULT.block])
@settings(max_examples=150, deadline=None)
@given(
    st.lists(jobs_st, min_size=0, max_size=30),
    st.lists(st.tuples(st.booleans(), st.integers(0, 10_000), jobs_st), max_size=80),
    st.lists(headroom, min_size=1, max_size=4),
    st.booleans(),
    st.integers(0, 200),
)
def test_blocks_follow_the_order_and_summaries_hold(  # type: ignore[no-untyped-def]
    size, initial, ops, rooms, limited, now
) -> None:
    _follow(initial, ops, rooms, limited, now, size)  # small blocks: many cuts and emptied blocks


GPUS, CPUS, MEMORY = [0, 250, 500, 1000, 2000], [0, 1000, 4000], [0, 4096, 16384]


def skip_of(job: FakeJob) -> int:
    """A skip key id, one per request and preemptibility (as ``allocate.skip_id`` numbers
    them); jobs asking for no GPU have none, as if the memo could not judge them."""
    gpu, cpu, memory = job.request
    if not gpu:
        return -1
    return (
        (GPUS.index(gpu) * 3 + CPUS.index(cpu)) * 3 + MEMORY.index(memory)
    ) * 2 + job.preemptible


SKIP_SETS = [{}, dict.fromkeys(range(0, 90, 3)), dict.fromkeys(range(90))]
"""Skip keys the walk skipped already: none, some, all."""


def _follow(  # type: ignore[no-untyped-def]
    initial, ops, rooms, limited, now, size
) -> None:
    skip_sets: list[dict[int, None]] = SKIP_SETS
    jobs: dict[str, FakeJob] = {}
    pending: list[tuple[int, int, str]] = []
    for seq, job in enumerate(initial):
        key = (-(seq % 3) * 25, seq, f"j{seq}")
        jobs[key[2]] = job
        insort(pending, key)
    blocks = PendingBlocks.of(pending, size)
    consistent(blocks, pending)
    seq = len(initial)
    for add, pick, job in ops:
        if add or not pending:
            seq += 1
            key = (-(pick % 3) * 25, seq if pick % 2 else -seq, f"j{seq}")
            jobs[key[2]] = job
            insort(pending, key)
            blocks.added(pending, key)
        else:
            key = pending.pop(pick % len(pending))
            blocks.removed(key)
        consistent(blocks, pending)
        lo = 0
        for b, count in enumerate(blocks.counts):
            summary = blocks.summary(b, pending, lo, jobs, skip_of)  # type: ignore[arg-type]
            for room in rooms:
                expected = all(
                    jobs[j].backoff_until <= now
                    and (limited or not jobs[j].preemptible)
                    and admission_held(room, jobs[j].request, jobs[j].preemptible)
                    for _, _, j in pending[lo : lo + count]
                )
                assert summary.all_held(limited, room, now) == expected
                # ``passes``: each job held back or of a key skipped already.
                for skipping in skip_sets:
                    passed = all(
                        jobs[j].backoff_until <= now
                        and (
                            skip_of(jobs[j]) in skipping  # type: ignore[arg-type]
                            or (
                                (limited or not jobs[j].preemptible)
                                and admission_held(room, jobs[j].request, jobs[j].preemptible)
                            )
                        )
                        for _, _, j in pending[lo : lo + count]
                    )
                    assert summary.passes(limited, room, now, skipping) == passed
            lo += count
        _check_held_run(blocks, pending, jobs, limited, now)
        if seq % 2:
            _keep_first_run(blocks, pending, jobs, limited, rooms[0], now)


def _keep_first_run(  # type: ignore[no-untyped-def]
    blocks: PendingBlocks, pending, jobs, limited: bool, room, now: int
) -> None:
    """Keep the first run of blocks held back whole, as a walk from the head would."""
    lo = 0
    first = None
    for b, count in enumerate(blocks.counts):
        if blocks.summary(b, pending, lo, jobs, skip_of).all_held(limited, room, now):
            first = pending[lo] if first is None else first
        elif first is not None:
            blocks.keep(first, pending[lo], limited, room, now)
            return
        lo += count
    blocks.keep(first, None, limited, room, now)


def _check_held_run(  # type: ignore[no-untyped-def]
    blocks: PendingBlocks, pending, jobs, limited: bool, now: int
) -> None:
    """The kept run, through every insertion and removal since, holds back each job in it
    under its headroom and any smaller one, later, and no job outside it."""
    run = blocks.held
    if run is None:
        return
    smaller = tuple(bound - 1 for bound in run.headroom)
    larger = [(*run.headroom[:i], run.headroom[i] + 1, *run.headroom[i + 1 :]) for i in range(4)]
    for key in pending:
        inside = run.first <= key and (run.stop is None or key < run.stop)
        job = jobs[key[2]]
        assert run.holds(key, limited, run.headroom, now) == inside
        assert run.holds(key, limited, smaller, now + 1) == inside  # type: ignore[arg-type]
        assert not run.holds(key, not limited, run.headroom, now)
        assert not any(run.holds(key, limited, room, now) for room in larger)  # type: ignore[arg-type]
        if inside:
            assert job.backoff_until <= now
            assert limited or not job.preemptible
            assert admission_held(run.headroom, job.request, job.preemptible)


@given(st.lists(requests, max_size=12))
def test_minimal_requests(vectors) -> None:  # type: ignore[no-untyped-def]
    """Every request is at least one of the minimal ones in every resource, and no
    minimal one is at least another."""
    kept = minimal(vectors)
    for v in vectors:
        assert any(all(u[r] <= v[r] for r in range(3)) for u in kept)
    for u in kept:
        assert not any(w != u and all(w[r] <= u[r] for r in range(3)) for w in kept)
