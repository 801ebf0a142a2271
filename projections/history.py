"""The folds behind the schema-2 tables: ``pods``, ``allocations`` and ``queue_shares``.

``PodFold`` reads the ledger's job events the way ``jobs`` does (what the ledger says, not
what the core would accept), keeping only live jobs and open allocations in memory; both
are reloaded from their tables when a run starts, so the fold resumes anywhere.

``ShareFold`` folds the ledger through the policy core itself (``scheduler.core.apply``)
and asks ``fair_shares`` for every queue's deserved quota and fair share at each minute
boundary of ledger time. The core's state cannot be rebuilt from table rows, so it is
pickled into ``projection_state`` together with the offset it reflects, in the same
transaction; a snapshot written by another version of the core is refused and the
state refolded from offset 0 instead (rows are not re-emitted).
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import operator
import pickle
import sys
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from events.model import (
    BindFailed,
    Event,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    JobUnschedulable,
    NodeRemoved,
    PodBound,
    PodEvicted,
    PodFinished,
    PodsAllocated,
    PodStarted,
    Tick,
)
from scheduler.core import Job, Node, Queue, State, apply, fair_shares
from scheduler.core.state import TERMINAL

__all__ = ["MINUTE_MS", "PodFold", "ShareFold", "state_format"]

MINUTE_MS = 60_000
MAX_GAP_MINUTES = 7 * 24 * 60
"""A silent stretch longer than a week emits only its last week of minute rows: a ledger
mixing simulated (from 0) and wall-clock (epoch) times must not write 29 million rows."""

_DONE = frozenset({"succeeded", "failed", "cancelled", "unschedulable"})


# --------------------------------------------------------------------------- pods


@dataclass(slots=True)
class Pod:
    """The fold state of one pod of a live job: exactly the ``pods`` table's base columns."""

    job: str
    pod: str
    queue: str
    gpu_milli: int
    status: str = "pending"
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


POD_SCHEMA = pa.schema(
    [
        ("job", pa.string()),
        ("pod", pa.string()),
        ("queue", pa.string()),
        ("gpu_milli", pa.int64()),
        ("status", pa.string()),
        ("node", pa.string()),
        ("allocations", pa.int32()),
        ("first_allocated_at_ms", pa.int64()),
        ("first_started_at_ms", pa.int64()),
        ("started_at_ms", pa.int64()),
        ("finished_at_ms", pa.int64()),
        ("ran_without_gpus", pa.bool_()),
        ("updated_offset", pa.int64()),
    ]
)
ALLOCATION_SCHEMA = pa.schema(
    [
        ("allocation_id", pa.string()),
        ("job", pa.string()),
        ("pod", pa.string()),
        ("queue", pa.string()),
        ("node", pa.string()),
        ("gpus", pa.string()),
        ("devices", pa.list_(pa.int32())),
        ("device_milli", pa.list_(pa.int32())),
        ("gpu_milli", pa.int64()),
        ("allocated_offset", pa.int64()),
        ("from_ms", pa.int64()),
        ("started_ms", pa.int64()),
        ("to_ms", pa.int64()),
        ("end_reason", pa.string()),
    ]
)


