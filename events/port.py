"""The log port: what every ledger backend (embedded file log, Kafka) provides."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
    """Reads envelopes in offset order."""

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < end`` (to the current end when ``end`` is None)."""
        ...

    def end_offset(self) -> int:
        """One past the last complete record currently readable."""
        ...
