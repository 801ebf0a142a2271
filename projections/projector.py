"""Fold a ledger into DuckDB tables that people can query with SQL.

The projector reads envelopes from any ``LedgerReader`` and maintains:

* ``events`` — every record, raw (type, key, time, JSON payload), for ad-hoc SQL;
* ``queues`` — the queue tree with each queue's ``/``-joined path;
* ``jobs`` — one row per job: its lifecycle times, status, preemptions and lost work;
* ``pods`` and ``allocations`` — every pod of a job, and every hold of a pod on a node
  (GPU slots, from/to, why it ended);
* ``preemptions`` — who was preempted, by whom, under which rule, and the work lost;
* ``gpu_utilization`` — monitoring samples (``gpu_utilization_sampled``) for drift;
* ``queue_shares`` — each queue's deserved quota, fair share, allocation and request over
  minutes of ledger time, a row per change (views give per-minute and per-window figures);
* ``tenant_percentiles`` / ``overall_percentiles`` and the views of
  ``projections.views`` — percentiles per queue and tree level, fairness SLO windows,
  weekly preemptions, GPU usage, GPUs requested but not allocated, throughput.

It is incremental and idempotent. ``projection_offsets`` records, per projection, the
next ledger offset to apply; each batch's rows and the advanced offsets commit in one
DuckDB transaction, so a re-run never applies an event twice and a crash mid-batch
leaves the previous batch's consistent state. Every event is folded through the policy
core once (``scheduler.fold.outcomes.OutcomeFold``); the jobs, pods and allocations are read
off its state, and ``queue_shares`` samples it. The job outcomes of live jobs are reloaded
from ``jobs``, ``pods`` and ``allocations`` when a run starts, the core's state from its
snapshot in ``projection_state``.

Rows are bulk-inserted from Arrow tables registered in DuckDB (``INSERT … SELECT``),
never row by row, so a million events project in seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
    Event,
    GpuUtilizationSampled,
    JobPreempted,
    QueueConfigured,
    QueueRemoved,
)
from events.port import LedgerReader
from projections.columns import rows_table, schema, table
from projections.history import (
    ALLOCATION_SCHEMA,
    MINUTE_MS,
    POD_SCHEMA,
    SHARE_NEUTRAL,
    STATE_FORMAT,
    ShareFold,
    allocation_rows,
    load_outcomes,
    pod_rows,
)
from projections.views import (
    JOB_AGGREGATES,
    SHARE_VIEW_DDL,
    SHARE_VIEW_NAMES,
    VIEW_DDL,
    VIEW_NAMES,
)
from scheduler.fold.heap import gc_paused
from scheduler.fold.outcomes import DONE_STATUSES, OutcomeFold
from scheduler.fold.snapshot import SnapshotError

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

PROJECTIONS: tuple[str, ...] = (
    "events",
    "queues",
    "jobs",
    "pods",
    "preemptions",
    "samples",
    "queue_shares",
)
"""Names of the projections whose progress ``projection_offsets`` tracks."""

ACTIVE_STATUSES: frozenset[str] = frozenset({"pending", "allocated", "running"})
"""Job statuses that later events can still change."""

TERMINAL_STATUSES: frozenset[str] = DONE_STATUSES
"""Job statuses that only a new ``job_submitted`` of the same name replaces."""


class SchemaError(RuntimeError):
    """The database is not a gpuledger projection, or one written by a newer version."""


# --------------------------------------------------------------------------- schema

# The percentile aggregates are shared by every job view (views.JOB_AGGREGATES) so the
# per-queue, overall, windowed and tree forms can never disagree on what a column means.
_AGGREGATES = JOB_AGGREGATES

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
    (
        """
        CREATE TABLE pods (
            job TEXT NOT NULL,
            pod TEXT NOT NULL,
            queue TEXT NOT NULL,
            gpu_milli BIGINT NOT NULL,
            status TEXT NOT NULL,
            node TEXT,
            allocations INTEGER NOT NULL,
            first_allocated_at_ms BIGINT,
            first_started_at_ms BIGINT,
            started_at_ms BIGINT,
            finished_at_ms BIGINT,
            ran_without_gpus BOOLEAN NOT NULL,
            updated_offset BIGINT NOT NULL,
            gpus DOUBLE NOT NULL,
            first_allocated_at_s DOUBLE,
            first_started_at_s DOUBLE,
            finished_at_s DOUBLE,
            PRIMARY KEY (job, pod)
        )
        """,
        """
        CREATE TABLE allocations (
            allocation_id TEXT PRIMARY KEY,
            job TEXT NOT NULL,
            pod TEXT NOT NULL,
            queue TEXT NOT NULL,
            node TEXT NOT NULL,
            gpus TEXT NOT NULL,
            devices INTEGER[] NOT NULL,
            device_milli INTEGER[] NOT NULL,
            gpu_milli BIGINT NOT NULL,
            allocated_offset BIGINT NOT NULL,
            from_ms BIGINT NOT NULL,
            started_ms BIGINT,
            to_ms BIGINT,
            end_reason TEXT,
            from_s DOUBLE NOT NULL,
            started_s DOUBLE,
            to_s DOUBLE
        )
        """,
        """
        CREATE TABLE preemptions (
            "offset" BIGINT PRIMARY KEY,
            at_ms BIGINT NOT NULL,
            at_s DOUBLE NOT NULL,
            job TEXT NOT NULL,
            queue TEXT NOT NULL,
            preemptor TEXT NOT NULL,
            preemptor_queue TEXT NOT NULL,
            rule TEXT NOT NULL,
            pods INTEGER NOT NULL,
            lost_gpu_ms BIGINT NOT NULL,
            lost_gpu_s DOUBLE NOT NULL,
            checkpointed_ms BIGINT NOT NULL
        )
        """,
        """
        CREATE TABLE gpu_utilization (
            "offset" BIGINT PRIMARY KEY,
            at_ms BIGINT NOT NULL,
            at_s DOUBLE NOT NULL,
            node TEXT NOT NULL,
            device INTEGER NOT NULL,
            utilization_pct INTEGER NOT NULL,
            memory_used_mib BIGINT NOT NULL
        )
        """,
        """
        CREATE TABLE queue_shares (
            minute BIGINT NOT NULL,
            at_ms BIGINT NOT NULL,
            at_s DOUBLE NOT NULL,
            queue TEXT NOT NULL,
            parent TEXT NOT NULL,
            deserved_gpu_milli BIGINT NOT NULL,
            fair_gpu_milli BIGINT NOT NULL,
            allocated_gpu_milli BIGINT NOT NULL,
            requested_gpu_milli BIGINT NOT NULL,
            deserved_gpus DOUBLE NOT NULL,
            fair_gpus DOUBLE NOT NULL,
            allocated_gpus DOUBLE NOT NULL,
            requested_gpus DOUBLE NOT NULL,
            pending_jobs INTEGER NOT NULL,
            running_jobs INTEGER NOT NULL,
            PRIMARY KEY (minute, queue)
        )
        """,
        """
        CREATE TABLE projection_state (
            projection TEXT PRIMARY KEY,
            format TEXT NOT NULL,
            state BLOB NOT NULL
        )
        """,
        *VIEW_DDL,
    ),
    (
        # queue_shares as intervals: a row per queue per change instead of per minute.
        "DROP TABLE queue_shares",
        """
        CREATE TABLE queue_shares (
            queue TEXT NOT NULL,
            parent TEXT NOT NULL,
            from_minute BIGINT NOT NULL,
            to_minute BIGINT NOT NULL,
            current BOOLEAN NOT NULL,
            from_ms BIGINT NOT NULL,
            to_ms BIGINT NOT NULL,
            from_s DOUBLE NOT NULL,
            to_s DOUBLE NOT NULL,
            deserved_gpu_milli BIGINT NOT NULL,
            fair_gpu_milli BIGINT NOT NULL,
            allocated_gpu_milli BIGINT NOT NULL,
            requested_gpu_milli BIGINT NOT NULL,
            deserved_gpus DOUBLE NOT NULL,
            fair_gpus DOUBLE NOT NULL,
            allocated_gpus DOUBLE NOT NULL,
            requested_gpus DOUBLE NOT NULL,
            pending_jobs INTEGER NOT NULL,
            running_jobs INTEGER NOT NULL,
            PRIMARY KEY (queue, from_minute)
        )
        """,
        # This step moves the saved core state to scheduler.fold.snapshot's format: a pickled
        # one is dropped and queue_shares refolded from the start.
        "DELETE FROM projection_state",
        "ALTER TABLE projection_state ADD COLUMN last_minute BIGINT",
        "DELETE FROM projection_offsets WHERE projection = 'queue_shares'",
        *SHARE_VIEW_DDL,
    ),
    (
        # Why-pending reasons carry their cause (events schema 6): jobs and pods (one
        # fold writes both) are folded again from the start, so that every row has it.
        "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS unschedulable_cause TEXT",
        "DELETE FROM projection_offsets WHERE projection IN ('jobs', 'pods')",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes and reads."""

