"""The one runtime step every runner calls: validate → apply → cycle → record.

The simulator's engine, the embedded loop, the Kafka service and the snapshot catch-up
differ only in where their inputs come from and where the records go; what happens to an
input is decided here, once:

1. ``admit`` turns a stored intake record into an event, or a ``Refusal`` naming why it
   may not enter the ledger: an envelope it cannot read, a schema version above what this
   code knows, an unknown event type, a producer clock too far ahead of the scheduler's;
2. ``step`` validates each event against the state (``scheduler.fold.validate``), applies the
   accepted ones in order, runs one ``cycle`` and returns the records to append — the
   accepted inputs followed by the cycle's decisions, the order replay relies on — and the
   refusals, which a runner sends to its dead letters.

Time is the runner's: a live runner passes ``stamp=True`` and every accepted input is
recorded at the runner's clock (never earlier than the state's ``now``), so a producer's
clock can neither move the scheduler's time nor reorder it. The simulator and replay
pass their own (simulated or recorded) times through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from events.codec import SCHEMA_VERSION, DecodeError, Envelope, UnknownEventType, decode_event, wrap
from events.model import Event, PolicyConfigured
from scheduler.core import REVISION, State, apply, cycle
from scheduler.core.policy import kai_knobs
from scheduler.fold.validate import validate

REFUSAL_KINDS = ("decode", "schema", "unknown_type", "clock", "invalid")
"""Why an intake record can be refused: it does not decode, breaks the schema, is of a type
this version does not know, is stamped too far ahead, or the validator refuses it."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an intake record did not enter the ledger; ``index`` is its place in the batch."""

    index: int
    kind: str
    """One of ``REFUSAL_KINDS``."""
    reason: str


@dataclass(slots=True)
class StepResult:
    """What one ``Runtime.step`` produced."""

    records: list[Envelope] = field(default_factory=list)
    """The accepted inputs (as recorded) then the cycle's decisions: append them in order."""
    decisions: list[Event] = field(default_factory=list)
    """The cycle's decisions, ``CycleCompleted`` last (empty when no cycle ran)."""
    refused: list[Refusal] = field(default_factory=list)
    accepted: int = 0


Input = tuple[Event, int]
"""An event and the time its producer gave it (ms)."""


class Runtime:
    """The state and the rules for taking inputs into it; see the module docstring."""

    def __init__(
        self,
        state: State | None = None,
        *,
        validating: bool = True,
        stamp: bool = False,
        max_skew_ms: int | None = None,
        live: bool = False,
    ) -> None:
        """``validating``: refuse inputs ``scheduler.fold.validate`` refuses (off only where
        inputs were accepted before, as in a replay); ``stamp``: record inputs at the
        runner's clock; ``max_skew_ms``: refuse an input stamped further ahead than this;
        ``live``: a runner in front of a real cluster (stamps, and refuses a policy that
        would re-place lost pods, which a cluster cannot bind twice)."""
        self.state = state if state is not None else State()
        self.validating = validating
        self.stamp = stamp or live
        self.max_skew_ms = max_skew_ms
        self.live = live

    @staticmethod
    def admit(env: Envelope, offset: int = -1) -> Event | Refusal:
        """Decode a stored intake record, or say why it cannot be taken."""
        if env.version > SCHEMA_VERSION:
            return Refusal(
                -1,
                "schema",
                f"offset {offset}: envelope schema version {env.version}; this version "
                f"reads up to {SCHEMA_VERSION}",
            )
        try:
            return decode_event(env, offset)
        except UnknownEventType as exc:
            return Refusal(-1, "unknown_type", str(exc))
        except DecodeError as exc:
            return Refusal(-1, "schema" if "payload" in str(exc) else "decode", str(exc))

    def step(
        self, inputs: Sequence[Input | Refusal], now: int, *, cycle_if_idle: bool = False
    ) -> StepResult:
        """Take ``inputs`` in order, run one cycle at ``now``, return what to record.

        A ``Refusal`` among the inputs (from ``admit``) is passed through to the result
        with its index. The cycle runs when at least one input was accepted, or always
        with ``cycle_if_idle`` (a tick of a runner's own clock).
        """
        result = self.take(inputs, now)
        if result.accepted or cycle_if_idle:
            self.run_cycle(now, result)
        return result

    def take(self, inputs: Sequence[Input | Refusal], now: int) -> StepResult:
        """Validate and apply ``inputs`` without running a cycle (the first half of
        ``step``; a catch-up over a ledger calls it record by record)."""
        state = self.state
        result = StepResult()
        records = result.records
        for index, item in enumerate(inputs):
            if isinstance(item, Refusal):
                result.refused.append(Refusal(index, item.kind, item.reason))
                continue
            event, at = item
            why = self._refuse(event, at, now)
            if why is not None:
                result.refused.append(Refusal(index, *why))
                continue
            if self.stamp:
                at = max(now, state.now)
            apply(state, event, at)
            records.append(wrap(event, at))
            result.accepted += 1
        return result

    def take_recorded(self, event: Event, at: int) -> None:
        """Fold one input a ledger recorded, at the time it was recorded: it was taken
        (validated, stamped) when it entered the ledger, so it is neither judged again nor
        wrapped into a record (``Replayer``, which re-runs a ledger)."""
        apply(self.state, event, at)

    def run_cycle(self, now: int, result: StepResult | None = None) -> list[Event]:
        """One cycle at ``now`` (the second half of ``step``); its decisions are appended
        to ``result``'s records when given."""
        state = self.state
        decisions = cycle(state, max(now, state.now) if self.stamp else now)
        if result is not None:
            result.decisions = decisions
            result.records.extend(wrap(d, state.now) for d in decisions)
        return decisions

    def _refuse(self, event: Event, at: int, now: int) -> tuple[str, str] | None:
        if self.max_skew_ms is not None and at > now + self.max_skew_ms:
            return (
                "clock",
                f"stamped {at - now} ms ahead of the scheduler's clock "
                f"(at most {self.max_skew_ms} ms accepted)",
            )
        if self.live and isinstance(event, PolicyConfigured) and event.requeue_lost:
            return (
                "invalid",
                "requeue_lost: true is for simulation; a live cluster's pods cannot "
                "be bound twice (send requeue_lost: false)",
            )
        if self.validating:
            why = validate(self.state, event)
            if why is not None:
                return ("invalid", why)
        return None


def live_policy(policy: str = "gpuledger") -> PolicyConfigured:
    """The policy a live runner records first on an empty ledger: this core's revision,
    lost pods never re-placed (``PolicyConfigured.requeue_lost``)."""
    config = PolicyConfigured(policy=policy, revision=REVISION, requeue_lost=False)
    return kai_knobs(config) if policy == "kai" else config


__all__ = ["REFUSAL_KINDS", "Input", "Refusal", "Runtime", "StepResult", "live_policy"]
