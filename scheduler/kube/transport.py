"""Where the Kubernetes adapters write their events and keep their resume positions.

An adapter (the ingestor, the binder) appends batches of intake events and, with each
batch, its *position*: what a restart needs to carry on without losing or repeating an
event (the ingestor's pods watch resourceVersion and the gangs it is assembling, the
binder's next ledger offset). ``IntakeSink`` makes the two land together:

``FileIntakeSink`` (the embedded single-process mode)
    The adapter's own file ledger ``INTAKE/<source>/`` plus ``INTAKE/<source>.state.json``.
    Before each append the state file records the position before and after the batch and
    the ledger's end; on restart, an end that moved past the recorded one proves the
    append landed (``after``), otherwise it did not (``before``). Each position key ``k`` is
    stored as ``k_before`` / ``k_after`` next to ``intake_end_before``, so the binder's file
    is what it always was; an older ``ingest.state.json`` (the position alone) still loads.

``KafkaIntakeSink`` (the live path)
    Records go to the domain's partition of ``<prefix>.intake`` with the header
    ``source=<source>``; the position goes to the compacted topic ``<prefix>.positions``
    (key: the component), in the SAME transaction. The transactional id is fixed per
    component and prefix (``<prefix>.<source>``, plus ``.<domain>`` outside the default
    domain), so starting an instance fences its predecessor and settles its open
    transaction; the predecessor's next commit fails (``SinkFenced``). Positions and
    earlier records are read back with ``read_committed``, after every transaction open
    when the instance started has been decided.

``LedgerFeed`` is the other direction, for the binder: a ledger read from an offset and
followed as it grows (``FileLedgerFeed`` over ``LedgerDirReader``, ``KafkaLedgerFeed`` over
the domain's partition of ``<prefix>.ledger``, committed records only).

Kafka locations are ``kafka://HOST:PORT/PREFIX`` (``parse_deployment``), optionally with
``?domain=NAME&domains=a,b`` as for the other ``kafka://`` URLs; credentials come from the
``GPULEDGER_KAFKA_*`` environment unless a ``KafkaSecurity`` is given.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from events.codec import Envelope, decode_envelope
from events.filelog import FileLedger, LedgerDirReader, holds_segments
from events.kafka_admin import (
    DEFAULT_DOMAIN,
    KafkaSettings,
    create_topics,
    ensure_topics,
    new_consumer,
    new_producer,
    run_sync,
    start_client,
)
from events.kafka_security import KafkaLogError, KafkaSecurity
from events.kafkalog import KafkaReader, end_offset_of, envelope_bytes, is_kafka_url, read_records
from events.localfiles import open_source, read_json, write_json_atomic
from scheduler.kube.retry import Backoff, retry

log = logging.getLogger(__name__)

T = TypeVar("T")

Position = dict[str, Any]
"""A component's resume position: a JSON object."""

SOURCE_HEADER = "source"
"""Record header naming the component that produced an intake record (Kafka)."""

_END_KEY = "intake_end_before"
SETTLE_TIMEOUT_S = 60.0
"""How long a start waits for transactions open on its topics to be decided (a killed
producer's is aborted by the broker after its transaction timeout, 10 s for this project's
producers, plus the broker's clean-up interval)."""
POSITION_MAX_BYTES = 64 * 1024 * 1024
"""Largest position record (the ingestor's holds the gangs being assembled and the UIDs of
the live pods of jobs it rejected, ≈ 100 bytes each)."""
_COMMIT_ATTEMPTS = 3


class SinkFenced(RuntimeError):  # noqa: N818  # names the condition, like aiokafka's
    """A newer instance of the component took over its transactional id; stop writing."""


def _copy(position: Position) -> Position:
    """A deep, JSON-clean copy (callers pass live, mutable state; msgspec: see
    ``write_json_atomic``)."""
    copied: Position = msgspec.json.decode(msgspec.json.encode(position, order="sorted"))
    return copied


# --------------------------------------------------------------------------- the sink


class IntakeSink(abc.ABC):
    """Appends one component's intake records together with its resume position."""

    source: str
    name: str

    @abc.abstractmethod
    def saved(self) -> Position:
        """The position of the last batch that landed (``{}`` on a first start)."""

    @abc.abstractmethod
    def earlier(self) -> Iterator[tuple[int, Envelope]]:
        """The records this component appended before, in order."""

    @abc.abstractmethod
    def commit(
        self, envelopes: Sequence[Envelope], after: Position, *, before: Position | None = None
    ) -> None:
        """Append ``envelopes`` and make ``after`` the saved position, atomically.

        ``before`` is where to resume if the append does not land (default: the saved
        position); it matters only where the two cannot be written at once (files).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the writer (lock, producer); idempotent."""


