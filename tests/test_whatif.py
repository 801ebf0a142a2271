"""What-if replays, `gpuledger state`, and the metrics they report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from events.memlog import MemoryLedger
from replay.metrics import collect, percentile, tenant_rows
from replay.sim import Simulation
from replay.whatif import extract
from scheduler.cli import main
from tests.simkit import demo_inputs, simulate

EX = "replay/examples"


@pytest.fixture(scope="module")
def demo_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--out", str(out)]) == 0
    return out / "gpuledger" / "ledger"


def test_percentile_matches_numpy() -> None:
    values = [3.0, 1.0, 7.5, 2.0, 10.0, 4.0]
    for q in (0.5, 0.9, 0.99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))
    assert percentile([], 0.5) is None


def test_resimulating_a_ledger_under_its_own_policy_reproduces_its_outcomes() -> None:
    """The world model learnt from the ledger (runtimes, latencies) is faithful."""
    _, ledger = simulate(*demo_inputs(), "gpuledger")
    history = extract(ledger.read(0))
    again = MemoryLedger()
    Simulation.from_inputs(
        history.world,
        history.jobs,
        bind_ms=history.bind_ms,
        startup_ms=history.startup_ms,
        policy=history.policy or "gpuledger",
        writer=again,
    ).run()
    assert (history.bind_ms, history.startup_ms) == (500, 5000)
    assert tenant_rows(collect(again.read(0))) == tenant_rows(collect(ledger.read(0)))
    assert again.blob() == ledger.blob()


def test_what_if_with_another_split_changes_per_tenant_figures(
    demo_ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    out = tmp_path / "whatif"
    code = main(["replay", "--ledger", str(demo_ledger), "--queues",
                 f"{EX}/demo-queues-20-20-60.yaml", "--out", str(out)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "queues from" in text and "training" in text
    report = json.loads((out / "whatif.json").read_text())
    rows = {r["queue"]: r for r in report["tenants"]}
    # experiments now deserve 60%: nobody reclaims from them any more
    assert rows["experiments"]["preemptions:before"] > 0
    assert rows["experiments"]["preemptions:after"] == 0
    assert rows["training"]["lost_gpu_h:after"] != rows["training"]["lost_gpu_h:before"]
    # the new ledger is a real ledger: it verifies
    assert main(["replay", "--ledger", str(out / "ledger"), "--verify"]) == 0


def test_what_if_under_fifo_shows_idle_gpus_of_half_placed_gangs(
    demo_ledger: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fifo"
    assert main(["replay", "--ledger", str(demo_ledger), "--policy-name", "fifo",
                 "--out", str(out)]) == 0  # fmt: skip
    report = json.loads((out / "whatif.json").read_text())
    training = next(r for r in report["tenants"] if r["queue"] == "training")
    assert training["idle_gpu_h:after"] > 10 * training["idle_gpu_h:before"]
    assert report["changed_fates"][0]["queue"] == "training"


def test_what_if_refuses_to_overwrite_and_needs_out(demo_ledger: Path, tmp_path: Path) -> None:
    assert main(["replay", "--ledger", str(demo_ledger), "--policy-name", "fifo"]) == 2
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    assert main(["replay", "--ledger", str(demo_ledger), "--policy-name", "drf",
                 "--out", str(tmp_path / "busy")]) == 2  # fmt: skip
    assert (tmp_path / "busy" / "x").read_text() == "keep me"


def test_what_if_over_a_time_window_takes_the_jobs_submitted_in_it(
    demo_ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    out = tmp_path / "window"
    assert main(["replay", "--ledger", str(demo_ledger), "--from", "6h", "--until", "12h",
                 "--policy-name", "drf", "--out", str(out)]) == 0  # fmt: skip
    first = capsys.readouterr().out.splitlines()[0]
    jobs = int(first.split("what-if over ")[1].split()[0])
    assert 30 < jobs < 200


def test_verify_from_a_time_compares_only_from_there(
    demo_ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["replay", "--ledger", str(demo_ledger), "--verify", "--from", "12h"]) == 0
    assert "0 mismatches from offset" in capsys.readouterr().out


def test_bad_bound_is_a_clear_error(demo_ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--ledger", str(demo_ledger), "--verify", "--from", "soon"]) == 2
    assert "expected an offset" in capsys.readouterr().err


def test_state_at_a_time_shows_queues_running_and_pending_with_reasons(
    demo_ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["state", "--ledger", str(demo_ledger), "--at", "6h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("at +06:00:00")
    assert not re.search(r"\b\d{3,}(\.\d+)?s\b", out)  # "for 5.0h", never "for 18000s"
    assert "flagship-finetune" in out and "fair_share" in out
    assert main(["state", "--ledger", str(demo_ledger), "--at", "40"]) == 0
    early = capsys.readouterr().out
    assert "through offset 39" in early
