"""The DuckDB projector: hand-checked histories, percentiles, and incremental safety."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import numpy as np
import pytest

from events.codec import Envelope, wrap
from events.model import (
    BindFailed,
    Event,
    JobCancelled,
    JobPreempted,
    JobSubmitted,
    JobUnschedulable,
    NodeRegistered,
    PodBound,
    PodFinished,
    PodPlacement,
    PodsAllocated,
    PodSpec,
    PodStarted,
    QueueConfigured,
    QueueRemoved,
    Tick,
)
from projections import projector
from projections.projector import SCHEMA_VERSION, ProjectStats, SchemaError, connect, project

# --------------------------------------------------------------------------- helpers


class ListReader:
    """A LedgerReader over an in-memory list of (offset, envelope)."""

    def __init__(
        self,
        records: Sequence[tuple[int, Envelope]],
        *,
        fail_at: int | None = None,
        preamble: int = 0,
    ):
        self.records = list(records)
        self.fail_at = fail_at
        self.preamble = preamble
        """Records ``ledger`` put before the given items (the node they are placed on)."""

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        for offset, env in self.records:
            if offset < start or (end is not None and offset >= end):
                continue
            if self.fail_at is not None and offset == self.fail_at:
                raise OSError(f"disk on fire at offset {offset}")
            yield offset, env

    def end_offset(self) -> int:
        return self.records[-1][0] + 1 if self.records else 0


def ledger(*items: tuple[int, Event | Envelope]) -> ListReader:
    """A reader over ``(at_ms, event)`` items, at consecutive offsets.

    The core (whose fold the projection reports) places pods only on nodes it knows: when
    the items register none, node ``n1`` (64 GPUs), where ``allocated`` places pods, is
    registered first, at offset 0 (when any item places pods).
    """
    events = [item for _, item in items]
    preamble: list[tuple[int, Event | Envelope]] = []
    placed = any(isinstance(e, PodsAllocated) for e in events)
    if placed and not any(isinstance(e, NodeRegistered) for e in events):
        preamble = [(0, NodeRegistered(node="n1", gpus=64, cpu_milli=10**9, memory_mib=10**9))]
    records = [
        (offset, item if isinstance(item, Envelope) else wrap(item, at))
        for offset, (at, item) in enumerate([*preamble, *items])
    ]
    return ListReader(records, preamble=len(preamble))


def prefix(reader: ListReader, n: int) -> ListReader:
    """The first ``n`` items of a ledger: the same ledger, earlier in its life."""
    return ListReader(reader.records[: n + reader.preamble], preamble=reader.preamble)


def submit(
    job: str, queue: str = "team", pods: int = 1, gpu: int = 1000, **kw: Any
) -> JobSubmitted:
    specs = tuple(PodSpec(name=f"{job}-{i}", gpu_milli=gpu) for i in range(pods))
    return JobSubmitted(job=job, queue=queue, pods=specs, **kw)


def allocated(job: str, pods: int = 1, queue: str = "team") -> PodsAllocated:
    placements = tuple(PodPlacement(pod=f"{job}-{i}", node="n1") for i in range(pods))
    return PodsAllocated(job=job, queue=queue, placements=placements)


def started(job: str, i: int = 0) -> PodStarted:
    return PodStarted(job=job, pod=f"{job}-{i}")


def finished(job: str, i: int = 0, ok: bool = True) -> PodFinished:
    return PodFinished(job=job, pod=f"{job}-{i}", succeeded=ok)


def preempted(job: str, lost_gpu_ms: int, queue: str = "team") -> JobPreempted:
    return JobPreempted(
        job=job,
        queue=queue,
        pods=(f"{job}-0",),
        preemptor="vip",
        preemptor_queue="other",
        rule="reclaim",
        lost_gpu_ms=lost_gpu_ms,
    )


def job_row(db: Path, job: str) -> dict[str, Any]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT * FROM jobs WHERE job = ?", [job])
        names = [d[0] for d in cur.description]
        row = cur.fetchone()
    finally:
        con.close()
    assert row is not None, f"no row for job {job}"
    return dict(zip(names, row, strict=True))


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


SNAPSHOT_QUERIES = {
    "events": 'SELECT * FROM events ORDER BY "offset"',
    "queues": "SELECT * FROM queues ORDER BY queue",
    "jobs": "SELECT * FROM jobs ORDER BY job",
    "offsets": "SELECT * FROM projection_offsets ORDER BY projection",
    "tenants": "SELECT * FROM tenant_percentiles ORDER BY queue",
    "overall": "SELECT * FROM overall_percentiles",
    "pods": "SELECT * FROM pods ORDER BY job, pod",
    "allocations": "SELECT * FROM allocations ORDER BY allocation_id",
    "preemptions": 'SELECT * FROM preemptions ORDER BY "offset"',
    "queue_shares": "SELECT * FROM queue_shares ORDER BY queue, from_minute",
    "tree": "SELECT * FROM tree_percentiles ORDER BY tree_path",
    "slo": "SELECT * FROM fairness_slo ORDER BY queue, window_end_s",
    "weekly": "SELECT * FROM preemptions_weekly ORDER BY queue, week",
    "usage": "SELECT * FROM gpu_usage ORDER BY queue, bucket",
    "waits": "SELECT * FROM requested_not_allocated ORDER BY job",
    "throughput": "SELECT * FROM throughput ORDER BY period, period_index, queue",
}


def snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table and view of a projection, in a stable order."""
    return {name: query(db, sql) for name, sql in SNAPSHOT_QUERIES.items()}


