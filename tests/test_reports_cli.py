"""The full report (table, JSON, HTML), the SQL shell, Parquet export and metrics import."""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from events.filelog import FileLedger, LedgerDirReader
from events.memlog import MemoryLedger
from events.metrics import MetricsError, parse_csv, parse_dcgm, read_samples
from events.model import Event, JobPreempted, QueueConfigured
from projections.html import render_html
from projections.parquet import export_parquet, open_parquet
from projections.projector import connect, project
from projections.report import full_report, parse_window
from scheduler.cli import CliError
from tests.simkit import demo_inputs, simulate
from tests.test_history import rows, slo_ledger, two_gpu_run
from tests.test_projector import finished, ledger, started, submit
from tests.test_report import run_cli

DATA = Path(__file__).resolve().parent / "data"
EVIL_QUEUE = "<script>alert('q')</script>"
EVIL_JOB = '"><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo day under the gpuledger policy, projected."""
    _, mem = simulate(*demo_inputs(), "gpuledger")
    db = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    project(mem, db)
    return db


def evil_ledger() -> MemoryLedger:
    items: list[tuple[int, Event]] = [(0, QueueConfigured(queue=EVIL_QUEUE))]
    for i in range(3):
        job = f"{EVIL_JOB}{i}"
        items += [(0, submit(job, queue=EVIL_QUEUE)), (1000, started(job))]
        items += [(5000 * (i + 1), finished(job))]
    preempt = JobPreempted(
        job=EVIL_JOB,
        queue=EVIL_QUEUE,
        pods=("p",),
        preemptor="</td><script>x()</script>",
        preemptor_queue=EVIL_QUEUE,
        rule="<b>rule</b>",
        lost_gpu_ms=10,
    )
    items += [(900, preempt)]
    items.sort(key=lambda x: x[0])
    return MemoryLedger(env for _, env in ledger(*items).records)


# --------------------------------------------------------------------------- report


def test_parse_window() -> None:
    assert [parse_window(t) for t in ("90s", "30m", "24h", "7d", "1w", "45")] == [
        90,
        1800,
        86400,
        604800,
        604800,
        45,
    ]
    for bad in ("", "h", "-1h", "0d", "soon"):
        with pytest.raises(ValueError, match="window"):
            parse_window(bad)


def test_full_report_sections_over_a_window(tmp_path: Path) -> None:
    db = tmp_path / "slo.duckdb"
    project(slo_ledger(), db)
    con = connect(db, read_only=True)
    try:
        everything = full_report(con)
        recent = full_report(con, parse_window("2h"))
    finally:
        con.close()
    queues = [r["queue"] for r in everything["tenants"]]
    assert queues == ["a", "b", "c", "all"]
    assert everything["tenants"][-1]["jobs"] == 14
    slo = {r["queue"]: r for r in everything["slo"]}
    assert (slo["a"]["breached"], slo["c"]["breached"], slo["b"]["evaluated"]) == (24, 0, 0)
    # The last 2 hours of ledger time (which ends at 30 h + 100 s) hold only c's jobs.
    assert [r["queue"] for r in recent["tenants"]] == ["c", "all"]
    assert [r["queue"] for r in recent["slo"]] == ["c"]
    assert recent["window"]["end_s"] == 30 * 3600 + 100


def test_html_escapes_every_name(tmp_path: Path) -> None:
    db = tmp_path / "evil.duckdb"
    project(evil_ledger(), db)
    con = connect(db, read_only=True)
    try:
        page = render_html(full_report(con), title="report of <evil> & co")
    finally:
        con.close()
    assert "<script" not in page.lower()
    assert "<img" not in page.lower()
    assert "<b>" not in page
    assert "&lt;script&gt;alert(&#x27;q&#x27;)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "report of &lt;evil&gt; &amp; co" in page
    assert page.count("<svg") == 5


