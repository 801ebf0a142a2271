"""The live path's Kafka topics and the clients every Kafka module makes.

Topics (``<prefix>.<name>``), each with one partition per scheduling domain:

``intake``       what producers (CLI, clock, binder, Kubernetes watch) submit, keyed by domain
``ledger``       the total order per domain: accepted inputs and decisions, written only in
                 transactions, read with ``read_committed``
``deadletters``  intake records the scheduler refused, with the reason and source offset
``snapshots``    compacted: the latest scheduler state per domain and its ledger offset

``KafkaSettings`` says where they are; ``ensure_topics`` creates them. The clients
(``new_consumer``, ``new_producer``, started with ``start_client`` for an error that says
why a connection failed) take their TLS and SASL options from ``events.kafka_security``.
The ports are synchronous, so the aiokafka clients run on one background event loop and
the sync code submits coroutines to it (``run_sync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest

from events.aiokafka_shim import add_partition_to_transaction, set_transaction_retry_backoff
from events.kafka_security import (
    FLAGS,
    KafkaAuthError,
    KafkaLogError,
    KafkaSecurity,
    option_hint,
    resolve_security,
)

T = TypeVar("T")

DEFAULT_BOOTSTRAP = os.environ.get("GPULEDGER_KAFKA", "127.0.0.1:19092")
"""The broker ``make kafka-up`` starts; override with ``GPULEDGER_KAFKA``."""

DEFAULT_PREFIX = "gpuledger"
DEFAULT_DOMAIN = "default"
COMPRESSION: str | None = None
"""Producers send uncompressed batches: gzip costs CPU three times on the intake →
decision path (the producer, the broker validating each batch, the consumer), which on a
machine the broker shares is latency; lz4/zstd would add a native dependency. A topic's
``compression.type`` makes the broker compress what it stores, if disk matters more."""
SNAPSHOT_MAX_BYTES = 256 * 1024 * 1024
"""Largest snapshot record (before compression): the state of a million-event ledger
with every finished job kept is ~70 MB of msgpack."""
READ_TIMEOUT_S = 30.0
"""How long a bounded read may make no progress before it is treated as a broker fault."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """Where the live path's topics are, which domains they hold, and how to connect.

    ``domains`` fixes the partition of each scheduling domain in every topic (its index),
    so every producer and every scheduler must be given the same list. ``security``
    defaults to the ``GPULEDGER_KAFKA_*`` environment (``KafkaSecurity.from_env``).
    """

    bootstrap: str = DEFAULT_BOOTSTRAP
    prefix: str = DEFAULT_PREFIX
    domains: tuple[str, ...] = (DEFAULT_DOMAIN,)
    security: KafkaSecurity = field(default_factory=KafkaSecurity.from_env)

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

    def snapshot_transactional_id(self, domain: str) -> str:
        """The transactional id of the domain's snapshot writer, fenced like the ledger's."""
        return f"{self.transactional_id(domain)}.snapshots"


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
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            # A wait cut short (Ctrl-C, a timeout) cancels what it waited for: a client
            # left mid-request on the loop would hold up its own close.
            future.cancel()
            raise


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


async def create_topics(
    bootstrap: str,
    topics: Sequence[tuple[str, int, dict[str, str]]],
    *,
    security: KafkaSecurity | None = None,
) -> None:
    """Create ``(name, partitions, configs)`` topics; existing ones are left as they are."""
    security = resolve_security(security)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_kwargs())
    await start_client(admin, bootstrap, security)
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
        security=settings.security,
        topics=[
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


def new_consumer(
    bootstrap: str, *, security: KafkaSecurity | None = None, **kwargs: Any
) -> AIOKafkaConsumer:
    """A consumer that reads only committed transactions, with large fetches for replay.

    Start it with ``start_client`` for a clear error when the broker refuses it."""
    kwargs.setdefault("enable_auto_commit", False)
    kwargs.setdefault("auto_offset_reset", "earliest")
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
        **resolve_security(security).client_kwargs(),
        **kwargs,
    )


# aiokafka retries an ``AddPartitionsToTxn`` refused with CONCURRENT_TRANSACTIONS after
# this many seconds (20 ms, as the Java client does: KAFKA-5477). The broker refuses it
# while it is still writing the previous transaction's markers, which on one broker takes
# a millisecond or two, and a producer that commits back to back — the scheduler service,
# one transaction per micro-batch — meets it in about one transaction in eight; each
# time the micro-batch's decisions waited 20 ms for nothing. Polled every 2 ms instead.
set_transaction_retry_backoff(0.002)


def new_producer(
    bootstrap: str,
    transactional_id: str | None = None,
    *,
    security: KafkaSecurity | None = None,
    compression: str | None = COMPRESSION,
    max_request_size: int = 1024 * 1024,
) -> AIOKafkaProducer:
    """An idempotent producer (transactional when given an id) that batches and compresses
    (``compression=None``: it does not, for large records that must not hold up the event
    loop while they are compressed); ``max_request_size``: the largest request it sends
    (aiokafka's default, 1 MiB, unless a caller writes larger records).

    Start it with ``start_client`` for a clear error when the broker refuses it."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **resolve_security(security).client_kwargs(),
        enable_idempotence=True,
        transactional_id=transactional_id,
        compression_type=compression,
        linger_ms=2,
        max_batch_size=1024 * 1024,
        # Short, so that a killed scheduler's open transaction is aborted by the broker
        # quickly if no successor fences it first.
        transaction_timeout_ms=10_000,
        request_timeout_ms=15_000,
        max_request_size=max_request_size,
    )


