"""The log port: what every ledger backend (embedded file log, Kafka) provides."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Protocol

from events.codec import Envelope


class LedgerWriter(Protocol):
    """Appends envelopes; on return they are durable and have consecutive offsets."""

    def append(self, envelopes: Sequence[Envelope]) -> int:
        """Append a batch atomically with respect to readers; return the first offset."""
        ...

    def end_offset(self) -> int:
        """The offset the next appended record will get."""
        ...

    def close(self) -> None:
        """Flush, release the writer lock."""
        ...


class LedgerReader(Protocol):
    """Reads envelopes in offset order.

    Offsets increase but need not be consecutive (a Kafka topic's transaction markers take
    offsets no reader sees): "read everything" means up to ``end_offset()``, never a count
    of records, and a reader that has read to ``end`` has consumed every offset below it.
    """

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < end`` (to the current end when ``end`` is None)."""
        ...

    def end_offset(self) -> int:
        """One past the last complete record currently readable."""
        ...

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = ...,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """Records from ``start`` on, then each new one as it becomes readable, in order.

        Polls every ``poll_s`` seconds while there is nothing new. Returns when ``stop()``
        is true (checked between polls) or after ``idle_timeout_s`` seconds without a new
        record; otherwise follows forever.
        """
        ...

    def close(self) -> None:
        """Release what the reader holds (files, broker connections); idempotent."""
        ...


def follow_polls(
    poll: Callable[[], Generator[tuple[int, Envelope], None, bool]],
    *,
    poll_s: float | None,
    stop: Callable[[], bool] | None,
    idle_timeout_s: float | None,
) -> Iterator[tuple[int, Envelope]]:
    """The loop of every ``LedgerReader.follow``: yield what each ``poll()`` yields.

    ``poll`` yields the records it finds and returns whether the reader moved on. Between
    polls that did not, sleeps ``poll_s`` seconds (None: ``poll`` itself waits, as a
    broker fetch does). Returns when ``stop()`` is true (checked before each poll) or when
    no poll has moved on for ``idle_timeout_s`` seconds.
    """
    idle_since = time.monotonic()
    while True:
        if stop is not None and stop():
            return
        if (yield from poll()):
            idle_since = time.monotonic()
            continue
        if idle_timeout_s is not None and time.monotonic() - idle_since >= idle_timeout_s:
            return
        if poll_s is not None:
            time.sleep(poll_s)
