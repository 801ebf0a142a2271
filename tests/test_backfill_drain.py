"""A reservation's head is not starved by the jobs backfilled onto its nodes (core revision 13).

A preemptible job may be placed on a blocked gang's reserved nodes and gives way when the gang
can start, but only while the work it would lose is younger than ``backfill_give_way_ms``; an
older one is waited for, and the reservation drains: no more jobs that would have to give way
are placed there. Property, on random streams of such jobs: the gang starts no later than the
last of the jobs on its nodes when it came due ends, whatever keeps arriving; no job that gives
way loses work older than the bound; and the jobs are never placed on a draining
reservation's nodes.
"""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from events.model import (
    Event,
    JobPreempted,
    JobUnschedulable,
    PodFinished,
    PodsAllocated,
    PodStarted,
)
from tests.builders import World, job, node, queue

BOUND_S = 600


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(2, 3),
    gap_s=st.integers(20, 400),
    lives=st.lists(st.integers(30, 3000), min_size=40, max_size=40),
    long_ends_s=st.integers(500, 4000),
)
def test_a_draining_reservation_starts_when_its_backfilled_jobs_end(
    nodes: int, gap_s: int, lives: list[int], long_ends_s: int
) -> None:
    w = World(
        *(node(f"n{k}") for k in range(nodes)),
        queue("big", deserved=8 * nodes),
        backfill=True,
        backfill_give_way_ms=BOUND_S * 1000,
    )
    w.at(0, job("long", "big", gpus=8, cls="build"))
    w.start(1, "long")
    w.at(2, job("gang", "big", pods=nodes, gpus=8))
    assert w.status("gang") == "pending"

    # (time, order, kind, job): submissions of 1-GPU preemptible fillers with no runtime
    # estimate, starts one second after placement, finishes `life` after the start
    agenda: list[tuple[int, int, str, str]] = [(long_ends_s, 0, "finish", "long")]
    for k, _ in enumerate(lives):
        heapq.heappush(agenda, (10 + k * gap_s, 1, "submit", f"f{k}"))
    heapq.heapify(agenda)
    life = {f"f{k}": lives[k] for k in range(len(lives))}
    started: dict[str, int] = {}
    placed_at: dict[str, int] = {}
    running_when_due: dict[str, int] | None = None  # job -> start, when the gang came due
    gang_at: int | None = None
    running_at_end: dict[str, int] = {}
    while agenda and gang_at is None:
        at, _, kind, name = heapq.heappop(agenda)
        assert at < 10 + len(lives) * gap_s + 2 * max(lives) + 10
        pending = [e for e in agenda if e[0] == at]
        batch = [(kind, name)] + [(k, n) for _, _, k, n in pending]
        for entry in pending:
            agenda.remove(entry)
        heapq.heapify(agenda)
        events: list[Event] = []
        for kind_, name_ in batch:
            current = w.state.jobs.get(name_)
            placed = current.placements if current is not None else {}
            if kind_ == "submit":
                events.append(job(name_, "big", gpus=1))
            elif kind_ == "start" and placed and placed_at.get(name_) == at - 1:
                events += [PodStarted(job=name_, pod=p) for p in placed]
                started[name_] = at
            elif (
                kind_ == "finish"
                and placed
                and (name_ == "long" or _ends(started, life, name_, at))
            ):
                events += [PodFinished(job=name_, pod=p) for p in placed]
                started.pop(name_, None)
        got = w.at(at, *events)
        for d in got:
            if isinstance(d, PodsAllocated) and d.job == "gang":
                gang_at = at
            elif isinstance(d, PodsAllocated):
                placed_at[d.job] = at
                heapq.heappush(agenda, (at + 1, 2, "start", d.job))
                heapq.heappush(agenda, (at + 1 + life[d.job], 3, "finish", d.job))
                # never onto the nodes of a reservation that is draining
                assert running_when_due is None or not d.backfill_for, d
            elif isinstance(d, JobPreempted):
                assert d.rule == "backfill"
                assert d.lost_gpu_ms < BOUND_S * 1000, d  # 1 GPU: lost ms per GPU
                started.pop(d.job, None)
                placed_at.pop(d.job, None)
            elif (
                isinstance(d, JobUnschedulable)
                and d.job == "gang"
                and "due now" in d.reason
                and running_when_due is None
            ):
                running_when_due = dict(started)
        if at == long_ends_s:
            running_at_end = dict(started)  # what holds the gang's nodes once `long` ends
    assert gang_at is not None, "the gang never started"
    # it starts when `long` ends, or by the time the last job running then ends (in that
    # very cycle): none placed later holds it up
    ends = [begun + life[j] for j, begun in running_at_end.items()]
    assert gang_at <= max([long_ends_s, *ends])


def _ends(started: dict[str, int], life: dict[str, int], name: str, at: int) -> bool:
    """Whether this run of the job ends at ``at`` (not an earlier run it was evicted from)."""
    return name in started and started[name] + life[name] == at