class FileIntakeSink(IntakeSink):
    """``INTAKE/<source>/`` plus ``INTAKE/<source>.state.json``; see the module docstring."""

    def __init__(self, intake: str | os.PathLike[str], source: str) -> None:
        """Open ``INTAKE/<source>/`` (taking its writer lock) and resolve the saved state."""
        self.source = source
        self.intake = Path(intake)
        self.writer: FileLedger = open_source(self.intake, source)
        self.state_path = self.intake / f"{source}.state.json"
        self.name = str(self.intake / source)
        self._saved = _resolve(read_json(self.state_path), self.writer.end_offset())

    def saved(self) -> Position:
        """The position of the last batch that landed."""
        return _copy(self._saved)

    def earlier(self) -> Iterator[tuple[int, Envelope]]:
        """Every record of ``INTAKE/<source>/``."""
        return LedgerDirReader(self.intake / self.source).read()

    def commit(
        self, envelopes: Sequence[Envelope], after: Position, *, before: Position | None = None
    ) -> None:
        """Write the state (before, after, ledger end), then append; see the module doc."""
        after = _copy(after)
        # With nothing to append, the end cannot move: the state must resolve to ``after``.
        prior = (self._saved if before is None else _copy(before)) if envelopes else after
        state: dict[str, Any] = {_END_KEY: self.writer.end_offset()}
        for suffix, position in (("_before", prior), ("_after", after)):
            for key, value in position.items():
                if f"{key}{suffix}" == _END_KEY:
                    raise ValueError(f"position key {key!r} is reserved")
                state[f"{key}{suffix}"] = value
        write_json_atomic(self.state_path, state)
        if envelopes:
            self.writer.append(envelopes)
        self._saved = after

    def close(self) -> None:
        """Release the writer lock."""
        self.writer.close()


def _resolve(saved: dict[str, object] | None, end: int) -> Position:
    """The position a state file stands for, given the ledger's end now."""
    if saved is None:
        return {}
    if _END_KEY not in saved:
        return dict(saved)  # an ingest.state.json written before the before/after format
    suffix = "_after" if end > int(str(saved[_END_KEY])) else "_before"
    return {
        key[: -len(suffix)]: value
        for key, value in saved.items()
        if key != _END_KEY and key.endswith(suffix)
    }


def positions_topic(settings: KafkaSettings) -> str:
    """The compacted topic of the adapters' positions."""
    return f"{settings.prefix}.positions"


async def ensure_adapter_topics(settings: KafkaSettings) -> None:
    """The live path's topics plus ``<prefix>.positions`` (compacted, one partition)."""
    await ensure_topics(settings)
    await create_topics(
        settings.bootstrap,
        [
            (
                positions_topic(settings),
                1,
                {
                    "cleanup.policy": "compact",
                    "segment.ms": "60000",
                    "min.cleanable.dirty.ratio": "0.1",
                    "max.message.bytes": str(POSITION_MAX_BYTES),
                },
            )
        ],
        security=settings.security,
    )


def component_of(source: str, domain: str) -> str:
    """A component's name in a deployment: its source, qualified outside the default domain."""
    return source if domain == DEFAULT_DOMAIN else f"{source}.{domain}"


def _is_fenced(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, ProducerFenced) or "fenc" in text or "epoch" in text


