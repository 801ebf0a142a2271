"""The rows of the ``pods``, ``allocations`` and ``queue_shares`` tables.

``pods`` and ``allocations`` are the changes ``scheduler.outcomes.OutcomeFold`` recorded
(the same fold gives ``jobs`` and ``replay.metrics`` their figures); the live jobs' rows
are given back to it when a run starts (``load_outcomes``), so it resumes anywhere.

``ShareFold`` reads the policy core's state that the outcome fold keeps and asks
``fair_shares`` for every queue's deserved quota and fair share at each minute boundary
of ledger time. The core's state cannot be rebuilt from table rows, so it is
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

from scheduler.core import Job, Node, Queue, State, fair_shares
from scheduler.core.state import TERMINAL
from scheduler.outcomes import Allocation, JobOutcome, OutcomeFold, PodOutcome

__all__ = [
    "ALLOCATION_SCHEMA",
    "MINUTE_MS",
    "POD_SCHEMA",
    "ShareFold",
    "allocation_rows",
    "load_outcomes",
    "pod_rows",
    "state_format",
]

MINUTE_MS = 60_000
MAX_GAP_MINUTES = 7 * 24 * 60
"""A silent stretch longer than a week emits only its last week of minute rows: a ledger
mixing simulated (from 0) and wall-clock (epoch) times must not write 29 million rows."""


# --------------------------------------------------------------------------- pods

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


def pod_rows(fold: OutcomeFold) -> pa.Table:
    """The batch's changed pods (``pods`` base columns)."""
    return _table(list(fold.changed_pods.values()), POD_SCHEMA)


def allocation_rows(fold: OutcomeFold) -> pa.Table:
    """The batch's opened and closed allocations."""
    return _table(list(fold.changed_allocs.values()), ALLOCATION_SCHEMA)


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

    def sample(self, at: int) -> None:
        """Sample the minute boundaries ``at`` crosses, before its event is folded."""
        minute = at // MINUTE_MS
        if self.last_minute is None:
            self.last_minute = minute
        elif minute > self.last_minute:
            self._sample(max(self.last_minute + 1, minute - MAX_GAP_MINUTES + 1), minute)
            self.last_minute = minute

    def advance_only(self, at: int) -> None:
        """Cross ``at``'s minute without sampling (its rows are stored already)."""
        minute = at // MINUTE_MS
        if self.last_minute is None or minute > self.last_minute:
            self.last_minute = minute

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
