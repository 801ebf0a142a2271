"""Consolidation: defragment the cluster for a queue's head that no victim rule could
start, by moving preemptible running jobs elsewhere (``job_preempted`` with rule
``consolidation``, then ``pods_allocated`` where they go). Only where pods can be run again
(``requeue_lost``, the simulator), and only when every moved job is placed again at once.
"""

from __future__ import annotations

from events.model import PodPlacement
from scheduler.core.placement import Statement, gang_demand, may_fit
from scheduler.core.state import Job, State
from scheduler.core.victims import Victims, may_take

Moves = list[tuple[Job, list[PodPlacement]]]
"""Jobs moved, each with where its pods go."""


def consolidate(
    state: State, job: Job, stmt: Statement, allowed: dict[str, None] | None, victims: Victims
) -> tuple[list[PodPlacement] | None, Moves]:
    """Move preemptible running jobs, cheapest first, until the gang fits and every job
    moved is placed again elsewhere; otherwise move nothing. Returns the gang's placements
    and the moves (both made in ``stmt``); a job that would land exactly where it is did
    not need to move and is left out."""
    if state.free_schedulable() < job.request[0]:
        return None, []  # not fragmentation: there is not enough free GPU in total
    # A job some of whose pods have finished is never moved: requeued, it would need every
    # pod placed again (its finished ones included), and only its live pods are placed here.
    candidates = [
        item[4]
        for item in victims.of(q.name for q in state.leaf_queues())
        if not item[4].finished and may_take(state, item[4], "preempt")
    ]
    start = stmt.checkpoint()
    moved: list[Job] = []
    demand = gang_demand(job, stmt.fractional)
    for victim in candidates:
        stmt.evict(victim)
        moved.append(victim)
        if stmt.index is not None and not may_fit(stmt.index, demand):
            continue
        point = stmt.checkpoint()
        placements = stmt.place_gang(job, skip=allowed)
        if placements is None:
            continue
        moves = _replace(state, stmt, moved)
        if moves is not None:
            return placements, [(o, w) for o, w in moves if w != o.live()]
        stmt.rollback(point)
    stmt.rollback(start)
    return None, []


def _replace(state: State, stmt: Statement, moved: list[Job]) -> Moves | None:
    """Place every moved job's live pods again, anywhere; None if one does not fit."""
    everywhere = list(state.nodes.values())
    moves: Moves = []
    for other in moved:
        live = {p.pod for p in other.live()}
        pods = [p for p in other.pods if p.name in live]
        where = stmt.place_pods(other.job, pods, everywhere)
        if where is None:
            return None
        moves.append((other, where))
    return moves
