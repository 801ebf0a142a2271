"""Fold a ledger into DuckDB tables that people can query with SQL.

The projector reads envelopes from any ``LedgerReader`` and maintains:

* ``events`` — every record, raw (type, key, time, JSON payload), for ad-hoc SQL;
* ``queues`` — the queue tree with each queue's ``/``-joined path;
* ``jobs`` — one row per job: its lifecycle times, status, preemptions and lost work;
* ``tenant_percentiles`` / ``overall_percentiles`` — views of time-to-ready and
  completion percentiles per queue and across all queues.

It is incremental and idempotent. ``projection_offsets`` records, per projection, the
next ledger offset to apply; each batch's rows and the advanced offsets commit in one
DuckDB transaction, so a re-run never applies an event twice and a crash mid-batch
leaves the previous batch's consistent state. The job fold keeps non-terminal jobs in
memory between batches and reloads them from ``jobs`` when a run starts, which is why
the table carries a few internal counters beside the reported columns.

Rows are bulk-inserted from Arrow tables registered in DuckDB (``INSERT … SELECT``),
never row by row, so a million events project in seconds.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from events.codec import Envelope, UnknownEventType, decode_event
from events.model import (
    MILLI,
    BindFailed,
    Event,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    JobUnschedulable,
    PodFinished,
    PodsAllocated,
    PodStarted,
    QueueConfigured,
    QueueRemoved,
)
from events.port import LedgerReader

__all__ = [
    "ACTIVE_STATUSES",
    "PROJECTIONS",
    "SCHEMA_VERSION",
    "TERMINAL_STATUSES",
    "ProjectStats",
    "SchemaError",
    "connect",
    "project",
]

PROJECTIONS: tuple[str, ...] = ("events", "queues", "jobs")
"""Names of the projections whose progress ``projection_offsets`` tracks."""

ACTIVE_STATUSES: frozenset[str] = frozenset({"pending", "allocated", "running"})
"""Job statuses that later events can still change."""

TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "unschedulable"})
"""Job statuses that only a new ``job_submitted`` of the same name replaces."""


class SchemaError(RuntimeError):
    """The database is not a gpuledger projection, or one written by a newer version."""


# --------------------------------------------------------------------------- schema

# The percentile aggregates are shared by the per-queue and the overall view so the two
# can never disagree on what a column means. Sums are taken over the exact integer columns
# so that the result does not depend on DuckDB's (parallel, unordered) summation order.
_AGGREGATES = """
    count(*) AS jobs,
    count(time_to_ready_s) AS ready,
    count(completion_s) AS finished,
    count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE status = 'unschedulable') AS unschedulable,
    count(*) FILTER (WHERE status IN ('pending', 'allocated', 'running')) AS active,
    quantile_cont(time_to_ready_s, 0.50) AS p50_ttr_s,
    quantile_cont(time_to_ready_s, 0.90) AS p90_ttr_s,
    quantile_cont(time_to_ready_s, 0.95) AS p95_ttr_s,
    quantile_cont(time_to_ready_s, 0.99) AS p99_ttr_s,
    quantile_cont(completion_s, 0.50) AS p50_completion_s,
    quantile_cont(completion_s, 0.90) AS p90_completion_s,
    quantile_cont(completion_s, 0.95) AS p95_completion_s,
    quantile_cont(completion_s, 0.99) AS p99_completion_s,
    CAST(coalesce(sum(preemptions), 0) AS BIGINT) AS preemptions,
    coalesce(sum(lost_gpu_ms), 0) / 3600000 AS lost_gpu_hours,
    coalesce(sum(gpu_milli), 0) / 1000 AS gpus_requested
