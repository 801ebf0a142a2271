"""The rows of the ``pods``, ``allocations`` and ``queue_shares`` tables.

``pods`` and ``allocations`` are the changes ``scheduler.fold.outcomes.OutcomeFold`` recorded
(the same fold gives ``jobs`` and ``replay.metrics`` their figures); the live jobs' rows
are given back to it when a run starts (``load_outcomes``), so it resumes anywhere.

``ShareFold`` reads the policy core's state that the outcome fold keeps and asks
``fair_shares`` for every queue's deserved quota and fair share at the minute boundaries
of ledger time that events cross, storing a row per queue only when its figures change (an
interval of minutes), so the table grows with the events, not with the clock. The core's
state cannot be rebuilt from table rows: it is saved into ``projection_state`` in
``scheduler.fold.snapshot``'s versioned msgpack format, in the same transaction as the rows
and offset it matches; a snapshot this version cannot read is refused and the state
refolded from offset 0 instead (rows are not re-emitted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from events.model import (
    CycleCompleted,
    Event,
    GpuUtilizationSampled,
    JobRejected,
    PodBound,
    PodStarted,
    Tick,
)
from projections.columns import rows_table, schema, table
from scheduler.core import State, fair_shares
from scheduler.fold.outcomes import Allocation, JobOutcome, OutcomeFold, PodOutcome
from scheduler.fold.snapshot import SNAPSHOT_FORMAT, decode_snapshot, encode_snapshot

__all__ = [
    "ALLOCATION_SCHEMA",
    "MINUTE_MS",
    "POD_SCHEMA",
    "SHARE_NEUTRAL",
    "SHARE_SCHEMA",
    "STATE_FORMAT",
    "ShareFold",
    "allocation_rows",
    "load_outcomes",
    "pod_rows",
]

MINUTE_MS = 60_000

# --------------------------------------------------------------------------- pods

POD_SCHEMA = schema(
    "job:string pod:string queue:string gpu_milli:int64 status:string node:string "
    "allocations:int32 first_allocated_at_ms:int64 first_started_at_ms:int64 "
    "started_at_ms:int64 finished_at_ms:int64 ran_without_gpus:bool "
    "updated_offset:int64"
)
ALLOCATION_SCHEMA = schema(
    "allocation_id:string job:string pod:string queue:string node:string gpus:string "
    "devices:int32[] device_milli:int32[] gpu_milli:int64 allocated_offset:int64 "
    "from_ms:int64 started_ms:int64 to_ms:int64 end_reason:string"
)


def pod_rows(fold: OutcomeFold) -> pa.Table:
    """The batch's changed pods (``pods`` base columns)."""
    return rows_table(fold.changed_pods.values(), POD_SCHEMA)


def allocation_rows(fold: OutcomeFold) -> pa.Table:
    """The batch's opened and closed allocations."""
    return rows_table(fold.changed_allocs.values(), ALLOCATION_SCHEMA)


def load_outcomes(
    fold: OutcomeFold,
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    open_rows: list[dict[str, Any]],
) -> None:
    """Give ``fold`` the live jobs' outcomes back from their ``jobs``, ``pods`` and open
    ``allocations`` rows (the fold-only figures restart from zero)."""
    for row in jobs:
        outcome = JobOutcome(**row)
        fold.jobs[outcome.job] = outcome
    for row in pods:
        pod = PodOutcome(**row)
        fold.pods.setdefault(pod.job, {})[pod.pod] = pod
    for row in open_rows:
        alloc = Allocation(**row)
        fold.open[(alloc.job, alloc.pod)] = alloc


# --------------------------------------------------------------------------- queue shares

SHARE_SCHEMA = schema(
    "queue:string parent:string from_minute:int64 to_minute:int64 current:bool "
    "deserved_gpu_milli:int64 fair_gpu_milli:int64 allocated_gpu_milli:int64 "
    "requested_gpu_milli:int64 pending_jobs:int32 running_jobs:int32"
)
"""The stored columns of ``queue_shares``; the projector derives ms, s and GPUs on insert."""

STATE_FORMAT = f"gpuledger-snapshot-{SNAPSHOT_FORMAT}"
"""``projection_state.format`` of a core state saved with ``scheduler.fold.snapshot``."""

SHARE_NEUTRAL: frozenset[type[Event]] = frozenset(
    {Tick, PodBound, PodStarted, CycleCompleted, GpuUtilizationSampled, JobRejected}
)
"""Events whose fold leaves every input of a queue's figures as it was: the queue tree and
its configuration, the nodes' capacity, the policy configuration, each queue's allocation,
pending order and active jobs (a pod's start changes only its job's start times and
status). After only these, a sample would compute the figures it computed last time."""

_Figures = tuple[str, int, int, int, int, int, int]
"""parent, deserved, fair, allocated and requested milli-GPUs, pending and running jobs."""