# Everything ``rebuild`` drops, views first because they depend on the tables.
_VIEWS = ("tenant_percentiles", "overall_percentiles")
_TABLES = (
    "events",
    "queues",
    "jobs",
    "pods",
    "allocations",
    "preemptions",
    "gpu_utilization",
    "queue_shares",
    "projection_state",
    "projection_offsets",
    "schema_version",
)


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
        for kind, name in (*SHARE_VIEW_NAMES, *VIEW_NAMES):
            con.execute(f"DROP {kind} IF EXISTS {name}")
        for view in _VIEWS:
            con.execute(f"DROP VIEW IF EXISTS {view}")
        for table in _TABLES:
            con.execute(f"DROP TABLE IF EXISTS {table}")


# --------------------------------------------------------------------------- fold state


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
_JOB_STATE_SCHEMA = schema(
    "job:string queue:string priority_class:string pods:int32 min_members:int32 "
    "gpu_milli:int64 submitted_at_ms:int64 submitted_offset:int64 "
    "updated_offset:int64 ready_at_ms:int64 finished_at_ms:int64 status:string "
    "preemptions:int32 lost_gpu_ms:int64 unschedulable_reason:string "
    "unschedulable_cause:string started_pods:int32 finished_pods:int32 failed_pods:int32"
)
_JOB_STATE_COLUMNS: tuple[str, ...] = tuple(_JOB_STATE_SCHEMA.names)
# The batch carries the two durations as ``scheduler.fold.outcomes`` defines them, too.
_JOB_BATCH_SCHEMA = _JOB_STATE_SCHEMA.append(pa.field("time_to_ready_ms", pa.int64())).append(
    pa.field("completion_ms", pa.int64())
)