"""

# Migration N (1-based) is MIGRATIONS[N-1]. Migrations are append-only: a shipped one is
# never edited, a change is a new migration, so every database converges on one schema.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE projection_offsets (
            projection TEXT PRIMARY KEY,
            next_offset BIGINT NOT NULL
        )
        """,
        """
        CREATE TABLE events (
            "offset" BIGINT PRIMARY KEY,
            at_ms BIGINT NOT NULL,
            at_s DOUBLE NOT NULL,
            type TEXT NOT NULL,
            key TEXT NOT NULL,
            version INTEGER NOT NULL,
            known BOOLEAN NOT NULL,
            payload JSON
        )
        """,
        """
        CREATE TABLE queues (
            queue TEXT PRIMARY KEY,
            parent TEXT NOT NULL,
            path TEXT NOT NULL,
            depth INTEGER NOT NULL,
            deserved_gpus DOUBLE NOT NULL,
            deserved_gpu_percent INTEGER,
            limit_gpus DOUBLE,
            over_quota_weight INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            configured_at_s DOUBLE NOT NULL,
            removed BOOLEAN NOT NULL,
            configured_at_ms BIGINT NOT NULL,
            configured_offset BIGINT NOT NULL
        )
        """,
        """
        CREATE TABLE jobs (
            job TEXT PRIMARY KEY,
            queue TEXT NOT NULL,
            queue_path TEXT NOT NULL,
            priority_class TEXT NOT NULL,
            pods INTEGER NOT NULL,
            min_members INTEGER NOT NULL,
            gpus DOUBLE NOT NULL,
            submitted_at_s DOUBLE NOT NULL,
            ready_at_s DOUBLE,
            finished_at_s DOUBLE,
            status TEXT NOT NULL,
            preemptions INTEGER NOT NULL,
            lost_gpu_s DOUBLE NOT NULL,
            time_to_ready_s DOUBLE,
            completion_s DOUBLE,
            unschedulable_reason TEXT,
            gpu_milli BIGINT NOT NULL,
            submitted_at_ms BIGINT NOT NULL,
            ready_at_ms BIGINT,
            finished_at_ms BIGINT,
            lost_gpu_ms BIGINT NOT NULL,
            started_pods INTEGER NOT NULL,
            finished_pods INTEGER NOT NULL,
            failed_pods INTEGER NOT NULL,
            submitted_offset BIGINT NOT NULL,
            updated_offset BIGINT NOT NULL
        )
        """,
        f"""
        CREATE VIEW tenant_percentiles AS
        SELECT queue, queue_path, {_AGGREGATES}
        FROM jobs
        GROUP BY queue, queue_path
        """,  # noqa: S608  # built from module constants only
        f"""
        CREATE VIEW overall_percentiles AS
        SELECT {_AGGREGATES}
        FROM jobs
        """,  # noqa: S608  # built from module constants only
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes and reads."""

# Everything ``rebuild`` drops, views first because they depend on the tables.
_VIEWS = ("tenant_percentiles", "overall_percentiles")
_TABLES = ("events", "queues", "jobs", "projection_offsets", "schema_version")


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Run the block in one transaction: commit on success, roll back on any exception."""
    con.begin()
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # already aborted or committed
            con.rollback()
        raise
    con.commit()


def _schema_version(con: duckdb.DuckDBPyConnection) -> int:
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() "
        "WHERE schema_name = 'main' AND table_name = 'schema_version'"
    ).fetchone()
    if exists is None or exists[0] == 0:
        return 0
    row = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    assert row is not None
    return int(row[0])


def _migrate(con: duckdb.DuckDBPyConnection) -> None:
    current = _schema_version(con)
    if current > SCHEMA_VERSION:
        raise SchemaError(
            f"projection schema version {current} is newer than this gpuledger "
            f"understands ({SCHEMA_VERSION}); rebuild it or upgrade gpuledger"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        # One transaction per migration: a crash leaves the database at a known version.
        with _transaction(con):
            con.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, applied_at TIMESTAMP DEFAULT current_timestamp)"
            )
            for statement in MIGRATIONS[version - 1]:
                con.execute(statement)
            con.execute("INSERT INTO schema_version (version) VALUES (?)", [version])