def _table(items: list[Any], schema: pa.Schema) -> pa.Table:
    rows = list(map(operator.attrgetter(*schema.names), items))
    columns = zip(*rows, strict=True) if rows else ([] for _ in schema)
    return pa.table(
        [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


@dataclass
class PodFold:
    """Pods of live jobs and their open allocations; the batch's changed rows."""

    jobs: dict[str, dict[str, Pod]] = field(default_factory=dict)
    open: dict[tuple[str, str], Allocation] = field(default_factory=dict)
    dirty_pods: dict[tuple[str, str], Pod] = field(default_factory=dict)
    dirty_allocs: dict[str, Allocation] = field(default_factory=dict)
    reset_jobs: dict[str, None] = field(default_factory=dict)
    """Jobs re-submitted in this batch: their old pod rows are deleted first."""

    @classmethod
    def load(cls, rows: list[dict[str, Any]], open_rows: list[dict[str, Any]]) -> PodFold:
        """Rebuild from the ``pods`` rows of live jobs and the open ``allocations`` rows."""
        fold = cls()
        for row in rows:
            pod = Pod(**row)
            fold.jobs.setdefault(pod.job, {})[pod.pod] = pod
        for row in open_rows:
            alloc = Allocation(**row)
            fold.open[(alloc.job, alloc.pod)] = alloc
        return fold

    def apply(self, event: Event, offset: int, at: int) -> None:
        """Fold one decoded event (any type; the irrelevant ones are skipped quickly)."""
        if isinstance(event, JobSubmitted):
            self._submit(event, offset)
            return
        if isinstance(event, NodeRemoved):
            victims = dict.fromkeys(a.job for a in self.open.values() if a.node == event.node)
            for job in victims:
                self._release_job(job, offset, at, "node_removed", "pending")
            return
        name = getattr(event, "job", None)
        pods = self.jobs.get(name) if isinstance(name, str) else None
        if pods is None:
            return
        match event:
            case PodsAllocated(job=job):
                for placement in event.placements:
                    pod = pods.get(placement.pod)
                    if pod is None or (job, placement.pod) in self.open:
                        continue
                    slots = placement.gpus
                    alloc = Allocation(
                        allocation_id=f"{offset}:{placement.pod}",
                        job=job,
                        pod=placement.pod,
                        queue=pod.queue,
                        node=placement.node,
                        gpus=",".join(f"{s.device}:{s.milli}" for s in slots),
                        devices=[s.device for s in slots],
                        device_milli=[s.milli for s in slots],
                        gpu_milli=sum(s.milli for s in slots),
                        allocated_offset=offset,
                        from_ms=at,
                    )
                    self.open[(job, placement.pod)] = alloc
                    self.dirty_allocs[alloc.allocation_id] = alloc
                    pod.status = "allocated"
                    pod.node = placement.node
                    pod.allocations += 1
                    if pod.first_allocated_at_ms is None:
                        pod.first_allocated_at_ms = at
                    self._touch(pod, offset)
            case PodStarted(job=job, pod=pod_name):
                pod = pods.get(pod_name)
                if pod is None or pod.status in _DONE or pod.started_at_ms is not None:
                    return
                held = self.open.get((job, pod_name))
                if held is not None and held.started_ms is None:
                    held.started_ms = at
                    self.dirty_allocs[held.allocation_id] = held
                if pod.gpu_milli > 0 and (held is None or held.gpu_milli == 0):
                    pod.ran_without_gpus = True  # the "GPU requested but not allocated" case
                pod.status = "running"
                pod.started_at_ms = at
                if pod.first_started_at_ms is None:
                    pod.first_started_at_ms = at
                self._touch(pod, offset)
            case PodFinished(job=job, pod=pod_name, succeeded=ok):
                pod = pods.get(pod_name)
                if pod is None or pod.status in _DONE:
                    return
                self._close(job, pod_name, at, "finished")
                pod.status = "succeeded" if ok else "failed"
                pod.finished_at_ms = at
                self._touch(pod, offset)
            case JobPreempted(job=job):
                self._release_job(job, offset, at, "preempted", "pending")
            case BindFailed(job=job):
                self._release_job(job, offset, at, "bind_failed", "pending")
            case JobCancelled(job=job):
                self._release_job(job, offset, at, "cancelled", "cancelled")
            case JobUnschedulable(job=job, final=True):
                self._release_job(job, offset, at, "unschedulable", "unschedulable")
            case _:
                pass

    def _submit(self, event: JobSubmitted, offset: int) -> None:
        live = self.jobs.get(event.job)
        if live is not None and any(p.status not in _DONE for p in live.values()):
            return  # a duplicate submission of a live job changes nothing (as in ``jobs``)
        pods = {
            spec.name: Pod(
                job=event.job,
                pod=spec.name,
                queue=event.queue,
                gpu_milli=spec.gpu_milli,
                updated_offset=offset,
            )
            for spec in event.pods
        }
        if live is not None:
            for old in live.values():
                self.dirty_pods.pop((old.job, old.pod), None)
        self.jobs[event.job] = pods
        self.reset_jobs[event.job] = None
        for pod in pods.values():
            self.dirty_pods[(pod.job, pod.pod)] = pod

    def _touch(self, pod: Pod, offset: int) -> None:
        pod.updated_offset = offset
        self.dirty_pods[(pod.job, pod.pod)] = pod

    def _close(self, job: str, pod: str, at: int, reason: str) -> None:
        alloc = self.open.pop((job, pod), None)
        if alloc is not None:
            alloc.to_ms = at
            alloc.end_reason = reason
            self.dirty_allocs[alloc.allocation_id] = alloc

    def _release_job(self, job: str, offset: int, at: int, reason: str, status: str) -> None:
        pods = self.jobs.get(job)
        if pods is None:
            return
        for pod in pods.values():
            self._close(job, pod.pod, at, reason)
            if status == "pending" or pod.status not in _DONE:
                # A preemption starts a new attempt: even members that had finished run
                # again, exactly as the ``jobs`` fold counts them.
                pod.status = status
                pod.started_at_ms = None
                if status == "pending":
                    pod.finished_at_ms = None
                self._touch(pod, offset)

    def pod_rows(self) -> pa.Table:
        """The batch's changed pods."""
        return _table(list(self.dirty_pods.values()), POD_SCHEMA)

    def allocation_rows(self) -> pa.Table:
        """The batch's opened and closed allocations."""
        return _table(list(self.dirty_allocs.values()), ALLOCATION_SCHEMA)

    def end_batch(self) -> None:
        """Forget the batch's changes; drop jobs whose every pod is done."""
        for job in dict.fromkeys(k[0] for k in self.dirty_pods):
            pods = self.jobs.get(job)
            if pods is not None and all(p.status in _DONE for p in pods.values()):
                del self.jobs[job]
        self.dirty_pods = {}
        self.dirty_allocs = {}
        self.reset_jobs = {}


# --------------------------------------------------------------------------- queue shares

SHARE_SCHEMA = pa.schema(
    [
        ("minute", pa.int64()),
        ("at_ms", pa.int64()),
        ("queue", pa.string()),
        ("parent", pa.string()),
        ("deserved_gpu_milli", pa.int64()),
        ("fair_gpu_milli", pa.int64()),
        ("allocated_gpu_milli", pa.int64()),
        ("requested_gpu_milli", pa.int64()),
        ("pending_jobs", pa.int32()),
        ("running_jobs", pa.int32()),
    ]
)


def state_format() -> str:
    """A fingerprint of the core's state classes: a snapshot is only loaded into the same."""
    parts = [f"py{sys.version_info[0]}.{sys.version_info[1]}"]
    for cls in (State, Job, Queue, Node):
        parts.append(cls.__name__ + ":" + ",".join(f.name for f in dataclasses.fields(cls)))
    return ";".join(parts)


_CORE_NOOPS: frozenset[type[Event]] = frozenset({Tick, PodBound, PodEvicted})
"""Event types ``scheduler.core.apply`` folds as nothing but a later ``state.now``.

Ticks and binds are a large part of a ledger; the share fold advances the clock for them
itself instead of sending them through ``apply``'s type match (a test checks that both
leave the same state)."""


_JOB_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Job))
_job_fields = operator.attrgetter(*_JOB_FIELDS)
_PODS = _JOB_FIELDS.index("pods")
_PER_ATTEMPT = tuple(_JOB_FIELDS.index(name) for name in ("placements", "started", "finished"))


