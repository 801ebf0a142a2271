"""The Kafka backend of the log port (aiokafka), and the topics of the live path.

Topics (``<prefix>.<name>``), each with one partition per scheduling domain:

``intake``       what producers (CLI, clock, binder, Kubernetes watch) submit, keyed by domain
``ledger``       the total order per domain: accepted inputs and decisions, written only in
                 transactions, read with ``read_committed``
``deadletters``  intake records the scheduler refused, with the reason and source offset
``snapshots``    compacted: the latest scheduler state per domain and its ledger offset

Values are the msgpack envelope bytes of ``events.codec`` (the same bytes the file log
stores); keys are the scheduling domain. ``KafkaLedger`` implements ``LedgerWriter`` and
``LedgerReader`` over one partition. The ports are synchronous, so the aiokafka clients
run on one background event loop (``loop()``) and the sync methods submit coroutines to it.

Offsets are Kafka offsets. They increase but, unlike the file log's, are not consecutive:
every committed transaction leaves a control marker that takes an offset and is never
delivered. Code that needs "one past the last record" uses ``end_offset()``, never a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import ConsumerRecord

from events.codec import Envelope, decode_envelope, encode_envelope

T = TypeVar("T")

DEFAULT_BOOTSTRAP = os.environ.get("GPULEDGER_KAFKA", "127.0.0.1:19092")
"""The broker ``make kafka-up`` starts; override with ``GPULEDGER_KAFKA``."""

DEFAULT_PREFIX = "gpuledger"
DEFAULT_DOMAIN = "default"
COMPRESSION = "gzip"
"""gzip is in the standard library; lz4/zstd would add a native dependency for little gain
at the ledger's record sizes."""
SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024
"""Largest snapshot record (before compression): the state of a million-event ledger
with every finished job kept is ~70 MB of msgpack."""
READ_TIMEOUT_S = 30.0
"""How long a bounded read may make no progress before it is treated as a broker fault."""


class KafkaLogError(RuntimeError):
    """The broker did not answer as a log must (missing topic, no progress, bad URL)."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Where the live path's topics are and which domains they hold.

    ``domains`` fixes the partition of each scheduling domain in every topic (its index),
    so every producer and every scheduler must be given the same list.
    """

    bootstrap: str = DEFAULT_BOOTSTRAP
    prefix: str = DEFAULT_PREFIX
    domains: tuple[str, ...] = (DEFAULT_DOMAIN,)

    @property
    def intake(self) -> str:
        """The intake topic."""
        return f"{self.prefix}.intake"

    @property
    def ledger(self) -> str:
        """The ledger topic."""
        return f"{self.prefix}.ledger"

    @property
    def deadletters(self) -> str:
        """The dead-letter topic."""
        return f"{self.prefix}.deadletters"

    @property
    def snapshots(self) -> str:
        """The compacted snapshot topic."""
        return f"{self.prefix}.snapshots"

    def partition(self, domain: str) -> int:
        """The partition of ``domain`` in every topic."""
        try:
            return self.domains.index(domain)
        except ValueError:
            known = ", ".join(self.domains)
            raise KafkaLogError(f"unknown scheduling domain {domain!r}; known: {known}") from None

    def group(self) -> str:
        """The consumer group of the schedulers."""
        return f"{self.prefix}.scheduler"

    def transactional_id(self, domain: str) -> str:
        """One transactional id per domain: a new owner fences the previous one."""
        return f"{self.prefix}.scheduler.{domain}"


# --------------------------------------------------------------------------- the event loop


class _LoopThread:
    """One asyncio loop on a daemon thread, shared by every sync wrapper of this process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="gpuledger-kafka", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the shared background loop and wait for its result."""
    global _loop  # noqa: PLW0603  # one loop per process, created on first use
    with _loop_lock:
        if _loop is None:
            _loop = _LoopThread()
        runner = _loop
    return runner.run(coro, timeout)


def shutdown() -> None:
    """Stop the shared loop (clients still open on it are abandoned); the next call to
    ``run_sync`` starts a new one. For test sessions and orderly exits."""
    global _loop
    with _loop_lock:
        runner, _loop = _loop, None
    if runner is not None:
        runner.loop.call_soon_threadsafe(runner.loop.stop)
        runner.thread.join(5)


# --------------------------------------------------------------------------- topics