# Integer ``/`` in DuckDB is DOUBLE division, correctly rounded like Python's ``/``.
_JOB_SELECT = """
    b.* EXCLUDE (time_to_ready_ms, completion_ms),
    coalesce(q.path, b.queue) AS queue_path,
    b.gpu_milli / 1000 AS gpus,
    b.submitted_at_ms / 1000 AS submitted_at_s,
    b.ready_at_ms / 1000 AS ready_at_s,
    b.finished_at_ms / 1000 AS finished_at_s,
    b.lost_gpu_ms / 1000 AS lost_gpu_s,
    b.time_to_ready_ms / 1000 AS time_to_ready_s,
    b.completion_ms / 1000 AS completion_s
"""

_QUEUE_SCHEMA = schema(
    "queue:string parent:string path:string depth:int32 deserved_gpus:float64 "
    "deserved_gpu_percent:int32 limit_gpus:float64 over_quota_weight:int32 "
    "priority:int32 configured_at_s:float64 removed:bool configured_at_ms:int64 "
    "configured_offset:int64"
)

_EVENT_SCHEMA = schema(
    "offset:int64 at_ms:int64 at_s:float64 type:string key:string version:int32 "
    "known:bool payload:string"
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
    """The in-memory fold of one run: the job outcomes (with the core's state they are
    read from), all queues, and the batch's changes."""

    outcomes: OutcomeFold
    queues: dict[str, _Queue]
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

    def end_batch(self) -> None:
        """Forget the batch's changes (the job outcomes' ``end_batch`` is called too)."""
        self.outcomes.end_batch()
        self.queues_changed = False


def _load_fold(con: duckdb.DuckDBPyConnection, *, live_jobs: bool) -> _Fold:
    """The queues, and (with ``live_jobs``) the live jobs' outcomes as the tables left them
    (the core's state they are read from is restored by ``_load_extra``)."""
    columns = ", ".join(_JOB_STATE_COLUMNS)
    live = "('pending', 'allocated', 'running')" if live_jobs else "()"
    outcomes = OutcomeFold()
    pod_cols = ", ".join(POD_SCHEMA.names)
    alloc_cols = ", ".join(ALLOCATION_SCHEMA.names)
    # Column lists and the status list are module constants.
    load_outcomes(
        outcomes,
        _rows_as_dicts(con.execute(f"SELECT {columns} FROM jobs WHERE status IN {live}")),  # noqa: S608
        _rows_as_dicts(
            con.execute(
                f"SELECT {pod_cols} FROM pods WHERE job IN ("  # noqa: S608
                f"SELECT job FROM jobs WHERE status IN {live}) ORDER BY job, pod"
            )
        ),
        _rows_as_dicts(
            con.execute(
                f"SELECT {alloc_cols} FROM allocations WHERE to_ms IS NULL "  # noqa: S608
                f"AND job IN (SELECT job FROM jobs WHERE status IN {live}) "
                "ORDER BY allocated_offset, pod"
            )
        ),
    )
    queues: dict[str, _Queue] = {}
    for row in con.execute(
        "SELECT queue, parent, deserved_gpus, deserved_gpu_percent, limit_gpus, "
        "over_quota_weight, priority, configured_at_ms, "
        "configured_offset, removed, path, depth FROM queues"
    ).fetchall():
        q = _Queue(*row)
        queues[q.queue] = q
    return _Fold(outcomes=outcomes, queues=queues)


# --------------------------------------------------------------------------- batch writing


def _job_rows(fold: _Fold) -> pa.Table:
    """The batch's changed jobs as stored columns and durations; ``_JOB_SELECT`` derives
    the rest."""
    return rows_table(fold.outcomes.changed_jobs.values(), _JOB_BATCH_SCHEMA)


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
    key: str | tuple[str, ...] | None = None,
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
            if isinstance(key, str):
                con.execute(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {name})")  # noqa: S608
            else:
                match = " AND ".join(f"{table}.{k} = d.{k}" for k in key)
                con.execute(f"DELETE FROM {table} USING {name} d WHERE {match}")  # noqa: S608
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
) -> Iterator[tuple[list[tuple[int, Envelope]], bool]]:
    """Chunks of up to ``size`` records, each with whether it is the last one.

    One record is read ahead to tell: the last chunk of a read to ``end`` advances the
    projection to ``end`` itself, which on Kafka lies past the last record (markers).
    """
    it = iter(records)
    chunk = list(itertools.islice(it, size))
    while chunk:
        ahead = list(itertools.islice(it, 1))
        yield chunk, not ahead
        chunk = ahead + list(itertools.islice(it, size - 1)) if ahead else []