def workload(seed: int = 7, jobs: int = 60) -> ListReader:
    """A random but complete history over a 3-level queue tree: every job kind appears."""
    rnd = random.Random(seed)
    items: list[tuple[int, Event]] = [
        (0, NodeRegistered(node="n1", gpus=8)),
        (0, QueueConfigured(queue="training", parent="ml")),  # before its parent
        (0, QueueConfigured(queue="ml", parent="root")),
        (0, QueueConfigured(queue="root")),
        (0, QueueConfigured(queue="infer", parent="ml")),
    ]
    timeline: list[tuple[int, int, Event]] = []  # (at, tiebreak, event)
    seq = 0

    def put(at: int, event: Event) -> None:
        nonlocal seq
        seq += 1
        timeline.append((at, seq, event))

    for j in range(jobs):
        name = f"j{j:03d}"
        queue = rnd.choice(["training", "infer"])
        pods = rnd.choice([1, 2, 4])
        t = rnd.randint(1, 100_000)
        put(t, submit(name, queue=queue, pods=pods))
        kind = rnd.random()
        if kind < 0.1:
            put(t + rnd.randint(1, 5000), JobCancelled(job=name))
            continue
        if kind < 0.15:
            put(
                t + 10,
                JobUnschedulable(
                    job=name, queue=queue, reason="too big", final=True, cause="never_fits"
                ),
            )
            continue
        attempts = 2 if kind < 0.35 else 1
        for attempt in range(attempts):
            t += rnd.randint(1, 20_000)
            put(t, allocated(name, pods, queue))
            for i in range(pods):
                t += rnd.randint(1, 3000)
                put(t, started(name, i))
            if attempt < attempts - 1:
                t += rnd.randint(1, 50_000)
                put(t, preempted(name, rnd.randint(0, 10**7), queue))
        for i in range(pods):
            t += rnd.randint(1, 60_000)
            put(t, finished(name, i, ok=rnd.random() > 0.1))
        put(t + 1, Tick())
    timeline.sort(key=lambda x: (x[0], x[1]))
    return ledger(*items, *[(at, ev) for at, _, ev in timeline])


# --------------------------------------------------------------------------- job lifecycles


