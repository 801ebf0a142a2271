"""The console's SQL sandbox against a running ``gpuledger serve``: queries see the projection
and nothing of the host, and every query is bounded (time, rows, concurrency); SIGTERM ends
the server promptly while queries run.

"No file outside the database is opened" is checked with the kernel's word for it: an
inotify watch on a directory the test owns, holding a canary file. Every hostile query
names the canary (or its directory); any open, read or listing of either shows up as an
inotify event, whatever DuckDB function did it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import signal
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_console import GPULEDGER, Server

pytestmark = pytest.mark.slow

IN_ACCESS, IN_OPEN = 0x1, 0x20
LOCAL = ("--listen", "127.0.0.1:0")


class Inotify:
    """An inotify watch on one directory: ``events()`` drains what happened in it."""

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self.fd, bytes(directory), IN_ACCESS | IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")

    def events(self) -> list[tuple[int, str]]:
        found: list[tuple[int, str]] = []
        while select.select([self.fd], [], [], 0.2)[0]:
            data = os.read(self.fd, 65536)
            at = 0
            while at < len(data):
                _wd, mask, _cookie, size = struct.unpack_from("iIII", data, at)
                name = data[at + 16 : at + 16 + size].rstrip(b"\0").decode()
                found.append((mask, name))
                at += 16 + size
        return found

    def close(self) -> None:
        os.close(self.fd)


class Console(Server):
    """A ``gpuledger serve`` subprocess on its own database, with the given SQL options."""

    def __init__(self, ledger: Path, db: Path, *args: str) -> None:
        self.db = db
        super().__init__("--ledger", str(ledger), "--db", str(db), *args)

    def sql(self, query: str) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            self.url + "/api/sql",
            data=json.dumps({"query": query}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sandbox")
    subprocess.run([GPULEDGER, "example", "fintech", "--out", str(out)], check=True)
    return out / "fintech" / "gpuledger" / "ledger"


@pytest.fixture(scope="module")
def console(ledger: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    srv = Console(
        ledger,
        tmp_path_factory.mktemp("db") / "history.duckdb",
        "--sql-timeout",
        "2",
        "--sql-concurrency",
        "2",
    )
    yield srv
    srv.stop()


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[tuple[Path, Inotify]]:
    home = tmp_path / "host"
    home.mkdir()
    secret = home / "canary.csv"
    secret.write_text("secret\ncanary-7f3a9c\n")
    watch = Inotify(home)
    yield secret, watch
    watch.close()


# Each row: a query that tries to reach beyond the projection, and what the refusal says.
# {canary} is the canary file, {home} its directory.
HOSTILE = [
    ("read_csv", "SELECT * FROM read_csv('{canary}')", "reads only the projection"),
    ("read_text", "SELECT content FROM read_text('{canary}')", "reads only the projection"),
    ("read_blob", "SELECT content FROM read_blob('{canary}')", "reads only the projection"),
    ("glob", "SELECT * FROM glob('{home}/*')", "reads only the projection"),
    ("read_parquet", "SELECT * FROM read_parquet('{home}/x.parquet')", "reads only the projection"),
    ("read_json", "SELECT * FROM read_json_auto('{canary}')", "reads only the projection"),
    ("url", "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')", "reads only the projection"),
    ("httpfs", "SELECT * FROM read_parquet('https://example.com/x.parquet')", "projection"),
    ("set", "SET enable_external_access = true", "not SET"),
    ("set memory", "SET memory_limit = '100GB'", "not SET"),
    ("reset", "RESET lock_configuration", "not "),
    ("pragma", "PRAGMA enable_profiling", "not PRAGMA"),
    ("copy to", "COPY jobs TO '{home}/out.csv'", "not COPY"),
    ("copy from", "COPY jobs FROM '{canary}'", "not COPY"),
    ("attach", "ATTACH '{home}/other.duckdb' AS other", "not ATTACH"),
    ("install", "INSTALL httpfs", "not LOAD"),
    ("load", "LOAD '{home}/evil.duckdb_extension'", "not LOAD"),
    ("export", "EXPORT DATABASE '{home}/dump'", "not EXPORT"),
    ("cte", "WITH f AS (SELECT * FROM read_text('{canary}')) SELECT * FROM f", "projection"),
    ("subquery", "SELECT (SELECT content FROM read_text('{canary}')) AS c", "projection"),
    ("in join", "SELECT * FROM jobs, read_csv('{canary}') LIMIT 1", "projection"),
    ("two statements", "SELECT 1; SELECT * FROM read_text('{canary}')", "one SQL statement"),
    ("call", "CALL read_text('{canary}')", "not CALL"),
]


@pytest.mark.parametrize(("name", "query", "says"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_sql_reaches_nothing_outside_the_projection(
    console: Console, canary: tuple[Path, Inotify], name: str, query: str, says: str
) -> None:
    secret, watch = canary
    status, body = console.sql(query.format(canary=secret, home=secret.parent))
    assert status == 400, (name, body)
    assert says in body["error"], body
    assert "canary-7f3a9c" not in json.dumps(body)
    assert watch.events() == [], f"{name}: the server touched the canary's directory"
    assert not (secret.parent / "out.csv").exists() and not (secret.parent / "dump").exists()


def test_the_canary_watch_sees_a_read(canary: tuple[Path, Inotify]) -> None:
    """The check above can fail: a plain read of the canary is seen."""
    secret, watch = canary
    assert "canary-7f3a9c" in secret.read_text()
    assert {mask & (IN_OPEN | IN_ACCESS) for mask, _ in watch.events()} >= {IN_OPEN}


def test_projection_queries_still_answer(console: Console) -> None:
    status, body = console.sql("SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'")
    assert status == 200 and body["rows"][0][0] > 0 and body["truncated"] is False
    status, body = console.sql("EXPLAIN SELECT * FROM jobs")
    assert status == 200 and body["rows"]


def test_row_cap_marks_the_answer_truncated(console: Console) -> None:
    status, body = console.sql("SELECT * FROM range(10000000)")
    assert status == 200
    assert len(body["rows"]) == 10_000 and body["truncated"] is True
    assert body["rows"][-1] == [9_999] and body["limit"] == "10,000 rows"
    status, body = console.sql("SELECT * FROM range(10000)")
    assert len(body["rows"]) == 10_000 and body["truncated"] is False


def _timed_get(url: str) -> float:
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
    return time.monotonic() - start


def test_runaway_query_is_interrupted_and_pages_keep_answering(console: Console) -> None:
    result: dict[str, Any] = {}

    def runaway() -> None:
        start = time.monotonic()
        result["answer"] = console.sql("SELECT sum(range) FROM range(100000000000)")
        result["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=runaway)
    thread.start()
    # intentional: a moment for the query to start (the console does not show its running
    # queries); the pages are then timed for as long as it runs
    time.sleep(0.3)
    pages = []
    while thread.is_alive():
        pages.append(_timed_get(console.url + "/queues"))
        time.sleep(0.1)  # intentional: the pace of the page requests
    thread.join()
    status, body = result["answer"]
    assert status == 400 and "time limit" in body["error"], body
    assert 2 <= result["seconds"] < 10
    # the pages were answered while the query ran, none waiting for it: on a loaded
    # machine both slow down, so each page is judged against the query's own time
    assert len(pages) >= 3 and max(pages) < result["seconds"] / 3, (pages, result["seconds"])
    assert console.sql("SELECT 42")[1]["rows"] == [[42]]


def test_queries_beyond_the_cap_get_429(console: Console) -> None:
    answers: list[int] = []
    lock = threading.Lock()

    def ask() -> None:
        status, _ = console.sql("SELECT sum(range) FROM range(100000000000)")
        with lock:
            answers.append(status)

    threads = [threading.Thread(target=ask) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [400, 400, 429, 429, 429]  # two timed out, three over the cap


def test_sigterm_during_queries_ends_serve_within_2s(ledger: Path, tmp_path: Path) -> None:
    srv = Console(ledger, tmp_path / "h.duckdb", "--sql-timeout", "60")
    answers: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: answers.append(srv.sql("SELECT sum(range) FROM range(100000000000)")[0])
        )
        for _ in range(3)
    ]
    try:
        for t in threads:
            t.start()
        # intentional: a moment for the three queries to reach the server; it does not show
        # its running queries, and a probing query would take a slot of its own
        time.sleep(1.0)
        start = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=10)
        stopped = time.monotonic() - start
        for t in threads:
            t.join(timeout=10)
    finally:
        srv.stop()
    assert srv.proc.returncode == 0
    assert stopped < 2.0, stopped
    assert sorted(answers) == [503, 503, 503]
    assert not Path(f"{tmp_path / 'h.duckdb'}.console.json").exists()


def test_sql_through_the_console_says_it_was_truncated(console: Console) -> None:
    done = subprocess.run(
        [
            GPULEDGER,
            "sql",
            "--server",
            console.url,
            "--format",
            "csv",
            "SELECT * FROM range(20000)",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1 + 10_000
    assert "first 10,000 rows only" in done.stderr
    refused = subprocess.run(
        [GPULEDGER, "sql", "--server", console.url, "SELECT * FROM read_text('/etc/hostname')"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0 and "reads only the projection" in refused.stderr


def test_bad_limits_are_refused(ledger: Path, tmp_path: Path) -> None:
    for args, says in (
        (["--sql-timeout", "0"], "time limit"),
        (["--sql-max-rows", "0"], "row limit"),
        (["--sql-memory", "lots"], "memory limit"),
    ):
        done = subprocess.run(
            [
                GPULEDGER,
                "serve",
                "--ledger",
                str(ledger),
                "--db",
                str(tmp_path / "x.db"),
                *LOCAL,
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)


def test_serve_on_a_damaged_ledger_names_the_damage(ledger: Path, tmp_path: Path) -> None:
    """A corrupted frame: one line naming the segment and byte, exit 2, no traceback."""
    import shutil

    damaged = tmp_path / "ledger"
    shutil.copytree(ledger, damaged)
    segment = sorted(damaged.glob("*.seg"))[0]
    with segment.open("r+b") as f:
        f.seek(segment.stat().st_size // 2)
        f.write(b"\xff\xff\xff\xff\x00\x00")
    done = subprocess.run(
        [GPULEDGER, "serve", "--ledger", str(damaged), "--db", str(tmp_path / "h.db"), *LOCAL],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert segment.name in done.stderr and "byte" in done.stderr


def test_a_second_serve_on_the_same_database_says_who_owns_it(
    console: Console, ledger: Path
) -> None:
    """Not DuckDB's raw lock error: what owns the file and what to do."""
    owned = str(console.db)
    done = subprocess.run(
        [GPULEDGER, "serve", "--ledger", str(ledger), "--db", owned, *LOCAL],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert "another process has this projection open" in done.stderr
    assert "Traceback" not in done.stderr