@contextlib.contextmanager
def _quick_switches() -> Iterator[None]:
    """Hand the GIL over every millisecond instead of every 5 during a run.

    The commit thread needs the GIL only briefly (to start each statement and to hand its
    Arrow tables to DuckDB), but with the default 5 ms switch interval each of those waits
    for the folding thread's time slice to run out, which stretches a batch's commit on the
    writer thread several-fold. At 1 ms the commit thread gets the GIL soon after it asks,
    and the folding thread hardly notices the extra switches.
    """
    was = sys.getswitchinterval()
    sys.setswitchinterval(min(was, 0.001))
    try:
        yield
    finally:
        sys.setswitchinterval(was)


_ROW_EVENTS: frozenset[type[Event]] = frozenset(
    {JobPreempted, GpuUtilizationSampled, QueueConfigured, QueueRemoved}
)
"""Events with rows of their own besides ``events``: ``preemptions``, ``gpu_utilization``
and ``queues``."""
_PREEMPTION_SCHEMA = schema(
    "offset:int64 at_ms:int64 job:string queue:string preemptor:string "
    "preemptor_queue:string rule:string pods:int32 lost_gpu_ms:int64 "
    "checkpointed_ms:int64"
)
_SAMPLE_SCHEMA = schema(
    "offset:int64 at_ms:int64 node:string device:int32 utilization_pct:int32 memory_used_mib:int64"
)

