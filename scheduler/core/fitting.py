"""Whether a pending job would fit now: the dry run behind work conservation.

Public for the read side (``replay.conservation``'s monitor, which charges idle time while
a job that fits waits): ``fitting_job_waits(state)`` answers it after a cycle,
``fitting_jobs`` lists such jobs lazily, ``live_reservations`` names the nodes a
reservation still holds. Each job's placement is a dry run with the gang policy's own node
scoring (``allocate.score_for``) and failed-shape memory (``placement.FailedShapes``), rolled
back; the gang policy's admission rules (``admission.admission_headroom``) say whether a
job that fits is held back by a limit or quota. Nothing here changes the state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from scheduler.core.admission import admission_headroom
from scheduler.core.allocate import score_for
from scheduler.core.fairshare import Shares, fair_shares
from scheduler.core.headroom import Headroom, admission_held
from scheduler.core.placement import FailedShapes, Statement, binpack_score
from scheduler.core.running import NEVER
from scheduler.core.state import GANG_POLICIES, Job, State

__all__ = ["fitting_job_waits", "fitting_jobs", "live_reservations"]


def live_reservations(state: State) -> dict[str, None]:
    """Nodes a reservation of the last cycle holds whose start is still ahead or unknown
    (capacity spoken for, as ``State.reserved`` says)."""
    now = state.now
    return {n: None for n, start in state.reserved.items() if start > now or start == NEVER}


def fitting_jobs(
    state: State,
    skip: dict[str, None],
    failed: FailedShapes | None = None,
    where: Callable[[Job], bool] | None = None,
) -> Iterator[Job]:
    """Pending jobs that would fit right now on free capacity outside the ``skip`` nodes, in
    pending order, lazily (only those ``where`` accepts, when given: it is asked before
    the dry run, which is the cost).

    Each job's placement is a dry run (free capacity only, nothing evicted, rolled back)
    with the node scoring the gang policy's ``allocate`` gives it (``score_for``: the job's
    placement strategy, else its queue's, else the policy's). Scoring decides more than
    where a gang lands: pods are placed one by one, so a gang that fits when packed may
    not fit when spread, and the question is whether the policy would have found room.
    Jobs waiting out a bind back-off, and gangs already part-placed, are passed over; a
    job asking no less than one that already failed, with the same scoring, is not
    tried (``FailedShapes``: the capacity stays the same throughout; pass ``failed`` to
    share what failed between two walks over the same capacity).
    """
    now = state.now
    idle = any(
        n.free_gpu_milli for n in state.nodes.values() if not n.cordoned and n.name not in skip
    )
    if failed is None:
        failed = FailedShapes(state.shape_cache, exact_gangs=state.tuning.exact_gangs)
    jobs = state.jobs
    for _, _, job_id in state.pending:
        job = jobs[job_id]
        if job.placements or job.backoff_until > now or (job.request[0] and not idle):
            continue
        if where is not None and not where(job):
            continue
        if _fits(state, job, skip, failed):
            yield job


def _fits(state: State, job: Job, skip: dict[str, None], failed: FailedShapes) -> bool:
    """Whether ``job`` fits on free capacity outside ``skip`` now (a dry run)."""
    queue = state.queues.get(job.queue)
    score = binpack_score if queue is None else score_for(state, queue, job)
    if not failed.may_fit(job, score):
        return False
    with Statement(state.nodes, score=score, index=state.free_index()) as stmt:
        fits = stmt.place_gang(job, skip=skip or None) is not None
    if not fits:
        failed.add(job, score)
    return fits


def fitting_job_waits(state: State) -> tuple[bool, int, bool]:
    """(a pending job fits outside live reservations, idle milli-GPUs there, and every
    such job is held back by a limit or the non-preemptible quota rule).

    The jobs no rule holds back are tried first, and only if none fits are the held ones:
    a rule is a few comparisons per job, a dry run a placement, and a queue's backlog
    beyond its quota can be thousands of jobs that fit."""
    skip = live_reservations(state)
    idle = sum(
        n.free_gpu_milli for n in state.nodes.values() if not n.cordoned and n.name not in skip
    )
    held = _held_by_rule(state)
    if held is None:
        return (next(fitting_jobs(state, skip), None) is not None, idle, False)
    failed = FailedShapes(state.shape_cache, exact_gangs=state.tuning.exact_gangs)
    kept: list[Job] = []

    def free(job: Job) -> bool:
        if held(job):
            kept.append(job)
            return False
        return True

    if next(fitting_jobs(state, skip, failed, free), None) is not None:
        return (True, idle, False)
    found = any(_fits(state, job, skip, failed) for job in kept)
    return (found, idle, found)


def _held_by_rule(state: State) -> Callable[[Job], bool] | None:
    """Whether the gang policy's own admission rules keep a job out now (a queue's limit
    up its tree, or non-preemptible work beyond deserved quota), as ``admission_reason``
    would say (``admission_held``, by each queue's headroom); None for the other policies,
    which have no such rules."""
    if state.policy not in GANG_POLICIES:
        return None
    shares: list[Shares] = []
    rooms: dict[str, Headroom] = {}

    def held(job: Job) -> bool:
        room = rooms.get(job.queue)
        if room is None:
            queue = state.queues.get(job.queue)
            if queue is None:
                return False
            if not shares:
                shares.append(fair_shares(state))
            room = rooms[job.queue] = admission_headroom(state, queue, shares[0])
        return admission_held(room, job.request, job.preemptible)

    return held
