"""Producing to a domain's intake topic and reading its dead letters.

Library calls over the Kafka client that the command line (``gpuledger submit``,
``queues apply``, ``dlq``), the benches and the tests share.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from events.codec import Envelope, encode_envelope, wrap
from events.kafka_admin import (
    KafkaSettings,
    ensure_topics,
    new_consumer,
    new_producer,
    run_sync,
    start_client,
)
from events.kafkalog import end_offset_of, read_records
from events.model import Event
from scheduler.runtime.service import decode_dead_letter


def send_intake(settings: KafkaSettings, domain: str, values: Sequence[bytes]) -> list[int]:
    """Produce raw values to the domain's intake partition; return their offsets."""
    partition = settings.partition(domain)

    async def go() -> list[int]:
        await ensure_topics(settings)
        producer = new_producer(settings.bootstrap, security=settings.security)
        await start_client(producer, settings.bootstrap, settings.security)
        try:
            futures = [
                await producer.send(settings.intake, v, key=domain.encode(), partition=partition)
                for v in values
            ]
            return [int((await f).offset) for f in futures]
        finally:
            await producer.stop()

    return run_sync(go())


def send_events(settings: KafkaSettings, domain: str, events: Sequence[Event]) -> list[int]:
    """Wrap events stamped with the wall clock and produce them to intake."""
    now = time.time_ns() // 1_000_000
    envs: list[Envelope] = [wrap(e, now) for e in events]
    return send_intake(settings, domain, [encode_envelope(e) for e in envs])


def read_dead_letters(settings: KafkaSettings, domain: str) -> list[tuple[int, Any]]:
    """Every dead letter of a domain, with its offset."""
    from aiokafka import TopicPartition  # noqa: PLC0415

    tp = TopicPartition(settings.deadletters, settings.partition(domain))

    async def go() -> list[tuple[int, Any]]:
        consumer = new_consumer(settings.bootstrap, security=settings.security)
        await start_client(consumer, settings.bootstrap, settings.security)
        try:
            consumer.assign([tp])
            out = []
            async for batch in read_records(consumer, tp, 0, await end_offset_of(consumer, tp)):
                out += [(m.offset, decode_dead_letter(m.value)) for m in batch]
            return out
        finally:
            await consumer.stop()

    return run_sync(go())


__all__ = ["read_dead_letters", "send_events", "send_intake"]
