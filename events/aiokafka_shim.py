"""Every place gpuledger relies on aiokafka's internals, in one module.

aiokafka has no public call for these three things; each function here names the internal it
uses, and ``tests/test_aiokafka_shim.py`` fails when an aiokafka release changes it, so an
upgrade breaks a test rather than the exactly-once loop. Nothing else in the project reads
or writes a private attribute of aiokafka.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.producer import sender as _sender

__all__ = ["add_partition_to_transaction", "fetch_all_metadata", "set_transaction_retry_backoff"]


def set_transaction_retry_backoff(seconds: float) -> None:
    """How long aiokafka's sender waits before it retries an ``AddPartitionsToTxn`` the
    broker refused with CONCURRENT_TRANSACTIONS (its module constant ``BACKOFF_OVERRIDE``,
    20 ms by default), for every producer of the process."""
    _sender.BACKOFF_OVERRIDE = seconds


def add_partition_to_transaction(producer: AIOKafkaProducer, tp: TopicPartition) -> None:
    """Add ``tp`` to the producer's open transaction now, as ``send`` does for a partition
    it has not added yet (``producer._txn_manager.maybe_add_partition_to_txn``); the sender
    task sends the ``AddPartitionsToTxn`` request when the event loop next runs it."""
    producer._txn_manager.maybe_add_partition_to_txn(tp)


async def fetch_all_metadata(consumer: AIOKafkaConsumer) -> ClusterMetadata:
    """The metadata of every topic of the cluster, through the started consumer's client
    (``consumer._client.fetch_all_metadata``): the consumer's public metadata covers only
    the topics it subscribed to."""
    metadata: ClusterMetadata = await consumer._client.fetch_all_metadata()
    return metadata
