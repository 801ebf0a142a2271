"""`gpuledger compare` and the seed's examples, fifo against gpuledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.examples import EXAMPLES
from scheduler.cli import main

EX = "replay/examples"


def test_compare_runs_every_policy_and_writes_json_and_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    code = main(["compare", "--cluster", f"{EX}/demo-cluster.yaml", "--queues",
                 f"{EX}/demo-queues.yaml", "--workload", f"{EX}/demo-workload.yaml",
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    for policy in ("gpuledger", "kai", "drf", "fifo", "easy"):
        assert f"{policy}" in text and (out / policy / "ledger").is_dir()
    data = json.loads((out / "compare.json").read_text())
    assert set(data) == {"gpuledger", "kai", "drf", "fifo", "easy"}
    for figures in data.values():
        queues = {row["queue"] for row in figures["tenants"]}
        assert queues == {"training", "interactive", "experiments", "all"}
        assert 0 < figures["utilisation"] <= 1
    html = (out / "compare.html").read_text()
    assert html.count("<svg") == 5 and "time to ready by tenant" in html
    # each policy's ledger is a real ledger
    assert main(["replay", "--ledger", str(out / "drf" / "ledger"), "--verify"]) == 0


def test_compare_escapes_names_in_html(tmp_path: Path) -> None:
    queues = tmp_path / "q.yaml"
    queues.write_text('queues:\n  - {name: "<script>x</script>", deserved_percent: 100}\n')
    workload = tmp_path / "w.yaml"
    workload.write_text(
        'jobs:\n  - {name: j, queue: "<script>x</script>", at_s: 0, runtime_s: 60}\n'
    )
    out = tmp_path / "cmp"
    assert main(["compare", "--cluster", f"{EX}/demo-cluster.yaml", "--queues", str(queues),
                 "--workload", str(workload), "--policies", "gpuledger", "--out", str(out)]) == 0  # fmt: skip
    html = (out / "compare.html").read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_compare_rejects_an_unknown_policy(tmp_path: Path) -> None:
    assert main(["compare", "--cluster", f"{EX}/demo-cluster.yaml", "--queues",
                 f"{EX}/demo-queues.yaml", "--workload", f"{EX}/demo-workload.yaml",
                 "--policies", "gpuledger,lottery", "--out", str(tmp_path)]) == 2  # fmt: skip


def _watch(out: Path, example: str) -> dict[str, dict[str, object]]:
    data = json.loads((out / example / "compare.json").read_text())
    assert set(data) == {"fifo", "gpuledger"}
    from events.filelog import LedgerDirReader
    from replay.metrics import collect

    fates = {}
    for policy in ("fifo", "gpuledger"):
        m = collect(LedgerDirReader(out / example / policy / "ledger").read(0))
        job = m.jobs[EXAMPLES[example].watch[0]] if EXAMPLES[example].watch else None
        fates[policy] = {
            "ttr": None if job is None else job.time_to_ready_ms,
            "idle": None if job is None else job.idle_gpu_ms,
            "unschedulable": "" if job is None else job.unschedulable,
            "tenants": {r["queue"]: r for r in data[policy]["tenants"]},
        }
    return fates


@pytest.mark.parametrize("example", ["fintech", "big-gang", "pipelines", "pinned"])
def test_each_seed_example_runs_with_one_command_and_shows_the_difference(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["example", example, "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{example}: ")
    fates = _watch(tmp_path, example)
    fifo, ours = fates["fifo"], fates["gpuledger"]
    if example == "fintech":  # the fine-tune is not stuck behind the notebooks
        assert ours["ttr"] is not None and fifo["ttr"] is not None
        assert ours["ttr"] * 10 < fifo["ttr"]
    elif example == "big-gang":  # no half-placed 512-GPU gang idling for hours
        assert ours["ttr"] < fifo["ttr"] / 5  # type: ignore[operator]
        assert ours["idle"] * 100 < fifo["idle"]  # type: ignore[operator]
    elif example == "pipelines":  # fractions share devices: all seven start at 06:00
        f90 = fifo["tenants"]["pipelines"]["ttr_p90_s"]
        o90 = ours["tenants"]["pipelines"]["ttr_p90_s"]
        assert o90 < 60 < f90
    else:  # pinned: rejected with the reason instead of hanging
        assert fifo["ttr"] is None and fifo["unschedulable"] == ""
        assert "gpu-07" in str(ours["unschedulable"])
        assert "still pending at the end" in text


def test_example_lists_the_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["example"]) == 0
    out = capsys.readouterr().out
    for name in ("fintech", "big-gang", "pipelines", "pinned"):
        assert name in out
    assert main(["example", "nope"]) == 2
