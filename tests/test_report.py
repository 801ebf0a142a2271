"""Reports over projections: table rendering, side-by-side comparison, and the CLI."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from events.codec import to_json_line
from events.model import Event, QueueConfigured
from projections.projector import project
from projections.report import (
    COMPARE_COLUMNS,
    REPORT_COLUMNS,
    compare_reports,
    format_duration,
    tenant_report,
)
from scheduler.cli import CliError, build_parser
from scheduler.render.table import Column, render_table
from tests.test_projector import (
    ListReader,
    allocated,
    finished,
    ledger,
    preempted,
    started,
    submit,
)


def history(ttr_s: dict[str, list[float]], run_s: float = 600, preempt: str = "") -> ListReader:
    """Queues ``root/<q>``, one single-pod job per entry with that time to ready (s).

    Every job runs ``run_s`` seconds once ready; ``preempt`` names a job that is evicted
    once (losing 1.8 GPU-hours) and restarts at once.
    """
    items: list[tuple[int, Event]] = [(0, QueueConfigured(queue="root"))]
    items += [(0, QueueConfigured(queue=q, parent="root")) for q in ttr_s]
    for q, ttrs in ttr_s.items():
        for i, ttr in enumerate(ttrs):
            job = f"{q}-{i}"
            ready = int(ttr * 1000)
            items += [
                (0, submit(job, queue=q)),
                (0, allocated(job, queue=q)),
                (ready, started(job)),
            ]
            end = ready + int(run_s * 1000)
            if job == preempt:
                lost = 6_480_000  # GPU-ms: 1.8 GPU-hours
                items += [
                    (ready + 1, preempted(job, lost, queue=q)),
                    (ready + 2, allocated(job, queue=q)),
                    (ready + 2, started(job)),
                ]
                end += 2
            items.append((end, finished(job)))
    items.sort(key=lambda item: item[0])
    return ledger(*items)


def line_of(text: str, first_word: str) -> list[str]:
    """The cells of the table line that starts with ``first_word``: split where two or more
    spaces are (a cell such as ``12.3 s`` holds one)."""
    for line in text.splitlines():
        if line.split(maxsplit=1)[:1] == [first_word]:
            return re.split(r" {2,}", line.strip())
    raise AssertionError(f"no line for {first_word!r} in:\n{text}")


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.0, "0 ms"),
        (0.85, "850 ms"),
        (0.9996, "1.0 s"),
        (12.34, "12.3 s"),
        (59.97, "1.0 min"),
        (246, "4.1 min"),
        (7200, "2.0 h"),
        (3.5 * 86400, "3.5 d"),
        (-90, "-1.5 min"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_render_table_aligns_and_humanizes() -> None:
    rows = [
        {"queue": "root/ml/training", "jobs": 120, "p90_ttr_s": 12.34, "lost_gpu_hours": 0.04},
        {"queue": "root/web", "jobs": 7, "p90_ttr_s": None, "lost_gpu_hours": 12.0},
    ]
    out = render_table(rows, ["queue", "jobs", Column("p90_ttr_s", "p90 TTR"), "lost_gpu_hours"])
    lines = out.splitlines()
    assert lines[0].split() == ["queue", "jobs", "p90", "TTR", "lost_gpu_hours"]
    assert set(lines[1]) == {"-", " "}
    assert re.split(r" {2,}", lines[2].strip()) == ["root/ml/training", "120", "12.3 s", "0.04"]
    assert lines[3].split() == ["root/web", "7", "-", "12.0"]
    # Text left-aligned, numbers right-aligned: every row has the same width, and the
    # jobs column's digits end where its header ends.
    assert len({len(line) for line in lines}) == 1
    assert lines[2].index("120") + 3 == lines[3].index("7") + 1 == lines[0].index("jobs") + 4
    assert lines[3].startswith("root/web ")


def test_render_table_with_no_rows_is_just_the_header() -> None:
    assert render_table([], ["a", "b_s"]).splitlines() == ["a  b_s", "-  ---"]


# --------------------------------------------------------------------------- reports


def test_tenant_report_rows_and_all_row(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(history({"a": [10, 20, 30], "b": [7200]}, preempt="a-1"), db)
    rows = tenant_report(db)
    assert [r["queue_path"] for r in rows] == ["root/a", "root/b", "all"]
    a, b, total = rows
    assert (a["jobs"], a["ready"], a["finished"], a["p50_ttr_s"]) == (3, 3, 3, 20.0)
    assert a["p90_ttr_s"] == pytest.approx(28.0)
    assert (a["preemptions"], a["lost_gpu_hours"]) == (1, pytest.approx(1.8))
    assert (b["jobs"], b["p50_ttr_s"], b["preemptions"]) == (1, 7200.0, 0)
    assert (total["queue"], total["jobs"], total["ready"], total["p50_ttr_s"]) == (
        "all",
        4,
        4,
        25.0,
    )
    assert tenant_report(db, total=False) == rows[:2]

    text = render_table(rows, REPORT_COLUMNS)
    cells = line_of(text, "root/a")
    assert cells[:9] == ["root/a", "3", "3", "3", "0", "20.0 s", "28.0 s", "29.8 s", "10.3 min"]
    assert line_of(text, "root/b")[5] == "2.0 h"
    assert line_of(text, "all")[-2:] == ["1", "1.80"]


def test_compare_reports_side_by_side(tmp_path: Path) -> None:
    fast, slow = tmp_path / "gpuledger.duckdb", tmp_path / "fifo.duckdb"
    project(history({"a": [10, 20, 30], "b": [60]}, preempt="b-0"), fast)
    project(history({"a": [60, 120, 180], "b": [7200]}), slow)
    out = compare_reports({"gpuledger": fast, "fifo": slow})
    lines = out.splitlines()
    # The group line names each policy over its own columns, in the order given.
    assert lines[0].index("gpuledger") < lines[0].index("fifo")
    per_run = [c.title for c in COMPARE_COLUMNS]
    assert lines[1].split() == ["queue", "jobs", *" ".join(per_run * 2).split()]
    # queue | jobs | gpuledger: ready p50 p90 p99 p90done preempt lost | fifo: same
    assert line_of(out, "root/a") == [
        "root/a", "3",
        "3", "20.0 s", "28.0 s", "29.8 s", "10.5 min", "0", "0.00",
        "3", "2.0 min", "2.8 min", "3.0 min", "12.8 min", "0", "0.00",
    ]  # fmt: skip
    assert line_of(out, "root/b") == [
        "root/b", "1",
        "1", "1.0 min", "1.0 min", "1.0 min", "11.0 min", "1", "1.80",
        "1", "2.0 h", "2.0 h", "2.0 h", "2.2 h", "0", "0.00",
    ]  # fmt: skip
    total = line_of(out, "all")
    assert total[:3] == ["all", "4", "4"]
    assert total[3] == "25.0 s"  # median of 10, 20, 30, 60 s
    assert total[10] == "2.5 min"  # median of 60, 120, 180, 7200 s
    assert "TTR" in out and "no data" in out


def test_compare_reports_with_different_workloads_shows_jobs_per_run(tmp_path: Path) -> None:
    one, two = tmp_path / "one.duckdb", tmp_path / "two.duckdb"
    project(history({"a": [10], "only-one": [5]}), one)
    project(history({"a": [10, 20]}), two)
    out = compare_reports({"one": one, "two": two})
    header = out.splitlines()[1].split()
    assert header.count("jobs") == 2
    assert line_of(out, "root/only-one")[1:3] == ["1", "1"]  # jobs, ready in run one
    assert line_of(out, "root/only-one")[-8:] == ["-"] * 8  # absent from run two
    assert line_of(out, "root/a")[1] == "1"
    assert line_of(out, "root/a")[9] == "2"


def test_compare_reports_needs_a_run() -> None:
    with pytest.raises(ValueError, match="at least one"):
        compare_reports({})


# --------------------------------------------------------------------------- CLI


def run_cli(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


@pytest.fixture
def jsonl_ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.jsonl"
    reader = history({"a": [10, 20, 30], "b": [60]}, preempt="a-0")
    path.write_bytes(b"".join(to_json_line(off, env) + b"\n" for off, env in reader.records))
    return path


def test_cli_project_report_and_sql(
    tmp_path: Path, jsonl_ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "out" / "p.duckdb"
    assert run_cli(["project", "--ledger", str(jsonl_ledger), "--db", str(db)]) == 0
    assert "projected" in capsys.readouterr().out
    assert run_cli(["project", "--ledger", str(jsonl_ledger), "--db", str(db)]) == 0
    assert "up to date" in capsys.readouterr().out
    assert run_cli(["project", "--ledger", str(jsonl_ledger), "--db", str(db), "--rebuild"]) == 0
    capsys.readouterr()

    assert run_cli(["report", "--db", str(db)]) == 0
    table = capsys.readouterr().out
    assert line_of(table, "root/a")[:6] == ["root/a", "3", "3", "3", "0", "20.0 s"]
    assert run_cli(["report", "--db", str(db), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["tenants"]
    assert [r["queue"] for r in rows] == ["a", "b", "all"]
    assert rows[0]["preemptions"] == 1

    query = "SELECT job, status, time_to_ready_s FROM jobs ORDER BY job"
    assert run_cli(["sql", "--db", str(db), query, "--format", "csv"]) == 0
    got = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert got[0] == ["job", "status", "time_to_ready_s"]
    assert got[1] == ["a-0", "succeeded", "10.0"]
    assert len(got) == 5

    assert run_cli(["sql", "--db", str(db), query]) == 0
    assert line_of(capsys.readouterr().out, "b-0") == ["b-0", "succeeded", "60.0"]

    payloads = "SELECT \"offset\", payload FROM events WHERE type = 'job_preempted'"
    assert run_cli(["sql", "--db", str(db), payloads, "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["payload"]["job"] == "a-0"  # JSON columns are nested, not strings


def test_cli_user_errors(tmp_path: Path, jsonl_ledger: Path) -> None:
    db = tmp_path / "p.duckdb"
    with pytest.raises(CliError, match="no projection database"):
        run_cli(["report", "--db", str(db)])
    with pytest.raises(CliError, match="no projection database"):
        run_cli(["sql", "--db", str(db), "SELECT 1"])
    project(ledger((0, submit("j"))), db)
    with pytest.raises(CliError, match="SQL error"):
        run_cli(["sql", "--db", str(db), "SELEC 1"])
    with pytest.raises(CliError, match="SQL error"):
        run_cli(["sql", "--db", str(db), "DELETE FROM jobs"])  # read-only
    with pytest.raises(CliError, match="cannot open ledger"):
        run_cli(["project", "--ledger", str(tmp_path / "nowhere"), "--db", str(db)])
    # The database holds one record more than this empty ledger: another ledger's.
    short = tmp_path / "short.jsonl"
    short.write_bytes(b"")
    with pytest.raises(CliError, match="rebuild"):
        run_cli(["project", "--ledger", str(short), "--db", str(db)])


def test_jsonl_export_projects_like_the_ledger(tmp_path: Path, jsonl_ledger: Path) -> None:
    db = tmp_path / "p.duckdb"
    run_cli(["project", "--ledger", str(jsonl_ledger), "--db", str(db)])
    rows = tenant_report(db)
    direct = tmp_path / "direct.duckdb"
    project(history({"a": [10, 20, 30], "b": [60]}, preempt="a-0"), direct)
    assert tenant_report(direct) == rows  # the exported ledger projects identically


def test_numbers_read_as_people_read_them() -> None:
    """No scientific notation, no binary noise, no Python spellings in a table."""
    from scheduler.render.table import Column, format_number, render_table

    assert [format_number(v) for v in (22050.4, 123.45, 12.345, 0.3249, 7.005e-07, 0.0, -2.5)] == [
        "22,050", "123.5", "12.35", "0.325", "<0.001", "0", "-2.50"
    ]  # fmt: skip
    table = render_table(
        [{"ratio": 1.951e-05, "big": 2.205e04, "ok": False, "x": 0.03149972222222222}],
        ["ratio", "big", "ok", Column("x", "x", "raw")],
    )
    assert "e-0" not in table and "e+0" not in table and "False" not in table
    assert "<0.001" in table and "22,050" in table and "no" in table.split()
    assert "0.0315" in table and "0.03149" not in table  # at most 4 decimals
    # One number of decimals per column: a measured column by its largest value, a SQL
    # column by what its values need (at most 4).
    table = render_table(
        [{"q": "a", "rate": 191.8, "x": 2.5}, {"q": "b", "rate": 1.6, "x": 0.03149972}],
        ["q", "rate", Column("x", "x", "raw")],
    )
    assert [line.split()[1:] for line in table.splitlines()[2:]] == [
        ["191.8", "2.5000"],
        ["1.6", "0.0315"],
    ]


def test_weekly_preemptions_by_rule_add_up(tmp_path: Path) -> None:
    """Every preemption counts under one rule (backfill's too), in the view and the report."""
    from events.filelog import FileLedger, LedgerDirReader
    from projections.projector import connect
    from replay.examples import simulate

    with FileLedger.open(tmp_path / "ledger") as writer:
        simulate("backfill", "gpuledger", writer)
    project(LedgerDirReader(tmp_path / "ledger"), tmp_path / "h.duckdb")
    con = connect(tmp_path / "h.duckdb", read_only=True)
    try:
        rows = con.execute(
            "SELECT sum(preemptions), sum(reclaims + preempts + backfills + other_rules), "
            "sum(backfills) FROM preemptions_weekly"
        ).fetchone()
        from projections.report import full_report

        report = full_report(con)
    finally:
        con.close()
    assert rows is not None and rows[0] == rows[1] and rows[2] > 0
    for r in report["preemptions_weekly"]:
        assert r["preemptions"] == r["reclaims"] + r["preempts"] + r["backfills"] + r["other_rules"]


def test_the_slo_table_counts_windows_as_the_console_does(tmp_path: Path) -> None:
    """`report`'s SLO table has the console's columns: all windows, those evaluated (enough
    completions to judge), breached; not the evaluated ones under the title "windows"."""
    from events.filelog import FileLedger, LedgerDirReader
    from projections.projector import connect
    from projections.report import SLO_COLUMNS, full_report
    from replay.examples import simulate

    with FileLedger.open(tmp_path / "ledger") as writer:
        simulate("demo", "gpuledger", writer)
    project(LedgerDirReader(tmp_path / "ledger"), tmp_path / "h.duckdb")
    con = connect(tmp_path / "h.duckdb", read_only=True)
    try:
        slo = full_report(con)["slo"]
    finally:
        con.close()
    assert [c.title for c in SLO_COLUMNS][1:4] == ["windows", "evaluated", "breached"]
    table = render_table(slo, SLO_COLUMNS)
    for row in slo:
        assert row["windows"] >= row["evaluated"] >= row["breached"]
        cells = line_of(table, row["queue_path"])
        assert cells[1:3] == [str(row["windows"]), str(row["evaluated"])]
