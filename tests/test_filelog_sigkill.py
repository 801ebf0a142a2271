"""Crash safety: SIGKILL a writer mid-append, again and again, and lose nothing acknowledged."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from events.codec import Envelope
from events.filelog import FileLedger, LedgerDirReader, verify

pytestmark = pytest.mark.integration

# Shared by the writer child and the checks below, so both derive a record from its offset.
RECORD_SOURCE = """
from events.codec import wrap
from events.model import PodStarted

def record(offset):
    return wrap(PodStarted(job=f"job-{offset}", pod="p" * (offset % 97)), at=offset * 7)
"""

# Appends random-sized batches forever; prints the last offset of each batch only after
# append() returned, i.e. once the batch is acknowledged.
WRITER_SOURCE = (
    RECORD_SOURCE
    + """
import random, sys
from events.filelog import FileLedger

path, seed, segment_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
with FileLedger.open(path, segment_bytes=segment_bytes) as w:
    print("ready", w.end_offset(), w.recovered_bytes, flush=True)
    while True:
        first = w.end_offset()
        # Mostly small appends; some span many pages, which is where a kill can tear a
        # write (the kernel checks for a fatal signal between pages).
        size = rng.randint(1, 40) if rng.random() < 0.75 else rng.randint(200, 2000)
        batch = [record(o) for o in range(first, first + size)]
        got = w.append(batch)
        assert got == first
        print(got + len(batch) - 1, flush=True)
"""
)

_namespace: dict[str, Any] = {}
exec(RECORD_SOURCE, _namespace)  # the same source the child runs
record = _namespace["record"]

KILLS = 30
SEGMENT_BYTES = 256 * 1024


def _run_and_kill(path: Path, seed: int, delay: float) -> tuple[int, list[int]]:
    """Start a writer, SIGKILL it after ``delay`` s of appending; return (start, acked)."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER_SOURCE, str(path), str(seed), str(SEGMENT_BYTES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    ready = child.stdout.readline().split()
    assert ready[:1] == [b"ready"], child.stderr.read() if child.stderr else b""
    time.sleep(delay)  # intentional: the random moment of the kill, mid-append
    os.kill(child.pid, signal.SIGKILL)
    out, err = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL, err
    # A line without its newline was not fully printed, so it acknowledges nothing.
    lines = out.split(b"\n")[:-1]
    return int(ready[1]), [int(line) for line in lines]


def test_sigkill_loses_no_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    rng = random.Random(20240611)
    acked_end = 0  # one past the highest acknowledged offset so far
    checked = 0  # records before this offset were verified in an earlier round
    cache: dict[int, Envelope] = {}
    repairs = 0
    deadline = time.monotonic() + 25
    for round_no in range(KILLS):
        assert time.monotonic() < deadline, f"too slow: {round_no} rounds done"
        start, acked = _run_and_kill(path, rng.randrange(1 << 30), rng.uniform(0.0, 0.08))
        # The child resumed exactly where the previous recovery left the ledger.
        assert start >= acked_end
        if acked:
            assert acked == sorted(acked)
            acked_end = acked[-1] + 1

        # Reopening as the writer runs recovery; every acknowledged record must survive.
        with FileLedger.open(path, segment_bytes=SEGMENT_BYTES) as w:
            end = w.end_offset()
            repairs += w.recovered_bytes > 0
        assert end >= acked_end, f"round {round_no}: acknowledged {acked_end}, found {end}"

        reader = LedgerDirReader(path)
        assert reader.end_offset() == end
        offsets = []
        for off, env in reader.read(checked):
            if off not in cache:
                cache[off] = record(off)
            assert env == cache[off], f"round {round_no}: offset {off} differs"
            offsets.append(off)
        assert offsets == list(range(checked, end))
        if round_no % 5 == 4:  # the full scan is the slow part; every record is read above
            report = verify(path)
            assert report.ok, [str(p) for p in report.problems]
            assert report.records == end
        checked = end
        cache.clear()

    assert acked_end > 0
    assert len(list(path.glob("*.seg"))) > 1
    # The ledger keeps working after all those crashes.
    with FileLedger.open(path) as w:
        assert w.append([record(checked)]) == checked
    assert [o for o, _ in LedgerDirReader(path).read(checked)] == [checked]
    # Not asserted (timing dependent), but worth seeing when run with -s.
    sys.stderr.write(f"{KILLS} kills, {repairs} torn tails repaired, {checked} records\n")
