"""Deterministic replay: re-run a ledger's inputs through the core and compare decisions.

The ledger interleaves inputs with the decisions of the cycles that followed them; each
cycle ends with ``CycleCompleted``. Replay folds the inputs, and where the ledger shows a
cycle it runs ``cycle`` at that cycle's time and compares every produced decision with the
recorded one, as msgpack envelope bytes. The first difference is reported with its
offset and a readable diff; after it the states have diverged, so replay stops there.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from events.codec import (
    DecodeError,
    UnknownEventType,
    decode_event,
    encode,
    encode_envelope,
    event_json,
)
from events.model import DECISION_TAGS, Event, PolicyConfigured
from events.port import LedgerReader
from scheduler.core import REVISION, State, apply, cycle


@dataclass(slots=True)
class Mismatch:
    """The first decision that replay did not reproduce."""

    offset: int
    expected: str
    produced: str

    def diff(self) -> str:
        """A unified diff of the two decisions as indented JSON."""
        a = _pretty(self.expected).splitlines()
        b = _pretty(self.produced).splitlines()
        return "\n".join(difflib.unified_diff(a, b, "ledger", "replay", lineterm="", n=2))


def _pretty(text: str) -> str:
    if not text:
        return "(nothing)"
    return json.dumps(json.loads(text), indent=2, sort_keys=False)


@dataclass(slots=True)
class ReplayResult:
    """What a replay saw and whether it reproduced every decision."""

    records: int = 0
    inputs: int = 0
    decisions: int = 0
    cycles: int = 0
    skipped: list[int] = field(default_factory=list)
    """Offsets of records of unknown types (parked, not applied)."""
    mismatch: Mismatch | None = None
    state: State = field(default_factory=State)
    revision_note: str = ""
    """Set when the ledger was written by another revision of the policy core."""

    @property
    def ok(self) -> bool:
        """True when every recorded decision was reproduced."""
        return self.mismatch is None


def run(
    reader: LedgerReader,
    *,
    start: int = 0,
    end: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``reader`` and verify its decisions; see the module docstring."""
    result = ReplayResult()
    state = result.state
    produced: list[Event] = []
    produced_at = 0
    index = 0  # next produced decision to compare
    in_cycle = False
    # The state at ``start`` can only be rebuilt by replaying what came before it, so
    # replay always begins at offset 0; ``start`` says where comparing begins.
    for offset, env in reader.read(0, end):
        result.records += 1
        if progress is not None and result.records % 100_000 == 0:
            progress(result.records)
        try:
            event = decode_event(env, offset)
        except UnknownEventType:
            result.skipped.append(offset)
            continue
        except DecodeError:
            raise
        if env.type in DECISION_TAGS:
            result.decisions += 1
            if not in_cycle:
                produced = cycle(state, env.at)
                produced_at = state.now
                index = 0
                in_cycle = True
                result.cycles += 1
            expected_bytes = encode_envelope(env)
            got = produced[index] if index < len(produced) else None
            got_bytes = encode(got, produced_at) if got is not None else b""
            if got_bytes != expected_bytes and offset >= start:
                result.mismatch = Mismatch(
                    offset=offset,
                    expected=event_json(event).decode(),
                    produced=event_json(got).decode() if got is not None else "",
                )
                return result
            index += 1
            if env.type == "cycle_completed":
                in_cycle = False
            continue
        if in_cycle:
            # The ledger ended a cycle early: the replayed cycle produced more decisions.
            if offset >= start:
                result.mismatch = _extra(produced, index, offset)
                return result
            in_cycle = False
        result.inputs += 1
        if isinstance(event, PolicyConfigured) and event.revision != REVISION:
            result.revision_note = (
                f"note: offset {offset} was written by policy revision {event.revision}; this "
                f"core implements revision {REVISION}, so decisions may legitimately differ"
            )
        apply(state, event, env.at)
    if in_cycle and index < len(produced):
        result.mismatch = _extra(produced, index, -1)
    return result


def _extra(produced: list[Event], index: int, offset: int) -> Mismatch:
    return Mismatch(offset=offset, expected="", produced=event_json(produced[index]).decode())
