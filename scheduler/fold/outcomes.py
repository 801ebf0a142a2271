"""What happened to each job, read off the policy core's own fold of the ledger.

Every consumer that reports job outcomes — the DuckDB projector's ``jobs``, ``pods`` and
``allocations`` tables, and ``replay.metrics`` behind ``gpuledger compare`` and the what-if
report — uses this one fold, so a fact means the same thing everywhere, and that meaning is
the core's (``scheduler.core.apply``): ``OutcomeFold.apply`` folds each event into a core
``State`` and records how the jobs the event touched changed in it — a gang allocated,
running, a pod finished or lost, the job requeued, ended. Nothing here re-interprets an
event on its own, so an event the core ignores (a start of an unplaced pod, a duplicate
submission, anything about an ended job) changes no outcome either.

Per job the fold keeps its status, first readiness (the first time the core saw the gang
running), end, preemptions and the work they lost, and its GPU time: ``allocated_gpu_ms``
(every hold, from allocation until the pod finished or was given back) and
``idle_gpu_ms`` (the part of it before the gang ran, or when it never did). Per pod it keeps
the ``pods`` table's columns, and per hold of a pod on a node an ``Allocation``.

Definitions shared by every report:

* time to ready: first readiness minus submission;
* completion: end minus submission, for a job that ran and ended ``succeeded`` or
  ``failed`` (a cancelled or unschedulable job has no completion time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from events.model import (
    MILLI,
    BindFailed,
    Event,
    EvictionFailed,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    JobTerminated,
    JobUnschedulable,
    NodeRegistered,
    NodeRemoved,
    PodBound,
    PodDeleted,
    PodFinished,
    PodPlacement,
    PodsAllocated,
    PodStarted,
    Tick,
)
from scheduler.core import Job, State, apply, ended_status

__all__ = [
    "DONE_STATUSES",
    "JOB_EVENTS",
    "Allocation",
    "JobOutcome",
    "OutcomeFold",
    "PodOutcome",
    "completion_ms",
]

PENDING: Final = "pending"
RUNNING: Final = "running"
DONE_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "unschedulable"})
"""Statuses after which a job (or pod) does not change again."""

JOB_EVENTS: frozenset[type[Event]] = frozenset(
    {
        JobSubmitted,
        PodsAllocated,
        PodStarted,
        PodFinished,
        JobPreempted,
        BindFailed,
        JobCancelled,
        JobUnschedulable,
        JobTerminated,
        PodDeleted,
    }
)
"""Event types that can change the job they name (``EvictionFailed`` and ``NodeRemoved``
change the jobs on their node instead)."""

_NOOPS: frozenset[type[Event]] = frozenset({Tick, PodBound})
"""Event types ``apply`` folds as nothing but a later ``state.now``: skipped past its match."""

_END_REASONS: dict[type[Event], str] = {
    PodFinished: "finished",
    JobPreempted: "preempted",
    BindFailed: "bind_failed",
    JobCancelled: "cancelled",
    JobUnschedulable: "unschedulable",
    JobTerminated: "terminated",
    PodDeleted: "deleted",
    NodeRemoved: "node_removed",
    EvictionFailed: "displaced",
}
"""Why a hold ended, by the event that ended it (``allocations.end_reason``)."""


def completion_ms(status: str, submitted: int, ready: int | None, ended: int | None) -> int | None:
    """Submission until the end, for a job that ran and ended succeeded or failed."""
    if ready is None or ended is None or status not in ("succeeded", "failed"):
        return None
    return ended - submitted


@dataclass(slots=True)
class PodOutcome:
    """One pod of a job: exactly the ``pods`` table's base columns."""

    job: str
    pod: str
    queue: str
    gpu_milli: int
    status: str = PENDING
    node: str | None = None
    allocations: int = 0
    first_allocated_at_ms: int | None = None
    first_started_at_ms: int | None = None
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    ran_without_gpus: bool = False
    updated_offset: int = 0


@dataclass(slots=True)
class Allocation:
    """One pod's hold on a node, from ``pods_allocated`` until it is given back."""

    allocation_id: str
    job: str
    pod: str
    queue: str
    node: str
    gpus: str
    devices: list[int]
    device_milli: list[int]
    gpu_milli: int
    allocated_offset: int
    from_ms: int
    started_ms: int | None = None
    to_ms: int | None = None
    end_reason: str | None = None


