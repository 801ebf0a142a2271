"""``gpuledger serve``: the console in a real browser (headless system Chromium through
Playwright), its JSON API, and ``sql``/``report`` asking it instead of the file.

One server runs for the module over the fintech example's ledger plus a hostile queue and
job (their names are HTML); its numbers are checked against SQL over an independent
projection of the same ledger. The browser tests skip only when no Chromium is installed
(``make browsers`` installs it), and under CI they fail instead (tests/prereq.py). Screenshots of every page go to ``$GPULEDGER_SCREENSHOTS``
(default ``out/screenshots``); docs/img holds the ones the README shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from events.codec import wrap
from events.filelog import FileLedger
from events.model import JobSubmitted, PodSpec, QueueConfigured, Resources
from events.sources import open_reader
from projections.projector import project
from replay.metrics import collect, tenant_rows
from tests.prereq import require
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

GPULEDGER = str(Path(sys.executable).parent / "gpuledger")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE_QUEUE = "<script>window.pwned=1</script>"
HOSTILE_JOB = '<img src=x onerror="window.pwned=2">'
SHOTS = Path(os.environ.get("GPULEDGER_SCREENSHOTS", "out/screenshots"))
CHART_JS = Path(__file__).parent.parent / "projections/console/static/vendor/chart.umd.js"


def _append(ledger: Path, events: list[Any], at: int) -> None:
    writer = FileLedger.open(ledger, create=False)
    try:
        writer.append([wrap(e, at + i) for i, e in enumerate(events)])
    finally:
        writer.close()


def _last_at(ledger: Path) -> int:
    reader = open_reader(ledger)
    try:
        return max(env.at for _, env in reader.read(0))
    finally:
        reader.close()


def _job(name: str, queue: str, gpus: int = 1) -> JobSubmitted:
    return JobSubmitted(
        job=name, queue=queue, pods=(PodSpec(name=f"{name}-0", gpu_milli=gpus * 1000),)
    )


class Server:
    """A ``gpuledger serve`` subprocess; ``url`` is where it listens."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [GPULEDGER, "serve", "--listen", "127.0.0.1:0", "--interval", "0.2", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.stderr = ""
        line = self.proc.stdout.readline()
        if "console on " not in line:
            self.stop()
            raise AssertionError(f"serve did not start: {line!r} {self.stderr}")
        self.url = line.split("console on ", 1)[1].split()[0]

    def get(self, path: str, token: str | None = None) -> Any:
        request = urllib.request.Request(self.url + path)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr = self.proc.stderr.read() if self.proc.stderr else ""


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("console")
    subprocess.run(
        [GPULEDGER, "example", "fintech", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    path = out / "fintech" / "gpuledger" / "ledger"
    at = _last_at(path) + 1000
    _append(
        path,
        [
            QueueConfigured(queue=HOSTILE_QUEUE, deserved=Resources(gpu_milli=1000)),
            _job(HOSTILE_JOB, HOSTILE_QUEUE, gpus=64),  # more than fits: it stays pending
        ],
        at,
    )
    return path


@pytest.fixture(scope="module")
def server(ledger: Path) -> Iterator[Server]:
    srv = Server("--ledger", str(ledger))
    yield srv
    srv.stop()


def _sql(ledger: Path, tmp: Path, query: str, params: list[Any] | None = None) -> list[Any]:
    """The same question over an independent projection of the ledger."""
    db = tmp / "independent.duckdb"
    reader = open_reader(ledger)
    try:
        project(reader, db)
    finally:
        reader.close()
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(query, params or []).fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------- without a browser


def test_api_numbers_equal_sql(server: Server, ledger: Path, tmp_path: Path) -> None:
    queues = {q["queue"]: q for q in server.get("/api/queues")}
    expected = _sql(
        ledger,
        tmp_path,
        "SELECT queue, count(*), count(*) FILTER (WHERE status = 'pending'), "
        "quantile_cont(time_to_ready_s, 0.9) FROM jobs GROUP BY queue",
    )
    assert {q for q, *_ in expected} <= queues.keys()
    for queue, jobs, pending, p90 in expected:
        assert queues[queue]["jobs"] == jobs
        assert queues[queue]["pending_jobs"] == pending
        assert queues[queue]["p90_ttr_s"] == (pytest.approx(p90) if p90 is not None else None)
    page = server.get("/api/jobs?status=succeeded&per_page=7&page=2")
    (total,) = _sql(ledger, tmp_path, "SELECT count(*) FROM jobs WHERE status = 'succeeded'")[0]
    assert page["total"] == total and len(page["rows"]) == 7
    assert {r["status"] for r in page["rows"]} == {"succeeded"}
    between = server.get("/api/jobs?from=2h&to=3h&queue=interactive")
    (count,) = _sql(
        ledger,
        tmp_path,
        "SELECT count(*) FROM jobs WHERE queue = 'interactive' "
        "AND submitted_at_s >= 7200 AND submitted_at_s < 10800",
    )[0]
    assert between["total"] == count > 0
    with pytest.raises(urllib.error.HTTPError) as bad:
        server.get("/api/jobs?from=yesterday")
    assert bad.value.code == 400
    assert "'yesterday'" in json.loads(bad.value.read())["error"]


def test_sql_and_report_go_through_the_server(server: Server, ledger: Path, tmp_path: Path) -> None:
    db = ledger.parent / "history.duckdb"
    # --db finds the running server (the file is locked by it); --server names it.
    for source in (["--db", str(db)], ["--server", server.url]):
        done = subprocess.run(
            [GPULEDGER, "sql", *source, "--format", "json", "SELECT count(*) AS n FROM jobs"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["n"] == server.get("/api/jobs")["total"]
    report = subprocess.run(
        [GPULEDGER, "report", "--server", server.url, "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    tenants = {t["queue"]: t for t in json.loads(report.stdout)["tenants"]}
    assert tenants[HOSTILE_QUEUE]["jobs"] == 1
    # the table through the console is the table from (an independent projection of) the file
    _sql(ledger, tmp_path, "SELECT 1")
    texts = [
        subprocess.run(
            [GPULEDGER, "report", *source], capture_output=True, text=True, check=True
        ).stdout
        for source in (["--server", server.url], ["--db", str(tmp_path / "independent.duckdb")])
    ]
    assert texts[0] == texts[1]
    refused = subprocess.run(
        [GPULEDGER, "sql", "--server", server.url, "DELETE FROM jobs"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "read-only" in refused.stderr
    assert server.get("/api/jobs")["total"] == tenants["all"]["jobs"]


def test_non_local_bind_needs_a_token(ledger: Path, tmp_path: Path) -> None:
    refused = subprocess.run(
        [
            GPULEDGER,
            "serve",
            "--ledger",
            str(ledger),
            "--db",
            str(tmp_path / "a.duckdb"),
            "--listen",
            "0.0.0.0:0",
        ],
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "GPULEDGER_TOKEN"},
    )
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in refused.stderr
    assert not (tmp_path / "a.duckdb").exists()
    srv = Server("--ledger", str(ledger), "--db", str(tmp_path / "b.duckdb"), "--token", "s3cret")
    try:
        with pytest.raises(urllib.error.HTTPError) as denied:
            srv.get("/api/status")
        assert denied.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            srv.get("/api/status", token="wrong")
        assert srv.get("/api/status", token="s3cret")["next_offset"] > 0
    finally:
        srv.stop()


def test_concurrent_readers_while_the_ledger_grows(ledger: Path, tmp_path: Path) -> None:
    """20 API readers and a `sql --server` shell while records are appended: every request
    is answered and the follower keeps up to the ledger's end."""
    srv = Server("--ledger", str(ledger), "--db", str(tmp_path / "c.duckdb"))
    stop = threading.Event()
    answered: list[int] = []
    failures: list[str] = []
    paths = ["/api/queues", "/api/jobs?page=2", "/api/nodes", "/api/tenants", "/api/status"]

    def reader(i: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                srv.get(paths[(i + n) % len(paths)])
                n += 1
            except Exception as exc:
                failures.append(f"{paths[(i + n) % len(paths)]}: {exc}")
                return
        answered.append(n)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    shell = subprocess.Popen(
        [GPULEDGER, "sql", "--server", srv.url, "--format", "csv"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        at = _last_at(ledger) + 1000
        for i in range(10):
            _append(ledger, [_job(f"grow-{i:02d}", "training")], at + i * 1000)
            time.sleep(0.3)  # intentional: the ledger grows over 3 s while the readers run
        out, err = shell.communicate("SELECT count(*) AS n FROM jobs;\n.tables\n", timeout=60)
        assert shell.returncode == 0, err
        assert "jobs" in out
        end = FileLedger.open(ledger, create=False)
        try:
            end_offset = end.end_offset()
        finally:
            end.close()
        wait_until(
            lambda: srv.get("/api/status")["next_offset"] >= end_offset,
            10,
            f"the console's follower to reach the ledger's end ({end_offset})",
            detail=lambda: srv.get("/api/status"),
        )
        status = srv.get("/api/status")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        srv.stop()
    assert not failures, failures[:3]
    assert len(answered) == 20 and min(answered) > 0
    assert status["next_offset"] == end_offset and status["follower_error"] == ""
    assert srv.proc.returncode == 0, srv.stderr  # SIGTERM: a clean stop
    assert not (tmp_path / "c.duckdb.console.json").exists()


# --------------------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(CHROMIUM, "no Chromium on this machine: `make browsers` installs it")
    require(
        importlib.util.find_spec("playwright") is not None,
        "playwright is not installed: pip install -e '.[dev]' (make test does)",
    )
    import playwright.sync_api as playwright

    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    yield pg
    context.close()


def _shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"console-{name}.png"), full_page=False)


def test_every_page_renders(server: Server, page: Any) -> None:
    for name, heading in (
        ("queues", "Queues"),
        ("jobs", "Jobs"),
        ("nodes", "Nodes"),
        ("tenants", "Tenants"),
    ):
        page.goto(f"{server.url}/{name}")
        assert page.locator("h1").inner_text() == heading
        if name == "tenants" and CHART_JS.exists():  # scripts/console-assets.sh put it there
            page.wait_for_function("window.Chart && Chart.getChart('chart-ttr') !== undefined")
        if name != "tenants":  # shown at a past moment (test_tenants_time_travel_…)
            _shot(page, name)
    page.goto(f"{server.url}/nodes")
    assert page.locator("section.node").count() == len(server.get("/api/nodes"))


def test_charts_read_as_the_tables_do(server: Server, page: Any) -> None:
    """Time axes in the unit that fits (the fintech run's waits run to hours, not 12,000
    seconds), and each queue's fair-share line in the colour of its allocated line."""
    if not CHART_JS.exists():
        pytest.fail("Chart.js is missing: scripts/console-assets.sh puts it in place")
    page.goto(f"{server.url}/tenants")
    page.wait_for_function("window.Chart && Chart.getChart('chart-ttr') !== undefined")
    unit = page.evaluate("Chart.getChart('chart-ttr').options.scales.y.title.text")
    largest = page.evaluate(
        "Math.max(...Chart.getChart('chart-ttr').data.datasets.flatMap(d => d.data.map(v => v || 0)))"
    )
    assert unit in ("min", "h", "d") and largest < 200
    # The axis's unit is the one the table writes its largest time to ready in.
    cells = page.locator("#tenants td[data-col$=_ttr_s]")
    texts = [cells.nth(i).inner_text() for i in range(cells.count())]
    values = [float(cells.nth(i).get_attribute("data-value") or 0) for i in range(cells.count())]
    assert texts[values.index(max(values))].endswith(f" {unit}")
    assert page.locator("figcaption").first.inner_text().endswith(f"({unit})")
    pairs = page.evaluate(
        "Chart.getChart('chart-alloc').data.datasets.map(d => [d.label, d.borderColor])"
    )
    colour = dict(pairs)
    queues = {label.rsplit(" ", 1)[0] for label, _ in pairs}
    assert len(queues) > 1
    for queue in queues:
        assert colour[f"{queue} allocated"] == colour[f"{queue} fair"]
    assert len({colour[f"{q} allocated"] for q in queues}) == len(queues)


def test_page_numbers_equal_sql(server: Server, page: Any, ledger: Path, tmp_path: Path) -> None:
    rows = _sql(
        ledger,
        tmp_path,
        "SELECT queue, count(*), quantile_cont(time_to_ready_s, 0.9), "
        "quantile_cont(completion_s, 0.5) FROM jobs GROUP BY queue",
    )
    page.goto(f"{server.url}/tenants")
    for queue, jobs, p90_ttr, p50_done in rows:
        row = page.locator("#tenants tr").filter(has=page.get_by_text(queue, exact=True))
        assert row.locator("[data-col=jobs]").inner_text() == str(jobs)
        for col, value in (("p90_ttr_s", p90_ttr), ("p50_completion_s", p50_done)):
            shown = row.locator(f"[data-col={col}]").get_attribute("data-value")
            assert (float(shown) if shown else None) == (
                pytest.approx(value) if value is not None else None
            )
    page.goto(f"{server.url}/jobs?status=succeeded")
    (total,) = _sql(ledger, tmp_path, "SELECT count(*) FROM jobs WHERE status = 'succeeded'")[0]
    assert page.locator("#total").inner_text().startswith(f"{total} jobs")
    held = dict(
        _sql(
            ledger,
            tmp_path,
            "SELECT node, sum(gpu_milli) / 1000 FROM allocations WHERE to_ms IS NULL GROUP BY 1",
        )
    )
    page.goto(f"{server.url}/nodes")
    for node, gpus in held.items():
        title = page.locator(f'section[data-node="{node}"] h2 small').inner_text()
        assert title.split(" · ")[1].startswith(f"{gpus:,.2f}/")


def test_job_timeline_equals_log_cat(server: Server, page: Any, ledger: Path) -> None:
    job = "priya-finetune"
    cat = subprocess.run(
        [GPULEDGER, "log", "cat", str(ledger)], capture_output=True, text=True, check=True
    )
    expected = [
        (r["offset"], r["type"])
        for r in map(json.loads, cat.stdout.splitlines())
        if r["key"] == job
    ]
    assert len(expected) >= 4
    page.goto(f"{server.url}/jobs/{job}")
    items = page.locator("#timeline li")
    shown = [
        (int(items.nth(i).get_attribute("data-offset")), items.nth(i).get_attribute("data-type"))
        for i in range(items.count())
    ]
    assert shown == expected
    # each line links to its ledger record
    first = items.first.locator("a.offset")
    record = server.get(first.get_attribute("href"))
    assert (record["offset"], record["type"]) == expected[0]
    _shot(page, "job")


def test_hostile_names_are_text(server: Server, page: Any) -> None:
    page.goto(f"{server.url}/queues")
    cell = page.locator("#queues td.name a").filter(has_text="<script>")
    assert cell.inner_text() == HOSTILE_QUEUE
    page.goto(f"{server.url}/jobs?status=pending")
    assert page.locator("#jobs td a").filter(has_text="<img").inner_text() == HOSTILE_JOB
    page.goto(f"{server.url}/tenants")
    assert page.evaluate("window.pwned") is None


def test_live_update_within_two_seconds(server: Server, page: Any, ledger: Path) -> None:
    page.goto(f"{server.url}/jobs")
    before = int(page.locator("#offset").inner_text())
    _append(ledger, [_job("late-arrival", "training")], _last_at(ledger) + 1000)
    appended = time.monotonic()
    page.locator('#jobs tr[data-job="late-arrival"]').wait_for(timeout=2000)
    assert time.monotonic() - appended < 2.0
    assert int(page.locator("#offset").inner_text()) > before


def _state_tables(text: str) -> tuple[str, dict[str, list[str]]]:
    """`gpuledger state` output: its headline and the first column of each table."""
    lines = text.splitlines()
    tables: dict[str, list[str]] = {}
    current = ""
    for line in lines[1:]:
        if line.endswith(":") and " " not in line:
            current = line[:-1]
            tables[current] = []
        elif current and line and not line.startswith(("-", "job ", "queue ", "  (none)")):
            tables[current].append(line.split()[0])
    return lines[0], tables


def test_time_travel_equals_state_at(server: Server, page: Any, ledger: Path) -> None:
    done = subprocess.run(
        [GPULEDGER, "state", "--ledger", str(ledger), "--at", "6h"],
        capture_output=True,
        text=True,
        check=True,
    )
    headline, tables = _state_tables(done.stdout)
    assert tables["running"], "the example should have jobs running at 6h"
    page.goto(f"{server.url}/jobs?at=6h")
    assert headline in page.locator("#headline").inner_text()
    for ident in ("running", "pending"):
        shown = page.locator(f"#{ident} tr[data-job]")
        names = [shown.nth(i).get_attribute("data-job") for i in range(shown.count())]
        assert names == tables[ident]
    # Every cell as the CLI prints it: the moment, GPUs, and how long each job had run
    # ("for": one duration formatter for the terminal and the page).
    printed = [
        re.split(r" {2,}", line.strip())
        for line in done.stdout.split("\nrunning:\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    ]
    rows = page.locator("#running tr[data-job]")
    cells = [
        [c.strip() for c in rows.nth(i).locator("td").all_inner_texts()]
        for i in range(rows.count())
    ]
    assert cells == printed and any(re.fullmatch(r"\d+\.\d (s|min|h|d)", c[-1]) for c in cells)
    page.goto(f"{server.url}/queues?at=6h")
    rows = page.locator("#queues-then tr[data-queue]")
    assert [rows.nth(i).get_attribute("data-queue") for i in range(rows.count())] == tables[
        "queues"
    ]
    # the slider: moving it to the first record shows the cluster before anything ran
    page.goto(f"{server.url}/nodes?at=6h")
    _shot(page, "nodes")
    assert page.locator(".slot").count() > 0
    page.locator("#travel-slider").fill("0")
    page.wait_for_url("**/nodes?at=0s")
    assert page.locator(".slot").count() == 0


def _report_of_prefix(ledger: Path, end: int, tmp: Path) -> dict[str, Any]:
    """`gpuledger report` over the ledger truncated before ``end``: `log export --until`,
    then `project`, then `report --format json`."""
    jsonl, db = tmp / f"prefix-{end}.jsonl", tmp / f"prefix-{end}.duckdb"
    for args in (
        ["log", "export", str(ledger), "--until", str(end), "--out", str(jsonl)],
        ["project", "--ledger", str(jsonl), "--db", str(db)],
    ):
        subprocess.run([GPULEDGER, *args], capture_output=True, check=True)
    done = subprocess.run(
        [GPULEDGER, "report", "--db", str(db), "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


PERCENTILES = tuple(f"p{q}_{what}_s" for what in ("ttr", "completion") for q in (50, 90, 95, 99))


def _tenant_cells(page: Any) -> dict[str, dict[str, Any]]:
    """The Tenants table as shown: per queue, the job counts and each percentile."""
    out: dict[str, dict[str, Any]] = {}
    rows = page.locator("#tenants tr[data-queue]")
    for i in range(rows.count()):
        row = rows.nth(i)
        cells: dict[str, Any] = {"jobs": int(row.locator("[data-col=jobs]").inner_text())}
        cells["ready"] = int(row.locator("td").nth(2).inner_text())
        for col in PERCENTILES:
            shown = row.locator(f"[data-col={col}]").get_attribute("data-value")
            cells[col] = float(shown) if shown else None
        out[str(row.get_attribute("data-queue"))] = cells
    return out


def test_tenants_time_travel_equals_report_of_the_truncated_ledger(
    server: Server, page: Any, ledger: Path, tmp_path: Path
) -> None:
    """Tenants at 6 h is `gpuledger report` (and replay.metrics) over the ledger cut at
    6 h, not today's tables filtered by time: a job that became ready after 6 h is still
    waiting there."""
    moment = 6 * 3_600_000
    reader = open_reader(ledger)
    try:
        records = list(reader.read(0))
    finally:
        reader.close()
    # state --at folds the records up to the first one later than the moment
    end = next(offset for offset, env in records if env.at > moment)
    expected = _report_of_prefix(ledger, end, tmp_path)
    # the API answers with exactly the truncated ledger's report, for both forms of `at`
    assert server.get("/api/report?at=6h") == expected
    assert server.get(f"/api/report?at={end}") == expected

    page.goto(f"{server.url}/tenants?at=6h")
    assert int(page.locator("#moment").get_attribute("data-end-offset")) == end
    if CHART_JS.exists():
        page.wait_for_function("window.Chart && Chart.getChart('chart-ttr') !== undefined")
    _shot(page, "tenants")
    then = _tenant_cells(page)
    wanted = {t["queue"]: t for t in expected["tenants"]}
    assert then.keys() == wanted.keys() and HOSTILE_QUEUE not in then
    for queue, cells in then.items():
        for col in ("jobs", "ready", *PERCENTILES):
            value = wanted[queue][col]
            assert cells[col] == (pytest.approx(value) if value is not None else None), (
                queue,
                col,
            )
    # the same figures from the one outcome fold, replay.metrics, over the prefix
    for row in tenant_rows(collect((o, e) for o, e in records if o < end)):
        cells = then[str(row["queue"])]
        assert cells["jobs"] == row["jobs"] and cells["ready"] == row["ready"]
        for mine, theirs in (("ttr", "ttr"), ("completion", "done")):
            for q in (50, 90, 99):
                value = row[f"{theirs}_p{q}_s"]
                assert cells[f"p{q}_{mine}_s"] == (
                    pytest.approx(value) if value is not None else None
                )
    # a job submitted before 6 h and ready after it counts as waiting then, not as ready
    later = _sql(
        ledger,
        tmp_path,
        "SELECT queue, count(*) FILTER (WHERE ready_at_ms <= ?), "
        "count(*) FILTER (WHERE ready_at_ms IS NOT NULL) FROM jobs "
        "WHERE submitted_at_ms <= ? GROUP BY queue",
        [moment, moment],
    )
    assert any(ready_then < ready_ever for _, ready_then, ready_ever in later)
    for queue, ready_then, _ in later:
        assert then[queue]["ready"] == ready_then
    # the SLO, the preemption audit and GPU-hours are the truncated ledger's too
    assert page.locator("#slo tr[data-queue]").count() == len(expected["slo"])
    assert page.locator("#audit tbody tr").count() == len(expected["preemption_audit"])
    usage = {u["queue"]: u for u in expected["usage"]}
    cells = page.locator("#usage tr[data-queue]")
    for i in range(cells.count()):
        row = cells.nth(i)
        shown = row.locator("[data-col=allocated_gpu_hours]").inner_text()
        assert shown == f"{usage[row.get_attribute('data-queue')]['allocated_gpu_hours']:,.2f}"
    # and it differs from the present where the ledger went on
    page.goto(f"{server.url}/tenants")
    now = _tenant_cells(page)
    assert now["all"]["jobs"] > then["all"]["jobs"]
    assert any(now[q]["p90_ttr_s"] != then[q]["p90_ttr_s"] for q in then)
    # the time-travel field on the Tenants page stays on it (and keeps the window)
    page.goto(f"{server.url}/tenants?window=7d")
    page.locator("#travel-at").fill(f"{end}")
    page.locator("#travel button").click()
    page.wait_for_url(f"**/tenants?at={end}&window=7d")
    assert _tenant_cells(page)["all"]["p90_ttr_s"] == then["all"]["p90_ttr_s"]


def test_whatif_runs_in_a_worker_and_leaves_the_ledger(
    server: Server, page: Any, ledger: Path
) -> None:
    before = server.get("/api/status")["next_offset"]
    page.goto(f"{server.url}/whatif")
    page.select_option("select[name=policy_name]", "fifo")
    page.locator("form.whatif button").click()
    page.wait_for_url("**/whatif/*")
    run = page.locator("#whatif-run")
    assert run.get_attribute("data-state") in ("running", "done")
    page.locator('#whatif-run[data-state="done"]').wait_for(timeout=120_000)
    table = page.locator("#whatif-table").inner_text()
    assert "training" in table and "->" in table
    fates = page.locator("table", has_text="ttr_before_s").inner_text()
    assert re.search(r"\d+\.\d (s|min|h|d)\b", fates)  # durations in human units
    assert not re.search(r"\d+\.\d{3}\b", fates)  # never 27432.192 seconds
    _shot(page, "whatif")
    run_id = int(page.url.rsplit("/", 1)[1])
    report = server.get(f"/api/whatif/{run_id}")
    assert report["report"]["changes"] == ["policy gpuledger -> fifo"]
    # it wrote its own ledger, never the served one
    writer = FileLedger.open(ledger, create=False)
    try:
        assert writer.end_offset() == before
    finally:
        writer.close()
    # a cross-site form post is refused
    request = urllib.request.Request(
        server.url + "/whatif",
        data=b"policy_name=fifo",
        headers={"Origin": "http://elsewhere.example"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 403


def test_a_moment_past_the_ledgers_end_is_refused(server: Server) -> None:
    """Not the end's figures shown as those of a later moment (``t=8.5536e+06s``)."""
    with pytest.raises(urllib.error.HTTPError) as late:
        server.get("/api/report?at=99d")
    assert late.value.code == 400
    assert "past the ledger's end" in json.loads(late.value.read())["error"]


def test_forecasts_read_as_the_cli_prints_them(server: Server, page: Any, ledger: Path) -> None:
    """The Jobs page at 6 h shows each pending job's position and forecast start, the
    Forecast page lists the same, and both are what `gpuledger forecast --at 6h --json`
    prints; the will-it-fit form refuses a job as the scheduler would."""
    done = subprocess.run(
        [GPULEDGER, "forecast", "--ledger", str(ledger), "--at", "6h", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    printed = {row["job"]: row for row in json.loads(done.stdout)["jobs"]}
    assert printed, "the example should have jobs pending at 6h"
    page.goto(f"{server.url}/jobs?at=6h")
    rows = page.locator("#pending tr[data-job]")
    shown = {
        rows.nth(i).get_attribute("data-job"): (
            rows.nth(i).locator("[data-col=position]").inner_text(),
            rows.nth(i).locator("[data-col=forecast]").inner_text(),
        )
        for i in range(rows.count())
    }
    assert shown == {job: (str(r["position"]), r["start"]) for job, r in printed.items()}
    page.goto(f"{server.url}/forecast?at=6h")
    listed = page.locator("#forecasts tr[data-job]")
    assert [listed.nth(i).get_attribute("data-job") for i in range(listed.count())] == list(printed)
    assert server.get("/api/forecasts?at=6h")["jobs"] == list(printed.values())
    page.fill(
        "textarea[name=job]", "jobs:\n  - {name: nope, queue: ghost, at_s: 0, runtime_s: 60}\n"
    )
    page.click("form.whatif button")
    assert "unknown queue 'ghost'" in page.locator("#new-job").inner_text()
