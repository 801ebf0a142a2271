"""The restore's catch-up fold lets the event loop run (``scheduler.service.fold_yielding``),
without a broker: the group's heartbeats are tasks on the same loop, and a fold that held
it for longer than the session would lose the domain while restoring it."""

from __future__ import annotations

import asyncio

from scheduler.service import fold_yielding


def test_a_long_fold_lets_other_tasks_run_between_slices() -> None:
    seen: list[int] = []  # the other task's count, as each item is folded

    async def main() -> list[int]:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)  # the task has started
        items = list(range(640))
        folded = await fold_yielding(items, lambda _: seen.append(ticks), slice_s=0.0)
        beating.cancel()
        return list(folded)

    assert asyncio.run(main()) == list(range(640))
    assert len(seen) == 640
    # The other task ran after every 64 items, and not in between.
    changes = [i for i in range(1, 640) if seen[i] != seen[i - 1]]
    assert changes == list(range(64, 640, 64))


def test_a_fold_within_its_slice_does_not_yield() -> None:
    seen: list[int] = []

    async def main() -> None:
        ticks = 0

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)
        await fold_yielding(list(range(300)), lambda _: seen.append(ticks), slice_s=3600)
        beating.cancel()

    asyncio.run(main())
    assert len(set(seen)) == 1
