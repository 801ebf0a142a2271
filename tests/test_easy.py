"""The ``easy`` baseline (EASY backfill over jobs) and the work-conservation measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events.model import JobPreempted, PodsAllocated
from replay.conservation import ConservationMonitor
from scheduler.cli import main
from tests.builders import World, job, node, queue

EX = "replay/examples"


def placed(decisions: list) -> dict[str, dict[str, str]]:  # type: ignore[type-arg]
    return {
        d.job: {p.pod: p.node for p in d.placements}
        for d in decisions
        if isinstance(d, PodsAllocated)
    }


def busy_world() -> World:
    """Two 4-GPU nodes; a 3-GPU job on n1 expected to run 100 s, a 3-GPU job on n2 expected
    to run 1,000 s (neither has reported running: their expected ends count from their
    placement at 0 s)."""
    w = World(node("n1", gpus=4), node("n2", gpus=4), queue("a"), queue("b"), policy="easy")
    w.at(0, job("r1", "a", gpus=3, runtime_s=100), job("r2", "b", gpus=3, runtime_s=1000))
    return w


def test_the_first_job_that_does_not_fit_reserves_and_later_jobs_keep_off_its_nodes() -> None:
    w = busy_world()
    # "big" needs a whole 4-GPU node: n1 frees first (at 0 + 100 s), so n1 is reserved.
    got = w.at(1, job("big", "a", gpus=4, runtime_s=500), job("long", "b", gpus=1))
    assert "big" not in placed(got)
    # 'long' has no expected runtime: it may not run on the reserved n1, but n2 has room.
    assert placed(got) == {"long": {"long-0": "n2"}}
    assert w.state.reserved == {"n1": 100_000}


def test_a_job_that_ends_before_the_reservation_starts_backfills_onto_its_nodes() -> None:
    w = World(node("n1", gpus=4), node("n2", gpus=4), queue("a"), queue("b"), policy="easy")
    w.at(0, job("r1", "a", gpus=2, runtime_s=100), job("r2", "b", gpus=4, runtime_s=1000))
    # n1 has 2 GPUs free and frees whole at 0 + 100 s (r1 was placed at 0 s): reserved
    # for "big".
    got = w.at(2, job("big", "a", gpus=4), job("short", "b", gpus=1, runtime_s=50),
               job("too-long", "b", gpus=1, runtime_s=500), job("unknown", "b", gpus=1))  # fmt: skip
    assert placed(got) == {"short": {"short-0": "n1"}}  # ends at 52 s, before 100 s
    assert w.state.reserved == {"n1": 100_000}


def test_jobs_start_in_submission_order_across_queues_and_priorities() -> None:
    w = World(node("n1", gpus=1), queue("a"), queue("b"), policy="easy")
    w.at(0, job("first", "a", cls="train"))
    got = w.at(1, job("second", "b", cls="inference"), job("third", "a", cls="train"))
    assert placed(got) == {}  # the one GPU is taken; priority does not jump the line
    w.finish(2, "first")
    assert w.state.jobs["second"].placements and not w.state.jobs["third"].placements


def test_easy_never_preempts() -> None:
    w = World(node("n1", gpus=2), queue("a", deserved=1), queue("b", deserved=1), policy="easy")
    w.at(0, job("hog", "a", gpus=2))
    got = w.at(1, job("owed", "b", gpus=1, cls="inference"))
    assert not any(isinstance(d, JobPreempted) for d in got)
    assert placed(got) == {}


def test_the_conservation_monitor_counts_idle_time_only_while_a_fitting_job_waits() -> None:
    # drf has no backfill: a queue's blocked head holds back the job behind it.
    w = World(node("n1", gpus=4), queue("a"), policy="drf")
    monitor = ConservationMonitor(every_ms=0)
    w.at(0, job("run", "a", gpus=2))
    monitor.observe(w.state, 0)
    w.at(1, job("head", "a", gpus=4), job("small", "a", gpus=1))
    monitor.observe(w.state, 1000)
    assert w.state.jobs["small"].placements == {}  # 2 GPUs idle, 'small' fits, waits
    monitor.observe(w.state, 61_000)
    assert monitor.waiting_ms == 60_000
    assert monitor.idle_gpu_ms == 2 * 60_000  # 2 idle GPUs for a minute, in GPU-ms
    assert monitor.idle_gpu_hours == pytest.approx(2 / 60)  # as compare prints it
    assert monitor.held_by_rule_ms == 0


def test_the_monitor_does_not_count_capacity_a_live_reservation_holds() -> None:
    w = busy_world()
    monitor = ConservationMonitor(every_ms=0)
    w.at(1, job("fill", "b", gpus=1))
    w.at(2, job("big", "a", gpus=4), job("long", "b", gpus=1))  # n1 reserved; n2 full
    assert w.state.jobs["long"].placements == {}
    monitor.observe(w.state, 2000)
    monitor.observe(w.state, 62_000)
    assert monitor.waiting_ms == 0


def test_compare_prints_the_headline_figures_for_every_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    assert main(["compare", "--cluster", f"{EX}/fintech-cluster.yaml", "--queues",
                 f"{EX}/fintech-queues.yaml", "--workload", f"{EX}/fintech-workload.yaml",
                 "--out", str(out), "--workers", "1"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "avg wait" in text and "lost %" in text and "idle-fit min" in text
    data = json.loads((out / "compare.json").read_text())
    assert set(data) == {"gpuledger", "kai", "drf", "fifo", "easy"}
    for figures in data.values():
        summary = figures["summary"]
        assert summary["jobs"] == summary["ready"] > 0
        assert 0 <= summary["lost_share"] < 1
        assert summary["idle_fit_min"] >= summary["idle_fit_by_rule_min"] >= 0
    assert data["easy"]["summary"]["preemptions"] == 0
    assert set(data["gpuledger"]["demand"]) == {
        row["queue"] for row in data["gpuledger"]["tenants"] if row["queue"] != "all"
    }
