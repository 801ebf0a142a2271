"""Deterministic replay: re-run a ledger's inputs through the core and compare decisions.

The ledger interleaves inputs with the decisions of the cycles that followed them; each
cycle ends with ``CycleCompleted``. Replay folds the inputs, and where the ledger shows a
cycle it runs ``cycle`` at that cycle's time and compares every produced decision with the
recorded one, as msgpack envelope bytes (``scheduler.fold.replayer.Replayer``, the comparator
the scheduler's snapshot catch-up uses too). The first difference is reported with its
offset and a readable diff; after it the states have diverged, so replay stops there.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from events.codec import event_json
from events.model import Event
from events.port import LedgerReader
from scheduler.core import REVISION, State
from scheduler.fold.replayer import Divergence, Replayer


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
    # The state at ``start`` can only be rebuilt by replaying what came before it, so
    # replay always begins at offset 0; ``start`` says where comparing begins.
    replayer = Replayer(result.state, compare_from=start)
    divergence: Divergence | None = None
    for offset, env in reader.read(0, end):
        divergence = replayer.feed(offset, env)
        if divergence is not None:
            break
        if progress is not None and replayer.records % 100_000 == 0:
            progress(replayer.records)
    else:
        divergence = replayer.finish()
    result.records = replayer.records
    result.inputs = replayer.inputs
    result.decisions = replayer.decisions
    result.cycles = replayer.cycles
    result.skipped = replayer.skipped
    if replayer.other_revision is not None:
        offset, revision = replayer.other_revision
        result.revision_note = (
            f"note: offset {offset} was written by policy revision {revision}; this "
            f"core implements revision {REVISION}, so decisions may legitimately differ"
        )
    if divergence is not None:
        result.mismatch = Mismatch(
            offset=divergence.offset,
            expected=_json(divergence.expected),
            produced=_json(divergence.produced),
        )
    return result


def _json(event: Event | None) -> str:
    return event_json(event).decode() if event is not None else ""
