"""The Kafka backend of the log port (aiokafka).

``KafkaReader`` implements ``LedgerReader`` and ``KafkaLedger`` also ``LedgerWriter``, each
over one partition of a topic (the live path's topics are in ``events.kafka_admin``).
Values are the msgpack envelope bytes of ``events.codec`` (the same bytes the file log
stores); keys are the scheduling domain. The ports are synchronous: the clients run on the
shared background loop (``events.kafka_admin.run_sync``).

Offsets are Kafka offsets. They increase but, unlike the file log's, are not consecutive:
every committed transaction leaves a control marker that takes an offset and is never
delivered. Code that needs "one past the last record" uses ``end_offset()``, never a count.

Connections take their TLS and SASL options from ``events.kafka_security``; a
``kafka://`` URL carries none, so it is read with the ``GPULEDGER_KAFKA_*`` environment's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qs, urlparse

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from events.aiokafka_shim import fetch_all_metadata
from events.codec import Envelope, decode_envelope, encode_envelope
from events.kafka_admin import (
    DEFAULT_DOMAIN,
    READ_TIMEOUT_S,
    KafkaSettings,
    new_consumer,
    new_producer,
    run_sync,
    send_records,
    start_client,
)
from events.kafka_security import KafkaLogError, KafkaSecurity, resolve_security
from events.port import follow_polls

T = TypeVar("T")

CLOSE_TIMEOUT_S = 10.0
"""How long closing a reader waits for its consumer to stop."""


async def end_offset_of(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
    """One past the last committed record (the last stable offset, under read_committed)."""
    ends = await consumer.end_offsets([tp])
    return int(ends[tp])


async def read_records(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    start: int,
    end: int,
    *,
    max_records: int = 20_000,
) -> AsyncIterator[list[ConsumerRecord[bytes, bytes]]]:
    """Batches of committed records with ``start <= offset < end`` from an assigned ``tp``.

    Stops on the consumer's position, not on a record count: transaction markers and
    aborted records take offsets that are never delivered.
    """
    if end <= start:
        return
    consumer.seek(tp, start)
    idle_since = time.monotonic()
    while await consumer.position(tp) < end:
        got = await consumer.getmany(tp, timeout_ms=200, max_records=max_records)
        batch = [m for m in got.get(tp, ()) if m.offset < end]
        if batch:
            idle_since = time.monotonic()
            yield batch
            if batch[-1].offset >= end - 1:
                return
        elif time.monotonic() - idle_since > READ_TIMEOUT_S:
            raise KafkaLogError(
                f"{tp.topic}[{tp.partition}]: no progress at offset "
                f"{await consumer.position(tp)} reading up to {end}"
            )


async def wait_stable(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> int:
    """Wait until the last stable offset of ``tp`` passes ``offset``; return it."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    while (end := await end_offset_of(consumer, tp)) < offset:
        if time.monotonic() > deadline:
            raise KafkaLogError(f"{tp.topic}[{tp.partition}]: offset {offset} never became stable")
        await asyncio.sleep(0.002)
    return end


def envelope_bytes(envelopes: Sequence[Envelope]) -> list[bytes]:
    """The stored bytes of each envelope (TypeError for anything else)."""
    out = []
    for env in envelopes:
        if not isinstance(env, Envelope):
            raise TypeError(f"append expects Envelopes, got {type(env).__name__}")
        out.append(encode_envelope(env))
    return out


# --------------------------------------------------------------------------- the port


async def _next(it: AsyncIterator[T]) -> T:
    return await anext(it)


