"""Every reader follows and closes; projecting, following and refusing ``kafka://`` ledgers.

A Kafka ledger topic is written in transactions, and each commit leaves a control marker
that takes an offset and is never delivered: the end of a topic is then one or more past
its last record. The unit tests model that with a reader whose offsets leave such gaps;
the integration tests (``-m integration``) run the same checks on the real broker, through
the CLI, with a topic prefix of their own.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import duckdb
import pytest

from events.codec import Envelope, encode, wrap
from events.filelog import FileLedger, LedgerDirReader
from events.kafka_admin import new_producer, run_sync
from events.kafkalog import KafkaLedger, open_kafka_reader
from events.memlog import MemoryLedger
from events.model import (
    Event,
    JobSubmitted,
    NodeRegistered,
    PodSpec,
    PodStarted,
    QueueConfigured,
    Resources,
)
from events.port import LedgerReader
from projections.projector import PROJECTIONS, project
from scheduler.cli import main
from tests.kafkakit import fresh_settings, kafka
from tests.waiting import wait_until

__all__ = ["kafka"]

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("events", "queues", "jobs", "pods", "queue_shares")

# --------------------------------------------------------------------------- helpers


def cluster_events() -> list[tuple[int, Event]]:
    """``(at_ms, event)``: a queue, a node and jobs over several minutes of ledger time."""
    return [
        (1_000, QueueConfigured(queue="team", deserved=Resources(gpu_milli=8_000))),
        (1_000, NodeRegistered(node="n0", gpus=8, cpu_milli=64_000, memory_mib=512_000)),
        *(
            (60_000 * (i + 1), JobSubmitted(job=f"j{i}", queue="team", pods=(PodSpec("p0", 1000),)))
            for i in range(4)
        ),
    ]


class GapReader:
    """A ``LedgerReader`` whose records sit at given offsets and whose end is given too.

    This is what a transactional Kafka topic looks like to a ``read_committed`` consumer:
    the offsets of commit markers and aborted records are never delivered.
    """

    def __init__(self, records: Sequence[tuple[int, Envelope]], end: int) -> None:
        self.records = list(records)
        self.end = end

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        stop = self.end if end is None else min(end, self.end)
        for offset, env in self.records:
            if start <= offset < stop:
                yield offset, env

    def end_offset(self) -> int:
        return self.end

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.01,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        yield from self.read(start)

    def close(self) -> None:
        pass


def with_markers(events: Sequence[tuple[int, Event]], per_txn: int = 2) -> GapReader:
    """Records in transactions of ``per_txn``, each followed by a marker's offset."""
    records: list[tuple[int, Envelope]] = []
    offset = 0
    for i, (at, event) in enumerate(events):
        records.append((offset, wrap(event, at)))
        offset += 1
        if i % per_txn == per_txn - 1 or i == len(events) - 1:
            offset += 1  # the commit marker
    return GapReader(records, offset)


def counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for table in TABLES:
            row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
            assert row is not None
            out[table] = int(row[0])
        return out
    finally:
        con.close()