@dataclass(slots=True)
class JobOutcome:
    """One job's fate so far: the ``jobs`` table's stored columns, then fold-only figures."""

    job: str
    queue: str
    priority_class: str
    pods: int
    min_members: int
    gpu_milli: int
    submitted_at_ms: int
    submitted_offset: int
    updated_offset: int
    ready_at_ms: int | None = None
    finished_at_ms: int | None = None
    status: str = PENDING
    preemptions: int = 0
    lost_gpu_ms: int = 0
    unschedulable_reason: str | None = None
    unschedulable_cause: str | None = None
    """The latest reason's cause (``scheduler.core.reasons``: never_fits, quota, share, …)."""
    started_pods: int = 0
    """Pods started in the current attempt (as are the next two)."""
    finished_pods: int = 0
    failed_pods: int = 0
    # Not stored in ``jobs``: complete only when the fold started at offset 0.
    allocated_gpu_ms: int = 0
    idle_gpu_ms: int = 0
    running_since: int | None = None
    """When the gang began running in the current attempt (None while it is not)."""

    @property
    def time_to_ready_ms(self) -> int | None:
        """Submission until the gang first ran."""
        return None if self.ready_at_ms is None else self.ready_at_ms - self.submitted_at_ms

    @property
    def completion_ms(self) -> int | None:
        """See ``completion_ms``."""
        return completion_ms(
            self.status, self.submitted_at_ms, self.ready_at_ms, self.finished_at_ms
        )


@dataclass(slots=True)
class _Before:
    """A job as it was before an event: what ``_record`` compares the core's job with."""

    job: Job
    status: str
    attempt: int
    placements: dict[str, PodPlacement]
    started: frozenset[str]
    finished: dict[str, bool]