def _reduce_job(job: Job) -> tuple[Any, ...]:
    """Pickle a job as ``Job(*fields)``, leaving out a terminal job's pods and placements
    (the core forgets most ended jobs itself, into ``State.ended``; the few it keeps are
    still referred to, e.g. a fifo gang that ended while pending).

    Positional values in field order are a third of the size of a slots class's default
    ``{slot: value}`` state, and load twice as fast; ``state_format`` names the fields.
    """
    values = list(_job_fields(job))
    if job.status in TERMINAL:
        values[_PODS] = ()
        for i in _PER_ATTEMPT:
            values[i] = {}  # a dict of its own for every job, as ``Job()`` would make
    return (Job, tuple(values))


_SNAPSHOT_DISPATCH: dict[type, Any] = {**copyreg.dispatch_table, Job: _reduce_job}


@dataclass
class ShareFold:
    """The core's ``State`` folded up to an offset, and the minute rows not yet written."""

    state: State = field(default_factory=State)
    last_minute: int | None = None
    """Minute of the latest applied event; boundaries after it are not yet crossed."""
    rows: list[list[Any]] = field(default_factory=lambda: [[] for _ in SHARE_SCHEMA])

    def snapshot(self) -> bytes:
        """The fold as bytes for ``projection_state`` (pending rows are not included).

        The core keeps an ended job only as its id in ``State.ended`` (a re-submission
        of the name is ignored); the few ended jobs it still holds whole are pickled
        without their pods and placements. ``_reduce_job`` writes each job's fields
        directly, so no stripped copies are made.
        """
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = _SNAPSHOT_DISPATCH
        pickler.dump((self.state, self.last_minute))
        return buffer.getvalue()

    @classmethod
    def restore(cls, blob: bytes) -> ShareFold:
        """The fold from ``snapshot`` bytes (the caller checked ``state_format``)."""
        # The projection database is derived data this projector wrote; opening it is
        # already trusting it, and the format fingerprint guards against a layout change.
        state, last_minute = pickle.loads(blob)  # noqa: S301
        if not isinstance(state, State):
            raise TypeError("projection_state holds no core State")
        return cls(state=state, last_minute=last_minute)

    def apply(self, event: Event, at: int) -> None:
        """Sample the minute boundaries ``at`` crosses, then fold ``event`` into the core."""
        minute = at // MINUTE_MS
        if self.last_minute is None:
            self.last_minute = minute
        elif minute > self.last_minute:
            self._sample(max(self.last_minute + 1, minute - MAX_GAP_MINUTES + 1), minute)
            self.last_minute = minute
        if type(event) in _CORE_NOOPS:
            state = self.state
            state.now = max(state.now, at)  # all that ``apply`` does with these
        else:
            apply(self.state, event, at)

    def advance_only(self, event: Event, at: int) -> None:
        """Fold without sampling: used to rebuild a state whose rows are already stored."""
        minute = at // MINUTE_MS
        if self.last_minute is None or minute > self.last_minute:
            self.last_minute = minute
        if type(event) in _CORE_NOOPS:
            state = self.state
            state.now = max(state.now, at)
        else:
            apply(self.state, event, at)

    def _sample(self, first: int, last: int) -> None:
        """Rows for boundaries ``first..last``: the state before the event that crossed them."""
        state = self.state
        if not state.queues:
            return
        shares = fair_shares(state)
        pending: dict[str, int] = dict.fromkeys(state.queues, 0)
        running: dict[str, int] = dict.fromkeys(state.queues, 0)
        for queue in state.queues.values():
            if queue.pending or queue.active:
                for up in state.ancestors(queue.name):
                    pending[up.name] += len(queue.pending)
                    running[up.name] += len(queue.active)
        base = [
            (
                name,
                q.parent,
                shares.deserved[name][0],
                shares.fair[name][0],
                q.allocated[0],
                shares.demand.get(name, q.allocated)[0],
                pending[name],
                running[name],
            )
            for name, q in sorted(state.queues.items())
        ]
        cols = self.rows
        for minute in range(first, last + 1):
            for values in base:
                cols[0].append(minute)
                cols[1].append(minute * MINUTE_MS)
                for i, value in enumerate(values, start=2):
                    cols[i].append(value)

    def take_rows(self) -> pa.Table:
        """The rows sampled since the last call, as an Arrow table."""
        table = pa.table(
            [pa.array(c, f.type) for c, f in zip(self.rows, SHARE_SCHEMA, strict=True)],
            schema=SHARE_SCHEMA,
        )
        self.rows = [[] for _ in SHARE_SCHEMA]
        return table
