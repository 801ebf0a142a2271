"""Replay reproduces every decision byte for byte, whatever the hash seed; and says where not."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from events.codec import SCHEMA_VERSION, decode_event, wrap
from events.model import JobUnschedulable, PodsAllocated
from scheduler.fold.verify import run as replay
from tests.simkit import demo_inputs, simulate

ROOT = Path(__file__).resolve().parent.parent

DIGEST_SCRIPT = """
import hashlib, sys
from tests.simkit import demo_inputs, simulate
_, ledger = simulate(*demo_inputs(), sys.argv[1])
print(hashlib.sha256(ledger.blob()).hexdigest(), len(ledger.records))
"""


def _digest_in_subprocess(policy: str, hashseed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", DIGEST_SCRIPT, policy],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("policy", ["gpuledger", "fifo"])
def test_same_ledger_bytes_under_different_hash_seeds(policy: str) -> None:
    a = _digest_in_subprocess(policy, "0")
    b = _digest_in_subprocess(policy, "4242")
    _, ledger = simulate(*demo_inputs(), policy)
    here = f"{hashlib.sha256(ledger.blob()).hexdigest()} {len(ledger.records)}"
    assert a == b == here


@pytest.mark.parametrize("policy", ["gpuledger", "fifo"])
def test_demo_ledger_replays_with_zero_mismatches(policy: str) -> None:
    result, ledger = simulate(*demo_inputs(), policy)
    replayed = replay(ledger)
    assert replayed.ok, replayed.mismatch and replayed.mismatch.diff()
    assert replayed.records == len(ledger.records)
    assert replayed.cycles == result.cycles
    # the replayed state is the simulated one
    assert replayed.state.status_counts() == result.statuses


def test_a_tampered_decision_is_reported_with_its_offset_and_a_diff() -> None:
    _, ledger = simulate(*demo_inputs(), "gpuledger")
    offset = next(
        i for i, env in enumerate(ledger.records) if env.type == "pods_allocated" and i > 100
    )
    original = decode_event(ledger.records[offset])
    assert isinstance(original, PodsAllocated)
    moved = msgspec.structs.replace(original.placements[0], node="elsewhere")
    forged = msgspec.structs.replace(original, placements=(moved, *original.placements[1:]))
    ledger.records[offset] = wrap(forged, ledger.records[offset].at)
    result = replay(ledger)
    assert not result.ok and result.mismatch is not None
    assert result.mismatch.offset == offset
    diff = result.mismatch.diff()
    assert '"node": "elsewhere"' in diff and diff.startswith("--- ledger")


def test_a_ledger_written_at_an_older_envelope_version_verifies() -> None:
    """The envelope version says which schema wrote a record, not what was decided: a
    ledger from before a field was added to ``policy_configured`` (version 7, before
    ``backfill_give_way_ms``) reproduces decision for decision; a changed decision in it
    is still reported."""
    _, ledger = simulate(*demo_inputs(), "gpuledger")
    older = SCHEMA_VERSION - 1
    ledger.records[:] = [msgspec.structs.replace(e, version=older) for e in ledger.records]
    result = replay(ledger)
    assert result.ok, result.mismatch and result.mismatch.diff()
    assert result.decisions > 100
    offset = next(i for i, env in enumerate(ledger.records) if env.type == "job_unschedulable")
    original = decode_event(ledger.records[offset])
    assert isinstance(original, JobUnschedulable)
    forged = msgspec.structs.replace(original, reason=original.reason + "!")
    ledger.records[offset] = wrap(forged, ledger.records[offset].at, older)
    tampered = replay(ledger)
    assert not tampered.ok and tampered.mismatch is not None
    assert tampered.mismatch.offset == offset


def test_a_missing_decision_is_a_mismatch() -> None:
    _, ledger = simulate(*demo_inputs(), "gpuledger")
    offset = next(i for i, env in enumerate(ledger.records) if env.type == "job_unschedulable")
    assert isinstance(decode_event(ledger.records[offset]), JobUnschedulable)
    del ledger.records[offset]
    result = replay(ledger)
    assert not result.ok and result.mismatch is not None
    assert result.mismatch.offset == offset


def test_unknown_event_types_are_skipped_not_fatal() -> None:
    _, ledger = simulate(*demo_inputs(), "gpuledger")
    future = ledger.records[0].__class__(
        type="gpu_sample_v9", key="x", at=0, payload=msgspec.Raw(msgspec.msgpack.encode({"a": 1}))
    )
    ledger.records.insert(1, future)
    result = replay(ledger)
    assert result.ok and result.skipped == [1]