@dataclass
class _Interval:
    from_minute: int
    figures: _Figures


@dataclass
class ShareFold:
    """Each queue's figures as intervals of minutes over which they held.

    ``sample`` is called before each event is folded into ``state`` (the core's state,
    which the job-outcome fold advances): when the event's minute is past the last one
    sampled, the boundaries in between all see the state as it is, so one ``fair_shares``
    call covers them, and a queue's interval ends only where its figures change. The
    current interval of every queue is written again with each batch of rows (its end is
    the minute after the last one sampled), so a resumed run continues it.
    """

    state: State = field(default_factory=State)
    last_minute: int | None = None
    """Minute of the latest event sampled; boundaries after it are not yet crossed."""
    current: dict[str, _Interval] = field(default_factory=dict)
    closed: list[tuple[str, int, int, _Figures]] = field(default_factory=list)
    """Intervals ended since the last ``take_rows``: queue, from, to (exclusive), figures."""
    changed: bool = True
    """Whether an event folded since the last sample may have changed the figures: the
    caller sets it for every folded event not in ``SHARE_NEUTRAL``, and a sample with it
    unset computes nothing (every current interval simply goes on)."""

    def snapshot(self) -> bytes:
        """The core's state in ``scheduler.fold.snapshot``'s versioned msgpack format."""
        return encode_snapshot("projection", self.state, 0, 0, 0)

    @classmethod
    def restore(cls, blob: bytes, last_minute: int | None) -> ShareFold:
        """The fold from ``snapshot`` bytes and its last minute (``SnapshotError`` if the
        bytes are not a snapshot this version reads)."""
        _, state = decode_snapshot(blob)
        return cls(state=state, last_minute=last_minute)

    def resume(self, current: list[dict[str, Any]]) -> None:
        """Continue the intervals of the stored rows marked ``current``."""
        for row in current:
            figures: _Figures = (
                row["parent"],
                row["deserved_gpu_milli"],
                row["fair_gpu_milli"],
                row["allocated_gpu_milli"],
                row["requested_gpu_milli"],
                row["pending_jobs"],
                row["running_jobs"],
            )
            self.current[row["queue"]] = _Interval(row["from_minute"], figures)

    def sample(self, at: int) -> None:
        """Sample the minute boundaries ``at`` crosses, before its event is folded."""
        minute = at // MINUTE_MS
        if self.last_minute is None:
            self.last_minute = minute
        elif minute > self.last_minute:
            self._sample(self.last_minute + 1)
            self.last_minute = minute

    def advance_only(self, at: int) -> None:
        """Cross ``at``'s minute without sampling (its rows are stored already)."""
        minute = at // MINUTE_MS
        if self.last_minute is None or minute > self.last_minute:
            self.last_minute = minute

    def _sample(self, first: int) -> None:
        """The figures from boundary ``first`` on: close the intervals they change."""
        if not self.changed:
            return
        self.changed = False
        state = self.state
        current = self.current
        if not state.queues and not current:
            return
        shares = fair_shares(state, resources=1) if state.queues else None  # GPUs only
        pending: dict[str, int] = dict.fromkeys(state.queues, 0)
        running: dict[str, int] = dict.fromkeys(state.queues, 0)
        for queue in state.queues.values():
            if queue.pending or queue.active:
                for up in state.ancestors(queue.name):
                    pending[up.name] += len(queue.pending)
                    running[up.name] += len(queue.active)
        for name in sorted(current.keys() - state.queues.keys()):
            gone = current.pop(name)  # a removed queue's interval ends
            self.closed.append((name, gone.from_minute, first, gone.figures))
        if shares is None:
            return
        for name, q in sorted(state.queues.items()):
            figures: _Figures = (
                q.parent,
                shares.deserved[name][0],
                shares.fair[name][0],
                q.allocated[0],
                shares.demand.get(name, q.allocated)[0],
                pending[name],
                running[name],
            )
            now = current.get(name)
            if now is not None and now.figures == figures:
                continue
            if now is not None:
                self.closed.append((name, now.from_minute, first, now.figures))
            current[name] = _Interval(first, figures)

    def take_rows(self) -> pa.Table:
        """The intervals closed since the last call, then every current one (ending after
        the last minute sampled), as an Arrow table."""
        cols: list[list[Any]] = [[] for _ in SHARE_SCHEMA]
        end = (self.last_minute or 0) + 1

        def add(queue: str, start: int, stop: int, is_current: bool, f: _Figures) -> None:
            values = (queue, f[0], start, stop, is_current, *f[1:])
            for col, value in zip(cols, values, strict=True):
                col.append(value)

        for queue, start, stop, figures in self.closed:
            add(queue, start, stop, False, figures)
        for queue, interval in sorted(self.current.items()):
            add(queue, interval.from_minute, end, True, interval.figures)
        self.closed = []
        return table(cols, SHARE_SCHEMA)