async def create_topics(bootstrap: str, topics: Sequence[tuple[str, int, dict[str, str]]]) -> None:
    """Create ``(name, partitions, configs)`` topics; existing ones are left as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(name, partitions, 1, topic_configs=configs)
            for name, partitions, configs in topics
            if name not in existing
        ]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):  # a racing creator won
                await admin.create_topics(new)
        # Metadata reaches the broker's cache a moment after creation; wait so the first
        # produce does not fail with an unknown partition.
        deadline = time.monotonic() + READ_TIMEOUT_S
        wanted = {name for name, _, _ in topics}
        while not wanted <= set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise KafkaLogError(f"topics {sorted(wanted)} did not appear")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def ensure_topics(settings: KafkaSettings) -> None:
    """Create the four topics of the live path with one partition per domain."""
    n = len(settings.domains)
    await create_topics(
        settings.bootstrap,
        [
            (settings.intake, n, {}),
            (settings.ledger, n, {}),
            (settings.deadletters, n, {}),
            # Only the newest snapshot per domain (the key) matters; compaction keeps it
            # and the short segments let the cleaner run on a small topic too.
            (
                settings.snapshots,
                n,
                {
                    "cleanup.policy": "compact",
                    "segment.ms": "60000",
                    "min.cleanable.dirty.ratio": "0.1",
                    "max.message.bytes": str(SNAPSHOT_MAX_BYTES),
                },
            ),
        ],
    )


# --------------------------------------------------------------------------- clients


def new_consumer(bootstrap: str, **kwargs: Any) -> AIOKafkaConsumer:
    """A consumer that reads only committed transactions, with large fetches for replay."""
    kwargs.setdefault("enable_auto_commit", False)
    kwargs.setdefault("auto_offset_reset", "earliest")
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
        **kwargs,
    )


def new_producer(bootstrap: str, transactional_id: str | None = None) -> AIOKafkaProducer:
    """An idempotent producer (transactional when given an id) that batches and compresses."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        transactional_id=transactional_id,
        compression_type=COMPRESSION,
        linger_ms=2,
        max_batch_size=1024 * 1024,
        # Short, so that a killed scheduler's open transaction is aborted by the broker
        # quickly if no successor fences it first.
        transaction_timeout_ms=10_000,
        request_timeout_ms=15_000,
    )


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

    def __init__(self, bootstrap: str, topic: str, partition: int = 0) -> None:
        """Connect; raises ``KafkaLogError`` if the topic or partition does not exist."""
        self.bootstrap = bootstrap
        self.topic = topic
        self.partition = partition
        self.name = f"kafka://{bootstrap}/{topic}?partition={partition}"
        self._tp = TopicPartition(topic, partition)
        self._consumer = run_sync(self._start_consumer())

    async def _start_consumer(self) -> AIOKafkaConsumer:
        consumer = new_consumer(self.bootstrap)
        await consumer.start()
        # The consumer's public metadata is only the topics it subscribed to; ask the
        # cluster for all of them to tell a missing partition from an empty one.
        cluster = await consumer._client.fetch_all_metadata()
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

        Returns when ``stop()`` is true (checked between polls) or after ``idle_timeout_s``
        seconds without a new record; otherwise follows forever.
        """
        position = start
        idle_since = time.monotonic()
        while True:
            if stop is not None and stop():
                return
            end = self.end_offset()
            if end > position:
                yield from self.read(position, end)
                position = end
                idle_since = time.monotonic()
                continue
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                return
            time.sleep(poll_s)

    def close(self) -> None:
        """Stop the consumer (idempotent)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            run_sync(consumer.stop())

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
    ) -> None:
        """Connect as the writer of ``topic[partition]``; records are keyed ``key``."""
        super().__init__(bootstrap, topic, partition)
        self.key = key.encode()
        self.transactional_id = transactional_id or f"gpuledger.writer.{topic}.{partition}"
        self._producer = run_sync(self._start_producer())

    async def _start_producer(self) -> AIOKafkaProducer:
        producer = new_producer(self.bootstrap, self.transactional_id)
        await producer.start()
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
            futures = [
                await producer.send(self.topic, v, key=self.key, partition=self.partition)
                for v in values
            ]
            first = await futures[0]
            last = (await asyncio.gather(*futures[1:]))[-1] if len(futures) > 1 else first
        # The commit returns before the broker has written the transaction's markers, so
        # the last stable offset trails it briefly; wait, so that a read after append
        # sees the batch as it would on the file log.
        await wait_stable(self._consumer, self._tp, int(last.offset) + 1)
        return int(first.offset)

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
        partition = KafkaSettings(domains=domains).partition(query["domain"][0])
    if "." not in topic:
        topic = f"{topic}.ledger"
    return KafkaUrl(bootstrap=parts.netloc, topic=topic, partition=partition)


def is_kafka_url(src: object) -> bool:
    """True for ``kafka://`` sources."""
    return isinstance(src, str) and src.startswith("kafka://")


def open_kafka_reader(url: str) -> KafkaReader:
    """A reader over the topic partition a ``kafka://`` URL names."""
    where = parse_url(url)
    return KafkaReader(where.bootstrap, where.topic, where.partition)


__all__ = [
    "COMPRESSION",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_DOMAIN",
    "DEFAULT_PREFIX",
    "SNAPSHOT_MAX_BYTES",
    "KafkaLedger",
    "KafkaLogError",
    "KafkaReader",
    "KafkaSettings",
    "KafkaUrl",
    "create_topics",
    "end_offset_of",
    "ensure_topics",
    "envelope_bytes",
    "is_kafka_url",
    "new_consumer",
    "new_producer",
    "open_kafka_reader",
    "parse_url",
    "read_records",
    "run_sync",
    "shutdown",
    "wait_stable",
]