def connect(
    db_path: str | os.PathLike[str], *, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """Open a projection database, creating it and applying migrations when writable.

    A read-only open checks the schema version instead: ``FileNotFoundError`` if the file
    does not exist, ``SchemaError`` if it is not a projection of this schema version.
    """
    path = Path(db_path)
    if read_only:
        if not path.exists():
            raise FileNotFoundError(f"no projection database at {path}")
        con = duckdb.connect(str(path), read_only=True)
        version = _schema_version(con)
        if version != SCHEMA_VERSION:
            con.close()
            raise SchemaError(
                f"{path} has projection schema version {version}, expected {SCHEMA_VERSION}"
                + ("; run `gpuledger project` first" if version == 0 else "")
            )
        return con
    path.parent.mkdir(parents=True, exist_ok=True)
    # Checkpoint once when the projector closes rather than every 16 MB of WAL: a
    # checkpoint per batch more than doubles the commit cost of a large projection.
    con = duckdb.connect(str(path), config={"checkpoint_threshold": "1GB"})
    try:
        _migrate(con)
    except BaseException:
        con.close()
        raise
    return con


def _drop_all(con: duckdb.DuckDBPyConnection) -> None:
    with _transaction(con):
        for view in _VIEWS:
            con.execute(f"DROP VIEW IF EXISTS {view}")
        for table in _TABLES:
            con.execute(f"DROP TABLE IF EXISTS {table}")


# --------------------------------------------------------------------------- fold state


@dataclass(slots=True)
class _Job:
    """The fold state of one job, exactly the columns ``_JOB_STATE_SCHEMA`` stores."""

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
    status: str = "pending"
    preemptions: int = 0
    lost_gpu_ms: int = 0
    unschedulable_reason: str | None = None
    # Counters of the current attempt; a preemption starts a new attempt.
    started_pods: int = 0
    finished_pods: int = 0
    failed_pods: int = 0

    @property
    def needed(self) -> int:
        """Pods that must run for the gang to be ready (min_members 0 means all)."""
        return self.min_members if self.min_members > 0 else self.pods

    def finish(self, status: str, at: int) -> None:
        self.status = status
        self.finished_at_ms = at


@dataclass(slots=True)
class _Queue:
    queue: str
    parent: str
    deserved_gpus: float
    deserved_gpu_percent: int | None
    limit_gpus: float | None
    over_quota_weight: int
    priority: int
    configured_at_ms: int
    configured_offset: int
    removed: bool = False
    path: str = ""
    depth: int = 0


# The fold state of a job as stored in ``jobs``; the other columns are derived from it in
# SQL on insert (``_JOB_SELECT``), so that the derivation exists in one place only.
_JOB_STATE_SCHEMA = pa.schema(
    [
        ("job", pa.string()),
        ("queue", pa.string()),
        ("priority_class", pa.string()),
        ("pods", pa.int32()),
        ("min_members", pa.int32()),
        ("gpu_milli", pa.int64()),
        ("submitted_at_ms", pa.int64()),
        ("submitted_offset", pa.int64()),
        ("updated_offset", pa.int64()),
        ("ready_at_ms", pa.int64()),
        ("finished_at_ms", pa.int64()),
        ("status", pa.string()),
        ("preemptions", pa.int32()),
        ("lost_gpu_ms", pa.int64()),
        ("unschedulable_reason", pa.string()),
        ("started_pods", pa.int32()),
        ("finished_pods", pa.int32()),
        ("failed_pods", pa.int32()),
    ]
)
_JOB_STATE_COLUMNS: tuple[str, ...] = tuple(_JOB_STATE_SCHEMA.names)
_job_state = operator.attrgetter(*_JOB_STATE_COLUMNS)

# Integer ``/`` in DuckDB is DOUBLE division, correctly rounded like Python's ``/``.
_JOB_SELECT = """
    b.*,
    coalesce(q.path, b.queue) AS queue_path,
    b.gpu_milli / 1000 AS gpus,
    b.submitted_at_ms / 1000 AS submitted_at_s,
    b.ready_at_ms / 1000 AS ready_at_s,
    b.finished_at_ms / 1000 AS finished_at_s,
    b.lost_gpu_ms / 1000 AS lost_gpu_s,
    (b.ready_at_ms - b.submitted_at_ms) / 1000 AS time_to_ready_s,
    CASE WHEN b.status IN ('succeeded', 'failed')
        THEN (b.finished_at_ms - b.submitted_at_ms) / 1000 END AS completion_s
"""

_QUEUE_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("parent", pa.string()),
        ("path", pa.string()),
        ("depth", pa.int32()),
        ("deserved_gpus", pa.float64()),
        ("deserved_gpu_percent", pa.int32()),
        ("limit_gpus", pa.float64()),
        ("over_quota_weight", pa.int32()),
        ("priority", pa.int32()),
        ("configured_at_s", pa.float64()),
        ("removed", pa.bool_()),
        ("configured_at_ms", pa.int64()),
        ("configured_offset", pa.int64()),
    ]
)

