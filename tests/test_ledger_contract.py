"""One contract for every ledger backend: the in-memory list, the file log and Kafka.

``LedgerContract`` states what the log port promises; each backend subclasses it and
says how to open a writer and a reader. Kafka's offsets increase but leave gaps (each
transaction's marker takes one), so the contract speaks of increasing offsets and of
``end_offset()``, never of counts.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from events.codec import Envelope, encode_envelope, wrap
from events.filelog import FileLedger, LedgerDirReader
from events.kafka_admin import create_topics, run_sync
from events.kafkalog import KafkaLedger, KafkaReader, open_kafka_reader
from events.memlog import MemoryLedger
from events.model import JobSubmitted, PodSpec, PodStarted
from tests.kafkakit import kafka

__all__ = ["kafka"]


def env(i: int) -> Envelope:
    return wrap(PodStarted(job=f"job-{i}", pod=f"pod-{i}"), at=1000 + i)


class LedgerContract:
    """What every backend must do; subclasses provide ``writer`` and ``reader``."""

    def writer(self) -> Any:
        raise NotImplementedError

    def reader(self, writer: Any) -> Any:
        raise NotImplementedError

    @pytest.fixture
    def ledger(self) -> Iterator[Any]:
        w = self.writer()
        yield w
        w.close()

    def test_empty(self, ledger: Any) -> None:
        r = self.reader(ledger)
        assert list(r.read()) == []
        assert r.end_offset() == ledger.end_offset()

    def test_append_then_read_in_order(self, ledger: Any) -> None:
        first = ledger.append([env(0), env(1), env(2)])
        second = ledger.append([env(3)])
        r = self.reader(ledger)
        got = list(r.read())
        assert [e for _, e in got] == [env(i) for i in range(4)]
        offsets = [o for o, _ in got]
        assert offsets == sorted(set(offsets))
        assert offsets[0] == first and offsets[3] == second
        assert r.end_offset() > offsets[-1]
        assert ledger.end_offset() == r.end_offset()

    def test_bytes_round_trip(self, ledger: Any) -> None:
        job = JobSubmitted(job="j", queue="q", pods=(PodSpec(name="p", gpu_milli=500),))
        ledger.append([wrap(job, 7)])
        [(_, got)] = list(self.reader(ledger).read())
        assert encode_envelope(got) == encode_envelope(wrap(job, 7))

    def test_read_range(self, ledger: Any) -> None:
        ledger.append([env(i) for i in range(5)])
        ledger.append([env(i) for i in range(5, 10)])
        r = self.reader(ledger)
        offsets = [o for o, _ in r.read()]
        window = list(r.read(offsets[3], offsets[7]))
        assert [e for _, e in window] == [env(i) for i in range(3, 7)]
        assert list(r.read(offsets[7], offsets[7])) == []
        assert [e for _, e in r.read(offsets[8])] == [env(8), env(9)]

    def test_empty_append_returns_end(self, ledger: Any) -> None:
        ledger.append([env(0)])
        end = ledger.end_offset()
        assert ledger.append([]) == end
        assert ledger.end_offset() == end

    def test_reader_sees_later_appends(self, ledger: Any) -> None:
        r = self.reader(ledger)
        ledger.append([env(0)])
        assert [e for _, e in r.read()] == [env(0)]
        ledger.append([env(1)])
        assert [e for _, e in r.read()] == [env(0), env(1)]


class TestMemoryLedger(LedgerContract):
    def writer(self) -> MemoryLedger:
        return MemoryLedger()

    def reader(self, writer: MemoryLedger) -> MemoryLedger:
        return writer


class TestFileLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.path = tmp_path / "ledger"

    def writer(self) -> FileLedger:
        return FileLedger.open(self.path)

    def reader(self, writer: FileLedger) -> LedgerDirReader:
        return LedgerDirReader(self.path)

    def test_follow_sees_live_appends(self, ledger: FileLedger) -> None:
        _follow_live(ledger, LedgerDirReader(self.path))


@pytest.mark.integration
class TestKafkaLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _topic(self, kafka: str) -> Iterator[None]:
        self.bootstrap = kafka
        self.topic = f"contract-{uuid.uuid4().hex[:10]}.ledger"
        run_sync(create_topics(kafka, [(self.topic, 1, {})]))
        self.readers: list[KafkaReader] = []
        yield
        for r in self.readers:
            r.close()

    def writer(self) -> KafkaLedger:
        return KafkaLedger(self.bootstrap, self.topic)

    def reader(self, writer: KafkaLedger) -> KafkaReader:
        r = open_kafka_reader(f"kafka://{self.bootstrap}/{self.topic}?partition=0")
        self.readers.append(r)
        return r

    def test_follow_sees_live_appends(self, ledger: KafkaLedger) -> None:
        _follow_live(ledger, self.reader(ledger))

    def test_second_writer_fences_the_first(self, ledger: KafkaLedger) -> None:
        ledger.append([env(0)])
        successor = KafkaLedger(self.bootstrap, self.topic)
        try:
            with pytest.raises(Exception, match=r"(?i)fenced|epoch"):
                ledger.append([env(1)])
            successor.append([env(2)])
            assert [e for _, e in self.reader(ledger).read()] == [env(0), env(2)]
        finally:
            successor.close()


def _follow_live(writer: Any, reader: Any) -> None:
    """A follower started before the appends sees all of them, in order."""
    seen: list[Envelope] = []
    done = threading.Event()

    def follow() -> None:
        for _, e in reader.follow(0, poll_s=0.02, idle_timeout_s=10):
            seen.append(e)
            if len(seen) == 6:
                done.set()
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    for i in range(3):
        writer.append([env(2 * i), env(2 * i + 1)])
        time.sleep(0.05)  # intentional: appends spread out, while the follower polls
    assert done.wait(15)
    assert seen == [env(i) for i in range(6)]
