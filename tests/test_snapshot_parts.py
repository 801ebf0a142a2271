"""A snapshot larger than a part is stored as several records (``scheduler.fold.snapshot``):
split and reassembled it is the same bytes, and what a reader meets on the compacted topic
(a legacy whole record, an older snapshot's leftovers, parts that do not follow each
other) never passes for the newest snapshot."""

from __future__ import annotations

import os

import pytest

from scheduler.fold.snapshot import (
    SNAPSHOT_ID,
    SNAPSHOT_PART,
    SnapshotAssembler,
    SnapshotRecord,
    split_snapshot,
)


def latest_snapshot(records: list[tuple[bytes | None, list[tuple[str, bytes]]]]) -> bytes | None:
    """The newest complete snapshot among ``(value, headers)`` records in offset order, as
    the service's restore assembles it."""
    assembler = SnapshotAssembler()
    for value, headers in records:
        assembler.feed(value, headers)
    return assembler.latest


def values(records: list[SnapshotRecord]) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    return [(value, headers) for _, value, headers in records]


def compact(records: list[SnapshotRecord]) -> list[SnapshotRecord]:
    """What log compaction keeps: the newest record of each key, in offset order."""
    last = {key: i for i, (key, _, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r[0]] == i]


def test_a_large_snapshot_is_split_into_parts_and_reassembled() -> None:
    data = os.urandom(10_000)
    records = list(split_snapshot("d", data, 3000, b"s1"))
    assert [key for key, _, _ in records] == [b"d/0", b"d/1", b"d/2", b"d/3"]
    assert all(len(v) <= 3000 for _, v, _ in records)
    assert [dict(h)[SNAPSHOT_PART] for _, _, h in records] == [b"0/4", b"1/4", b"2/4", b"3/4"]
    assert {dict(h)[SNAPSHOT_ID] for _, _, h in records} == {b"s1"}
    assert latest_snapshot(values(records)) == data


def test_a_small_snapshot_is_one_record_as_before() -> None:
    data = b"x" * 100
    assert list(split_snapshot("d", data, 100)) == [(b"d", data, [])]
    assert latest_snapshot(values(split_snapshot("d", data, 100))) == data
    with pytest.raises(ValueError, match="positive"):
        list(split_snapshot("d", data, 0))


def test_the_newest_complete_snapshot_wins_after_compaction() -> None:
    legacy = [(b"d", b"legacy", [])]  # written whole by an older version
    older = list(split_snapshot("d", os.urandom(5000), 1000, b"old"))  # 5 parts
    newer_data = os.urandom(2500)
    newer = list(split_snapshot("d", newer_data, 1000, b"new"))  # 3 parts
    log = legacy + older + newer
    assert latest_snapshot(values(log)) == newer_data
    # Compaction keeps the legacy record and the older snapshot's parts 3 and 4, which
    # now precede the newer snapshot and form no complete sequence.
    kept = compact(log)
    assert [k for k, _, _ in kept] == [b"d", b"d/3", b"d/4", b"d/0", b"d/1", b"d/2"]
    assert latest_snapshot(values(kept)) == newer_data


def test_incomplete_or_interleaved_parts_are_not_a_snapshot() -> None:
    whole = os.urandom(3000)
    first = list(split_snapshot("d", whole, 1000, b"a"))
    second = list(split_snapshot("d", os.urandom(3000), 1000, b"b"))
    # a sequence cut short: the older complete one stands
    assert latest_snapshot(values(first + second[:2])) == whole
    # parts of two snapshots mixed: neither passes for complete
    mixed = [first[0], second[1], first[2]]
    assert latest_snapshot(values(mixed)) is None
    # a part out of order
    assert latest_snapshot(values([first[0], first[2], first[1]])) is None
    # a garbled part header is skipped, the whole record after it read
    garbled = (b"x", [(SNAPSHOT_PART, b"one of two")])
    assert latest_snapshot([garbled, (b"w", [])]) == b"w"
