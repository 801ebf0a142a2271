"""Every way of tearing a simulated ledger: each offline reader either refuses it (non-zero,
one line, nothing written) or, under ``--accept-torn-tail``, reads every record of the
appends that completed before the tear, and no other.

The ledger is a real simulation re-appended in batches whose end positions the test notes,
so the records a reader must return are known without asking the reader's own code.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.codec import Envelope
from events.filelog import HEADER_SIZE, FileLedger, LedgerDirReader
from scheduler.cli import main

EX = "replay/examples"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[int, int]]]:
    """A one-segment ledger of the demo's records, appended in batches of whole steps;
    and for each append, (its end in the segment, the records written up to it)."""
    root = tmp_path_factory.mktemp("torn")
    sim = root / "sim"
    code = main(
        [
            "simulate",
            "--cluster", f"{EX}/demo-cluster.yaml",
            "--queues", f"{EX}/demo-queues.yaml",
            "--workload", f"{EX}/demo-workload.yaml",
            "--ledger", str(sim), "--no-fairness",
        ]
    )  # fmt: skip
    assert code == 0
    envelopes = [env for _, env in LedgerDirReader(sim).read(0)][:1500]
    # A writer appends whole steps (inputs, then the cycle's decisions up to its
    # cycle_completed): batches of 1 to 13 steps here, so every append ends a cycle.
    steps: list[list[Envelope]] = [[]]
    for env in envelopes:
        steps[-1].append(env)
        if env.type == "cycle_completed":
            steps.append([])
    steps = [step for step in steps if step and step[-1].type == "cycle_completed"]
    ledger = root / "ledger"
    ends: list[tuple[int, int]] = []
    with FileLedger.open(ledger) as writer:
        (segment,) = ledger.glob("*.seg")
        done, taken, size = 0, 0, 1
        while taken < len(steps):
            batch = [env for step in steps[taken : taken + size] for env in step]
            writer.append(batch)
            taken += size
            done += len(batch)
            ends.append((segment.stat().st_size, done))
            size = size * 7 % 13 + 1
    return ledger, ends


READERS = {
    "verify": lambda ledger, out: ["replay", "--ledger", str(ledger), "--verify"],
    "state": lambda ledger, out: ["state", "--ledger", str(ledger), "--at", "0"],
    "project": lambda ledger, out: ["project", "--ledger", str(ledger), "--db", str(out)],
}


def _tear(segment: Path, how: str, at: int, junk: bytes) -> None:
    data = segment.read_bytes()
    if how == "cut":
        data = data[:at]
    elif how == "junk":
        data = data + junk
    else:  # both: an append cut short, and garbage where the rest of it was
        data = data[:at] + junk
    segment.write_bytes(data)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    how=st.sampled_from(["cut", "junk", "cut+junk"]),
    fraction=st.floats(0.0, 1.0),
    junk=st.binary(min_size=1, max_size=64),
    reader=st.sampled_from(sorted(READERS)),
)
def test_every_reader_refuses_a_torn_ledger_or_reads_exactly_what_came_before(
    written: tuple[Path, list[tuple[int, int]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    how: str,
    fraction: float,
    junk: bytes,
    reader: str,
) -> None:
    source, ends = written
    here = Path(tempfile.mkdtemp(dir=tmp_path))
    work = here / "ledger"
    shutil.copytree(source, work)
    (segment,) = work.glob("*.seg")
    at = HEADER_SIZE + round(fraction * (segment.stat().st_size - HEADER_SIZE))
    _tear(segment, how, at, junk)
    cut = at if how != "junk" else ends[-1][0]
    whole = max((n for end, n in ends if end <= cut), default=0)
    torn = segment.stat().st_size > max((end for end, _ in ends if end <= cut), default=HEADER_SIZE)
    out = here / "projection.duckdb"
    capsys.readouterr()

    code = main(READERS[reader](work, out))
    err = capsys.readouterr().err
    if torn:
        assert code != 0, (how, at)
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert "the ledger is damaged" in err, err
        assert not out.exists()
    elif whole:  # a cut on an append's boundary leaves a shorter, whole ledger
        assert code == 0, err

    code = main([*READERS[reader](work, out), "--accept-torn-tail"])
    captured = capsys.readouterr()
    if not whole and reader != "project":
        # Nothing before the tear: "no records" is the answer, and not a success. (A
        # projection of no records is an empty database, as for a live ledger's first run.)
        assert code != 0 and "Traceback" not in captured.err
        assert "no records" in captured.out + captured.err, captured
        return
    assert code == 0, captured.err
    if reader == "verify":
        assert f"replayed {whole} records" in captured.out, captured.out
        assert ("up to its torn tail" in captured.out) == torn
    elif reader == "project":
        import duckdb

        with duckdb.connect(str(out), read_only=True) as con:
            row = con.execute('SELECT count(*), max("offset") FROM events').fetchone()
        assert row is not None and row[0] == whole, (row, whole)