_EVENT_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("at_ms", pa.int64()),
        ("at_s", pa.float64()),
        ("type", pa.string()),
        ("key", pa.string()),
        ("version", pa.int32()),
        ("known", pa.bool_()),
        ("payload", pa.string()),
    ]
)


def _queue_paths(queues: dict[str, _Queue]) -> None:
    """Set every queue's path and depth from the current parent links.

    Recomputed for all queues whenever any changes: a queue may be configured before its
    parent, or moved under another one, and every descendant's path changes with it. A
    parent that was never configured still names the top of the path; a cycle (a bad
    configuration) stops the walk instead of looping.
    """
    for q in queues.values():
        names = [q.queue]
        seen = {q.queue}
        parent = q.parent
        while parent and parent not in seen:
            names.append(parent)
            seen.add(parent)
            up = queues.get(parent)
            parent = up.parent if up is not None else ""
        q.path = "/".join(reversed(names))
        q.depth = len(names) - 1


@dataclass
class _Fold:
    """The in-memory fold of one run: active jobs, all queues, and the batch's changes."""

    jobs: dict[str, _Job]
    queues: dict[str, _Queue]
    dirty_jobs: dict[str, _Job] = field(default_factory=dict)
    queues_changed: bool = False

    def apply_queue(self, event: Event, offset: int, at: int) -> None:
        match event:
            case QueueConfigured():
                percent = event.deserved_gpu_percent
                limit = event.limit.gpu_milli
                self.queues[event.queue] = _Queue(
                    queue=event.queue,
                    parent=event.parent,
                    deserved_gpus=event.deserved.gpu_milli / MILLI,
                    deserved_gpu_percent=percent,
                    limit_gpus=None if limit < 0 else limit / MILLI,
                    over_quota_weight=event.over_quota_weight,
                    priority=event.priority,
                    configured_at_ms=at,
                    configured_offset=offset,
                )
                self.queues_changed = True
            case QueueRemoved():
                q = self.queues.get(event.queue)
                if q is not None and not q.removed:
                    q.removed = True
                    self.queues_changed = True
            case _:
                pass

    def apply_job(self, event: Event, offset: int, at: int) -> None:
        if isinstance(event, JobSubmitted):
            self._submit(event, offset, at)
            return
        # Events about a job this fold does not hold are dropped: either the job was
        # never submitted in this ledger, or it is terminal and was evicted from memory
        # after an earlier batch, where it would have ignored the event anyway.
        name = getattr(event, "job", None)  # node, queue and cycle events have none
        job = self.jobs.get(name) if isinstance(name, str) else None
        if job is None or job.status not in ACTIVE_STATUSES:
            return
        match event:
            case PodStarted():
                job.started_pods += 1
                if job.started_pods >= job.needed and job.status != "running":
                    job.status = "running"
                    if job.ready_at_ms is None:
                        job.ready_at_ms = at
            case PodFinished():
                job.finished_pods += 1
                if not event.succeeded:
                    job.failed_pods += 1
                if job.finished_pods >= job.pods:
                    job.finish("failed" if job.failed_pods else "succeeded", at)
            case PodsAllocated():
                if job.status == "pending":
                    job.status = "allocated"
            case JobPreempted():
                job.preemptions += 1
                job.lost_gpu_ms += event.lost_gpu_ms
                # A new attempt: the gang must start (and finish) all over again.
                job.started_pods = job.finished_pods = job.failed_pods = 0
                job.status = "pending"
            case BindFailed():
                # The allocation is released; the job waits to be placed again.
                if job.status == "allocated":
                    job.status = "pending"
            case JobCancelled():
                job.finish("cancelled", at)
            case JobUnschedulable():
                job.unschedulable_reason = event.reason
                if event.final:
                    job.finish("unschedulable", at)
            case _:
                return  # pod_bound, pod_evicted: no change to the job's row
        job.updated_offset = offset
        self.dirty_jobs[job.job] = job

    def _submit(self, event: JobSubmitted, offset: int, at: int) -> None:
        known = self.jobs.get(event.job)
        if known is not None and known.status in ACTIVE_STATUSES:
            return  # a duplicate submission does not restart a live job
        job = _Job(
            job=event.job,
            queue=event.queue,
            priority_class=event.priority_class,
            pods=len(event.pods),
            min_members=event.min_members,
            gpu_milli=sum(p.gpu_milli for p in event.pods),
            submitted_at_ms=at,
            submitted_offset=offset,
            updated_offset=offset,
        )
        # A name reused after the first job ended starts a new row (the last one wins).
        self.jobs[event.job] = job
        self.dirty_jobs[event.job] = job

    def end_batch(self) -> None:
        """Forget the batch's changes and evict terminal jobs (they can't change again)."""
        for name, job in self.dirty_jobs.items():
            if job.status in TERMINAL_STATUSES and self.jobs.get(name) is job:
                del self.jobs[name]
        self.dirty_jobs = {}
        self.queues_changed = False


