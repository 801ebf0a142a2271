"""Console benchmark: ``gpuledger serve`` over a large ledger, its pages and API timed.

``rows(ledger, db)`` writes the ledger's records to a ledger directory, starts ``gpuledger
serve`` on it and the already projected ``db`` (so nothing is left to project), and times
the Jobs and Queues pages and their API calls over HTTP: ``REQUESTS`` sequential requests
each after one warm-up, p50 and p95; then the Tenants page at two past moments, its first
request (which projects the ledger up to the moment) timed apart from the cached ones.
The server's resident memory (VmRSS) while it serves is reported beside. ``python -m
bench.console [--quick]`` runs it alone on the month-scale simulator ledger of
``bench.__main__``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.measure import status_mib
from events.filelog import FileLedger
from events.memlog import MemoryLedger

P95_MS_TARGET = 300
REQUESTS = 40
PATHS = (
    "/api/queues",
    "/api/jobs",
    "/api/jobs?status=succeeded&page=200",
    "/queues",
    "/jobs",
    "/jobs?status=succeeded&page=200",
)


def _rss_mib(pid: int) -> float:
    return status_mib(pid, "VmRSS", float("nan"))


def rows(ledger: MemoryLedger, db: Path) -> list[dict[str, Any]]:
    """Bench rows for the console serving ``ledger`` from its projection ``db``."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-console-bench-") as tmp:
        directory = Path(tmp) / "ledger"
        writer = FileLedger.open(directory)
        try:
            for start in range(0, len(ledger.records), 100_000):
                writer.append(ledger.records[start : start + 100_000])
        finally:
            writer.close()
        gpuledger = str(Path(sys.executable).parent / "gpuledger")
        proc = subprocess.Popen(
            [
                gpuledger,
                "serve",
                "--ledger",
                str(directory),
                "--db",
                str(db),
                "--listen",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split("console on ", 1)[1].split()[0]
            jobs = 0
            for path in PATHS:
                with urllib.request.urlopen(url + path, timeout=120) as r:  # warm-up
                    body = r.read()
                if path == "/api/jobs":
                    import json  # noqa: PLC0415

                    jobs = json.loads(body)["total"]
                times = _timed_gets(url + path)
                detail = f"p50 {statistics.median(times):,.0f} ms, {REQUESTS} requests"
                out.append(_latency_row(path, times, detail))
            serving = _rss_mib(proc.pid)
            out.extend(_tenants_then(url, len(ledger.records)))
            out.append(
                {
                    "benchmark": "console memory while serving",
                    "figure": f"{serving:,.0f} MiB",
                    "target": "",
                    "ratio": 1.0,
                    "fifo": "",
                    "detail": f"{len(ledger.records):,} events, {jobs:,} jobs (VmRSS); "
                    f"{_rss_mib(proc.pid):,.0f} MiB after the Tenants time travels",
                }
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return out


def _tenants_then(url: str, records: int) -> list[dict[str, Any]]:
    """The Tenants page at past moments: the first request projects the ledger's prefix
    (half the ledger; then three quarters, onwards from the half's projection), the
    next ones answer from the cache."""
    out: list[dict[str, Any]] = []
    for share in (2, 4 / 3):
        path = f"/tenants?at={int(records / share)}"
        started = time.perf_counter()
        with urllib.request.urlopen(url + path, timeout=1800) as r:
            r.read()
        first_s = time.perf_counter() - started
        times = _timed_gets(url + path)
        detail = (
            f"first (projects the prefix) {first_s:,.1f} s, "
            f"then p50 {statistics.median(times):,.0f} ms"
        )
        out.append(_latency_row(path, times, detail))
    return out


def _timed_gets(url: str) -> list[float]:
    """Milliseconds of each of ``REQUESTS`` sequential GETs of ``url``."""
    times = []
    for _ in range(REQUESTS):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            r.read()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _latency_row(path: str, times: list[float], detail: str) -> dict[str, Any]:
    """The bench row of a page's request times: p95 against ``P95_MS_TARGET``."""
    p95 = statistics.quantiles(times, n=20)[-1]
    return {
        "benchmark": f"console GET {path}",
        "figure": f"p95 {p95:,.0f} ms",
        "target": f"<= {P95_MS_TARGET} ms",
        "ratio": P95_MS_TARGET / max(p95, 1e-6),
        "fifo": "",
        "detail": detail,
    }


def main(argv: Sequence[str] | None = None) -> int:
    from bench.__main__ import _simulate  # noqa: PLC0415
    from projections.projector import project  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m bench.console")
    parser.add_argument("--quick", action="store_true", help="a tenth of the month")
    args = parser.parse_args(argv)
    _, ledger = _simulate("gpuledger", 0.1 if args.quick else 1.0)
    if len(ledger.records) > 1_000_000:
        ledger = MemoryLedger(ledger.records[:1_000_000], name="bench")
    with tempfile.TemporaryDirectory(prefix="gpuledger-console-bench-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        project(ledger, db)
        for row in rows(ledger, db):
            print(
                f"{row['benchmark']:<48} {row['figure']:>12}  {row['target']:<10} {row['detail']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
