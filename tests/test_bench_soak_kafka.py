"""The live-path soak (``python -m bench.soak --kafka``) in a tiny configuration.

Only the accounting is asserted, never a time or a memory figure: every submitted job is
decided and in the ledger exactly once, every finish the soak reported is in the ledger,
nothing was dead-lettered, the scheduler stopped cleanly and the table has every window.
"""

from __future__ import annotations

import pytest

from bench.kafka_soak import Plan, render, soak
from tests.kafkakit import kafka

__all__ = ["kafka"]


def test_plan_for_minutes_splits_whole_windows() -> None:
    plan = Plan.for_minutes(3.5, 15)
    assert (plan.normal_windows, plan.burst_windows, plan.after_windows) == (4, 4, 6)
    assert plan.phases()[:5] == ["normal"] * 4 + ["burst"]
    tiny = Plan.for_minutes(0.01, 15)
    assert (tiny.normal_windows, tiny.burst_windows, tiny.after_windows) == (1, 1, 1)


@pytest.mark.integration
def test_tiny_soak_accounts_for_every_job(kafka: str) -> None:
    plan = Plan(
        rate=20,
        factor=10,
        window_s=2,
        normal_windows=1,
        burst_windows=1,
        after_windows=2,
        runtime_s=0.5,
        drain_s=20,
    )
    result = soak(kafka, plan)
    windows, sm = result["windows"], result["summary"]

    assert [w["phase"] for w in windows] == ["normal", "burst", "after", "after"]
    for w in windows:
        assert w["submitted"] > 0
        assert w["latency_n"] == w["submitted"]  # each of its jobs was decided
        assert w["rss_mib"] > 0
        assert w["lag"] is not None
    assert windows[1]["submitted"] > windows[0]["submitted"]  # the burst offered more

    assert sm["jobs_submitted"] == sum(w["submitted"] for w in windows) > 0
    assert sm["jobs_undecided"] == 0
    assert sm["jobs_decided"] == sm["jobs_allocated"] == sm["jobs_submitted"]
    assert sm["ledger_job_submitted"] == sm["jobs_submitted"]  # exactly once
    assert sm["finishes_sent"] > 0
    assert sm["ledger_pod_finished"] == sm["finishes_sent"]
    assert sm["dead_letters"] == 0
    assert sm["scheduler_exit_code"] == 0
    assert sm["pre_burst_p99_ms"] is not None and sm["last_window_p99_ms"] is not None

    table = render(result).splitlines()
    assert len(table) == 2 + len(windows) + 3  # title, header, one row per window, summary
    assert table[-2].startswith("memory: RSS")
    assert table[-1].startswith("latency: p99")
