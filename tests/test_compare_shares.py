"""`gpuledger compare`'s per-queue demand against deserved quota, and how much of each
queue's waiting its share explains (issue 15's acceptance: a queue that borrows may wait
longer, by what its fair share explains)."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.model import JobSubmitted, PodSpec
from replay.compare import compare, demand_table, offered_demand, share_table
from replay.config import ClusterFile, QueuesFile, WorkloadFile, load
from replay.metrics import JobRecord, LedgerMetrics, share_waits
from replay.sim import SimJob

HOUR = 3_600_000


def _sim_job(name: str, queue: str, at: int, runtime: int, gpus: int) -> SimJob:
    pods = (PodSpec(name=f"{name}-0", gpu_milli=gpus),)
    return SimJob(at, JobSubmitted(job=name, queue=queue, pods=pods), runtime)


def test_offered_demand_sees_a_burst_that_the_average_hides() -> None:
    # 8 GPUs for 1 h, then 1 GPU for 9 h: 1.7 GPUs on average against a quota of 4, but
    # above it for a tenth of the span.
    jobs = [_sim_job(f"a{i}", "a", 0, HOUR, 1000) for i in range(8)]
    jobs.append(_sim_job("b", "b", 0, 10 * HOUR, 1000))
    jobs.append(_sim_job("a-long", "a", HOUR, 9 * HOUR, 1000))
    d = offered_demand(jobs, {"a": 4000, "b": 4000})
    assert d["a"] == {
        "deserved_gpus": 4.0,
        "demand_gpus": pytest.approx(1.7),
        "peak_gpus": 8.0,
        "above_pct": pytest.approx(10.0),
    }
    assert d["b"]["above_pct"] == 0 and d["b"]["peak_gpus"] == 1.0


def test_share_waits_splits_each_wait_at_the_queues_deserved_quota() -> None:
    # Queue q deserves 2 GPUs and holds 0, then 2 from t=100 s, then 1 from t=300 s. A
    # 1-GPU job waiting from 50 s to 400 s would have borrowed from 100 s to 300 s (q held
    # 2 of its 2), so 200 s of its 350 s wait are at its share and 150 s within it.
    m = LedgerMetrics(start=0, end=500_000)
    m.jobs = {
        "j": JobRecord(job="j", queue="q", gpus=1000, submitted=50_000, ready=400_000),
        # a 2-GPU job waiting from 0 to 100 s: q held 0, so 2 more would not borrow
        "k": JobRecord(job="k", queue="q", gpus=2000, submitted=0, ready=100_000),
    }
    m.held = {"q": [(100_000, 2000), (300_000, 1000)]}
    row = share_waits(m, {"q": 2000})["q"]
    assert row["wait_at_share_pct"] == pytest.approx(100 * 200 / 450)
    within = sorted([150.0, 100.0])
    assert row["in_share_p90_s"] == pytest.approx(within[0] + 0.9 * (within[1] - within[0]))


CLUSTER = """
nodes:
  - {name: n, count: 1, gpus: 8}
"""
QUEUES = """
queues:
  - {name: a, deserved_percent: 50}
  - {name: b, deserved_percent: 50}
"""
# a: twelve 1-GPU jobs at once for an hour (it deserves 4 of the 8 GPUs), then a long
# quiet job; b: four 1-GPU jobs half an hour in, within its quota.
WORKLOAD = (
    """
jobs:
"""
    + "".join(f"  - {{name: a{i}, queue: a, at_s: 0, runtime_s: 3600}}\n" for i in range(12))
    + "".join(f"  - {{name: b{i}, queue: b, at_s: 1800, runtime_s: 3600}}\n" for i in range(4))
    + "  - {name: a-late, queue: a, at_s: 7200, runtime_s: 72000}\n"
)


def test_compare_says_a_queue_bursts_above_its_quota_and_how_much_of_its_wait_that_explains(
    tmp_path: Path,
) -> None:
    for name, text in (("c", CLUSTER), ("q", QUEUES), ("w", WORKLOAD)):
        (tmp_path / f"{name}.yaml").write_text(text)
    runs = compare(
        load(tmp_path / "c.yaml", ClusterFile),
        load(tmp_path / "q.yaml", QueuesFile),
        load(tmp_path / "w.yaml", WorkloadFile),
        ["gpuledger", "fifo"],
        tmp_path / "out",
        workers=1,
    )
    demand = {line.split()[0]: line.split() for line in demand_table(runs).splitlines()[2:]}
    # a asks for 12 GPUs for an hour: below its 4 on average over the day, but bursting
    assert runs[0].demand["a"]["demand_gpus"] < 4 and demand["a"][5] == "bursts"
    assert demand["b"][5] == "within"
    mine = runs[0].shares
    # a's jobs waited while a held its share (it borrowed the 4 GPUs b did not use);
    # b's reclaimed them at once: none of its waiting is explained by its share
    # (all but binding and starting, 2.5 s a job)
    assert mine["a"]["wait_at_share_pct"] > 99 and mine["a"]["in_share_p90_s"] == 2.5
    assert mine["b"]["wait_at_share_pct"] == 0 and mine["b"]["in_share_p90_s"] == 2.5
    assert "p90 within share" in share_table(runs)