class KafkaReader:
    """Reads one partition of a topic (implements ``LedgerReader``), committed records only."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partition: int = 0,
        *,
        security: KafkaSecurity | None = None,
    ) -> None:
        """Connect; raises ``KafkaLogError`` if the topic or partition does not exist
        (``KafkaAuthError`` if the broker refuses the credentials)."""
        self.bootstrap = bootstrap
        self.topic = topic
        self.partition = partition
        self.security = resolve_security(security)
        self.name = f"kafka://{bootstrap}/{topic}?partition={partition}"
        self._tp = TopicPartition(topic, partition)
        self._consumer = run_sync(self._start_consumer())

    async def _start_consumer(self) -> AIOKafkaConsumer:
        consumer = new_consumer(self.bootstrap, security=self.security)
        await start_client(consumer, self.bootstrap, self.security)
        # The consumer's public metadata is only the topics it subscribed to; ask the
        # cluster for all of them to tell a missing partition from an empty one.
        cluster = await fetch_all_metadata(consumer)
        partitions = cluster.partitions_for_topic(self.topic) or set()
        if self.partition not in partitions:
            await consumer.stop()
            raise KafkaLogError(f"{self.name}: no such topic or partition")
        consumer.assign([self._tp])
        return consumer

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Committed records with ``start <= offset < end`` (to the current end if None)."""
        for off, value in self.read_raw(start, end):
            yield off, decode_envelope(value, off)

    def read_raw(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(offset, stored envelope bytes)`` with ``start <= offset < end``."""
        stop = self.end_offset() if end is None else end
        records = read_records(self._consumer, self._tp, start, stop)
        while True:
            try:
                batch: list[ConsumerRecord[bytes, bytes]] = run_sync(_next(records))
            except StopAsyncIteration:
                return
            for m in batch:
                yield m.offset, m.value or b""

    def end_offset(self) -> int:
        """One past the last committed record."""
        return run_sync(end_offset_of(self._consumer, self._tp))

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.2,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """Yield records from ``start`` on as they are committed.

        The consumer keeps its position between polls and each poll is a fetch that the
        broker holds open for up to ``poll_s`` until a transaction commits, so a record
        arrives one fetch after its commit (no end-offset request or seek per poll).
        Returns when ``stop()`` is true (checked between polls) or after ``idle_timeout_s``
        seconds without a new record; otherwise follows forever.
        """
        position = start

        def poll() -> Generator[tuple[int, Envelope], None, bool]:
            nonlocal position
            batch, position = run_sync(self._fetch_from(position, poll_s))
            for m in batch:
                yield m.offset, decode_envelope(m.value or b"", m.offset)
            return bool(batch)

        return follow_polls(poll, poll_s=None, stop=stop, idle_timeout_s=idle_timeout_s)

    async def _fetch_from(
        self, position: int, wait_s: float
    ) -> tuple[list[ConsumerRecord[bytes, bytes]], int]:
        """Committed records from ``position`` (waiting up to ``wait_s`` for one) and the
        position after them, past any transaction marker."""
        consumer = self._consumer
        assert consumer is not None
        if await consumer.position(self._tp) != position:
            consumer.seek(self._tp, position)  # a read() in between moved the consumer
        got = await consumer.getmany(
            self._tp, timeout_ms=max(round(wait_s * 1000), 1), max_records=20_000
        )
        batch = [m for m in got.get(self._tp, ()) if m.offset >= position]
        return batch, int(await consumer.position(self._tp))

    def close(self) -> None:
        """Stop the consumer (idempotent), waiting at most ``CLOSE_TIMEOUT_S``: a closing
        reader (an interrupted follower) must not hang on a broker that does not answer;
        the consumer is then abandoned."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(TimeoutError):
                run_sync(consumer.stop(), CLOSE_TIMEOUT_S)

    def __enter__(self) -> KafkaReader:
        """The reader itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the reader."""
        self.close()


class KafkaLedger(KafkaReader):
    """The writer of one ledger partition (implements ``LedgerWriter`` and ``LedgerReader``).

    Each ``append`` is one Kafka transaction, so readers (``read_committed``) see a batch
    whole or not at all, like the file log's appends. The transactional id plays the file
    log's lock: opening a second writer with the same id fences the first, whose next
    append fails.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partition: int = 0,
        *,
        key: str = DEFAULT_DOMAIN,
        transactional_id: str | None = None,
        security: KafkaSecurity | None = None,
    ) -> None:
        """Connect as the writer of ``topic[partition]``; records are keyed ``key``."""
        super().__init__(bootstrap, topic, partition, security=security)
        self.key = key.encode()
        self.transactional_id = transactional_id or f"gpuledger.writer.{topic}.{partition}"
        self._producer = run_sync(self._start_producer())

    async def _start_producer(self) -> AIOKafkaProducer:
        producer = new_producer(self.bootstrap, self.transactional_id, security=self.security)
        await start_client(producer, self.bootstrap, self.security)
        return producer

    def append(self, envelopes: Sequence[Envelope]) -> int:
        """Append a batch in one transaction; return the offset of its first record."""
        values = envelope_bytes(envelopes)
        if not values:
            return self.end_offset()
        return run_sync(self._append(values))

    async def _append(self, values: list[bytes]) -> int:
        producer = self._producer
        async with producer.transaction():
            sent = await send_records(producer, self.topic, self.partition, self.key, values)
        assert sent is not None  # values is not empty
        first, last = sent
        # The commit returns before the broker has written the transaction's markers, so
        # the last stable offset trails it briefly; wait, so that a read after append
        # sees the batch as it would on the file log.
        await wait_stable(self._consumer, self._tp, last + 1)
        return first

    def close(self) -> None:
        """Stop the producer and the consumer (idempotent)."""
        producer, self._producer = self._producer, None
        if producer is not None:
            run_sync(producer.stop())
        super().close()

    def __enter__(self) -> KafkaLedger:
        """The ledger itself."""
        return self


# --------------------------------------------------------------------------- URLs


@dataclass(frozen=True, slots=True)
class KafkaUrl:
    """``kafka://host:port/topic?partition=N`` (or ``?domain=NAME&domains=a,b``)."""

    bootstrap: str
    topic: str
    partition: int


def parse_url(url: str) -> KafkaUrl:
    """Parse a ``kafka://`` ledger URL; a bare prefix (``kafka://h:p/gpuledger``) means
    that deployment's ledger topic."""
    parts = urlparse(url)
    if parts.scheme != "kafka" or not parts.netloc or not parts.path.strip("/"):
        raise KafkaLogError(f"{url}: expected kafka://HOST:PORT/TOPIC[?partition=N]")
    topic = parts.path.strip("/")
    query = parse_qs(parts.query)
    partition = int(query.get("partition", ["0"])[0])
    if "domain" in query:
        domains = tuple(query.get("domains", [DEFAULT_DOMAIN])[0].split(","))
        partition = KafkaSettings(domains=domains, security=KafkaSecurity()).partition(
            query["domain"][0]
        )
    if "." not in topic:
        topic = f"{topic}.ledger"
    return KafkaUrl(bootstrap=parts.netloc, topic=topic, partition=partition)


def is_kafka_url(src: object) -> bool:
    """True for ``kafka://`` sources."""
    return isinstance(src, str) and src.startswith("kafka://")


def open_kafka_reader(url: str, *, security: KafkaSecurity | None = None) -> KafkaReader:
    """A reader over the topic partition a ``kafka://`` URL names.

    The URL carries no credentials: ``security`` defaults to the ``GPULEDGER_KAFKA_*``
    environment."""
    where = parse_url(url)
    return KafkaReader(where.bootstrap, where.topic, where.partition, security=security)


__all__ = [
    "KafkaLedger",
    "KafkaReader",
    "KafkaUrl",
    "end_offset_of",
    "envelope_bytes",
    "is_kafka_url",
    "open_kafka_reader",
    "parse_url",
    "read_records",
    "wait_stable",
]