# Derived columns of the schema-2 tables, computed on insert like ``_JOB_SELECT``.
_POD_SELECT = """
    b.*,
    b.gpu_milli / 1000 AS gpus,
    b.first_allocated_at_ms / 1000 AS first_allocated_at_s,
    b.first_started_at_ms / 1000 AS first_started_at_s,
    b.finished_at_ms / 1000 AS finished_at_s
"""
_ALLOCATION_SELECT = """
    b.*,
    b.from_ms / 1000 AS from_s,
    b.started_ms / 1000 AS started_s,
    b.to_ms / 1000 AS to_s
"""
_AT_SELECT = "b.*, b.at_ms / 1000 AS at_s"
_PREEMPTION_SELECT = "b.*, b.at_ms / 1000 AS at_s, b.lost_gpu_ms / 1000 AS lost_gpu_s"
_SHARE_SELECT = f"""
    b.*,
    b.from_minute * {MINUTE_MS} AS from_ms,
    b.to_minute * {MINUTE_MS} AS to_ms,
    b.from_minute * 60.0 AS from_s,
    b.to_minute * 60.0 AS to_s,
    b.deserved_gpu_milli / 1000 AS deserved_gpus,
    b.fair_gpu_milli / 1000 AS fair_gpus,
    b.allocated_gpu_milli / 1000 AS allocated_gpus,
    b.requested_gpu_milli / 1000 AS requested_gpus
"""

_SNAPSHOT_EVENTS = 1_000_000
"""Events folded between snapshots of the core's state (at least): encoding it costs in
proportion to the jobs it holds, and between snapshots only queue_shares lags behind."""
_SNAPSHOT_EVENTS_PER_JOB = 10
"""…and at least this many events per job the state knows (live, or ended and kept as its
id), so that the snapshots of a long ledger cost a bounded share of the run."""


@dataclass
class _Extra:
    """The schema-2 folds of one run and where each starts in the ledger."""

    shares: ShareFold
    from_core: int
    """The first offset the core's state (``_Fold.outcomes.state``) has not folded."""
    from_preemptions: int
    from_samples: int
    from_shares: int
    preemptions: list[list[Any]] = field(default_factory=lambda: [[] for _ in _PREEMPTION_SCHEMA])
    samples: list[list[Any]] = field(default_factory=lambda: [[] for _ in _SAMPLE_SCHEMA])
    since_snapshot: int = 0
    """Events read since the core's state was last snapshotted (or the run started)."""

    def snapshot_due(self) -> bool:
        """Whether enough was folded to snapshot the core's state mid-run."""
        state = self.shares.state
        jobs = len(state.jobs) + len(state.ended)
        return self.since_snapshot >= max(_SNAPSHOT_EVENTS, _SNAPSHOT_EVENTS_PER_JOB * jobs)

    def take(self, schema: pa.Schema, cols: list[list[Any]]) -> pa.Table:
        rows = table(cols, schema)
        for c in cols:
            c.clear()
        return rows


