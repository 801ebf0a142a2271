"""What ``events.aiokafka_shim`` relies on in aiokafka's internals still holds: each test
fails when an aiokafka release changes the internal a shim function uses."""

from __future__ import annotations

import asyncio
import inspect

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.producer import sender

from events import aiokafka_shim


def test_the_sender_waits_the_backoff_the_shim_sets() -> None:
    """The sender's retry of a CONCURRENT_TRANSACTIONS refusal returns the module's
    ``BACKOFF_OVERRIDE``, read when it retries (so setting it later takes effect)."""
    handler = inspect.getsource(sender)
    assert "CONCURRENT_TRANSACTIONS" in handler or "ConcurrentTransactions" in handler
    assert "return BACKOFF_OVERRIDE" in handler
    before = sender.BACKOFF_OVERRIDE
    try:
        aiokafka_shim.set_transaction_retry_backoff(0.004)
        assert sender.BACKOFF_OVERRIDE == 0.004
    finally:
        sender.BACKOFF_OVERRIDE = before


def test_a_partition_added_now_is_pending_for_the_sender() -> None:
    """A transactional producer has a transaction manager whose partitions to add the
    sender sends; the shim puts the partition there, as ``send`` would."""

    async def run() -> set[TopicPartition]:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", transactional_id="t")
        manager = producer._txn_manager
        manager.set_pid_and_epoch(1, 0)  # what InitProducerId gives it, without a broker
        manager.begin_transaction()  # what producer.begin_transaction() does
        tp = TopicPartition("ledger", 0)
        aiokafka_shim.add_partition_to_transaction(producer, tp)
        added = set(manager.partitions_to_add())
        await producer.stop()
        return added

    assert asyncio.run(run()) == {TopicPartition("ledger", 0)}


def test_a_consumer_has_a_client_that_fetches_all_metadata() -> None:
    async def run() -> AIOKafkaClient:
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        client = consumer._client
        await consumer.stop()
        return client

    client = asyncio.run(run())
    assert isinstance(client, AIOKafkaClient)
    assert inspect.iscoroutinefunction(client.fetch_all_metadata)
