"""Every SQL query the console runs, in one module.

The console reads the projection only through its tables and views (``queues``, ``jobs``,
``allocations``, ``preemptions``, ``queue_shares``, ``events`` and the views of
``projections.views``), so a change of how a table is projected is adapted here and
nowhere else. Each function takes an open DuckDB connection (a cursor of the server's
connection) and returns plain rows: lists of dicts of JSON-ready values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from projections.report import full_report

__all__ = [
    "JOB_FILTERS",
    "JobFilter",
    "end_of_moment",
    "job_detail",
    "jobs_page",
    "nodes",
    "queues",
    "record",
    "status",
    "tenants",
]


def _rows(con: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]


def status(con: Any) -> dict[str, Any]:
    """Where the projection stands: records projected, next offset, ledger time span."""
    row = con.execute(
        'SELECT count(*), min(at_ms), max(at_ms), coalesce(max("offset") + 1, 0) FROM events'
    ).fetchone()
    return {"events": row[0], "first_ms": row[1], "last_ms": row[2], "next_offset": row[3]}


def end_of_moment(con: Any, at_ms: int, next_offset: int) -> int:
    """The offset of the first projected record after ``at_ms`` (``next_offset`` if none):
    the records below it are the ledger up to that moment, as ``state --at`` folds them
    (it stops at the first record later than the moment)."""
    row = con.execute(
        'SELECT min("offset") FROM events WHERE at_ms > ? AND "offset" < ?',
        [at_ms, next_offset],
    ).fetchone()
    return next_offset if row[0] is None else int(row[0])


# The live numbers per leaf queue come from ``jobs`` and ``allocations`` (current to the
# last projected record); the resolved deserved quota and fair share come from the
# latest ``queue_shares`` row of each queue. Inner queues sum their subtree by path.
_QUEUES = """
WITH shares AS (
  SELECT queue, deserved_gpus, fair_gpus FROM queue_shares
  QUALIFY row_number() OVER (PARTITION BY queue ORDER BY from_minute DESC) = 1
), held AS (
  SELECT queue, sum(gpu_milli) / 1000 AS allocated_gpus FROM allocations
  WHERE to_ms IS NULL GROUP BY queue
), waiting AS (
  SELECT queue, count(*) AS pending_jobs, sum(gpu_milli) / 1000 AS pending_gpus
  FROM jobs WHERE status = 'pending' GROUP BY queue
), leaf AS (
  SELECT q.path, coalesce(h.allocated_gpus, 0) AS allocated_gpus,
         coalesce(w.pending_jobs, 0) AS pending_jobs,
         coalesce(w.pending_gpus, 0) AS pending_gpus
  FROM queues q LEFT JOIN held h USING (queue) LEFT JOIN waiting w USING (queue)
)
SELECT q.queue, q.parent, q.path, q.depth, q.priority, q.over_quota_weight,
       coalesce(s.deserved_gpus, q.deserved_gpus) AS deserved_gpus,
       s.fair_gpus, q.limit_gpus,
       coalesce(sum(l.allocated_gpus), 0) AS allocated_gpus,
       coalesce(sum(l.pending_jobs), 0) AS pending_jobs,
       coalesce(sum(l.pending_gpus), 0) AS pending_gpus,
       t.jobs, t.p50_ttr_s, t.p90_ttr_s
FROM queues q
LEFT JOIN leaf l ON l.path = q.path OR starts_with(l.path, q.path || '/')
LEFT JOIN shares s USING (queue) LEFT JOIN tenant_percentiles t USING (queue)
WHERE NOT q.removed
GROUP BY ALL
ORDER BY q.path
"""


def queues(con: Any) -> list[dict[str, Any]]:
    """The queue tree, top-down by path, with quota, fair share, allocation and waits.

    ``borrowing`` is true when a queue holds more than its deserved quota (over-quota
    borrowing); ``over_limit`` when it holds more than its limit.
    """
    rows = _rows(con, _QUEUES)
    for row in rows:
        deserved = row["deserved_gpus"] or 0.0
        row["borrowing"] = row["allocated_gpus"] > deserved + 1e-9
        limit = row["limit_gpus"]
        row["over_limit"] = limit is not None and row["allocated_gpus"] > limit + 1e-9
    return rows


@dataclass(frozen=True, slots=True)
class JobFilter:
    """The Jobs page's filters; empty strings and ``None`` mean "any"."""

    queue: str = ""
    status: str = ""
    priority_class: str = ""
    namespace: str = ""
    cause: str = ""
    """A pending job's why-pending cause (``jobs.unschedulable_cause``)."""
    submitted_from_s: float | None = None
    submitted_to_s: float | None = None
    page: int = 1
    per_page: int = 50


JOB_FILTERS = ("queue", "status", "priority_class", "namespace", "cause")
"""Text filters of the Jobs page, each an exact match on the column of the same name
(``cause``: on a pending job's ``unschedulable_cause``)."""

# A live job is named ``namespace/group`` (scheduler.kube.mapping); a simulated one has no
# namespace. ``jobs`` has no namespace column, so it is derived from the name here.
_NAMESPACE = "CASE WHEN contains(job, '/') THEN split_part(job, '/', 1) ELSE '' END"