class KafkaIntakeSink(IntakeSink):
    """Intake records and positions in one transaction; see the module docstring."""

    def __init__(self, settings: KafkaSettings, source: str, domain: str = DEFAULT_DOMAIN) -> None:
        """Create the topics if needed, fence the predecessor, load the saved position.

        Raises ``KafkaLogError`` (``KafkaAuthError``) if the broker cannot be used."""
        self.settings = settings
        self.source = source
        self.domain = domain
        self.partition = settings.partition(domain)
        self.component = component_of(source, domain)
        self.transactional_id = f"{settings.prefix}.{self.component}"
        self.name = f"kafka://{settings.bootstrap}/{settings.prefix} ({self.component})"
        self.intake_tp = TopicPartition(settings.intake, self.partition)
        self.positions_tp = TopicPartition(positions_topic(settings), 0)
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self.instance = uuid.uuid4().hex
        """Marks this instance's position records (with a sequence number)."""
        self._head: tuple[int, str] = (0, "")
        """``(seq, instance)`` of the last position record committed."""
        self._saved: Position = {}
        try:
            run_sync(self._start())
            self._head, self._saved = run_sync(self._load())
        except BaseException:
            self.close()
            raise

    async def _start(self) -> None:
        s = self.settings
        await ensure_adapter_topics(s)
        # Initialising the transactional id fences a predecessor and settles (aborts) its
        # open transaction, so everything it wrote is decided before anything is read.
        await self._start_producer()
        consumer = new_consumer(s.bootstrap, security=s.security)
        await start_client(consumer, s.bootstrap, s.security)
        self._consumer = consumer

    async def _start_producer(self) -> None:
        s = self.settings
        producer = new_producer(
            s.bootstrap,
            self.transactional_id,
            security=s.security,
            max_request_size=POSITION_MAX_BYTES,  # as the service does for snapshots
        )
        await start_client(producer, s.bootstrap, s.security)
        self._producer = producer

    async def _settled_end(self, tp: TopicPartition) -> int:
        """The last stable offset, once every transaction open now has been decided.

        Read committed stops at the first open transaction: another component's commit in
        flight (or its killed instance's, until the broker aborts it) could otherwise hide
        records of this one that follow it. So: the high watermark now, then wait for the
        last stable offset to reach it."""
        s = self.settings
        probe = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            isolation_level="read_uncommitted",
            enable_auto_commit=False,
            **s.security.client_kwargs(),
        )
        await start_client(probe, s.bootstrap, s.security)
        try:
            high = int((await probe.end_offsets([tp]))[tp])
        finally:
            await probe.stop()
        consumer = self._consumer
        assert consumer is not None
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (end := await end_offset_of(consumer, tp)) < high:
            if time.monotonic() > deadline:
                raise KafkaLogError(
                    f"{tp.topic}[{tp.partition}]: a transaction before offset {high} is still "
                    f"open after {SETTLE_TIMEOUT_S:.0f}s (a producer with a long transaction "
                    "timeout?)"
                )
            await asyncio.sleep(0.05)
        return end

    async def _load(self) -> tuple[tuple[int, str], Position]:
        """The last committed ``(seq, instance)`` and position of this component."""
        consumer = self._consumer
        assert consumer is not None
        tp = self.positions_tp
        consumer.assign([tp])
        end = await self._settled_end(tp)
        key = self.component.encode()
        found: tuple[tuple[int, str], Position] = ((0, ""), {})
        async for batch in read_records(consumer, tp, 0, end):
            for m in batch:
                if m.key == key and m.value is not None:
                    data = json.loads(m.value)
                    head = (int(data["seq"]), str(data.get("instance", "")))
                    found = (head, dict(data["position"]))
        return found

    def saved(self) -> Position:
        """The position committed with the last transaction of this component."""
        return _copy(self._saved)

    def earlier(self) -> Iterator[tuple[int, Envelope]]:
        """This component's committed records on its intake partition (by their header)."""
        tag = self.source.encode()
        batches = self._earlier_batches()
        while True:
            try:
                batch = run_sync(_anext(batches))
            except StopAsyncIteration:
                return
            for offset, headers, value in batch:
                if any(k == SOURCE_HEADER and v == tag for k, v in headers):
                    yield offset, decode_envelope(value, offset)

    async def _earlier_batches(self) -> AsyncIterator[list[tuple[int, Any, bytes]]]:
        consumer = self._consumer
        assert consumer is not None
        tp = self.intake_tp
        consumer.assign([tp])
        end = await self._settled_end(tp)
        async for batch in read_records(consumer, tp, 0, end):
            yield [(m.offset, m.headers or (), m.value or b"") for m in batch]

    def commit(
        self, envelopes: Sequence[Envelope], after: Position, *, before: Position | None = None
    ) -> None:
        """One transaction: the records, then the position (``before`` is not needed).

        A transaction that fails for another reason than fencing is retried on a new
        producer, unless the position topic shows that it committed after all, or that
        another instance has committed since (then this one is fenced: ``SinkFenced``)."""
        del before  # the records and the position land together or not at all
        position = _copy(after)
        if not envelopes and position == self._saved:
            return  # nothing new to say
        values = envelope_bytes(envelopes)
        head = (self._head[0] + 1, self.instance)
        value = msgspec.json.encode(
            {"seq": head[0], "instance": head[1], "position": position}, order="sorted"
        )
        fenced = f"{self.name}: fenced by a newer instance ({self.transactional_id})"
        tries = 0

        def attempt() -> None:
            nonlocal tries
            tries += 1
            if tries > 1:
                now, _ = run_sync(self._recover())
                if now == head:
                    return  # the last try committed; only its answer was lost
                if now != self._head:
                    raise SinkFenced(fenced)  # a successor wrote meanwhile
            run_sync(self._commit(values, value))

        try:
            retry(
                attempt,
                what=f"{self.name}: transaction",
                attempts=_COMMIT_ATTEMPTS,
                backoff=Backoff(0.2, 1.0),
                transient=lambda exc: isinstance(exc, KafkaError) and not _is_fenced(exc),
            )
        except KafkaError as exc:
            if _is_fenced(exc):
                raise SinkFenced(fenced) from exc
            raise
        self._head, self._saved = head, position

    async def _commit(self, values: list[bytes], position: bytes) -> None:
        producer = self._producer
        assert producer is not None
        s = self.settings
        key = self.domain.encode()
        headers = [(SOURCE_HEADER, self.source.encode())]
        futures: list[asyncio.Future[Any]] = []
        try:
            async with producer.transaction():
                for v in values:
                    futures.append(
                        await producer.send(
                            s.intake, v, key=key, partition=self.partition, headers=headers
                        )
                    )
                futures.append(
                    await producer.send(
                        self.positions_tp.topic,
                        position,
                        key=self.component.encode(),
                        partition=self.positions_tp.partition,
                    )
                )
                await asyncio.gather(*futures)
        finally:
            for f in futures:  # a failed transaction fails them all: the error is raised once
                f.add_done_callback(_retrieve)

    async def _recover(self) -> tuple[tuple[int, str], Position]:
        """A new producer (settling the failed transaction), then the committed position."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()
        await self._start_producer()
        return await self._load()

    def close(self) -> None:
        """Stop the producer and the consumer (idempotent)."""
        producer, self._producer = self._producer, None
        consumer, self._consumer = self._consumer, None

        async def stop() -> None:
            for client in (producer, consumer):
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.stop()

        if producer is not None or consumer is not None:
            run_sync(stop())


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _anext(it: AsyncIterator[T]) -> T:
    return await anext(it)


# --------------------------------------------------------------------------- the feed


class LedgerFeed(abc.ABC):
    """A ledger read from an offset and followed as it grows (the binder's input)."""

    name: str

    @abc.abstractmethod
    def wait(self, stop: Callable[[], bool], *, poll_s: float) -> bool:
        """Wait until the ledger exists; False if ``stop()`` came first."""

    @abc.abstractmethod
    def read(self, start: int, end: int) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < end``."""

    @abc.abstractmethod
    def follow(
        self, start: int, *, poll_s: float, stop: Callable[[], bool]
    ) -> Iterator[tuple[int, Envelope]]:
        """Records from ``start`` on as they arrive, until ``stop()``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the feed holds; idempotent."""


class FileLedgerFeed(LedgerFeed):
    """A ledger directory, followed with ``LedgerDirReader.follow``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Nothing is opened until ``wait``: the ledger may not exist yet."""
        self.path = Path(path)
        self.name = str(self.path)
        self._reader: LedgerDirReader | None = None

    def wait(self, stop: Callable[[], bool], *, poll_s: float) -> bool:
        """Poll until the directory holds a segment."""
        while not holds_segments(self.path):
            if stop():
                return False
            time.sleep(poll_s)
        self._reader = LedgerDirReader(self.path)
        return True

    def _opened(self) -> LedgerDirReader:
        if self._reader is None:
            self._reader = LedgerDirReader(self.path)
        return self._reader

    def read(self, start: int, end: int) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < end``."""
        return self._opened().read(start, end)

    def follow(
        self, start: int, *, poll_s: float, stop: Callable[[], bool]
    ) -> Iterator[tuple[int, Envelope]]:
        """``LedgerDirReader.follow``."""
        return self._opened().follow(start, poll_s=poll_s, stop=stop)

    def close(self) -> None:
        """Nothing to release."""
        self._reader = None


class KafkaLedgerFeed(KafkaReader, LedgerFeed):
    """The domain's partition of ``<prefix>.ledger``, committed records only."""

    POLL_MS = 200
    """Longest wait of one fetch: how soon ``stop()`` is noticed while the ledger is idle."""

    def __init__(self, settings: KafkaSettings, domain: str = DEFAULT_DOMAIN) -> None:
        """Create the topics if needed and connect."""
        run_sync(ensure_adapter_topics(settings))
        super().__init__(
            settings.bootstrap,
            settings.ledger,
            settings.partition(domain),
            security=settings.security,
        )

    def wait(self, stop: Callable[[], bool], *, poll_s: float) -> bool:
        """The topic exists (the constructor made sure of it)."""
        del poll_s
        return not stop()

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Committed records with ``start <= offset < end``."""
        return super().read(start, end)

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.2,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """``KafkaReader.follow`` with each fetch held open up to ``POLL_MS`` (``poll_s`` is
        the file feed's polling period and does not apply)."""
        del poll_s
        return super().follow(
            start, poll_s=self.POLL_MS / 1000, stop=stop, idle_timeout_s=idle_timeout_s
        )


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True, slots=True)
class Deployment:
    """A ``kafka://HOST:PORT/PREFIX`` location: the deployment's topics and the domain."""

    settings: KafkaSettings
    domain: str

    def same_as(self, other: Deployment) -> bool:
        """Whether both name the same topics and partition."""
        a, b = self.settings, other.settings
        return (a.bootstrap, a.prefix, a.domains, self.domain) == (
            b.bootstrap,
            b.prefix,
            b.domains,
            other.domain,
        )


def parse_deployment(
    url: str, *, topic: str = "", security: KafkaSecurity | None = None
) -> Deployment:
    """``kafka://HOST:PORT/PREFIX[?domain=NAME&domains=a,b]`` (``KafkaLogError`` if not).

    A path ``PREFIX.<topic>`` (``topic`` being the one the caller reads or writes, e.g.
    ``ledger``) is taken as ``PREFIX``, so the ledger URL the other commands take works."""
    parts = urlparse(url)
    prefix = parts.path.strip("/")
    usage = "expected kafka://HOST:PORT/PREFIX[?domain=NAME&domains=a,b]"
    if parts.scheme != "kafka" or not parts.netloc or not prefix or "/" in prefix:
        raise KafkaLogError(f"{url}: {usage}")
    if topic and prefix.endswith(f".{topic}"):
        prefix = prefix[: -len(topic) - 1]
    query = parse_qs(parts.query)
    unknown = sorted(set(query) - {"domain", "domains"})
    if unknown:
        raise KafkaLogError(f"{url}: unknown parameter(s) {', '.join(unknown)}; {usage}")
    domains = tuple(d for d in query.get("domains", [DEFAULT_DOMAIN])[0].split(",") if d)
    domain = query.get("domain", [DEFAULT_DOMAIN])[0]
    if security is None:
        settings = KafkaSettings(bootstrap=parts.netloc, prefix=prefix, domains=domains)
    else:
        settings = KafkaSettings(
            bootstrap=parts.netloc, prefix=prefix, domains=domains, security=security
        )
    settings.partition(domain)  # an unknown domain is an error here, not at the first send
    return Deployment(settings, domain)


def open_sink(
    where: str | os.PathLike[str], source: str, *, security: KafkaSecurity | None = None
) -> IntakeSink:
    """The sink a location names: a ``kafka://`` deployment or an intake directory."""
    if is_kafka_url(where):
        d = parse_deployment(str(where), topic="intake", security=security)
        return KafkaIntakeSink(d.settings, source, d.domain)
    return FileIntakeSink(where, source)


def open_feed(
    where: str | os.PathLike[str], *, security: KafkaSecurity | None = None
) -> LedgerFeed:
    """The feed a location names: a ``kafka://`` deployment or a ledger directory."""
    if is_kafka_url(where):
        d = parse_deployment(str(where), topic="ledger", security=security)
        return KafkaLedgerFeed(d.settings, d.domain)
    return FileLedgerFeed(where)


__all__ = [
    "SOURCE_HEADER",
    "Deployment",
    "FileIntakeSink",
    "FileLedgerFeed",
    "IntakeSink",
    "KafkaIntakeSink",
    "KafkaLedgerFeed",
    "LedgerFeed",
    "Position",
    "SinkFenced",
    "component_of",
    "ensure_adapter_topics",
    "open_feed",
    "open_sink",
    "parse_deployment",
    "positions_topic",
]