def _load_fold(con: duckdb.DuckDBPyConnection) -> _Fold:
    columns = ", ".join(_JOB_STATE_COLUMNS)
    jobs: dict[str, _Job] = {}
    cursor = con.execute(
        f"SELECT {columns} FROM jobs WHERE status IN ('pending', 'allocated', 'running')"  # noqa: S608  # constant column list
    )
    for values in cursor.fetchall():
        job = _Job(**dict(zip(_JOB_STATE_COLUMNS, values, strict=True)))
        jobs[job.job] = job
    queues: dict[str, _Queue] = {}
    for row in con.execute(
        "SELECT queue, parent, deserved_gpus, deserved_gpu_percent, limit_gpus, "
        "over_quota_weight, priority, configured_at_ms, "
        "configured_offset, removed, path, depth FROM queues"
    ).fetchall():
        q = _Queue(*row)
        queues[q.queue] = q
    return _Fold(jobs=jobs, queues=queues)


# --------------------------------------------------------------------------- batch writing


def _job_rows(fold: _Fold) -> pa.Table:
    """The batch's changed jobs as fold-state columns; ``_JOB_SELECT`` derives the rest."""
    rows = list(map(_job_state, fold.dirty_jobs.values()))
    columns = zip(*rows, strict=True) if rows else ([] for _ in _JOB_STATE_SCHEMA)
    return pa.table(
        [pa.array(col, f.type) for col, f in zip(columns, _JOB_STATE_SCHEMA, strict=True)],
        schema=_JOB_STATE_SCHEMA,
    )


def _queue_rows(fold: _Fold) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name in _QUEUE_SCHEMA.names}
    for q in fold.queues.values():
        cols["queue"].append(q.queue)
        cols["parent"].append(q.parent)
        cols["path"].append(q.path)
        cols["depth"].append(q.depth)
        cols["deserved_gpus"].append(q.deserved_gpus)
        cols["deserved_gpu_percent"].append(q.deserved_gpu_percent)
        cols["limit_gpus"].append(q.limit_gpus)
        cols["over_quota_weight"].append(q.over_quota_weight)
        cols["priority"].append(q.priority)
        cols["configured_at_s"].append(q.configured_at_ms / 1000)
        cols["removed"].append(q.removed)
        cols["configured_at_ms"].append(q.configured_at_ms)
        cols["configured_offset"].append(q.configured_offset)
    return pa.table(cols, schema=_QUEUE_SCHEMA)


