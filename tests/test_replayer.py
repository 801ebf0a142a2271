"""One comparator: ``replay --verify`` and the snapshot catch-up part from a ledger at the
same record, because both are ``scheduler.fold.replayer.Replayer``."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

import msgspec
import pytest

from events.codec import Envelope, decode_event, wrap
from events.memlog import MemoryLedger
from events.model import DECISION_TAGS, PodsAllocated
from scheduler.core import State
from scheduler.fold.replayer import Replayer
from scheduler.fold.snapshot import (
    CatchUp,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
    state_bytes,
)
from scheduler.fold.verify import run as replay
from tests.simkit import demo_inputs, simulate


@cache
def _demo() -> tuple[Envelope, ...]:
    _, ledger = simulate(*demo_inputs(), "gpuledger")
    return tuple(ledger.records)


def _forge_placement(records: list[Envelope]) -> int:
    offset = next(i for i, e in enumerate(records) if e.type == "pods_allocated" and i > 100)
    original = decode_event(records[offset])
    assert isinstance(original, PodsAllocated)
    moved = msgspec.structs.replace(original.placements[0], node="elsewhere")
    forged = msgspec.structs.replace(original, placements=(moved, *original.placements[1:]))
    records[offset] = wrap(forged, records[offset].at)
    return offset


def _drop_unschedulable(records: list[Envelope]) -> int:
    offset = next(i for i, e in enumerate(records) if e.type == "job_unschedulable")
    del records[offset]
    return offset


def _end_cycle_early(records: list[Envelope]) -> int:
    """Drop a cycle's last two decisions: the ledger then goes on with an input while the
    re-run cycle still has decisions to make."""
    end = next(
        i
        for i in range(len(records) - 1)
        if records[i].type == "cycle_completed"
        # two decisions before it, so that one stays in the ledger to start the cycle
        and records[i - 1].type in DECISION_TAGS
        and records[i - 2].type in DECISION_TAGS
        and records[i + 1].type not in DECISION_TAGS
        and i > 100
    )
    del records[end - 1 : end + 1]
    return end - 1


TAMPERINGS: dict[str, Callable[[list[Envelope]], int]] = {
    "forged placement": _forge_placement,
    "dropped decision": _drop_unschedulable,
    "cycle ended early": _end_cycle_early,
}


@pytest.mark.parametrize("tamper", TAMPERINGS.values(), ids=TAMPERINGS.keys())
def test_verify_and_catch_up_part_at_the_same_record(
    tamper: Callable[[list[Envelope]], int],
) -> None:
    records = list(_demo())
    offset = tamper(records)
    verified = replay(MemoryLedger(records))
    assert verified.mismatch is not None and verified.mismatch.offset == offset
    with pytest.raises(SnapshotError) as caught:
        CatchUp(State()).feed_all(enumerate(records))
    match = re.match(r"offset (\d+): ", str(caught.value))
    assert match is not None and int(match.group(1)) == offset


def test_compare_from_passes_over_an_earlier_divergence() -> None:
    records = list(_demo())
    offset = _forge_placement(records)
    assert replay(MemoryLedger(records), start=offset + 1).ok
    replayer = Replayer(State(), compare_from=offset + 1)
    assert all(replayer.feed(i, env) is None for i, env in enumerate(records))
    assert replayer.finish() is None and replayer.records == len(records)


def test_catch_up_from_a_snapshot_reaches_the_replayed_state() -> None:
    records = _demo()
    full = replay(MemoryLedger(list(records)))
    assert full.ok
    # A snapshot taken at a cycle boundary halfway through, caught up with the rest.
    middle = next(
        i + 1
        for i in range(len(records) // 2, len(records))
        if records[i].type == "cycle_completed"
    )
    head = Replayer(State())
    assert all(head.feed(i, records[i]) is None for i in range(middle))
    assert not head.pending
    _, restored = decode_snapshot(encode_snapshot("d", head.state, middle, 0, middle))
    catch = CatchUp(restored)
    state = catch.feed_all((i, records[i]) for i in range(middle, len(records)))
    assert catch.records == len(records) - middle and not catch.pending
    assert state_bytes(state) == state_bytes(full.state)
