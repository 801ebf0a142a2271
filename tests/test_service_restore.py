"""The restore's catch-up fold lets the event loop run (``scheduler.runtime.service.fold_yielding``),
without a broker: the group's heartbeats are tasks on the same loop, and a fold that held
it for longer than the session would lose the domain while restoring it."""

from __future__ import annotations

import asyncio

from scheduler.runtime.service import fold_yielding


def _fold_beside_a_task(count: int, slice_s: float) -> list[int]:
    """Fold ``count`` items beside a task that counts its turns on the loop: per item
    folded, the turns it had had by then."""
    seen: list[int] = []

    async def main() -> None:
        turns = 0

        async def heartbeat() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0)  # the task has started
        items = list(range(count))
        folded = await fold_yielding(items, lambda _: seen.append(turns), slice_s=slice_s)
        assert folded == items
        beating.cancel()

    asyncio.run(main())
    assert len(seen) == count
    return seen


def test_a_long_fold_lets_other_tasks_run_between_slices() -> None:
    seen = _fold_beside_a_task(640, slice_s=0.0)
    # The other task ran after every 64 items, and not in between.
    changes = [i for i in range(1, 640) if seen[i] != seen[i - 1]]
    assert changes == list(range(64, 640, 64))


def test_a_fold_within_its_slice_does_not_yield() -> None:
    assert len(set(_fold_beside_a_task(300, slice_s=3600))) == 1