def _insert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    rows: pa.Table,
    *,
    key: str | None = None,
    select: str = "b.*",
    join: str = "",
) -> int:
    """Insert an Arrow table into ``table`` in one statement, replacing rows by ``key``."""
    if rows.num_rows == 0:
        return 0
    name = f"_gpuledger_batch_{table}"
    con.register(name, rows)
    try:
        # Table, key and SQL fragments are this module's constants, never user input.
        if key is not None:
            # An upsert as delete-then-insert: DuckDB's INSERT OR REPLACE is several times
            # slower when most keys already exist, which is the common case for jobs.
            con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {name})")  # noqa: S608
        con.execute(f"INSERT INTO {table} BY NAME SELECT {select} FROM {name} b {join}")  # noqa: S608
    finally:
        con.unregister(name)
    return int(rows.num_rows)


# --------------------------------------------------------------------------- the projector


@dataclass(frozen=True)
class ProjectStats:
    """What one ``project`` run did."""

    events_read: int
    """Ledger records read and committed by this run."""
    rows_written: int
    """Rows inserted or replaced across all tables."""
    last_offset: int | None
    """Offset of the last record committed by this run (None if there was nothing new)."""
    next_offset: int
    """Where the next run starts: one past the last projected record."""
    seconds: float
    """Wall-clock duration of the run."""
    batches: int = 0
    """Transactions committed."""

    @property
    def events_per_second(self) -> float:
        """Projection throughput of this run."""
        return self.events_read / self.seconds if self.seconds > 0 else 0.0


_payload_json = msgspec.json.Encoder()


def _batches(
    records: Iterable[tuple[int, Envelope]], size: int
) -> Iterable[list[tuple[int, Envelope]]]:
    it = iter(records)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is folded.

    Decoding a batch allocates hundreds of thousands of small objects, each allocation
    counting towards a collection that walks everything still alive: it more than doubles
    the fold time. The fold creates no reference cycles (refcounting frees it all), so
    pausing collection for one batch holds back nothing.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_QUEUE_EVENTS = (QueueConfigured, QueueRemoved)


def _fold_batch(
    chunk: list[tuple[int, Envelope]],
    fold: _Fold,
    from_events: int,
    from_queues: int,
    from_jobs: int,
) -> pa.Table:
    """Fold a batch into ``fold`` and return its ``events`` rows.

    The hot loop of the projector: columns are plain lists with their ``append`` bound
    once, and the derived columns (seconds, text payload) are computed by Arrow in bulk.
    """
    offsets: list[int] = []
    ats: list[int] = []
    types: list[str] = []
    keys: list[str] = []
    versions: list[int] = []
    known: list[bool] = []
    payloads: list[str] = []
    add_offset, add_at, add_type = offsets.append, ats.append, types.append
    add_key, add_version, add_known = keys.append, versions.append, known.append
    add_payload, encode = payloads.append, _payload_json.encode
    apply_queue, apply_job = fold.apply_queue, fold.apply_job
    for offset, env in chunk:
        at = env.at
        try:
            event: Event | None = decode_event(env, offset)
        except UnknownEventType:
            event = None  # a newer writer's type: keep it raw, fold nothing
        if offset >= from_events:
            add_offset(offset)
            add_at(at)
            add_type(env.type)
            add_key(env.key)
            add_version(env.version)
            add_known(event is not None)
            raw = event if event is not None else msgspec.msgpack.decode(env.payload)
            add_payload(encode(raw).decode())
        if event is None:
            continue
        if offset >= from_queues and isinstance(event, _QUEUE_EVENTS):
            apply_queue(event, offset, at)
        if offset >= from_jobs:
            apply_job(event, offset, at)
    at_ms = pa.array(ats, pa.int64())
    return pa.table(
        [
            pa.array(offsets, pa.int64()),
            at_ms,
            pc.divide(at_ms.cast(pa.float64()), 1000.0),
            pa.array(types, pa.string()),
            pa.array(keys, pa.string()),
            pa.array(versions, pa.int32()),
            pa.array(known, pa.bool_()),
            pa.array(payloads, pa.string()),
        ],
        schema=_EVENT_SCHEMA,
    )


