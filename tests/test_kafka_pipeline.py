"""The service's transactions on the real broker: the ledger partition is added to a
transaction before any record is sent to it (``add_partition_now``), so that round trip
overlaps the micro-batch's cycle."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import TopicPartition

from events.kafka_admin import KafkaSettings, add_partition_now, new_producer, run_sync
from tests.kafkakit import kafka, settings

__all__ = ["kafka", "settings"]

pytestmark = pytest.mark.integration


def test_add_partition_now_adds_it_before_any_record(settings: KafkaSettings) -> None:
    s = settings
    tp = TopicPartition(s.ledger, 0)

    async def go() -> tuple[bool, int]:
        producer = new_producer(s.bootstrap, f"{s.prefix}.txn")
        await producer.start()
        try:
            async with producer.transaction():
                await add_partition_now(producer, s.ledger, 0)
                # the broker's answer arrives with nothing sent: the request went at once
                deadline = time.monotonic() + 10
                while tp not in producer._txn_manager.txn_partitions:
                    assert time.monotonic() < deadline, "the partition was never added"
                    await asyncio.sleep(0.01)
                added = True
                sent = await (await producer.send(s.ledger, b"r", key=b"d", partition=0))
            async with producer.transaction():  # one with nothing sent to it commits too
                await add_partition_now(producer, s.ledger, 0)
            return added, int(sent.offset)
        finally:
            await producer.stop()

    assert run_sync(go(), 60) == (True, 0)