def offsets(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("SELECT projection, next_offset FROM projection_offsets").fetchall()
        return {str(name): int(off) for name, off in rows}
    finally:
        con.close()


# --------------------------------------------------------------------------- the projector


@pytest.mark.parametrize("batch_size", [1, 2, 50_000])
def test_projection_reaches_the_end_past_commit_markers(tmp_path: Path, batch_size: int) -> None:
    reader = with_markers(cluster_events())
    assert reader.records[-1][0] + 1 < reader.end  # the last offset is a marker's
    db = tmp_path / "p.duckdb"

    first = project(reader, db, batch_size=batch_size)
    assert first.events_read == len(reader.records)
    assert first.next_offset == reader.end
    assert offsets(db) == dict.fromkeys(PROJECTIONS, reader.end)
    before = counts(db)
    assert before["events"] == len(reader.records)
    assert before["queue_shares"] > 0

    again = project(reader, db, batch_size=batch_size)
    assert again.events_read == 0
    assert again.rows_written == 0
    assert again.next_offset == reader.end
    assert counts(db) == before


def test_projection_steps_over_a_tail_without_records(tmp_path: Path) -> None:
    """An aborted transaction at the end: offsets move, no record is readable."""
    reader = with_markers(cluster_events())
    db = tmp_path / "p.duckdb"
    project(reader, db)
    before = counts(db)

    reader.end += 3  # two aborted records and the abort marker
    stats = project(reader, db)
    assert (stats.events_read, stats.next_offset) == (0, reader.end)
    assert offsets(db) == dict.fromkeys(PROJECTIONS, reader.end)
    assert counts(db) == before

    late = wrap(JobSubmitted(job="late", queue="team", pods=(PodSpec("p0", 1000),)), 600_000)
    reader.records.append((reader.end, late))
    reader.end += 2
    stats = project(reader, db)
    assert (stats.events_read, stats.next_offset) == (1, reader.end)
    assert counts(db)["jobs"] == before["jobs"] + 1


def test_projection_with_markers_equals_the_one_without(tmp_path: Path) -> None:
    """Gaps in the offsets change no row but the offsets themselves."""
    gappy = with_markers(cluster_events())
    dense = MemoryLedger(wrap(e, at) for at, e in cluster_events())
    project(gappy, tmp_path / "gappy.duckdb", batch_size=2)
    project(dense, tmp_path / "dense.duckdb", batch_size=2)

    def shares(db: Path) -> list[tuple[object, ...]]:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute("SELECT * FROM queue_shares ORDER BY ALL").fetchall()
        finally:
            con.close()

    assert shares(tmp_path / "gappy.duckdb") == shares(tmp_path / "dense.duckdb")
    assert counts(tmp_path / "gappy.duckdb") == counts(tmp_path / "dense.duckdb")


# --------------------------------------------------------------------------- the port


def pod(i: int) -> Envelope:
    return wrap(PodStarted(job=f"job-{i}", pod=f"pod-{i}"), at=1000 + i)


def follow_appends(reader: LedgerReader, append: Callable[[list[Envelope]], object]) -> None:
    """A follower from offset 1 sees the record there and two appended after it started."""
    seen: list[Envelope] = []
    done = threading.Event()

    def follow() -> None:
        for _, env in reader.follow(1, poll_s=0.01, stop=done.is_set):
            seen.append(env)
            if len(seen) == 3:
                done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    wait_until(lambda: seen, 10, "the follower to read the record at offset 1")
    append([pod(2)])
    append([pod(3)])
    t.join(15)
    assert not t.is_alive()
    assert seen == [pod(1), pod(2), pod(3)]
    # With nothing new, a follow ends on its idle timeout or its stop callback.
    assert list(reader.follow(4, poll_s=0.01, idle_timeout_s=0.05)) == []
    assert list(reader.follow(0, stop=lambda: True)) == []
    reader.close()
    reader.close()  # idempotent


def test_memory_reader_follows_and_closes() -> None:
    ledger = MemoryLedger([pod(0), pod(1)])
    follow_appends(ledger, ledger.append)


def test_directory_reader_follows_and_closes(tmp_path: Path) -> None:
    with FileLedger.open(tmp_path / "l") as writer:
        writer.append([pod(0), pod(1)])
        follow_appends(LedgerDirReader(tmp_path / "l"), writer.append)


# --------------------------------------------------------------------------- the CLI


def test_log_cat_follow_on_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "l"
    with FileLedger.open(path) as writer:
        writer.append([pod(0), pod(1)])

    def produce() -> None:
        # intentional: the appends come a moment after `log cat --follow` starts (its
        # progress cannot be watched from here; its 1.5 s idle timeout leaves room)
        time.sleep(0.3)
        with FileLedger.open(path) as w:
            w.append([pod(2)])
            w.append([wrap(NodeRegistered(node="n", gpus=1), 5), pod(4)])

    t = threading.Thread(target=produce)
    t.start()
    code = main(["log", "cat", str(path), "--from", "1", "--follow", "--idle-timeout", "1.5"])
    t.join()
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [int(re.search(r'"offset":(\d+)', x)[1]) for x in lines] == [1, 2, 3, 4]  # type: ignore[index]

    code = main(
        ["log", "cat", str(path), "--type", "node_registered", "-f", "--idle-timeout", "0.2"]
    )
    assert code == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_log_cat_follow_refuses_until(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FileLedger.open(tmp_path / "l") as writer:
        writer.append([pod(0)])
    assert main(["log", "cat", str(tmp_path / "l"), "--follow", "--until", "3"]) == 2
    assert "--until" in capsys.readouterr().err


URL = "kafka://127.0.0.1:1/nowhere"
"""No broker listens there: a command must refuse the URL before connecting."""


def refusing(tmp: Path) -> list[tuple[list[str], str]]:
    """``(argv, the option the message must name)`` of commands that cannot take a URL."""
    ex = ROOT / "replay" / "examples"
    inputs = [
        "--cluster",
        str(ex / "demo-cluster.yaml"),
        "--queues",
        str(ex / "demo-queues.yaml"),
        "--workload",
        str(ex / "demo-workload.yaml"),
    ]
    csv = tmp / "samples.csv"
    csv.write_text("timestamp_ms,node,gpu,utilization_pct\n1,n0,0,50\n")
    jsonl = tmp / "x.jsonl"
    jsonl.write_text("")
    with FileLedger.open(tmp / "ledger") as writer:
        writer.append([pod(0)])
    return [
        (["log", "verify", URL], "LEDGER"),
        (["log", "import", str(jsonl), "--ledger", URL], "--ledger"),
        (["metrics", "import", str(csv), "--format", "csv", "--ledger", URL], "--ledger"),
        (["simulate", *inputs, "--ledger", URL], "--ledger"),
        (
            ["replay", "--ledger", str(tmp / "ledger"), "--policy-name", "fifo", "--out", URL],
            "--out",
        ),
        (["demo", "--out", URL], "--out"),
        (["compare", *inputs, "--out", URL], "--out"),
        (["example", "pinned", "--out", URL], "--out"),
    ]


def test_commands_that_cannot_use_a_kafka_url_refuse_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    cases = refusing(tmp_path)
    monkeypatch.chdir(work)
    for argv, option in cases:
        started = time.monotonic()
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert option in err and "kafka://" in err, (argv, err)
        assert time.monotonic() - started < 5, argv  # refused, not a connection timeout
        assert list(work.iterdir()) == [], (argv, "nothing is created for a URL")


# --------------------------------------------------------------------------- the broker


@contextlib.contextmanager
def transactions(bootstrap: str, topic: str) -> Iterator[Callable[[list[tuple[int, Event]]], int]]:
    """``append(events)``: one transaction of the ``KafkaLedger`` writer; returns the end."""
    writer = KafkaLedger(bootstrap, topic, transactional_id=f"w.{uuid.uuid4().hex}")

    def append(events: list[tuple[int, Event]]) -> int:
        writer.append([wrap(e, at) for at, e in events])
        return writer.end_offset()

    try:
        yield append
    finally:
        writer.close()


def abort_one(bootstrap: str, topic: str, events: list[tuple[int, Event]]) -> None:
    """Send ``events`` in a transaction that aborts: ``read_committed`` never sees them."""

    async def go() -> None:
        producer = new_producer(bootstrap, f"a.{uuid.uuid4().hex}")
        await producer.start()
        try:
            await producer.begin_transaction()
            for at, e in events:
                await producer.send_and_wait(topic, encode(e, at), key=b"default", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    run_sync(go())


def wait_end(url: str, above: int) -> int:
    """The topic's stable end once it passes ``above`` (abort markers land after a moment)."""
    with open_kafka_reader(url) as reader:

        def past() -> int:
            end = reader.end_offset()
            return end if end > above else 0

        return wait_until(past, 30, f"the end to pass {above}", detail=reader.end_offset)


@pytest.mark.integration
def test_project_a_transactional_kafka_ledger(
    kafka: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = fresh_settings(kafka)
    url = f"kafka://{kafka}/{s.prefix}"
    db = tmp_path / "k.duckdb"
    project_cmd = ["project", "--ledger", url, "--db", str(db)]
    events = cluster_events()
    with transactions(kafka, s.ledger) as append:
        for i in range(0, len(events), 2):
            end = append(events[i : i + 2])

        assert main(project_cmd) == 0
        out = capsys.readouterr().out
        assert f"projected {len(events)} events" in out
        assert out.rstrip().endswith(f"next offset {end}")
        assert offsets(db) == dict.fromkeys(PROJECTIONS, end)
        before = counts(db)
        assert before["events"] == len(events)
        assert before["queue_shares"] > 0

        assert main(project_cmd) == 0
        assert capsys.readouterr().out == f"{db} is up to date (next offset {end})\n"
        assert counts(db) == before

        # read_committed: an aborted transaction's records are never projected, and the
        # offsets step over them.
        late = (600_000, JobSubmitted(job="aborted", queue="team", pods=(PodSpec("p0", 1000),)))
        abort_one(kafka, s.ledger, [late, late])
        end = wait_end(url, end)
        assert main(project_cmd) == 0
        assert capsys.readouterr().out == f"{db} is up to date (next offset {end})\n"
        assert offsets(db) == dict.fromkeys(PROJECTIONS, end)
        assert counts(db) == before

        end = append([(660_000, JobSubmitted(job="j9", queue="team", pods=(PodSpec("p0", 1),)))])
    assert main(project_cmd) == 0
    out = capsys.readouterr().out
    assert "projected 1 events" in out and out.rstrip().endswith(f"next offset {end}")
    after = counts(db)
    assert (after["events"], after["jobs"]) == (before["events"] + 1, before["jobs"] + 1)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM jobs WHERE job = 'aborted'").fetchone() == (0,)
    con.close()


class Lines:
    """The stdout lines of a child process, collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.got: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self.got.put(x) for x in stdout], daemon=True).start()

    def until(self, pred: Callable[[list[str]], bool], timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while not pred(self.seen):
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.got.empty()):
                raise AssertionError(f"waited for output; got {self.seen}")
            with contextlib.suppress(queue.Empty):
                self.seen.append(self.got.get(timeout=min(left, 0.5)))
        return self.seen


def gpuledger(log: Path, *argv: str) -> subprocess.Popen[str]:
    """``gpuledger ARGV`` as a child whose stdout is piped unbuffered; stderr goes to ``log``.

    The child takes Ctrl-C (SIGINT) as a terminal would deliver it, even where the test
    run itself ignores it (a run started in the background by a shell without job control
    inherits SIGINT ignored, and so would the child, which then never stops on it)."""
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_sigint_default,  # noqa: PLW1509  # it only resets a signal
        )


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def offsets_of(lines: list[str]) -> list[int]:
    return [int(re.search(r'"offset":(\d+)', x)[1]) for x in lines]  # type: ignore[index]


def stop(*procs: subprocess.Popen[str] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_log_cat_and_tail_follow_a_kafka_ledger(kafka: str, tmp_path: Path) -> None:
    s = fresh_settings(kafka)
    url = f"kafka://{kafka}/{s.prefix}"
    events = cluster_events()
    err = tmp_path / "stderr.log"
    cat = tail = None
    try:
        with transactions(kafka, s.ledger) as append:
            append(events[:2])
            cat = gpuledger(err, "log", "cat", url, "--follow", "--idle-timeout", "5")
            tail = gpuledger(err, "log", "tail", url, "-n", "1", "-f", "--idle-timeout", "5")
            cat_lines, tail_lines = Lines(cat), Lines(tail)
            cat_lines.until(lambda seen: len(seen) >= 2)
            tail_lines.until(lambda seen: len(seen) >= 1)
            append(events[2:4])
            append(events[4:])
        with open_kafka_reader(url) as reader:
            written = [off for off, _ in reader.read()]
        assert len(written) == len(events)
        assert offsets_of(cat_lines.until(lambda seen: len(seen) >= len(events))) == written
        assert offsets_of(tail_lines.until(lambda seen: len(seen) >= len(events) - 1)) == [
            *written[1:]
        ]
        # Both end on their idle timeout, successfully.
        assert cat.wait(30) == 0, err.read_text()
        assert tail.wait(30) == 0, err.read_text()
    finally:
        stop(cat, tail)


@pytest.mark.integration
def test_project_follow_keeps_advancing_on_kafka(kafka: str, tmp_path: Path) -> None:
    s = fresh_settings(kafka)
    url = f"kafka://{kafka}/{s.prefix}"
    db = tmp_path / "f.duckdb"
    events = cluster_events()
    err = tmp_path / "stderr.log"
    proc = None

    def reached(end: int) -> Callable[[list[str]], bool]:
        return lambda seen: any(x.rstrip().endswith(f"next offset {end}") for x in seen)

    try:
        with transactions(kafka, s.ledger) as append:
            end = append(events[:3])
            proc = gpuledger(err, "project", "--follow", url, "--db", str(db), "--interval", "0.2")
            lines = Lines(proc)
            lines.until(reached(end))
            end = append(events[3:])
            seen = lines.until(reached(end))
        assert not any(x.rstrip().endswith("next offset 0") for x in seen), seen
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, err.read_text()
    finally:
        stop(proc)
    assert offsets(db) == dict.fromkeys(PROJECTIONS, end)
    got = counts(db)
    assert got["events"] == len(events)
    assert got["queue_shares"] > 0