def jobs_page(con: Any, flt: JobFilter) -> dict[str, Any]:
    """One page of jobs, newest submission first, and how many jobs match in total.

    Each row carries the current why-pending reason (the latest ``job_unschedulable``)
    for a job that is still pending.
    """
    where: list[str] = []
    params: list[Any] = []
    for name in ("queue", "status", "priority_class"):
        value = getattr(flt, name)
        if value:
            where.append(f"{name} = ?")
            params.append(value)
    if flt.namespace:
        where.append(f"{_NAMESPACE} = ?")
        params.append(flt.namespace)
    if flt.cause:
        where.append("status = 'pending' AND unschedulable_cause = ?")
        params.append(flt.cause)
    if flt.submitted_from_s is not None:
        where.append("submitted_at_s >= ?")
        params.append(flt.submitted_from_s)
    if flt.submitted_to_s is not None:
        where.append("submitted_at_s < ?")
        params.append(flt.submitted_to_s)
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    total = con.execute(f"SELECT count(*) FROM jobs {clause}", params).fetchone()[0]  # noqa: S608  # clause holds only placeholders
    per_page = max(1, min(flt.per_page, 500))
    page = max(1, flt.page)
    rows = _rows(
        con,
        f"SELECT job, queue, {_NAMESPACE} AS namespace, priority_class, status, pods, gpus, "  # noqa: S608  # as above
        "submitted_at_s, submitted_at_ms, time_to_ready_s, completion_s, preemptions, "
        "CASE WHEN status = 'pending' THEN unschedulable_reason END AS reason, "
        "CASE WHEN status = 'pending' THEN unschedulable_cause END AS cause, "
        f"submitted_offset FROM jobs {clause} "
        "ORDER BY submitted_at_ms DESC, job LIMIT ? OFFSET ?",
        [*params, per_page, (page - 1) * per_page],
    )
    return {"total": total, "page": page, "per_page": per_page, "rows": rows}


def job_detail(con: Any, job: str) -> dict[str, Any] | None:
    """A job's row, its allocations, and its whole ledger timeline (every record keyed by
    it, in offset order, with the payload), or ``None`` for an unknown job."""
    found = _rows(con, "SELECT * FROM jobs WHERE job = ?", [job])
    if not found:
        return None
    timeline = _rows(
        con,
        'SELECT "offset", at_ms, at_s, type, payload FROM events WHERE key = ? ORDER BY "offset"',
        [job],
    )
    allocations = _rows(
        con,
        "SELECT allocation_id, pod, node, gpus, gpu_milli, allocated_offset, from_s, "
        "started_s, to_s, end_reason FROM allocations WHERE job = ? "
        "ORDER BY allocated_offset, pod",
        [job],
    )
    caused = _rows(
        con,
        'SELECT "offset", at_s, job, queue, rule, lost_gpu_ms FROM preemptions '
        'WHERE preemptor = ? ORDER BY "offset"',
        [job],
    )
    return {"job": found[0], "timeline": timeline, "allocations": allocations, "caused": caused}


def record(con: Any, offset: int) -> dict[str, Any] | None:
    """The ledger record at ``offset`` as projected into ``events``, or ``None``."""
    found = _rows(
        con,
        'SELECT "offset", at_ms, type, key, version, known, payload FROM events WHERE "offset" = ?',
        [offset],
    )
    return found[0] if found else None


def nodes(con: Any) -> list[dict[str, Any]]:
    """Every node the ledger registered and did not remove: its devices, which pod holds
    which part of each device (open allocations), whether it is cordoned, idle devices."""
    registered = _rows(
        con,
        "SELECT key AS node, CAST(payload->>'$.gpus' AS INTEGER) AS gpus, "
        "payload->>'$.gpu_model' AS gpu_model FROM events WHERE type = 'node_registered' "
        'QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1',
    )
    lifecycle = {
        str(r["node"]): r
        for r in _rows(
            con,
            "SELECT key AS node, "
            "max(\"offset\") FILTER (WHERE type = 'node_removed') AS removed_at, "
            "max(\"offset\") FILTER (WHERE type = 'node_registered') AS registered_at, "
            "arg_max(CAST(payload->>'$.cordoned' AS BOOLEAN), \"offset\") "
            "FILTER (WHERE type = 'node_cordoned') AS cordoned "
            "FROM events WHERE type IN ('node_registered', 'node_removed', 'node_cordoned') "
            "GROUP BY key",
        )
    }
    held = _rows(
        con,
        "SELECT node, job, pod, queue, devices, device_milli, started_s IS NOT NULL AS running "
        "FROM allocations WHERE to_ms IS NULL ORDER BY node, job, pod",
    )
    slots: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for h in held:
        per_device = slots.setdefault(str(h["node"]), {})
        for device, milli in zip(h["devices"] or [], h["device_milli"] or [], strict=True):
            per_device.setdefault(int(device), []).append(
                {
                    "job": h["job"],
                    "pod": h["pod"],
                    "queue": h["queue"],
                    "milli": int(milli),
                    "running": bool(h["running"]),
                }
            )
    out: list[dict[str, Any]] = []
    for row in sorted(registered, key=lambda r: str(r["node"])):
        name = str(row["node"])
        life = lifecycle.get(name, {})
        removed = life.get("removed_at")
        if removed is not None and removed > (life.get("registered_at") or -1):
            continue
        per_device = slots.get(name, {})
        devices = [
            {
                "device": d,
                "holders": per_device.get(d, []),
                "used_milli": sum(s["milli"] for s in per_device.get(d, [])),
            }
            for d in range(int(row["gpus"] or 0))
        ]
        out.append(
            {
                "node": name,
                "gpus": int(row["gpus"] or 0),
                "gpu_model": row["gpu_model"] or "",
                "cordoned": bool(life.get("cordoned")),
                "devices": devices,
                "idle_devices": sum(1 for d in devices if d["used_milli"] == 0),
                "used_gpus": sum(d["used_milli"] for d in devices) / 1000,
            }
        )
    return out


def tenants(con: Any, window_s: float | None) -> dict[str, Any]:
    """The report's sections (``projections.report.full_report``) over the last
    ``window_s`` seconds of ledger time, or all history."""
    return full_report(con, window_s)
