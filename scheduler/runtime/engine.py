"""The engine: the runtime step plus a ledger writer, for runners that append to a ledger.

It hands a batch of inputs to ``Runtime.step`` (validate → apply → cycle) and appends the
records it returns — the accepted inputs followed by the cycle's decisions, the order
replay relies on. The simulator drives it with simulated time; the embedded loop drives
it from intake with the wall clock. Refused inputs are kept in ``refused`` for the runner
to report (the simulator's inputs are its own, so a refusal there is a bug in a workload).
"""

from __future__ import annotations

from collections.abc import Sequence

from events.codec import Envelope
from events.model import Event
from events.port import LedgerWriter
from scheduler.core import State
from scheduler.fold.step import Input, Refusal, Runtime, StepResult


class Engine:
    """A ``Runtime`` and a ledger writer; ``step`` is one scheduling cycle over a batch."""

    def __init__(
        self,
        writer: LedgerWriter | None = None,
        *,
        flush_every: int = 1,
        runtime: Runtime | None = None,
    ) -> None:
        """Append to ``writer`` every ``flush_every`` records (None: keep nothing)."""
        self.runtime = runtime if runtime is not None else Runtime()
        self.writer = writer
        self.flush_every = flush_every
        self._buffer: list[Envelope] = []
        self.records = 0
        self.refused: list[Refusal] = []

    @property
    def state(self) -> State:
        """The scheduler's state."""
        return self.runtime.state

    @state.setter
    def state(self, state: State) -> None:
        self.runtime.state = state

    def run_step(
        self, inputs: Sequence[Input | Refusal], now: int, *, cycle_if_idle: bool = True
    ) -> StepResult:
        """One runtime step; its records are buffered for the ledger."""
        result = self.runtime.step(inputs, now, cycle_if_idle=cycle_if_idle)
        self.refused.extend(result.refused)
        self._buffer.extend(result.records)
        if len(self._buffer) >= self.flush_every:
            self.flush()
        return result

    def step(self, inputs: Sequence[Input], now: int) -> list[Event]:
        """Take ``(event, at)`` inputs, run a cycle at ``now``; return its decisions."""
        return self.run_step(inputs, now).decisions

    def flush(self) -> None:
        """Append what is buffered to the ledger (one durable batch)."""
        if self._buffer and self.writer is not None:
            self.writer.append(self._buffer)
        self.records += len(self._buffer)
        self._buffer = []
