"""projections.console.queries over a real projection: the Jobs page's server-side
pagination partitions the filtered jobs exactly, and the Queues rows add up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.codec import decode_event
from events.model import JobUnschedulable
from events.sources import open_reader
from projections.console import queries
from projections.projector import project

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")
STATUSES = ("", "pending", "running", "succeeded", "failed", "cancelled")
QUEUES = ("", "training", "interactive", "experiments", "nope")


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    out = tmp_path_factory.mktemp("queries")
    subprocess.run(
        [GPULEDGER, "example", "fintech", "--out", str(out)], check=True, capture_output=True
    )
    db = out / "h.duckdb"
    reader = open_reader(out / "fintech" / "gpuledger" / "ledger")
    try:
        project(reader, db)
    finally:
        reader.close()
    connection = duckdb.connect(str(db), read_only=True)
    yield connection
    connection.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    per_page=st.integers(min_value=1, max_value=60),
    status=st.sampled_from(STATUSES),
    queue=st.sampled_from(QUEUES),
    lo=st.one_of(st.none(), st.integers(min_value=0, max_value=60_000)),
)
def test_pages_partition_the_filtered_jobs(
    con: duckdb.DuckDBPyConnection, per_page: int, status: str, queue: str, lo: int | None
) -> None:
    flt = queries.JobFilter(queue=queue, status=status, submitted_from_s=lo, per_page=per_page)
    first = queries.jobs_page(con, flt)
    seen: list[str] = []
    page = 1
    while True:
        result = queries.jobs_page(
            con,
            queries.JobFilter(
                queue=queue, status=status, submitted_from_s=lo, per_page=per_page, page=page
            ),
        )
        assert result["total"] == first["total"]
        if not result["rows"]:
            break
        assert len(result["rows"]) <= per_page
        seen += [r["job"] for r in result["rows"]]
        page += 1
    where = ["TRUE"]
    params: list[object] = []
    if status:
        where.append("status = ?")
        params.append(status)
    if queue:
        where.append("queue = ?")
        params.append(queue)
    if lo is not None:
        where.append("submitted_at_s >= ?")
        params.append(lo)
    expected = [
        r[0]
        for r in con.execute(
            f"SELECT job FROM jobs WHERE {' AND '.join(where)} ORDER BY submitted_at_ms DESC, job",
            params,
        ).fetchall()
    ]
    assert seen == expected
    assert first["total"] == len(expected)


def test_queue_rows_add_up(con: duckdb.DuckDBPyConnection) -> None:
    rows = {r["queue"]: r for r in queries.queues(con)}
    jobs = dict(con.execute("SELECT queue, count(*) FROM jobs GROUP BY queue").fetchall())
    assert {q: rows[q]["jobs"] for q in jobs} == jobs
    for row in rows.values():
        assert row["borrowing"] == (row["allocated_gpus"] > (row["deserved_gpus"] or 0) + 1e-9)
    record = queries.record(con, 0)
    assert record is not None and record["offset"] == 0
    assert queries.record(con, 10**9) is None
    assert queries.job_detail(con, "no-such-job") is None


def test_the_cause_column_is_the_latest_reasons_cause(
    con: duckdb.DuckDBPyConnection, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the same ledger the fixture projected, folded here by hand
    out = tmp_path_factory.mktemp("causes")
    subprocess.run(
        [GPULEDGER, "example", "fintech", "--out", str(out)], check=True, capture_output=True
    )
    reader = open_reader(out / "fintech" / "gpuledger" / "ledger")
    latest: dict[str, str] = {}
    try:
        for offset, env in reader.read():
            event = decode_event(env, offset)
            if isinstance(event, JobUnschedulable):
                latest[event.job] = event.cause
    finally:
        reader.close()
    assert len(set(latest.values())) >= 2, "the example gives reasons of several causes"
    rows = dict(con.execute("SELECT job, unschedulable_cause FROM jobs").fetchall())
    assert {job: cause for job, cause in rows.items() if cause is not None} == latest

    pending = dict(
        con.execute("SELECT job, unschedulable_cause FROM jobs WHERE status = 'pending'").fetchall()
    )
    for cause in set(latest.values()):
        page = queries.jobs_page(con, queries.JobFilter(cause=cause, per_page=500))
        assert {r["job"] for r in page["rows"]} == {j for j, c in pending.items() if c == cause}
        assert all(r["cause"] == cause for r in page["rows"])