def _fold_batch(
    chunk: list[tuple[int, Envelope]],
    fold: _Fold,
    from_events: int,
    from_queues: int,
    from_jobs: int,
    extra: _Extra,
) -> pa.Table:
    """Fold a batch into ``fold`` and ``extra`` and return its ``events`` rows.

    The hot loop of the projector: columns are plain lists with their ``append`` bound
    once, and the derived columns (seconds, text payload) are computed by Arrow in bulk
    (the payloads are JSON-encoded in one call, a line each). Every event is folded into
    the core's state by the job-outcome fold (which records outcomes from ``from_jobs``
    on); the share fold samples that state before each event, recomputing the figures
    only after an event that can change them (``SHARE_NEUTRAL``).
    """
    offsets: list[int] = []
    ats: list[int] = []
    types: list[str] = []
    keys: list[str] = []
    versions: list[int] = []
    known: list[bool] = []
    payloads: list[Any] = []
    add_offset, add_at, add_type = offsets.append, ats.append, types.append
    add_key, add_version, add_known = keys.append, versions.append, known.append
    add_payload = payloads.append
    apply_queue, apply_core = fold.apply_queue, fold.outcomes.apply
    shares = extra.shares
    sample, advance_shares = shares.sample, shares.advance_only
    from_core, from_shares = extra.from_core, extra.from_shares
    from_preemptions, from_samples = extra.from_preemptions, extra.from_samples
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
            add_payload(event if event is not None else msgspec.msgpack.decode(env.payload))
        if event is None:
            continue
        kind = type(event)
        if kind in _ROW_EVENTS:
            if kind is JobPreempted:
                if offset >= from_preemptions:
                    _preemption_row(extra.preemptions, event, offset, at)  # type: ignore[arg-type]
            elif kind is GpuUtilizationSampled:
                if offset >= from_samples:
                    _sample_row(extra.samples, event, offset, at)  # type: ignore[arg-type]
            elif offset >= from_queues:
                apply_queue(event, offset, at)
        if offset >= from_core:
            if offset >= from_shares:
                sample(at)
            else:
                advance_shares(at)
            apply_core(event, offset, at, record=offset >= from_jobs)
            if kind not in SHARE_NEUTRAL:
                shares.changed = True
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
            _json_lines(payloads),
        ],
        schema=_EVENT_SCHEMA,
    )


def _json_lines(items: list[Any]) -> pa.Array:
    """Each item's JSON text: encoded in one call, a line each (JSON text holds no raw
    newline), and split into an Arrow string column."""
    if not items:
        return pa.array([], pa.string())
    lines = _payload_json.encode_lines(items)[:-1]  # no empty last line
    return pc.split_pattern(pa.array([lines], pa.binary()), b"\n").flatten().cast(pa.string())


def _preemption_row(cols: list[list[Any]], event: JobPreempted, offset: int, at: int) -> None:
    for col, value in zip(
        cols,
        (
            offset,
            at,
            event.job,
            event.queue,
            event.preemptor,
            event.preemptor_queue,
            event.rule,
            len(event.pods),
            event.lost_gpu_ms,
            event.checkpointed_ms,
        ),
        strict=True,
    ):
        col.append(value)


def _sample_row(cols: list[list[Any]], event: GpuUtilizationSampled, offset: int, at: int) -> None:
    for col, value in zip(
        cols,
        (offset, at, event.node, event.device, event.utilization_pct, event.memory_used_mib),
        strict=True,
    ):
        col.append(value)


