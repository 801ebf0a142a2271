"""Schema 2: pods, allocations, preemptions, queue shares and the views, hand-checked."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from bench.projection import long_ledger, table_rows
from events.codec import decode_event
from events.memlog import MemoryLedger
from events.model import (
    Event,
    GpuSlot,
    GpuUtilizationSampled,
    JobPreempted,
    NodeRegistered,
    PodFinished,
    PodPlacement,
    PodsAllocated,
    PodStarted,
    QueueConfigured,
    Resources,
)
from projections import projector
from projections.history import ShareFold
from projections.projector import project
from projections.views import SHARE_VIEW_NAMES, VIEW_NAMES
from replay.config import ClusterFile, QueuesFile, WorkloadFile, load
from replay.examples import EXAMPLES
from replay.sim import Simulation
from scheduler.core import State, apply
from scheduler.fold.outcomes import OutcomeFold
from scheduler.fold.snapshot import state_bytes
from tests.test_projector import (
    ListReader,
    allocated,
    finished,
    ledger,
    snapshot,
    started,
    submit,
    workload,
)

H = 3_600_000  # one hour in ms
GPU_H = 3600.0  # GPU-seconds in a GPU-hour


def rows(db: Path, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


def queue(name: str, parent: str = "", gpus: int = 0) -> QueueConfigured:
    return QueueConfigured(queue=name, parent=parent, deserved=Resources(gpu_milli=gpus * 1000))


def two_gpu_run() -> ListReader:
    """One 2-GPU job on a registered node, with utilisation samples on both devices.

    Allocated at 60 s, running from 600 s, finished at 4200 s (70 min).
    """
    place = PodPlacement(pod="ja-0", node="n1", gpus=(GpuSlot(0, 1000), GpuSlot(1, 1000)))
    return ledger(
        (0, NodeRegistered(node="n1", gpus=8)),
        (0, queue("root", gpus=8)),
        (0, queue("a", "root", gpus=6)),
        (0, queue("b", "root", gpus=2)),
        (0, submit("ja", queue="a", gpu=2000)),
        (60_000, PodsAllocated(job="ja", queue="a", placements=(place,))),
        (600_000, PodStarted(job="ja", pod="ja-0")),
        (600_000, GpuUtilizationSampled(node="n1", device=0, utilization_pct=50)),
        (600_000, GpuUtilizationSampled(node="n1", device=1, utilization_pct=0)),
        (900_000, GpuUtilizationSampled(node="n1", device=0, utilization_pct=100)),
        (4_200_000, PodFinished(job="ja", pod="ja-0")),
    )


# --------------------------------------------------------------------------- pods, allocations


def test_pods_and_allocations_follow_the_job(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(two_gpu_run(), db)
    (pod,) = rows(db, "SELECT * FROM pods")
    assert (pod["job"], pod["pod"], pod["queue"], pod["status"], pod["node"]) == (
        "ja",
        "ja-0",
        "a",
        "succeeded",
        "n1",
    )
    assert (pod["gpus"], pod["allocations"], pod["ran_without_gpus"]) == (2.0, 1, False)
    assert (pod["first_allocated_at_s"], pod["first_started_at_s"], pod["finished_at_s"]) == (
        60.0,
        600.0,
        4200.0,
    )
    (alloc,) = rows(db, "SELECT * FROM allocations")
    assert alloc["gpus"] == "0:1000,1:1000"
    assert (alloc["devices"], alloc["device_milli"], alloc["gpu_milli"]) == (
        [0, 1],
        [1000, 1000],
        2000,
    )
    assert (alloc["from_s"], alloc["started_s"], alloc["to_s"], alloc["end_reason"]) == (
        60.0,
        600.0,
        4200.0,
        "finished",
    )


def test_preemption_closes_allocations_and_the_next_attempt_opens_new_ones(
    tmp_path: Path,
) -> None:
    db = tmp_path / "p.duckdb"
    reader = ledger(
        (0, submit("v", pods=2)),
        (10, PodsAllocated(job="v", queue="team", placements=_places("v", 2))),
        (20, started("v", 0)),
        (30, started("v", 1)),
        (40, finished("v", 0)),
        (
            50,
            JobPreempted(
                job="v",
                queue="team",
                pods=("v-0", "v-1"),
                preemptor="boss",
                preemptor_queue="vip",
                rule="reclaim",
                lost_gpu_ms=7_200_000,
                checkpointed_ms=10,
            ),
        ),
        (60, PodsAllocated(job="v", queue="team", placements=_places("v", 2))),
    )
    project(reader, db, batch_size=2)
    allocs = rows(db, "SELECT pod, from_ms, to_ms, end_reason FROM allocations ORDER BY 2, 1")
    assert allocs == [
        {"pod": "v-0", "from_ms": 10, "to_ms": 40, "end_reason": "finished"},
        {"pod": "v-1", "from_ms": 10, "to_ms": 50, "end_reason": "preempted"},
        {"pod": "v-0", "from_ms": 60, "to_ms": None, "end_reason": None},
        {"pod": "v-1", "from_ms": 60, "to_ms": None, "end_reason": None},
    ]
    statuses = rows(db, "SELECT pod, status, allocations FROM pods ORDER BY pod")
    assert statuses == [
        {"pod": "v-0", "status": "allocated", "allocations": 2},
        {"pod": "v-1", "status": "allocated", "allocations": 2},
    ]
    (p,) = rows(db, "SELECT * FROM preemptions")
    assert (p["offset"], p["at_s"], p["job"], p["queue"]) == (6, 0.05, "v", "team")  # after n1
    assert (p["preemptor"], p["preemptor_queue"], p["rule"], p["pods"]) == (
        "boss",
        "vip",
        "reclaim",
        2,
    )
    assert (p["lost_gpu_s"], p["checkpointed_ms"]) == (7200.0, 10)


def _places(job: str, pods: int) -> tuple[PodPlacement, ...]:
    return tuple(
        PodPlacement(pod=f"{job}-{i}", node="n1", gpus=(GpuSlot(i, 1000),)) for i in range(pods)
    )


# --------------------------------------------------------------------------- queue shares


def test_queue_shares_come_from_the_policy_core_each_minute(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(two_gpu_run(), db)
    minutes = rows(db, "SELECT DISTINCT minute FROM queue_shares_minutes ORDER BY minute")
    # Events span minutes 0..70: boundaries 1..70 were crossed (70 itself by the finish).
    assert [m["minute"] for m in minutes] == list(range(1, 71))
    got = {
        (r["minute"], r["queue"]): r
        for r in rows(db, "SELECT * FROM queue_shares_minutes WHERE minute IN (1, 2, 70)")
    }
    a1, a2, b2, root2 = got[(1, "a")], got[(2, "a")], got[(2, "b")], got[(2, "root")]
    # Minute 1: the job is pending (its allocation is stamped exactly at 60 s, after it).
    assert (a1["deserved_gpus"], a1["fair_gpus"], a1["allocated_gpus"]) == (6.0, 2.0, 0.0)
    assert (a1["requested_gpus"], a1["pending_jobs"], a1["running_jobs"]) == (2.0, 1, 0)
    assert (a2["allocated_gpus"], a2["requested_gpus"], a2["pending_jobs"]) == (2.0, 2.0, 0)
    assert a2["running_jobs"] == 1
    assert (b2["deserved_gpus"], b2["fair_gpus"], b2["requested_gpus"]) == (2.0, 0.0, 0.0)
    assert (root2["deserved_gpus"], root2["allocated_gpus"], root2["parent"]) == (8.0, 2.0, "")
    assert got[(70, "a")]["allocated_gpus"] == 2.0  # the state before the finish at 70 min
    assert got[(2, "a")]["at_s"] == 120.0
    # Stored as intervals: a row per queue per change of its figures, not per minute.
    a = rows(db, "SELECT * FROM queue_shares WHERE queue = 'a' ORDER BY from_minute")
    assert [(r["from_minute"], r["to_minute"], r["current"]) for r in a] == [
        (1, 2, False),  # pending
        (2, 71, True),  # running until the last minute sampled (70)
    ]
    assert (a[1]["from_s"], a[1]["to_s"], a[1]["allocated_gpus"]) == (120.0, 4260.0, 2.0)
    window = rows(db, "SELECT * FROM queue_shares_between(60, 180) WHERE queue = 'a'")
    # Half the window pending with 0 GPUs, half running with 2.
    assert window[0]["allocated_gpus"] == pytest.approx(1.0)
    assert window[0]["allocated_gpu_hours"] == pytest.approx(2 * 60 / 3600)


def test_queue_shares_resume_from_a_snapshot_written_by_another_core(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    project(ListReader(reader.records[:200]), db, batch_size=50)
    con = duckdb.connect(str(db))
    con.execute("UPDATE projection_state SET format = 'an older format'")
    con.close()
    project(reader, db, batch_size=50)  # refolds 0..200 without rows, then carries on
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")


def test_a_version_1_database_is_migrated_and_the_new_tables_filled(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    project(reader, db)
    # Turn it back into what gpuledger wrote before schema 2.
    con = duckdb.connect(str(db))
    for kind, name in (*SHARE_VIEW_NAMES, *VIEW_NAMES):
        con.execute(f"DROP {kind} {name}")
    for table in ("pods", "allocations", "preemptions", "gpu_utilization", "queue_shares"):
        con.execute(f"DROP TABLE {table}")
    con.execute("DROP TABLE projection_state")
    con.execute("DELETE FROM schema_version WHERE version >= 2")
    con.execute(
        "DELETE FROM projection_offsets WHERE projection NOT IN ('events', 'queues', 'jobs')"
    )
    con.close()
    stats = project(reader, db)
    assert stats.events_read == len(reader.records)  # the new projections start at 0
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")


def test_a_version_2_database_gets_queue_shares_as_intervals(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    project(ListReader(reader.records[:150]), db)
    # Turn it back into schema 2: a row per minute, the core's state pickled.
    con = duckdb.connect(str(db))
    con.execute("DROP VIEW queue_shares_minutes")
    con.execute("DROP MACRO TABLE queue_shares_between")
    con.execute("DROP TABLE queue_shares")
    con.execute(
        "CREATE TABLE queue_shares (minute BIGINT, at_ms BIGINT, queue TEXT, "
        "PRIMARY KEY (minute, queue))"
    )
    con.execute("INSERT INTO queue_shares VALUES (1, 60000, 'root')")
    con.execute("DELETE FROM projection_state")
    con.execute("ALTER TABLE projection_state DROP COLUMN last_minute")
    con.execute("INSERT INTO projection_state VALUES ('queue_shares', 'py3.11;State:…', ?)", [b"x"])
    con.execute("DELETE FROM schema_version WHERE version >= 3")
    con.close()
    stats = project(reader, db)
    assert stats.events_read == len(reader.records)  # queue_shares is refolded from 0
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")
    (fmt,) = rows(db, "SELECT format FROM projection_state")
    assert fmt == {"format": "gpuledger-snapshot-2"}


def test_a_version_3_database_gets_the_cause_of_every_reason(tmp_path: Path) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    db = tmp_path / "p.duckdb"
    project(ListReader(reader.records[:150]), db)
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE jobs DROP COLUMN unschedulable_cause")
    con.execute("DELETE FROM schema_version WHERE version = 4")
    con.close()
    project(reader, db)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")
    causes = rows(db, "SELECT count(unschedulable_cause) AS n FROM jobs")
    assert causes[0]["n"] > 0, "the workload's jobs waited with reasons"


def test_the_core_ignores_utilisation_samples() -> None:
    state = State()
    apply(state, NodeRegistered(node="n1", gpus=8), 5)
    before = pickle.dumps(state)
    apply(state, GpuUtilizationSampled(node="n1", device=0, utilization_pct=99), 10_000)
    assert pickle.dumps(state) == before
    assert state.now == 5  # not even the clock moves


def test_the_outcome_fold_leaves_the_state_the_core_would(tmp_path: Path) -> None:
    # The outcome fold advances the clock itself for the event types the core ignores.
    reader = workload(seed=3, jobs=80)
    core, fold = State(), OutcomeFold()
    for offset, env in reader.records:
        event = decode_event(env, offset)
        apply(core, event, env.at)
        fold.apply(event, offset, env.at)
    assert pickle.dumps(fold.state) == pickle.dumps(core)
    # The projection's snapshot is scheduler.fold.snapshot's: it loads back as the same state.
    restored = ShareFold.restore(ShareFold(state=fold.state).snapshot(), 7)
    assert restored.last_minute == 7
    assert state_bytes(restored.state) == state_bytes(core)
    assert core.ended  # ended jobs kept as ids only


def test_mid_run_snapshots_then_crash_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = workload()
    project(reader, tmp_path / "fresh.duckdb")
    monkeypatch.setattr(projector, "_SNAPSHOT_EVENTS", 40)
    monkeypatch.setattr(projector, "_SNAPSHOT_EVENTS_PER_JOB", 0)
    db = tmp_path / "p.duckdb"
    with pytest.raises(OSError, match="disk on fire"):
        project(ListReader(reader.records, fail_at=130), db, batch_size=20)
    # Snapshots after 40, 80 and 120 events: queue_shares resumes from the last one.
    assert rows(
        db, "SELECT next_offset FROM projection_offsets WHERE projection = 'queue_shares'"
    ) == [{"next_offset": 120}]
    project(reader, db, batch_size=20)
    assert snapshot(db) == snapshot(tmp_path / "fresh.duckdb")


# --------------------------------------------------------------------------- percentiles


def test_tree_and_windowed_percentiles_match_numpy(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(workload(seed=5, jobs=150), db)
    jobs = rows(db, "SELECT * FROM jobs")
    tree = {r["tree_path"]: r for r in rows(db, "SELECT * FROM tree_percentiles")}
    assert sorted(tree) == ["root", "root/ml", "root/ml/infer", "root/ml/training"]
    assert [tree[p]["depth"] for p in sorted(tree)] == [0, 1, 2, 2]
    for path, r in tree.items():
        mine = [j for j in jobs if (j["queue_path"] + "/").startswith(path + "/")]
        ttr = [j["time_to_ready_s"] for j in mine if j["time_to_ready_s"] is not None]
        done = [j["completion_s"] for j in mine if j["completion_s"] is not None]
        assert r["jobs"] == len(mine)
        for q in (50, 90, 99):
            assert r[f"p{q}_ttr_s"] == pytest.approx(np.percentile(ttr, q), rel=1e-12)
            assert r[f"p{q}_completion_s"] == pytest.approx(np.percentile(done, q), rel=1e-12)
    # A window selects jobs by submission time, half-open [from, to).
    window = rows(
        db, "SELECT * FROM tenant_percentiles_between(20.0, 70.0) WHERE queue = 'training'"
    )[0]
    picked = [
        j["completion_s"]
        for j in jobs
        if j["queue"] == "training"
        and 20.0 <= j["submitted_at_s"] < 70.0
        and j["completion_s"] is not None
    ]
    assert window["finished"] == len(picked) > 5
    assert window["p90_completion_s"] == pytest.approx(np.percentile(picked, 90), rel=1e-12)
    windowed_tree = rows(
        db, "SELECT jobs FROM tree_percentiles_between(20.0, 70.0) WHERE tree_path = 'root'"
    )
    assert windowed_tree == [{"jobs": sum(1 for j in jobs if 20.0 <= j["submitted_at_s"] < 70.0)}]


# --------------------------------------------------------------------------- fairness SLO


def slo_ledger() -> ListReader:
    """Queue ``a``: completions 100,100,100,100,1000 s ending in hour 0 (p90/p50 = 6.4);
    ``b``: four jobs (too few to judge); ``c``: five 100 s jobs ending in hour 30."""
    runs = [("a", 1000, 1100)] * 4 + [("a", 100, 1100)]
    runs += [("b", 0, 2000)] * 4 + [("c", 30 * 3600, 30 * 3600 + 100)] * 5
    timeline: list[tuple[int, Event]] = []
    for i, (q, submitted_s, done_s) in enumerate(runs):
        name = f"{q}{i}"
        timeline += [
            (submitted_s * 1000, submit(name, queue=q)),
            (submitted_s * 1000, allocated(name, queue=q)),
            (submitted_s * 1000, started(name)),
            (done_s * 1000, finished(name)),
        ]
    timeline.sort(key=lambda x: x[0])
    return ledger((0, queue("a")), (0, queue("b")), (0, queue("c")), *timeline)


def test_fairness_slo_windows_breaches_and_noisy_neighbours(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(slo_ledger(), db)
    slo = rows(db, "SELECT * FROM fairness_slo ORDER BY queue, window_end_s")
    a = [r for r in slo if r["queue"] == "a"]
    # Windows end on every hour; a's completions (at 1100 s) are in those ending 1..24 h.
    assert [r["window_end_s"] for r in a] == [h * 3600.0 for h in range(1, 25)]
    assert a[0]["window_start_s"] == 3600.0 - 86400.0
    for r in a:
        assert (r["finished"], r["p50_completion_s"]) == (5, 100.0)
        assert r["p90_completion_s"] == pytest.approx(100 + 0.6 * 900)
        assert r["ratio"] == pytest.approx(6.4)
        assert (r["slo_breach"], r["noisy_neighbour"]) == (True, True)
    b = [r for r in slo if r["queue"] == "b"]
    assert {(r["finished"], r["slo_breach"], r["noisy_neighbour"]) for r in b} == {(4, None, None)}
    c = [r for r in slo if r["queue"] == "c"]
    assert [(r["window_end_s"], r["ratio"], r["slo_breach"]) for r in c] == [
        (31 * 3600.0, 1.0, False)
    ]
    summary = {r["queue"]: r for r in rows(db, "SELECT * FROM fairness_slo_summary")}
    assert (summary["a"]["windows"], summary["a"]["breached"], summary["a"]["noisy"]) == (
        24,
        24,
        24,
    )
    assert (summary["a"]["first_breach_end_s"], summary["a"]["last_breach_end_s"]) == (
        3600.0,
        86400.0,
    )
    assert (summary["b"]["evaluated"], summary["b"]["breached"]) == (0, 0)
    assert (summary["c"]["evaluated"], summary["c"]["breached"]) == (1, 0)


# --------------------------------------------------------------------------- preemptions weekly


def test_preemptions_weekly_counts_and_the_handful_threshold(tmp_path: Path) -> None:
    week = 7 * 24 * H
    items: list[tuple[int, Event]] = [(0, queue("root")), (0, queue("b", "root"))]

    def evict(at: int, victim_queue: str, by: str) -> tuple[int, Event]:
        return (
            at,
            JobPreempted(
                job=f"{victim_queue}-{at}",
                queue=victim_queue,
                pods=("x",),
                preemptor="p",
                preemptor_queue=by,
                rule="reclaim" if by != victim_queue else "preempt",
                lost_gpu_ms=1_800_000,
            ),
        )

    items += [evict(1000 + i, "b", "train") for i in range(6)]
    items += [evict(week + 5, "b", "b"), evict(week + 6, "b", "notebooks")]
    items += [evict(2000, "a", "train")]
    items.sort(key=lambda x: x[0])
    db = tmp_path / "p.duckdb"
    project(ledger(*items), db)
    got = [
        (
            r["queue_path"],
            r["week"],
            r["preemptions"],
            r["reclaims"],
            r["preempts"],
            r["preemptor_queues"],
            r["lost_gpu_hours"],
            r["more_than_a_handful"],
        )
        for r in rows(db, "SELECT * FROM preemptions_weekly ORDER BY queue, week")
    ]
    assert got == [
        ("a", 0, 1, 1, 0, "train", 0.5, False),
        ("root/b", 0, 6, 6, 0, "train", 3.0, True),
        ("root/b", 1, 2, 1, 1, "b,notebooks", 1.0, False),
    ]


# --------------------------------------------------------------------------- GPU usage


def test_gpu_usage_allocated_idle_and_utilised_hours(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(two_gpu_run(), db)
    usage = rows(db, "SELECT * FROM gpu_usage ORDER BY bucket")
    assert [(r["queue_path"], r["bucket"], r["bucket_start_s"]) for r in usage] == [
        ("root/a", 0, 0.0),
        ("root/a", 1, 3600.0),
    ]
    h0, h1 = usage
    # Hour 0: held 60..3600 s on 2 GPUs, running from 600 s.
    assert h0["allocated_gpu_hours"] == pytest.approx(2 * 3540 / GPU_H)
    assert h0["running_gpu_hours"] == pytest.approx(2 * 3000 / GPU_H)
    assert h0["idle_gpu_hours"] == pytest.approx(2 * 540 / GPU_H)
    # Samples: device 0 at 50 % for 600..900 s then 100 % until held out (5 min) at 1200 s;
    # device 1 at 0 % for 600..900 s.
    assert h0["sampled_gpu_hours"] == pytest.approx((600 + 300) / GPU_H)
    assert h0["utilised_gpu_hours"] == pytest.approx((300 * 0.5 + 300 * 1.0) / GPU_H)
    assert h0["drift_gpu_hours"] == pytest.approx(450 / GPU_H)
    assert h0["utilisation"] == pytest.approx(0.5)
    # Hour 1: 3600..4200 s, all running, no samples.
    assert h1["allocated_gpu_hours"] == pytest.approx(2 * 600 / GPU_H)
    assert h1["idle_gpu_hours"] == pytest.approx(0.0)
    assert (h1["sampled_gpu_hours"], h1["utilised_gpu_hours"], h1["utilisation"]) == (
        None,
        None,
        None,
    )
    (total,) = rows(db, "SELECT sum(allocated_gpu_hours) AS h FROM gpu_usage_by(60)")
    assert total["h"] == pytest.approx(2 * 4140 / GPU_H)
    samples = rows(db, "SELECT node, device, utilization_pct FROM gpu_utilization ORDER BY 1")
    assert len(samples) == 3


# --------------------------------------------------------------------------- waits, throughput


def test_requested_not_allocated_flags_long_waits_and_pods_run_without_gpus(
    tmp_path: Path,
) -> None:
    def alloc(job: str, gpus: bool = True) -> PodsAllocated:
        slots = (GpuSlot(0, 1000),) if gpus else ()
        return PodsAllocated(
            job=job,
            queue="team",
            placements=(PodPlacement(pod=f"{job}-0", node="n1", gpus=slots),),
        )

    reader = ledger(
        (0, submit("slow")),
        (0, submit("quick")),
        (0, submit("nogpu")),
        (0, submit("never")),
        (0, submit("cpu", gpu=0)),
        (100_000, alloc("quick")),
        (200_000, alloc("nogpu", gpus=False)),
        (210_000, started("nogpu")),
        (700_000, alloc("slow")),
        (2_000_000, started("quick")),
    )
    db = tmp_path / "p.duckdb"
    project(reader, db)
    got = {
        r["job"]: (r["waited_s"], r["never_allocated"], r["ran_without_gpus"])
        for r in rows(db, "SELECT * FROM requested_not_allocated")
    }
    assert got == {
        "slow": (700.0, False, False),
        "nogpu": (2000.0, True, True),  # placed with no GPU slot, then ran: the alarm
        "never": (2000.0, True, False),  # still waiting when the ledger ends
    }
    stricter = rows(db, "SELECT job FROM requested_not_allocated_after(50) ORDER BY job")
    assert [r["job"] for r in stricter] == ["never", "nogpu", "quick", "slow"]


def test_throughput_per_day_and_week(tmp_path: Path) -> None:
    day = 24 * H
    items: list[tuple[int, Event]] = []
    for name, q, end in [("x", "a", 10), ("y", "a", 20), ("z", "a", day + 5), ("w", "b", 30)]:
        items += [
            (0, submit(name, queue=q)),
            (0, allocated(name, queue=q)),
            (1, started(name)),
            (end, finished(name)),
        ]
    items.sort(key=lambda x: x[0])
    db = tmp_path / "p.duckdb"
    project(ledger(*items), db)
    got = [
        (r["period"], r["period_index"], r["queue"], r["finished"])
        for r in rows(db, "SELECT * FROM throughput ORDER BY period, period_index, queue")
    ]
    assert got == [
        ("day", 0, "a", 2),
        ("day", 0, "b", 1),
        ("day", 1, "a", 1),
        ("week", 0, "a", 3),
        ("week", 0, "b", 1),
    ]


def test_a_long_quiet_ledger_projects_rows_in_proportion_to_its_events(tmp_path: Path) -> None:
    # ~300 jobs over 4,000 hours in 22 leaf queues: a row per queue per minute would be
    # 5 million rows; intervals keep every table in proportion to the events.
    reader = long_ledger()
    events = reader.end_offset()
    assert events > 2_000
    db = tmp_path / "long.duckdb"
    project(reader, db)
    counts = table_rows(db)
    assert sum(counts.values()) < 3 * events, counts
    (span,) = rows(
        db,
        "SELECT min(from_minute) AS first, max(to_minute) AS last, "
        "count(DISTINCT queue) AS queues FROM queue_shares",
    )
    last_at = max(env.at for _, env in reader.read(0))
    assert span["queues"] == 22
    assert span["last"] == last_at // 60_000 + 1  # the intervals cover the whole ledger
    assert last_at > 3_900 * H
    # Per-minute figures on demand, for any minute of it.
    minute = (last_at // 2) // 60_000
    (row,) = rows(db, "SELECT count(*) AS n FROM queue_shares_minutes WHERE minute = ?", [minute])
    assert row["n"] == 22


def _example_ledger(name: str) -> MemoryLedger:
    example = EXAMPLES[name]
    out = MemoryLedger()
    Simulation(
        load(example.path("cluster"), ClusterFile),
        load(example.path("queues"), QueuesFile),
        load(example.path("workload"), WorkloadFile),
        "gpuledger",
        out,
    ).run()
    return out


@pytest.mark.parametrize("name", ["fintech", "big-gang", "long"])
def test_skipped_share_samples_are_the_ones_that_would_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The share fold skips the samples after SHARE_NEUTRAL events only: sampling after
    every event gives the same queue_shares rows."""
    source = long_ledger() if name == "long" else _example_ledger(name)
    project(source, tmp_path / "skipping.duckdb")
    monkeypatch.setattr(projector, "SHARE_NEUTRAL", frozenset())
    project(source, tmp_path / "every.duckdb")
    sql = "SELECT * FROM queue_shares ORDER BY queue, from_minute"
    expected = rows(tmp_path / "every.duckdb", sql)
    assert len(expected) > len(source.records) // 100  # the figures do change
    assert rows(tmp_path / "skipping.duckdb", sql) == expected
