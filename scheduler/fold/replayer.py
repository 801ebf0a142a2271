"""Re-run a ledger's records and compare each decision with the recorded one.

The ledger interleaves inputs with the decisions of the cycles that followed them; each
cycle ends with ``CycleCompleted``. ``Replayer`` folds the inputs as recorded
(``Runtime.take_recorded``), and where the ledger shows a cycle it runs one
(``Runtime.run_cycle``) at that cycle's time and compares every produced decision with the
recorded one, as msgpack envelope bytes (at the envelope version the ledger was written
at). A cycle also updates bookkeeping its decisions do not carry (fair-share usage,
wake-up times, the "fresh" list), so it must be re-run rather than its decisions applied.

It is the one comparator of ``gpuledger replay --verify`` (``scheduler.fold.verify.run``, from
offset 0) and of the scheduler's snapshot catch-up (``scheduler.fold.snapshot.CatchUp``, from a
snapshot's position); each turns a ``Divergence`` into its own report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.codec import Envelope, UnknownEventType, decode_event, wrap
from events.model import DECISION_TAGS, Event, PolicyConfigured
from scheduler.core import REVISION, State
from scheduler.fold.step import Runtime


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first record where the re-run and the ledger part.

    ``expected`` is the ledger's decision at ``offset`` (None: the ledger has an input
    there, or has ended (``offset`` -1), while the re-run cycle made more decisions);
    ``produced`` the re-run's decision in its place (None: the cycle made no more).
    """

    offset: int
    expected: Event | None
    produced: Event | None


@dataclass(slots=True)
class Replayer:
    """Folds ledger records into ``state`` one at a time, re-running every cycle.

    Feed records in ledger order, starting at a cycle boundary (offset 0 or a snapshot's
    position). Divergences at offsets below ``compare_from`` are passed over (the fold goes
    on, as ``replay --verify --from`` needs the state before the bound).
    """

    state: State
    compare_from: int = 0
    records: int = 0
    inputs: int = 0
    decisions: int = 0
    cycles: int = 0
    skipped: list[int] = field(default_factory=list)
    """Offsets of records of unknown types (a newer writer's; parked, not applied)."""
    other_revision: tuple[int, int] | None = None
    """``(offset, revision)`` of the latest ``PolicyConfigured`` written by a revision of the
    core other than this one's: its decisions may legitimately differ."""
    runtime: Runtime = field(init=False)
    _produced: list[Event] = field(init=False, default_factory=list)
    _produced_at: int = field(init=False, default=0)
    _index: int = field(init=False, default=0)
    """The next produced decision to compare."""
    _in_cycle: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        """The ledger's inputs were validated when they were taken: none is refused again."""
        self.runtime = Runtime(self.state, validating=False)

    @property
    def pending(self) -> bool:
        """True while a cycle's decisions are only partly seen."""
        return self._in_cycle

    def feed(self, offset: int, env: Envelope) -> Divergence | None:
        """Fold one record; the divergence it shows, if any (then the states differ and
        feeding on is pointless). ``DecodeError`` for a record that does not decode."""
        self.records += 1
        if env.type in DECISION_TAGS:
            return self._decision(offset, env)
        try:
            event = decode_event(env, offset)
        except UnknownEventType:
            self.skipped.append(offset)
            return None
        if self._in_cycle:
            # The ledger ended the cycle early: the re-run cycle made more decisions.
            self._in_cycle = False
            # (Past the end of the produced list the two parted at an earlier decision,
            # below ``compare_from``.)
            if offset >= self.compare_from and self._index < len(self._produced):
                return Divergence(offset, None, self._produced[self._index])
        self.inputs += 1
        if isinstance(event, PolicyConfigured) and event.revision != REVISION:
            self.other_revision = (offset, event.revision)
        self.runtime.take_recorded(event, env.at)
        return None

    def _decision(self, offset: int, env: Envelope) -> Divergence | None:
        """A recorded decision: the next one the re-run cycle produced must be the same
        envelope (wrapped at the version the ledger was written at: a decision an older
        writer recorded is the same decision). Its payload is decoded only to report a
        difference (``DecodeError`` if it does not decode)."""
        self.decisions += 1
        if not self._in_cycle:
            self._produced = self.runtime.run_cycle(env.at)
            self._produced_at = self.state.now
            self._index = 0
            self._in_cycle = True
            self.cycles += 1
        index = self._index
        got = self._produced[index] if index < len(self._produced) else None
        self._index = index + 1
        if env.type == "cycle_completed":
            self._in_cycle = False
        if offset < self.compare_from:
            return None
        # Envelopes are equal exactly when their msgpack bytes are (a struct's fields in
        # order, the payload as raw bytes).
        if got is not None and wrap(got, self._produced_at, env.version) == env:
            return None
        return Divergence(offset, decode_event(env, offset), got)

    def finish(self) -> Divergence | None:
        """At the end of the records: the decision the re-run made that the ledger lacks
        (a cycle the ledger left unfinished), if any."""
        if self._in_cycle and self._index < len(self._produced):
            return Divergence(-1, None, self._produced[self._index])
        return None


__all__ = ["Divergence", "Replayer"]
