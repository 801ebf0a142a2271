"""An in-memory ledger: the log port over a Python list.

For simulations whose ledger is not kept, benchmarks that measure the core rather than the
disk, JSON Lines sources read whole, and tests. Offsets are list positions.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence

from events.codec import Envelope, encode_envelope
from events.port import follow_polls


class MemoryLedger:
    """A ``LedgerWriter`` and ``LedgerReader`` over ``records`` (a public list)."""

    def __init__(self, envelopes: Iterable[Envelope] = (), *, name: str = "<memory>") -> None:
        """Start with ``envelopes``; ``name`` is used in messages."""
        self.name = name
        self.records: list[Envelope] = list(envelopes)

    def append(self, envelopes: Sequence[Envelope]) -> int:
        """Append a batch; return its first offset."""
        first = len(self.records)
        self.records.extend(envelopes)
        return first

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < end``."""
        records = self.records
        stop = len(records) if end is None else min(end, len(records))
        for offset in range(max(start, 0), stop):
            yield offset, records[offset]

    def end_offset(self) -> int:
        """The number of records."""
        return len(self.records)

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.05,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """Records from ``start`` on, then those appended later (by another thread).

        Returns when ``stop()`` is true (checked between polls) or when nothing new has
        arrived for ``idle_timeout_s`` seconds; otherwise it follows forever.
        """
        position = max(start, 0)

        def poll() -> Generator[tuple[int, Envelope], None, bool]:
            nonlocal position
            end = len(self.records)
            if end <= position:
                return False
            yield from self.read(position, end)
            position = end
            return True

        return follow_polls(poll, poll_s=poll_s, stop=stop, idle_timeout_s=idle_timeout_s)

    def close(self) -> None:
        """Nothing to release."""

    def blob(self) -> bytes:
        """Every record's stored bytes, concatenated: equal blobs mean identical ledgers."""
        return b"".join(encode_envelope(e) for e in self.records)