def test_cli_html_report_escapes_a_script_queue_and_a_quoted_job(tmp_path: Path) -> None:
    """Through ``gpuledger report --format html``: names are text, never markup."""
    queue, job = "<script>alert(1)</script>", "say \"hi\" & <b>bye</b> 'now'"
    items: list[tuple[int, Event]] = [
        (0, QueueConfigured(queue=queue)),
        (0, submit(job, queue=queue)),
        (
            900,
            JobPreempted(
                job=job,
                queue=queue,
                pods=("p",),
                preemptor=f"{job}&2",
                preemptor_queue=queue,
                rule="reclaim",
                lost_gpu_ms=10,
            ),
        ),
        (1000, started(job)),
        (5000, finished(job)),
    ]
    db = tmp_path / "names.duckdb"
    project(MemoryLedger(env for _, env in ledger(*items).records), db)
    out = tmp_path / "report.html"
    assert run_cli(["report", "--db", str(db), "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "<script" not in page.lower() and "<b>" not in page and "& <" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "say &quot;hi&quot; &amp; &lt;b&gt;bye&lt;/b&gt; &#x27;now&#x27;" in page
    assert "&#x27;now&#x27;&amp;2" in page  # the preemptor column


def test_cli_report_formats(
    tmp_path: Path, demo_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["report", "--db", str(demo_db), "--window", "24h"]) == 0
    text = capsys.readouterr().out
    for title in ("Tenants (last 1.0 d", "Fairness SLO", "Preemptions per week", "GPU usage"):
        assert title in text
    assert run_cli(["report", "--db", str(demo_db), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["queue"] for r in report["tenants"]} == {
        "training",
        "interactive",
        "experiments",
        "all",
    }
    assert sum(r["preemptions"] for r in report["preemptions_weekly"]) == sum(
        r["preemptions"] for r in report["tenants"][:-1]
    )
    assert all(r["allocated_gpu_hours"] > 0 for r in report["usage"])
    out = tmp_path / "r" / "report.html"
    assert run_cli(["report", "--db", str(demo_db), "--format", "html", "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(CliError, match="bad window"):
        run_cli(["report", "--db", str(demo_db), "--window", "yesterday"])


# --------------------------------------------------------------------------- headless Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and unfiltered scanlines of an 8-bit RGB/RGBA PNG (zlib + struct)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    lines: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            corner = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + pred) & 0xFF
        lines.append(bytes(line))
        prev = line
    return width, height, lines


@pytest.mark.integration
@pytest.mark.browser
@pytest.mark.prereq(CHROMIUM, "no Chromium on this machine: `make browsers` installs it")
def test_html_report_renders_in_headless_chromium(tmp_path: Path, demo_db: Path) -> None:
    page = tmp_path / "report.html"
    assert run_cli(["report", "--db", str(demo_db), "--format", "html", "-o", str(page)]) == 0
    shot = tmp_path / "shot.png"
    assert CHROMIUM is not None
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1000,1400",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    width, height, lines = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 1400)
    colours = {line[i : i + 3] for line in lines[::7] for i in range(0, len(line), 3 * 5)}
    assert len(colours) > 20, f"screenshot is (nearly) blank: {len(colours)} colours"
    # The plots drew: the palette's first bar colour (#4269d0) appears on the page.
    assert any(c == bytes.fromhex("4269d0") for c in colours)


# --------------------------------------------------------------------------- SQL CLI


def test_sql_formats_and_parquet_output(
    tmp_path: Path, demo_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "SELECT queue, count(*) AS n FROM jobs GROUP BY queue ORDER BY queue"
    assert run_cli(["sql", "--db", str(demo_db), query, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["queue"] for r in got] == ["experiments", "interactive", "training"]
    out = tmp_path / "q.parquet"
    assert run_cli(["sql", "--db", str(demo_db), query, "--format", "parquet", "-o", str(out)]) == 0
    assert pq.read_table(out).to_pylist() == got
    with pytest.raises(CliError, match="needs --output"):
        run_cli(["sql", "--db", str(demo_db), query, "--format", "parquet"])


def test_sql_shell_reads_statements_from_stdin(
    demo_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = (
        "SELECT count(*) AS jobs\n  FROM jobs;\n"
        "SELEC oops;\n"
        ".tables\n"
        "SELECT 41 + 1 AS answer\n"  # no ';' before the end of input: still run
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    assert run_cli(["sql", "--db", str(demo_db), "--format", "csv"]) == 1  # one failed
    captured = capsys.readouterr()
    assert captured.out.splitlines()[:2] == ["jobs", "287"]
    assert "fairness_slo" in captured.out and "queue_shares" in captured.out
    assert captured.out.splitlines()[-2:] == ["answer", "42"]
    assert "SQL error" in captured.err


# --------------------------------------------------------------------------- Parquet


def test_parquet_export_answers_every_view_like_the_database(
    tmp_path: Path, demo_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    assert run_cli(["export", "--db", str(demo_db), "--parquet", str(lake)]) == 0
    assert "exported" in capsys.readouterr().out
    days = sorted(p.name for p in (lake / "events").iterdir())
    assert days == ["day=0", "day=1"]  # a day of simulation plus its tail
    queries = [
        "SELECT * FROM tenant_percentiles ORDER BY queue",
        "SELECT * FROM overall_percentiles",
        "SELECT * FROM tree_percentiles ORDER BY tree_path",
        "SELECT * FROM tenant_percentiles_between(3600, 40000) ORDER BY queue",
        "SELECT * FROM fairness_slo ORDER BY queue, window_end_s",
        "SELECT * FROM fairness_slo_summary ORDER BY queue",
        "SELECT * FROM preemptions_weekly ORDER BY queue, week",
        "SELECT * FROM gpu_usage ORDER BY queue, bucket",
        "SELECT * FROM requested_not_allocated ORDER BY job",
        "SELECT * FROM throughput ORDER BY period, period_index, queue",
        "SELECT count(*), sum(allocated_gpu_milli) FROM queue_shares",
        "SELECT payload->>'$.job' AS job FROM events WHERE type = 'job_preempted' "
        'ORDER BY "offset"',
    ]
    db = connect(demo_db, read_only=True)
    parquet = open_parquet(lake)
    try:
        for sql in queries:
            expected = db.execute(sql).fetchall()
            assert parquet.execute(sql).fetchall() == expected, sql
            assert expected, f"no rows to compare for {sql}"
    finally:
        db.close()
        parquet.close()
    # The report runs on the lake as well.
    assert run_cli(["report", "--parquet", str(lake), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tenants"]) == 4
    with pytest.raises(CliError, match="no Parquet export"):
        run_cli(["sql", "--parquet", str(tmp_path), "SELECT 1"])


def test_parquet_export_of_empty_tables(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    project(ledger((0, submit("j"))), db)
    export_parquet(db, tmp_path / "lake")
    con = open_parquet(tmp_path / "lake")
    try:
        assert con.execute("SELECT count(*) FROM preemptions_weekly").fetchall() == [(0,)]
        assert con.execute("SELECT jobs FROM tenant_percentiles").fetchall() == [(1,)]
    finally:
        con.close()


# --------------------------------------------------------------------------- metrics import


def test_dcgm_dump_parses_utilisation_and_memory() -> None:
    samples = read_samples(DATA / "dcgm-exporter.prom", "dcgm")
    assert len(samples) == 8
    first = samples[0]
    assert (first.at, first.node, first.device, first.utilization_pct) == (
        1764000000000,
        "gpu-node-01",
        0,
        97,
    )
    assert first.memory_used_mib == 78211
    by_key = {(s.at, s.node, s.device): s for s in samples}
    assert by_key[(1764000030000, "gpu-node-02", 1)].memory_used_mib == 24576
    shifted = read_samples(DATA / "dcgm-exporter.prom", "dcgm", shift_ms=-1764000000000)
    assert [s.at for s in shifted] == [0] * 4 + [30000] * 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n"} 101 5', "dump:2: utilisation 101"),
        ('DCGM_FI_DEV_GPU_UTIL{Hostname="n"} 10 5', "dump:2: .*numeric 'gpu' label"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 10 5', "dump:2: .*no node label"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n"} 10', "dump:2: sample has no timestamp"),
        # The syntax is prometheus_client's parser's; its reason goes in the message.
        ('DCGM_FI_DEV_GPU_UTIL{gpu=0,Hostname="n"} 10 5', "dump:2: .*Invalid labels: gpu=0"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n} 10 5', 'dump:2: .*\'{gpu="0",Hostname="n}\''),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n"} ten 5', "dump:2: .*float: 'ten'"),
        ("this is not prometheus", "dump:2: not a Prometheus sample line"),
        ("{", "dump:2: not a Prometheus sample line"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n"} 10 5.5', "dump:2: timestamp 5.5 is not"),
        ('DCGM_FI_DEV_FB_USED{gpu="0",Hostname="n"} +Inf 5', "dump:2: memory used inf MiB"),
    ],
)
def test_dcgm_errors_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(MetricsError, match=message):
        parse_dcgm(["# HELP x\n", text + "\n"], "dump")


def test_dcgm_host_label_alternatives_and_default_time() -> None:
    lines = [
        'DCGM_FI_DEV_GPU_UTIL{gpu="2",host="a"} 12.6',
        'DCGM_FI_DEV_GPU_UTIL{gpu="3",kubernetes_node="b",Hostname=""} 7 100',
    ]
    got = [(s.at, s.node, s.device, s.utilization_pct) for s in parse_dcgm(lines, default_at=9)]
    assert got == [(9, "a", 2, 13), (100, "b", 3, 7)]


def test_dcgm_timestamps_stay_milliseconds_and_labels_unescape() -> None:
    # prometheus_client reads a timestamp as seconds (ms / 1000); the samples keep the ms.
    lines = [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n \\"x\\""} 50 1764000000123',
        'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="n \\"x\\""} 4096.4 1764000000123',
        'DCGM_FI_DEV_GPU_UTIL{Hostname="n2",gpu="1"} 1 -5',
    ]
    got = [
        (s.at, s.node, s.device, s.utilization_pct, s.memory_used_mib) for s in parse_dcgm(lines)
    ]
    assert got == [(-5, "n2", 1, 1, 0), (1764000000123, 'n "x"', 0, 50, 4096)]


def test_csv_samples_and_errors() -> None:
    good = ["timestamp_ms,node,gpu,utilization_pct,memory_used_mib\n", "5,n1,0,50,1024\n"]
    (s,) = parse_csv(good, "u.csv")
    assert (s.at, s.node, s.device, s.utilization_pct, s.memory_used_mib) == (5, "n1", 0, 50, 1024)
    with pytest.raises(MetricsError, match=r"u\.csv:1: header lacks gpu"):
        parse_csv(["timestamp_ms,node,utilization_pct\n"], "u.csv")
    with pytest.raises(MetricsError, match=r"u\.csv:3: timestamp_ms and gpu must be integers"):
        parse_csv([good[0], good[1], "x,n1,0,50,1\n"], "u.csv")
    with pytest.raises(MetricsError, match=r"u\.csv:2: utilisation -3"):
        parse_csv([good[0], "5,n1,0,-3,1\n"], "u.csv")


def test_metrics_import_into_a_ledger_then_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scheduler's ledger plus imported DCGM samples project into utilised GPU-hours."""
    ledger_dir = tmp_path / "ledger"
    writer = FileLedger.open(ledger_dir)
    # The two-GPU run of test_history on node n1; its samples come from a CSV instead.
    writer.append(
        [env for _, env in two_gpu_run().records if env.type != "gpu_utilization_sampled"]
    )
    writer.close()
    csv_file = tmp_path / "util.csv"
    csv_file.write_text(
        "timestamp_ms,node,gpu,utilization_pct,memory_used_mib\n"
        "600000,n1,0,50,1000\n600000,n1,1,0,0\n900000,n1,0,100,1000\n"
    )
    argv = ["metrics", "import", "--format", "csv", str(csv_file), "--ledger", str(ledger_dir)]
    assert run_cli(argv) == 0
    assert "imported 3 GPU utilisation samples from 1 node(s)" in capsys.readouterr().out
    db = tmp_path / "p.duckdb"
    project(LedgerDirReader(ledger_dir), db)
    (h0,) = rows(db, "SELECT * FROM gpu_usage WHERE bucket = 0")
    assert h0["utilisation"] == pytest.approx(0.5)
    assert h0["utilised_gpu_hours"] == pytest.approx(450 / 3600)

    dump = DATA / "dcgm-exporter.prom"
    argv = ["metrics", "import", "--format", "dcgm", str(dump), "--ledger", str(ledger_dir)]
    assert run_cli(argv) == 0
    project(LedgerDirReader(ledger_dir), db)
    assert rows(db, "SELECT count(*) AS n FROM gpu_utilization") == [{"n": 11}]
    bad = tmp_path / "bad.prom"
    bad.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n"} 250 1\n')
    with pytest.raises(CliError, match=r"bad\.prom:1: utilisation 250"):
        run_cli(["metrics", "import", "--format", "dcgm", str(bad), "--ledger", str(ledger_dir)])
    with pytest.raises(CliError, match="cannot open ledger"):
        run_cli(
            ["metrics", "import", "--format", "dcgm", str(dump), "--ledger", str(tmp_path / "x")]
        )


def test_duckdb_reads_the_view_definitions_back(demo_db: Path) -> None:
    """The views are stored in the file: any DuckDB client can use them."""
    con = duckdb.connect(str(demo_db), read_only=True)
    try:
        names = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    finally:
        con.close()
    assert {"fairness_slo", "gpu_usage", "preemptions_weekly", "throughput"} <= names
