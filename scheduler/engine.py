"""The embedded engine: the one loop every runner shares.

It folds a batch of inputs into the state, runs one cycle, and appends the inputs
followed by the cycle's decisions to a ledger — the order replay relies on. The simulator
drives it with simulated time; a live service drives it from intake.
"""

from __future__ import annotations

from collections.abc import Sequence

from events.codec import Envelope, wrap
from events.model import Event
from events.port import LedgerWriter
from scheduler.core import State, apply, cycle


class Engine:
    """State + ledger writer; ``step`` is one scheduling cycle over a batch of inputs."""

    def __init__(self, writer: LedgerWriter | None = None, *, flush_every: int = 1) -> None:
        self.state = State()
        self.writer = writer
        self.flush_every = flush_every
        self._buffer: list[Envelope] = []
        self.records = 0

    def step(self, inputs: Sequence[tuple[Event, int]], now: int) -> list[Event]:
        """Apply ``(event, at)`` inputs in order, run a cycle at ``now``, log it all."""
        state = self.state
        buffer = self._buffer
        for event, at in inputs:
            apply(state, event, at)
            buffer.append(wrap(event, at))
        decisions = cycle(state, now)
        for decision in decisions:
            buffer.append(wrap(decision, state.now))
        if len(buffer) >= self.flush_every:
            self.flush()
        return decisions

    def flush(self) -> None:
        """Append what is buffered to the ledger (one durable batch)."""
        if self._buffer and self.writer is not None:
            self.writer.append(self._buffer)
        self.records += len(self._buffer)
        self._buffer = []