def project(
    reader: LedgerReader,
    db_path: str | os.PathLike[str],
    *,
    rebuild: bool = False,
    batch_size: int = 50_000,
    progress: Callable[[ProjectStats], None] | None = None,
) -> ProjectStats:
    """Bring the projection database at ``db_path`` up to the ledger's current end.

    Reads from the lowest ``next_offset`` recorded in ``projection_offsets`` up to the
    ``end_offset()`` the reader reports when the run starts, in batches of ``batch_size``
    records; each batch commits atomically with the advanced offsets. ``rebuild`` drops
    every projection table first and starts again from offset 0. ``progress``, if given,
    is called with the running totals after each committed batch (an exception it raises
    stops the run with every batch before it kept).

    Raises ``ValueError`` if the database has projected past the reader's end (it was
    built from a different ledger: rebuild it), ``DecodeError`` for a corrupt record.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    started = time.perf_counter()
    con = connect(db_path)
    try:
        if rebuild:
            _drop_all(con)
            _migrate(con)
        next_offsets = dict.fromkeys(PROJECTIONS, 0)
        next_offsets.update(
            (str(name), int(off))
            for name, off in con.execute(
                "SELECT projection, next_offset FROM projection_offsets"
            ).fetchall()
            if name in next_offsets
        )
        end = reader.end_offset()
        start = min(next_offsets.values())
        if max(next_offsets.values()) > end:
            raise ValueError(
                f"{db_path} has projected up to offset {max(next_offsets.values())} but the "
                f"ledger ends at {end}: it was built from another ledger; rebuild it"
            )
        fold = _load_fold(con)
        events_read = rows_written = batches = 0
        last_offset: int | None = None
        next_offset = min(next_offsets.values())

        def stats() -> ProjectStats:
            return ProjectStats(
                events_read=events_read,
                rows_written=rows_written,
                last_offset=last_offset,
                next_offset=next_offset,
                seconds=time.perf_counter() - started,
                batches=batches,
            )

        # Per-projection starting points: a projection added by a later migration starts
        # at 0 while the others skip what they already hold.
        from_events, from_queues, from_jobs = (next_offsets[p] for p in PROJECTIONS)
        for chunk in _batches(reader.read(start, end), batch_size):
            with _gc_paused():
                event_rows = _fold_batch(chunk, fold, from_events, from_queues, from_jobs)
                if fold.queues_changed:
                    _queue_paths(fold.queues)
                job_rows = _job_rows(fold)
                queue_rows = _queue_rows(fold) if fold.queues_changed else None
            batch_next = chunk[-1][0] + 1

            # The batch's rows and the advanced offsets commit together or not at all.
            with _transaction(con):
                written = _insert(con, "events", event_rows)
                if queue_rows is not None:
                    written += _insert(con, "queues", queue_rows, key="queue")
                written += _insert(
                    con,
                    "jobs",
                    job_rows,
                    key="job",
                    select=_JOB_SELECT,
                    join="LEFT JOIN queues q ON q.queue = b.queue",
                )
                if queue_rows is not None:
                    # Jobs written by earlier batches follow their queue's new path.
                    con.execute(
                        "UPDATE jobs SET queue_path = q.path FROM queues q "
                        "WHERE jobs.queue = q.queue AND jobs.queue_path <> q.path"
                    )
                con.executemany(
                    "INSERT OR REPLACE INTO projection_offsets VALUES (?, ?)",
                    [[p, max(batch_next, next_offsets[p])] for p in PROJECTIONS],
                )
            for p in PROJECTIONS:
                next_offsets[p] = max(batch_next, next_offsets[p])
            fold.end_batch()
            events_read += len(chunk)
            rows_written += written
            batches += 1
            last_offset = chunk[-1][0]
            next_offset = min(next_offsets.values())
            if progress is not None:
                progress(stats())
        return stats()
    finally:
        con.close()
