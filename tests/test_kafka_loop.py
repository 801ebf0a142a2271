"""The shared asyncio loop of the Kafka adapters (``events.kafka_admin.run_sync``): a wait
cut short cancels what it waited for, so an interrupted reader leaves no request running
on the loop to hold up its close."""

from __future__ import annotations

import asyncio

import pytest

from events.kafka_admin import run_sync


def test_a_wait_cut_short_cancels_the_coroutine_it_waited_for() -> None:
    cancelled = run_sync(_flag())

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        run_sync(forever(), 0.05)
    assert run_sync(_waited(cancelled), 5.0)


async def _flag() -> asyncio.Event:
    return asyncio.Event()


async def _waited(event: asyncio.Event) -> bool:
    await asyncio.wait_for(event.wait(), 5.0)
    return event.is_set()