def test_gang_is_ready_only_when_every_member_runs(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    reader = ledger(
        (0, QueueConfigured(queue="team")),
        (1000, submit("g", pods=2, gpu=500)),
        (2000, allocated("g", 2)),
        (3000, started("g", 0)),
        (5000, started("g", 1)),
        (8000, finished("g", 0)),
        (9500, finished("g", 1)),
    )
    project(prefix(reader, 4), db)
    row = job_row(db, "g")
    assert row["status"] == "allocated"
    assert row["ready_at_s"] is None
    assert row["time_to_ready_s"] is None

    project(prefix(reader, 6), db)
    row = job_row(db, "g")
    assert row["status"] == "running"  # one pod finished, the other still runs
    assert row["ready_at_s"] == 5.0

    project(reader, db)
    row = job_row(db, "g")
    assert row["status"] == "succeeded"
    assert row["pods"] == 2
    assert row["gpus"] == 1.0
    assert row["submitted_at_s"] == 1.0
    assert row["ready_at_s"] == 5.0
    assert row["time_to_ready_s"] == 4.0
    assert row["finished_at_s"] == 9.5
    assert row["completion_s"] == 8.5
    assert row["preemptions"] == 0
    assert row["queue_path"] == "team"


def test_min_members_sets_readiness(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(
        ledger(
            (0, submit("elastic", pods=4, min_members=2)),
            (50, allocated("elastic", 2)),
            (100, started("elastic", 0)),
            (300, started("elastic", 1)),
        ),
        db,
    )
    row = job_row(db, "elastic")
    assert (row["status"], row["ready_at_s"], row["min_members"]) == ("running", 0.3, 2)


def test_preempted_job_counts_one_preemption_and_completes_on_second_attempt(
    tmp_path: Path,
) -> None:
    db = tmp_path / "p.duckdb"
    reader = ledger(
        (0, submit("p", pods=2)),
        (100, allocated("p", 2)),
        (1000, started("p", 0)),
        (1500, started("p", 1)),
        (9000, finished("p", 0)),  # one member ends in the first attempt...
        (10_000, preempted("p", lost_gpu_ms=8_000)),  # ...then the gang is evicted
        (20_000, allocated("p", 2)),
        (21_000, started("p", 0)),
        (22_000, started("p", 1)),
        (30_000, finished("p", 0)),
        (31_000, finished("p", 1)),
    )
    project(prefix(reader, 6), db)
    row = job_row(db, "p")
    assert row["status"] == "pending"  # preempted jobs go back to the queue
    assert row["preemptions"] == 1
    assert row["lost_gpu_s"] == 8.0

    project(prefix(reader, 8), db)
    row = job_row(db, "p")
    assert row["status"] == "allocated"  # one of two members restarted: not ready again yet
    assert row["ready_at_s"] == 1.5

    project(reader, db)
    row = job_row(db, "p")
    assert row["status"] == "succeeded"
    assert row["preemptions"] == 1
    assert row["lost_gpu_s"] == 8.0
    assert row["ready_at_s"] == 1.5  # the FIRST time the gang ran
    assert row["time_to_ready_s"] == 1.5
    # The first attempt's finished member does not count: both finish in attempt two.
    assert row["finished_at_s"] == 31.0
    assert row["completion_s"] == 31.0


def test_a_failed_member_fails_the_job(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(
        ledger(
            (0, submit("f", pods=2)),
            (5, allocated("f", 2)),
            (10, started("f", 0)),
            (20, started("f", 1)),
            (30, finished("f", 0, ok=False)),
            (40, finished("f", 1)),
        ),
        db,
    )
    row = job_row(db, "f")
    assert (row["status"], row["completion_s"]) == ("failed", 0.04)


def test_cancelled_job_is_terminal(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(
        ledger(
            (1000, submit("c")),
            (2000, allocated("c")),
            (6000, JobCancelled(job="c")),
            (7000, started("c")),  # a straggler report changes nothing
        ),
        db,
    )
    row = job_row(db, "c")
    assert row["status"] == "cancelled"
    assert row["finished_at_s"] == 6.0
    assert row["completion_s"] is None  # completion is for jobs that ran to the end
    assert row["ready_at_s"] is None


def test_final_unschedulable_ends_the_job_with_its_reason(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(
        ledger(
            (0, submit("big", pods=16)),
            (0, submit("wait")),
            (500, JobUnschedulable(job="wait", queue="team", reason="queue over quota")),
            (1000, JobUnschedulable(job="big", queue="team", reason="waiting for GPUs")),
            (2000, JobUnschedulable(job="big", queue="team", reason="16 GPUs > 8", final=True)),
        ),
        db,
    )
    big = job_row(db, "big")
    assert (big["status"], big["finished_at_s"]) == ("unschedulable", 2.0)
    assert big["unschedulable_reason"] == "16 GPUs > 8"
    assert big["completion_s"] is None
    wait = job_row(db, "wait")
    assert (wait["status"], wait["unschedulable_reason"]) == ("pending", "queue over quota")


def test_bind_failure_returns_an_allocated_job_to_pending(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(
        ledger(
            (0, submit("b")),
            (1, allocated("b")),
            (2, BindFailed(job="b", pod="b-0", node="n1", reason="node gone")),
        ),
        db,
    )
    assert job_row(db, "b")["status"] == "pending"


# --------------------------------------------------------------------------- queues


def test_queue_path_follows_a_three_level_tree_configured_out_of_order(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    reader = ledger(
        (0, QueueConfigured(queue="training", parent="ml")),
        (1, submit("early", queue="training")),
        (2, QueueConfigured(queue="ml", parent="root")),
        (3, QueueConfigured(queue="root")),
        (4, submit("late", queue="training")),
        (5, submit("stray", queue="nowhere")),
        (6, QueueRemoved(queue="ml")),
    )
    project(reader, db, batch_size=1)  # the early job's row is written before the tree is
    paths = dict(query(db, "SELECT queue, path FROM queues"))
    assert paths == {"root": "root", "ml": "root/ml", "training": "root/ml/training"}
    depths = dict(query(db, "SELECT queue, depth FROM queues"))
    assert depths == {"root": 0, "ml": 1, "training": 2}
    assert query(db, "SELECT queue FROM queues WHERE removed") == [("ml",)]
    assert job_row(db, "early")["queue_path"] == "root/ml/training"
    assert job_row(db, "late")["queue_path"] == "root/ml/training"
    assert job_row(db, "stray")["queue_path"] == "nowhere"


def test_moving_a_queue_moves_its_jobs_across_runs(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    reader = ledger(
        (0, QueueConfigured(queue="a")),
        (0, QueueConfigured(queue="b")),
        (0, QueueConfigured(queue="leaf", parent="a")),
        (1, submit("j", queue="leaf")),
        (2, QueueConfigured(queue="leaf", parent="b")),
    )
    project(prefix(reader, 4), db)
    assert job_row(db, "j")["queue_path"] == "a/leaf"
    project(reader, db)  # a new run, the job row untouched by this batch
    assert job_row(db, "j")["queue_path"] == "b/leaf"


# --------------------------------------------------------------------------- percentiles


def test_tenant_percentiles_match_numpy_linear_interpolation(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    reader = workload(seed=11, jobs=120)
    project(reader, db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        for queue in ("training", "infer"):
            ttr = [
                r[0]
                for r in con.execute(
                    "SELECT time_to_ready_s FROM jobs WHERE queue = ? "
                    "AND time_to_ready_s IS NOT NULL",
                    [queue],
                ).fetchall()
            ]
            done = [
                r[0]
                for r in con.execute(
                    "SELECT completion_s FROM jobs WHERE queue = ? AND completion_s IS NOT NULL",
                    [queue],
                ).fetchall()
            ]
            cur = con.execute("SELECT * FROM tenant_percentiles WHERE queue = ?", [queue])
            names = [d[0] for d in cur.description]
            fetched = cur.fetchone()
            assert fetched is not None
            view = dict(zip(names, fetched, strict=True))
            assert len(ttr) > 10 and len(done) > 10
            assert view["queue_path"] == f"root/ml/{queue}"
            assert view["ready"] == len(ttr)
            assert view["finished"] == len(done)
            for p in (50, 90, 95, 99):
                assert view[f"p{p}_ttr_s"] == pytest.approx(
                    np.percentile(ttr, p, method="linear"), rel=1e-12
                )
                assert view[f"p{p}_completion_s"] == pytest.approx(
                    np.percentile(done, p, method="linear"), rel=1e-12
                )
            stats = con.execute(
                "SELECT sum(preemptions), sum(lost_gpu_s) / 3600, count(*) FROM jobs "
                "WHERE queue = ?",
                [queue],
            ).fetchone()
            assert stats is not None
            assert view["preemptions"] == stats[0] > 0
            assert view["lost_gpu_hours"] == pytest.approx(stats[1])
            assert view["jobs"] == stats[2]
        overall = con.execute("SELECT jobs, ready FROM overall_percentiles").fetchone()
        total = con.execute("SELECT count(*), count(time_to_ready_s) FROM jobs").fetchone()
        assert overall == total
    finally:
        con.close()


def test_hand_computed_percentiles(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    items: list[tuple[int, Event]] = []
    for i, ttr_ms in enumerate([1000, 2000, 3000, 4000, 10_000]):
        items += [(0, submit(f"j{i}")), (0, allocated(f"j{i}")), (ttr_ms, started(f"j{i}"))]
    project(ledger(*items), db)
    p50, p90 = query(db, "SELECT p50_ttr_s, p90_ttr_s FROM tenant_percentiles")[0]
    assert p50 == 3.0
    assert p90 == pytest.approx(4.0 + 0.6 * 6.0)  # between 4 s and 10 s at 0.6 of the way


# --------------------------------------------------------------------------- incremental safety


def test_projecting_twice_adds_nothing(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    reader = workload()
    first = project(reader, db)
    before = snapshot(db)
    second = project(reader, db)
    assert snapshot(db) == before
    assert first.events_read == len(reader.records)
    assert first.last_offset == len(reader.records) - 1
    assert first.next_offset == len(reader.records)
    assert (second.events_read, second.rows_written, second.last_offset) == (0, 0, None)
    assert second.next_offset == first.next_offset
    assert len(before["events"]) == len(reader.records)


def test_small_batches_equal_one_batch(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "one.duckdb", batch_size=len(reader.records))
    stats = project(reader, tmp_path / "many.duckdb", batch_size=3)
    assert stats.batches == -(-len(reader.records) // 3)
    assert snapshot(tmp_path / "many.duckdb") == snapshot(tmp_path / "one.duckdb")


def test_growing_ledger_projected_run_by_run_equals_one_run(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "grown.duckdb"
    for n in range(0, len(reader.records) + 1, 37):
        project(prefix(reader, n), db, batch_size=10)
    project(reader, db, batch_size=10)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")


def test_exception_from_progress_then_resume(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    seen: list[ProjectStats] = []

    def stop_after_two(stats: ProjectStats) -> None:
        seen.append(stats)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        project(reader, db, batch_size=25, progress=stop_after_two)
    # The two committed batches are kept, exactly.
    assert query(db, 'SELECT count(*), max("offset") FROM events') == [(50, 49)]
    assert query(
        db, "SELECT DISTINCT next_offset FROM projection_offsets WHERE projection <> 'queue_shares'"
    ) == [(50,)]
    # The core's state is snapshotted every few batches: queue_shares has not committed yet.
    assert (
        query(db, "SELECT next_offset FROM projection_offsets WHERE projection = 'queue_shares'")
        == []
    )
    assert [s.events_read for s in seen] == [25, 50]

    resumed = project(reader, db, batch_size=25)
    # queue_shares resumes from its last snapshot (none yet: offset 0); the others skip
    # the 50 records they hold, which the snapshot comparison below proves.
    assert resumed.events_read == len(reader.records)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")


def test_progress_sees_each_batch_committed_in_order(tmp_path: Path) -> None:
    """Batches commit on a writer thread while the next is folded: progress still sees
    every batch once, in ledger order, with the offset its commit advanced to; the GIL
    switch interval the run shortens is given back."""
    import sys

    reader = workload()
    db = tmp_path / "p.duckdb"
    interval = sys.getswitchinterval()
    seen: list[tuple[int, int | None, int, int]] = []

    def check(stats: ProjectStats) -> None:
        seen.append((stats.events_read, stats.last_offset, stats.next_offset, stats.batches))

    stats = project(reader, db, batch_size=7, progress=check)
    n = len(reader.records)
    assert [s[0] for s in seen] == [min(7 * (i + 1), n) for i in range(len(seen))]
    assert [s[1] for s in seen] == [e - 1 for e, *_ in seen]
    # next_offset is the lowest projection's: queue_shares lags until its snapshot, at the end
    assert seen[-1][2] == n and all(s[2] <= s[0] for s in seen)
    assert [s[3] for s in seen] == list(range(1, len(seen) + 1))
    assert seen[-1][0] == stats.events_read == n and stats.batches == len(seen)
    assert sys.getswitchinterval() == interval


def test_reader_failing_mid_way_then_resume(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    broken = ListReader(reader.records, fail_at=64)
    with pytest.raises(OSError, match="disk on fire"):
        project(broken, db, batch_size=20)
    # Batches [0, 20), [20, 40), [40, 60) committed; the one reading 64 never started.
    assert query(db, "SELECT count(*) FROM events") == [(60,)]
    project(reader, db, batch_size=20)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")


def test_crash_inside_the_batch_transaction_keeps_the_previous_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    real_insert = projector._insert
    job_inserts = 0

    def failing_insert(con: duckdb.DuckDBPyConnection, table: str, rows: Any, **kw: Any) -> int:
        nonlocal job_inserts
        if table == "jobs":
            job_inserts += 1
            if job_inserts == 3:  # the third batch: its events are already inserted
                raise RuntimeError("power cut")
        return real_insert(con, table, rows, **kw)

    monkeypatch.setattr(projector, "_insert", failing_insert)
    with pytest.raises(RuntimeError, match="power cut"):
        project(reader, db, batch_size=30)
    after_crash = snapshot(db)
    assert len(after_crash["events"]) == 60  # the third batch's events were rolled back
    assert {row[1] for row in after_crash["offsets"]} == {60}

    monkeypatch.setattr(projector, "_insert", real_insert)
    project(reader, db, batch_size=30)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")
    assert query(db, 'SELECT count(*), count(DISTINCT "offset") FROM events') == [
        (len(reader.records), len(reader.records))
    ]


def test_rebuild_equals_fresh(tmp_path: Path) -> None:
    reader = workload()
    other = workload(seed=99, jobs=30)
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    project(other, db)
    with pytest.raises(ValueError, match="rebuild"):
        project(prefix(reader, 10), db)  # the database is ahead of this ledger
    project(reader, db, rebuild=True)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")
    versions = [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    assert query(db, "SELECT version FROM schema_version ORDER BY version") == versions


# --------------------------------------------------------------------------- raw events


def test_unknown_event_type_is_stored_raw_and_skipped(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    alien = Envelope(
        type="gpu_melted",
        key="n1",
        at=1500,
        payload=msgspec.Raw(msgspec.msgpack.encode({"type": "gpu_melted", "node": "n1"})),
    )
    reader = ledger(
        (0, submit("j")),
        (1000, allocated("j")),
        (1500, alien),
        (2000, started("j")),
        (2500, PodBound(job="j", pod="j-0", node="n1")),
    )
    stats = project(reader, db)
    assert stats.events_read == 6  # with the node ``ledger`` registers first
    rows = query(
        db,
        "SELECT \"offset\", at_ms, at_s, type, key, known, payload->>'$.node' "
        'FROM events ORDER BY "offset"',
    )
    assert rows[3] == (3, 1500, 1.5, "gpu_melted", "n1", False, "n1")
    assert [r[5] for r in rows] == [True, True, True, False, True, True]
    row = job_row(db, "j")
    assert (row["status"], row["ready_at_s"], row["updated_offset"]) == ("running", 2.0, 4)


def test_payload_is_the_event_as_json(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(ledger((0, submit("j", pods=2, gpu=250))), db)
    (payload,) = query(db, "SELECT payload FROM events")[0]
    decoded = msgspec.json.decode(payload)
    assert decoded["type"] == "job_submitted"
    assert [(p["name"], p["gpu_milli"]) for p in decoded["pods"]] == [("j-0", 250), ("j-1", 250)]


def test_empty_ledger_creates_the_schema(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "p.duckdb"
    stats = project(ListReader([]), db)
    assert (stats.events_read, stats.next_offset, stats.last_offset) == (0, 0, None)
    assert query(db, "SELECT count(*) FROM tenant_percentiles") == [(0,)]
    assert query(db, "SELECT jobs, p50_ttr_s FROM overall_percentiles") == [(0, None)]


def test_read_only_connect_checks_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        connect(tmp_path / "missing.duckdb", read_only=True)
    plain = tmp_path / "plain.duckdb"
    duckdb.connect(str(plain)).close()
    with pytest.raises(SchemaError, match="gpuledger project"):
        connect(plain, read_only=True)


def test_rejects_a_zero_batch_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        project(ListReader([]), tmp_path / "p.duckdb", batch_size=0)
