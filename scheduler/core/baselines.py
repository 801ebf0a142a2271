"""Baseline policies, run on the same core to show what the gang policy adds.

``fifo``
    a faithful model of the default kube-scheduler: no queues, no gangs, no preemption.
    Pods are placed one by one in priority-then-creation order on the least allocated
    node; a pod that does not fit is skipped, so gangs can hold GPUs half-placed. A
    fractional GPU request takes a whole device (``nvidia.com/gpu`` is an integer).

``drf``
    flat dominant-resource fairness with gangs: every leaf queue is one user; the queue
    with the lowest dominant share (its largest share of any resource of the cluster)
    goes next; its head gang is placed all-or-nothing by bin packing. No hierarchy, no
    quotas or limits, no reclaim or preemption, no backfill: a queue whose head does not
    fit waits behind it for the cycle.

``easy``
    EASY backfill (Lifka's, as in Slurm's backfill scheduler), at the level of jobs: no
    queues, no quotas, no preemption. Jobs are taken in submission order; the first one
    that does not fit gets a reservation — the nodes it will get at the earliest time
    running jobs' expected ends free them (never, for jobs without an expected runtime) —
    and every later job that fits starts now, unless it would run on the reserved nodes
    past the reservation's start. Gangs are all-or-nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from events.model import Event, PodPlacement, PodsAllocated, PodSpec
from scheduler.core.backfill import RunningEnds, reservation_for
from scheduler.core.fairshare import capacity
from scheduler.core.placement import FailedShapes, Statement, effective_gpu_milli, spread_score
from scheduler.core.running import NEVER
from scheduler.core.state import Job, Queue, Reservation, State
from scheduler.core.victims import Victims

Emit = Callable[[Event], None]


def fifo(state: State, emit: Emit) -> None:
    """Place pending pods one by one, creation order, least allocated node first."""
    failed: list[tuple[int, int, int]] = []
    seen: dict[tuple[int, int, int], int] = {}
    for _, _, job_id in list(state.pending):
        job = state.jobs[job_id]
        todo = [
            pod
            for pod in job.pods
            if pod.name not in job.placements and _may_fit(pod, failed, seen)
        ]
        if not todo:
            continue  # (a statement for no placement at all would only be rolled back)
        placed: list[PodPlacement] = []
        with Statement(
            state.nodes, fractional=False, score=spread_score, index=state.free_index()
        ) as stmt:
            for pod in todo:
                if not _may_fit(pod, failed, seen):
                    continue  # a pod of the same job failed before it, no larger
                placement = stmt.place(job.job, pod, None)
                if placement is None:
                    if not pod.node_selector and not pod.tolerations and len(failed) < 16:
                        gpu = effective_gpu_milli(pod, False)
                        failed.append((gpu, pod.cpu_milli, pod.memory_mib))
                    continue
                placed.append(placement)
        if placed:
            emit(PodsAllocated(job=job.job, queue=job.queue, placements=tuple(placed)))


def _may_fit(
    pod: PodSpec, failed: list[tuple[int, int, int]], seen: dict[tuple[int, int, int], int]
) -> bool:
    """False if a pod no larger than this one already failed this cycle.

    Within a cycle free capacity only shrinks, so a pod at least as large in every
    resource as one that did not fit cannot fit either. ``failed`` only grows, so per
    request ``seen`` keeps how many of its entries were checked already (-1: one of them
    rules it out), and only those added since are checked again.
    """
    gpu = effective_gpu_milli(pod, False)
    key = (gpu, pod.cpu_milli, pod.memory_mib)
    checked = seen.get(key, 0)
    if checked < 0:
        return False
    for g, c, m in failed[checked:]:
        if gpu >= g and key[1] >= c and key[2] >= m:
            seen[key] = -1
            return False
    seen[key] = len(failed)
    return True


def drf(state: State, emit: Emit) -> None:
    """Dominant-resource fair share over leaf queues, gangs all-or-nothing."""
    total = capacity(state)
    done: dict[str, None] = {}
    leaves = [q for q in state.leaf_queues() if q.pending]

    def dominant(queue: Queue) -> tuple[int, int, str]:
        share = max(
            (queue.allocated[i] * 1_000_000 // total[i] for i in range(3) if total[i] > 0),
            default=0,
        )
        return (share, queue.pending[0][1], queue.name)

    while True:
        candidates = [q for q in leaves if q.pending and q.name not in done]
        if not candidates:
            return
        queue = min(candidates, key=dominant)
        job = state.jobs[queue.pending[0][2]]
        with Statement(state.nodes, index=state.free_index()) as stmt:
            placements = stmt.place_gang(job)
        if placements is None:
            done[queue.name] = None
            continue
        emit(PodsAllocated(job=job.job, queue=job.queue, placements=tuple(placements)))


def easy(state: State, emit: Emit) -> None:
    """Submission order; one reservation for the first job that does not fit; backfill."""
    reservation: Reservation | None = None
    failed = FailedShapes(state.shape_cache, exact_gangs=state.tuning.exact_gangs)
    running = RunningEnds(state)
    jobs = state.jobs
    reserved_off: tuple[str, ...] = ()  # the reservation's nodes, as the memo's token
    for _, _, job_id in sorted(state.pending, key=_seq):
        job = jobs[job_id]
        if job.placements:
            continue  # a gang part-placed by an earlier cycle is the binder's to finish
        skip = _reserved_for(state, job, reservation)
        kept_off = reserved_off if skip else ()
        if not failed.may_fit(job, kept_off):
            continue
        with Statement(state.nodes, index=state.free_index()) as stmt:
            placements = stmt.place_gang(job, skip=skip)
        if placements is not None:
            emit(PodsAllocated(job=job.job, queue=job.queue, placements=tuple(placements)))
            continue
        failed.add(job, kept_off)
        if reservation is None:
            reservation = reservation_for(state, job, running, Victims(state))
            state.reserved = (
                {} if reservation is None else dict.fromkeys(reservation.nodes, reservation.start)
            )
            reserved_off = tuple(reservation.nodes) if reservation is not None else ()


def _seq(entry: tuple[int, int, str]) -> int:
    return entry[1]  # the pending order's submission sequence


def _reserved_for(
    state: State, job: Job, reservation: Reservation | None
) -> dict[str, None] | None:
    """The reserved nodes the job must keep off: all of them unless it is expected to end
    before the reservation starts."""
    if reservation is None:
        return None
    runtime = job.expected_runtime_ms
    if (
        runtime is not None
        and reservation.start < NEVER
        and state.now + runtime <= reservation.start
    ):
        return None
    return reservation.nodes