async def send_records(
    producer: AIOKafkaProducer,
    topic: str,
    partition: int,
    key: bytes,
    values: Sequence[bytes],
    last_headers: Sequence[tuple[str, bytes]] = (),
) -> tuple[int, int] | None:
    """Send ``values`` to ``topic[partition]`` in order, as whole record batches, and return
    the offsets of the first and the last record (None when there are none);
    ``last_headers`` go on the last record.

    One ``send_batch`` per batch of up to the producer's batch size, instead of one
    ``send`` per record: a per-record send costs about three times the CPU (a future,
    a partition lookup and an accumulator append each), which at a thousand ledger
    records a second is a large part of a micro-batch. Inside a transaction, as
    ``send`` is."""
    if not values:
        return None
    sent: list[tuple[asyncio.Future[Any], int]] = []
    batch, count = producer.create_batch(), 0
    last = len(values) - 1
    for i, value in enumerate(values):
        headers = list(last_headers) if i == last else []
        while batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
            if count == 0:
                raise KafkaLogError(f"{topic}: a record of {len(value)} bytes exceeds a batch")
            sent.append((await producer.send_batch(batch, topic, partition=partition), count))
            batch, count = producer.create_batch(), 0
        count += 1
    sent.append((await producer.send_batch(batch, topic, partition=partition), count))
    done = await asyncio.gather(*(future for future, _ in sent))
    return int(done[0].offset), int(done[-1].offset) + sent[-1][1] - 1


async def add_partition_now(producer: AIOKafkaProducer, topic: str, partition: int) -> None:
    """Add ``topic[partition]`` to the open transaction now, before anything is sent to it.

    aiokafka adds a partition to the transaction (``AddPartitionsToTxn``, a round trip to
    the coordinator) when the first record for it is sent, and holds the produce request
    back until the answer; so a transaction's round trips are strictly in sequence. Added
    here, the request is on the wire while the caller computes what it will send (the
    scheduler service: the micro-batch's cycle), and the answer is usually back by then.
    A transaction in which nothing is sent to the partition still commits (the partition
    only gets the commit marker)."""
    add_partition_to_transaction(producer, TopicPartition(topic, partition))
    # The sender task wakes, starts the request task, and that writes the request: a few
    # turns of the event loop, before the caller's synchronous work holds it.
    for _ in range(4):
        await asyncio.sleep(0)