def _rows_as_dicts(cur: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _load_extra(
    con: duckdb.DuckDBPyConnection,
    reader: LedgerReader,
    next_offsets: dict[str, int],
    fold: _Fold,
) -> _Extra:
    """The share fold as the database left it, with the core's state restored into
    ``fold.outcomes`` (from its snapshot, or refolded if it must be)."""
    from_shares, from_jobs = next_offsets["queue_shares"], next_offsets["jobs"]
    shares: ShareFold | None = None
    current = _rows_as_dicts(con.execute("SELECT * FROM queue_shares WHERE current ORDER BY queue"))
    if 0 < from_shares <= from_jobs:
        row = con.execute(
            "SELECT format, state, last_minute FROM projection_state "
            "WHERE projection = 'queue_shares'"
        ).fetchone()
        if row is not None and row[0] == STATE_FORMAT:
            with contextlib.suppress(SnapshotError):  # an unreadable snapshot is refolded
                shares = ShareFold.restore(bytes(row[1]), row[2])
    if shares is not None:
        from_core = from_shares
    else:
        # No snapshot this version reads, or one the jobs have not reached: fold the
        # prefix again, recording nothing (its rows are stored already).
        from_core = min(from_shares, from_jobs)
        shares = ShareFold()
        fold.outcomes.state = shares.state
        with gc_paused():
            for offset, env in reader.read(0, from_core):
                with contextlib.suppress(UnknownEventType):
                    event = decode_event(env, offset)
                    shares.advance_only(env.at)
                    fold.outcomes.apply(event, offset, env.at, record=False)
    shares.resume(current)
    fold.outcomes.state = shares.state
    return _Extra(
        shares=shares,
        from_core=from_core,
        from_preemptions=next_offsets["preemptions"],
        from_samples=next_offsets["samples"],
        from_shares=from_shares,
    )


@dataclass
class _Batch:
    """Everything one batch commits, taken from the folds before it is written."""

    events: pa.Table
    queues: pa.Table | None
    jobs: pa.Table
    pods: pa.Table
    allocations: pa.Table
    preemptions: pa.Table
    samples: pa.Table
    shares: pa.Table | None
    """The buffered minute rows, with ``state`` when the core's state is snapshotted."""
    state: bytes | None
    last_minute: int | None
    """The share fold's last sampled minute, saved beside ``state``."""
    offsets: list[tuple[str, int]]
    """The projections this batch advances, and to where."""
    records: int
    last_offset: int


def _prepare_batch(
    chunk: list[tuple[int, Envelope]],
    fold: _Fold,
    extra: _Extra,
    starts: tuple[int, int, int],
    next_offsets: dict[str, int],
    end: int | None,
) -> _Batch:
    """Fold one batch and take its rows; advance ``next_offsets`` as its commit will.

    ``starts`` are the offsets from which events, queues and jobs apply in this run.
    ``end`` is given for the run's last batch only: the end offset the run read up to.
    """
    from_events, from_queues, from_jobs = starts
    event_rows = _fold_batch(chunk, fold, from_events, from_queues, from_jobs, extra)
    if fold.queues_changed:
        _queue_paths(fold.queues)
    # The last batch advances to the end of the read, not one past its last record: on a
    # transactional Kafka topic the end lies past it (commit markers, aborted records),
    # and stopping short would leave every later run re-reading that gap.
    batch_next = chunk[-1][0] + 1 if end is None else max(end, chunk[-1][0] + 1)
    extra.since_snapshot += len(chunk)
    # The core's state is snapshotted every so many events and at the end of the run;
    # until then queue_shares keeps its offset and buffers its rows in memory.
    snapshot = extra.snapshot_due() or end is not None
    batch = _Batch(
        events=event_rows,
        queues=_queue_rows(fold) if fold.queues_changed else None,
        jobs=_job_rows(fold),
        # A job submitted again drops its old pods (usually none).
        pods=pod_rows(fold.outcomes),
        allocations=allocation_rows(fold.outcomes),
        preemptions=extra.take(_PREEMPTION_SCHEMA, extra.preemptions),
        samples=extra.take(_SAMPLE_SCHEMA, extra.samples),
        shares=extra.shares.take_rows() if snapshot else None,
        state=extra.shares.snapshot() if snapshot else None,
        last_minute=extra.shares.last_minute,
        offsets=[
            (p, max(batch_next, next_offsets[p]))
            for p in PROJECTIONS
            if p != "queue_shares" or snapshot
        ],
        records=len(chunk),
        last_offset=chunk[-1][0],
    )
    next_offsets.update(batch.offsets)
    if snapshot:
        extra.since_snapshot = 0
    fold.end_batch()
    return batch


def _commit_batch(con: duckdb.DuckDBPyConnection, batch: _Batch) -> int:
    """Insert a batch's rows and advance its offsets in one transaction; rows written."""
    with _transaction(con):
        written = _insert(con, "events", batch.events)
        if batch.queues is not None:
            written += _insert(con, "queues", batch.queues, key="queue")
        written += _insert(
            con,
            "jobs",
            batch.jobs,
            key="job",
            select=_JOB_SELECT,
            join="LEFT JOIN queues q ON q.queue = b.queue",
        )
        if batch.queues is not None:
            # Jobs written by earlier batches follow their queue's new path.
            con.execute(
                "UPDATE jobs SET queue_path = q.path FROM queues q "
                "WHERE jobs.queue = q.queue AND jobs.queue_path <> q.path"
            )
        written += _insert(con, "pods", batch.pods, key=("job", "pod"), select=_POD_SELECT)
        written += _insert(
            con,
            "allocations",
            batch.allocations,
            key="allocation_id",
            select=_ALLOCATION_SELECT,
        )
        written += _insert(con, "preemptions", batch.preemptions, select=_PREEMPTION_SELECT)
        written += _insert(con, "gpu_utilization", batch.samples, select=_AT_SELECT)
        if batch.shares is not None:
            written += _insert(
                con,
                "queue_shares",
                batch.shares,
                key=("queue", "from_minute"),
                select=_SHARE_SELECT,
            )
        if batch.state is not None:
            con.execute(
                "INSERT OR REPLACE INTO projection_state (projection, format, state, last_minute) "
                "VALUES ('queue_shares', ?, ?, ?)",
                [STATE_FORMAT, batch.state, batch.last_minute],
            )
        con.executemany(
            "INSERT OR REPLACE INTO projection_offsets VALUES (?, ?)",
            [list(row) for row in batch.offsets],
        )
    return written


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
        if next_offsets["pods"] != next_offsets["jobs"]:
            # One fold writes both: a database from before ``pods`` existed folds its jobs
            # again from the start together with their pods (the same rows result).
            next_offsets["pods"] = next_offsets["jobs"] = 0
        end = reader.end_offset()
        start = min(next_offsets.values())
        if max(next_offsets.values()) > end:
            raise ValueError(
                f"{db_path} has projected up to offset {max(next_offsets.values())} but the "
                f"ledger ends at {end}: it was built from another ledger; rebuild it"
            )
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

        def account(done: Future[int], batch: _Batch, advanced_to: int) -> None:
            nonlocal rows_written, events_read, batches, last_offset, next_offset
            rows_written += done.result()  # the commit's exception, if it failed
            events_read += batch.records
            batches += 1
            last_offset = batch.last_offset
            next_offset = advanced_to
            if progress is not None:
                progress(stats())

        if start >= end:
            return stats()  # up to date: no fold state to load
        # Per-projection starting points: a projection added by a later migration starts
        # at 0 while the others skip what they already hold.
        starts = (next_offsets["events"], next_offsets["queues"], next_offsets["jobs"])
        with (
            gc_paused(),
            _quick_switches(),
            ThreadPoolExecutor(1, thread_name_prefix="gpuledger-commit") as writer,
        ):
            fold = _load_fold(con, live_jobs=next_offsets["jobs"] > 0)
            extra = _load_extra(con, reader, next_offsets, fold)
            # Batch N commits on the writer thread while batch N+1 is folded here: DuckDB
            # releases the GIL while it inserts, so the two cores share the work. Commits
            # stay in ledger order, one at a time; the totals count committed batches only.
            committing: tuple[Future[int], _Batch, int] | None = None
            for chunk, last in _batches(reader.read(start, end), batch_size):
                batch = _prepare_batch(
                    chunk, fold, extra, starts, next_offsets, end if last else None
                )
                if committing is not None:
                    account(*committing)
                committing = (
                    writer.submit(_commit_batch, con, batch),
                    batch,
                    min(next_offsets.values()),
                )
            if committing is not None:
                account(*committing)
                return stats()
        # No record in [start, end): only offsets no reader sees (an aborted transaction
        # and its marker). Nothing changes but where the next run starts.
        with _transaction(con):
            con.executemany(
                "INSERT OR REPLACE INTO projection_offsets VALUES (?, ?)",
                [[p, max(end, next_offsets[p])] for p in PROJECTIONS],
            )
        next_offset = end
        return stats()
    finally:
        con.close()
