"""The service's micro-batch pipeline on the real broker, in process: what a micro-batch
takes from intake, and the transaction's partition added before its records.

``SchedulerService`` runs on the clients' shared loop (``run_sync``), with its producer's
commit slowed down so that intake arrives while a transaction is open."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import TopicPartition

from events.codec import encode_envelope, wrap
from events.kafka_admin import KafkaSettings, add_partition_now, new_producer, run_sync
from events.model import JobSubmitted, PodSpec, QueueConfigured
from scheduler.service import SchedulerService, ServiceConfig
from tests.kafkakit import kafka, settings

__all__ = ["kafka", "settings"]

pytestmark = pytest.mark.integration


def record(event: Any) -> bytes:
    return encode_envelope(wrap(event, time.time_ns() // 1_000_000))


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


def test_a_batch_takes_all_intake_that_arrived_during_the_previous_commit(
    settings: KafkaSettings,
) -> None:
    """aiokafka fetches a partition again only once what it fetched has been taken; a
    loop that polls between micro-batches left what arrived during a commit for the
    micro-batch after next. The service takes it into the very next one."""
    s = settings
    sizes: list[int] = []
    committing = asyncio.Event()

    class SlowCommits(SchedulerService):
        async def _take_over(self) -> None:
            await super()._take_over()
            commit = self._producer.commit_transaction

            async def slow() -> None:  # a broker slow to end the transaction
                committing.set()
                await asyncio.sleep(1.5)
                await commit()
                committing.clear()

            self._producer.commit_transaction = slow
            step = self.runtime.step

            def counted(inputs: list[Any], now: int) -> Any:
                sizes.append(sum(isinstance(i, tuple) for i in inputs))
                return step(inputs, now)

            self.runtime.step = counted  # type: ignore[method-assign]

    async def go() -> None:
        service = SlowCommits(
            ServiceConfig(settings=s, domain="default", session_timeout_ms=1500, policy="fifo")
        )
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        producer = new_producer(s.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(s.intake, record(QueueConfigured(queue="q")), partition=0)
            await asyncio.wait_for(committing.wait(), 60)  # the first batch commits, slowly
            for i in range(10):
                job = JobSubmitted(job=f"j{i}", queue="q", pods=(PodSpec(name="p", cpu_milli=1),))
                await producer.send_and_wait(s.intake, record(job), partition=0)
                await asyncio.sleep(0.02)
            deadline = time.monotonic() + 60
            while sum(sizes) < 12 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await producer.stop()
            await asyncio.wait_for(task, 30)

    run_sync(go(), 180)
    # first batch: the recorded policy and the queue; then all ten jobs, sent during its
    # commit, in the next one
    assert sizes[:2] == [2, 10], sizes