async def start_client(client: Any, bootstrap: str, security: KafkaSecurity | None = None) -> None:
    """``await client.start()`` for any aiokafka client; when it cannot connect, stop it and
    raise ``KafkaAuthError`` or ``KafkaLogError`` saying why.

    aiokafka's own error is only "Unable to bootstrap" (the reason goes to its log), so on
    failure one connection is made directly to find it: refused credentials, a SASL or TLS
    handshake the listener does not speak, or nothing listening."""
    try:
        await client.start()
    except KafkaConnectionError as exc:
        with contextlib.suppress(Exception):
            await (client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop())
        raise await diagnose_connection(bootstrap, resolve_security(security), exc) from exc


async def diagnose_connection(
    bootstrap: str, security: KafkaSecurity, original: BaseException | None = None
) -> KafkaLogError:
    """Connect to each bootstrap server once and return the error that says what is wrong."""
    where = f"Kafka at {bootstrap} ({security.describe()})"
    reason = str(original) if original is not None else "no bootstrap server answered"
    for host, port, _ in collect_hosts(bootstrap, randomize=False):
        try:
            conn = await create_conn(
                host, port, request_timeout_ms=10_000, **security.client_kwargs()
            )
        except SaslAuthenticationFailed as exc:
            return KafkaAuthError(
                f"{where}: SASL authentication refused by the broker: {_broker_message(exc)}"
            )
        except (UnsupportedSaslMechanismError, IllegalSaslStateError) as exc:
            return KafkaAuthError(
                f"{where}: the listener at {host}:{port} refused the SASL handshake "
                f"({_broker_message(exc)}); does it use {security.security_protocol}?"
            )
        except ssl.SSLCertVerificationError as exc:
            return KafkaLogError(
                f"{where}: TLS certificate of {host}:{port} not trusted ({exc.verify_message}); "
                f"check {option_hint('ssl_cafile')}"
            )
        except ssl.SSLError as exc:
            return KafkaLogError(
                f"{where}: TLS handshake with {host}:{port} failed ({exc.reason or exc}); "
                "does the listener use TLS, and does it require a client certificate?"
            )
        except (KafkaConnectionError, ConnectionResetError, asyncio.IncompleteReadError) as exc:
            hint = f"the listener probably does not use {security.security_protocol}"
            if security.tls:
                hint += f", or it requires a client certificate ({FLAGS['ssl_certfile']})"
            reason = (
                f"{host}:{port} closed the connection during the handshake "
                f"({_exc_text(exc)}); {hint}"
            )
            continue
        except (OSError, KafkaError, TimeoutError) as exc:
            why = getattr(exc, "strerror", None) or _exc_text(exc)
            reason = f"cannot connect to {host}:{port}: {why}"
            continue
        try:
            await conn.send(MetadataRequest([]))
        except (KafkaError, TimeoutError, OSError) as exc:
            # A SASL listener answers ApiVersions unauthenticated, then drops a client that
            # sends anything but a SASL handshake.
            reason = (
                f"{host}:{port} closed the connection on the first request ({_exc_text(exc)}); the "
                f"listener probably expects SASL or TLS, not {security.security_protocol}"
            )
        else:
            reason = f"{host}:{port} answers now; the first attempt failed: {reason}"
        finally:
            conn.close()
    return KafkaLogError(f"{where}: {reason}")


def _broker_message(exc: BaseException) -> str:
    """The broker's text of a refused handshake, else the error's description."""
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    return text or getattr(exc, "description", "") or type(exc).__name__


def _exc_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


__all__ = [
    "COMPRESSION",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_DOMAIN",
    "DEFAULT_PREFIX",
    "READ_TIMEOUT_S",
    "SNAPSHOT_MAX_BYTES",
    "KafkaSettings",
    "add_partition_now",
    "create_topics",
    "diagnose_connection",
    "ensure_topics",
    "new_consumer",
    "new_producer",
    "run_sync",
    "shutdown",
    "start_client",
]