@dataclass
class OutcomeFold:
    """The core's state folded event by event, and each job's outcome read off it.

    ``apply`` always folds the event into ``state``; with ``record=False`` it records
    nothing (a projector catching the core's state up to where its tables already are).
    The batch's changes are in ``changed_jobs``, ``changed_pods`` and ``changed_allocs``
    until ``end_batch``. With ``timelines`` the fold also keeps the GPU allocation over
    time (``utilisation``: at, allocated milli-GPUs, capacity milli-GPUs), each queue's
    pending jobs over time (``depth``) and each queue's allocated milli-GPUs over time
    (``held``).
    """

    state: State = field(default_factory=State)
    jobs: dict[str, JobOutcome] = field(default_factory=dict)
    pods: dict[str, dict[str, PodOutcome]] = field(default_factory=dict)
    open: dict[tuple[str, str], Allocation] = field(default_factory=dict)
    changed_jobs: dict[str, JobOutcome] = field(default_factory=dict)
    changed_pods: dict[tuple[str, str], PodOutcome] = field(default_factory=dict)
    changed_allocs: dict[str, Allocation] = field(default_factory=dict)
    timelines: bool = False
    utilisation: list[tuple[int, int, int]] = field(default_factory=list)
    depth: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    held: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    allocated_milli: int = 0
    queue_milli: dict[str, int] = field(default_factory=dict)
    capacity_milli: int = 0
    pending: dict[str, int] = field(default_factory=dict)

    # ----------------------------------------------------------------- folding

    def apply(self, event: Event, offset: int, at: int, *, record: bool = True) -> None:
        """Fold ``event`` (stamped ``at``, at ``offset``) and record what it changed."""
        kind = type(event)
        state = self.state
        if kind in _NOOPS:
            state.now = max(state.now, at)
            return
        if not record:
            apply(state, event, at)
            if self.timelines and (kind is NodeRegistered or kind is NodeRemoved):
                self.capacity_milli = sum(n.gpus for n in state.nodes.values()) * MILLI
            return
        befores: list[_Before] = []
        if kind in JOB_EVENTS:
            name: str = event.job  # type: ignore[attr-defined]  # every JOB_EVENTS type has it
            job = state.jobs.get(name)
            if job is not None:
                befores.append(_before(job))
        elif kind is NodeRemoved or kind is EvictionFailed:
            node = state.nodes.get(event.node)  # type: ignore[attr-defined]
            if node is not None:
                for job_id in dict.fromkeys(node.pods.values()):
                    job = state.jobs.get(job_id)
                    if job is not None:
                        befores.append(_before(job))
        apply(state, event, at)
        if kind is JobSubmitted:
            assert isinstance(event, JobSubmitted)
            new = None if befores else state.jobs.get(event.job)
            if new is not None:  # the core took it in: a new job (not a duplicate)
                self._submitted(event, new, offset, at)
            return
        for before in befores:
            self._record(before, event, offset, at)
        if self.timelines and (kind is NodeRegistered or kind is NodeRemoved):
            self.capacity_milli = sum(n.gpus for n in state.nodes.values()) * MILLI
            self.utilisation.append((at, self.allocated_milli, self.capacity_milli))

    def _submitted(self, event: JobSubmitted, core: Job, offset: int, at: int) -> None:
        outcome = JobOutcome(
            job=core.job,
            queue=core.queue,
            priority_class=core.priority_class,
            pods=len(core.pods),
            min_members=event.min_members,
            gpu_milli=sum(p.gpu_milli for p in core.pods),
            submitted_at_ms=at,
            submitted_offset=offset,
            updated_offset=offset,
        )
        self.jobs[core.job] = outcome
        self.changed_jobs[core.job] = outcome
        pods = {
            spec.name: PodOutcome(
                job=core.job,
                pod=spec.name,
                queue=core.queue,
                gpu_milli=spec.gpu_milli,
                updated_offset=offset,
            )
            for spec in core.pods
        }
        self.pods[core.job] = pods
        for pod in pods.values():
            self.changed_pods[(pod.job, pod.pod)] = pod
        self._depth(core.queue, at, +1)

    def _record(self, before: _Before, event: Event, offset: int, at: int) -> None:
        """Record how the core's job changed from ``before`` (the same object, mutated)."""
        core = before.job
        outcome = self.jobs.get(core.job)
        if outcome is None:
            return  # submitted before this fold started recording (or never recorded)
        status = core.status
        if self.state.jobs.get(core.job) is not core:
            code = self.state.ended.get(core.job)
            if code is not None:
                status = ended_status(code)
        placements, started, finished = core.placements, core.started, core.finished
        new_attempt = status != before.status or core.attempt != before.attempt
        changed = new_attempt
        reason = _END_REASONS.get(type(event), "released")
        pods = self.pods.get(core.job, {})
        # Holds that ended: given back (released, requeued) or finished/lost in place.
        for pod_name, placement in before.placements.items():
            if pod_name in before.finished:
                continue
            now = placements.get(pod_name)
            if now is placement and pod_name not in finished:
                continue
            self._close(outcome, core.job, pod_name, at, reason)
            pod = pods.get(pod_name)
            if pod is None:
                continue
            if now is placement:  # finished (or lost) where it ran
                ok = finished[pod_name]
                pod.status = "succeeded" if ok else "failed"
                pod.finished_at_ms = at
            self._touch(pod, offset)
            changed = True
        # Holds that began.
        for pod_name, placement in placements.items():
            if before.placements.get(pod_name) is placement:
                continue
            pod = pods.get(pod_name)
            if pod is None:
                continue
            self._open(pod, placement, offset, at)
            changed = True
        # Pods that started.
        for pod_name in started:
            if pod_name in before.started:
                continue
            pod = pods.get(pod_name)
            if pod is None:
                continue
            held = self.open.get((core.job, pod_name))
            if held is not None and held.started_ms is None:
                held.started_ms = at
                self.changed_allocs[held.allocation_id] = held
            if pod.gpu_milli > 0 and (held is None or held.gpu_milli == 0):
                pod.ran_without_gpus = True  # the "GPU requested but not allocated" case
            pod.status = RUNNING
            pod.started_at_ms = at
            if pod.first_started_at_ms is None:
                pod.first_started_at_ms = at
            self._touch(pod, offset)
            changed = True
        # A new attempt or the end: every pod not done now follows the job.
        if new_attempt and (status in DONE_STATUSES or status == PENDING):
            changed = True
            for pod in pods.values():
                if pod.pod in placements and pod.pod in finished:
                    continue  # ended where it ran (above, or earlier in this attempt)
                if status == PENDING:
                    if pod.status == PENDING and pod.started_at_ms is None:
                        continue
                    pod.status = PENDING
                    pod.started_at_ms = None
                    pod.finished_at_ms = None
                elif pod.status in DONE_STATUSES:
                    continue
                else:
                    pod.status = status
                    pod.started_at_ms = None
                self._touch(pod, offset)
        if isinstance(event, JobPreempted) and before.status in ("allocated", "running"):
            outcome.preemptions += 1
            outcome.lost_gpu_ms += event.lost_gpu_ms
            changed = True
        if isinstance(event, JobUnschedulable) and before.status == PENDING:
            outcome.unschedulable_reason = event.reason
            outcome.unschedulable_cause = event.cause or None
            changed = True
        if status != before.status:
            if before.status == PENDING:
                self._depth(outcome.queue, at, -1)
            elif status == PENDING:
                self._depth(outcome.queue, at, +1)
            if status == RUNNING:
                outcome.running_since = at
                if outcome.ready_at_ms is None:
                    outcome.ready_at_ms = at
            elif status == PENDING:
                outcome.running_since = None
            if status in DONE_STATUSES:
                outcome.finished_at_ms = at
        elif core.attempt != before.attempt:
            outcome.running_since = None  # requeued and placed again by the same event
        outcome.status = status
        counts = (len(started), len(finished), [*finished.values()].count(False))
        if counts != (outcome.started_pods, outcome.finished_pods, outcome.failed_pods):
            outcome.started_pods, outcome.finished_pods, outcome.failed_pods = counts
            changed = True
        if changed:
            outcome.updated_offset = offset
            self.changed_jobs[core.job] = outcome

    def _open(self, pod: PodOutcome, placement: PodPlacement, offset: int, at: int) -> None:
        slots = placement.gpus
        devices = [s.device for s in slots]
        milli = [s.milli for s in slots]
        alloc = Allocation(
            allocation_id=f"{offset}:{pod.pod}",
            job=pod.job,
            pod=pod.pod,
            queue=pod.queue,
            node=placement.node,
            gpus=",".join([f"{d}:{m}" for d, m in zip(devices, milli, strict=True)]),
            devices=devices,
            device_milli=milli,
            gpu_milli=sum(milli),
            allocated_offset=offset,
            from_ms=at,
        )
        self.open[(pod.job, pod.pod)] = alloc
        self.changed_allocs[alloc.allocation_id] = alloc
        pod.status = "allocated"
        pod.node = placement.node
        pod.allocations += 1
        if pod.first_allocated_at_ms is None:
            pod.first_allocated_at_ms = at
        self._touch(pod, offset)
        if alloc.gpu_milli:
            self.allocated_milli += alloc.gpu_milli
            if self.timelines:
                self.utilisation.append((at, self.allocated_milli, self.capacity_milli))
                self._held(alloc.queue, at, alloc.gpu_milli)

    def _close(self, outcome: JobOutcome, job: str, pod: str, at: int, reason: str) -> None:
        alloc = self.open.pop((job, pod), None)
        if alloc is None:
            return
        alloc.to_ms = at
        alloc.end_reason = reason
        self.changed_allocs[alloc.allocation_id] = alloc
        milli = alloc.gpu_milli
        if not milli:
            return
        outcome.allocated_gpu_ms += milli * (at - alloc.from_ms) // MILLI
        ran = outcome.running_since
        idle_until = at if ran is None else max(min(ran, at), alloc.from_ms)
        outcome.idle_gpu_ms += milli * (idle_until - alloc.from_ms) // MILLI
        self.allocated_milli -= milli
        if self.timelines:
            self.utilisation.append((at, self.allocated_milli, self.capacity_milli))
            self._held(alloc.queue, at, -milli)

    def _touch(self, pod: PodOutcome, offset: int) -> None:
        pod.updated_offset = offset
        self.changed_pods[(pod.job, pod.pod)] = pod

    def _depth(self, queue: str, at: int, delta: int) -> None:
        if not self.timelines:
            return
        count = self.pending.get(queue, 0) + delta
        self.pending[queue] = count
        self.depth.setdefault(queue, []).append((at, count))

    def _held(self, queue: str, at: int, delta: int) -> None:
        milli = self.queue_milli.get(queue, 0) + delta
        self.queue_milli[queue] = milli
        self.held.setdefault(queue, []).append((at, milli))

    # ----------------------------------------------------------------- batches

    def end_batch(self) -> None:
        """Forget the batch's changes and the jobs that ended in it (they cannot change)."""
        for name, outcome in self.changed_jobs.items():
            if outcome.status in DONE_STATUSES and self.jobs.get(name) is outcome:
                del self.jobs[name]
                pods = self.pods.pop(name, {})
                for pod in pods:
                    self.open.pop((name, pod), None)
        self.changed_jobs = {}
        self.changed_pods = {}
        self.changed_allocs = {}


def _before(job: Job) -> _Before:
    return _Before(
        job=job,
        status=job.status,
        attempt=job.attempt,
        placements=dict(job.placements),
        started=frozenset(job.started),
        finished=dict(job.finished),
    )
