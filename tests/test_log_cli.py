"""``gpuledger log``: cat, tail, verify, export, import."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from events.codec import SCHEMA_VERSION, Envelope, wrap
from events.filelog import FileLedger, LedgerDirReader
from events.model import NodeRegistered, PodStarted


def run(argv: Sequence[str]) -> int:
    """Run ``gpuledger ARGV`` through the console script's entry point."""
    from scheduler.cli import main

    return main(list(argv))


def env(i: int) -> Envelope:
    if i % 3 == 0:
        return wrap(NodeRegistered(node=f"n{i}", gpus=8), at=i)
    return wrap(PodStarted(job=f"job-{i}", pod=f"pod-{i}"), at=i)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger"
    with FileLedger.open(path, segment_bytes=500) as w:
        for i in range(0, 30, 3):
            w.append([env(j) for j in range(i, i + 3)])
    return path


def rows(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_cat(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["log", "cat", str(ledger)]) == 0
    out = rows(capsys.readouterr().out)
    assert [r["offset"] for r in out] == list(range(30))
    assert out[1] == {
        "offset": 1,
        "type": "pod_started",
        "key": "job-1",
        "at": 1,
        "version": SCHEMA_VERSION,
        "payload": {"type": "pod_started", "job": "job-1", "pod": "pod-1"},
    }

    assert run(["log", "cat", str(ledger), "--from", "10", "--until", "20"]) == 0
    assert [r["offset"] for r in rows(capsys.readouterr().out)] == list(range(10, 20))

    assert run(["log", "cat", str(ledger), "--type", "node_registered", "--until", "10"]) == 0
    assert [r["offset"] for r in rows(capsys.readouterr().out)] == [0, 3, 6, 9]

    assert run(["log", "cat", str(ledger), "--type", "nope"]) == 2
    assert "unknown event type nope" in capsys.readouterr().err


def test_cat_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    """`gpuledger log cat L | head -1`: the reader going away is normal use, not an error
    (the ledger's records fill more than a pipe's buffer, so the writer meets the close)."""
    import subprocess
    import sys

    ledger = tmp_path / "big"
    with FileLedger.open(ledger) as w:
        w.append([env(j) for j in range(5000)])
    gpuledger = str(Path(sys.executable).parent / "gpuledger")
    cat = subprocess.Popen(
        [gpuledger, "log", "cat", str(ledger)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert cat.stdout is not None and cat.stderr is not None
    first = cat.stdout.readline()
    cat.stdout.close()  # as `head -1` does after its line
    assert cat.wait(timeout=60) == 0
    assert json.loads(first)["offset"] == 0
    assert cat.stderr.read() == b""


def test_cat_reads_a_jsonl_export(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "x.jsonl"
    assert run(["log", "export", str(ledger), "--out", str(export)]) == 0
    assert "exported 30 records" in capsys.readouterr().err
    assert run(["log", "cat", str(export), "--from", "28"]) == 0
    assert capsys.readouterr().out.encode() == b"".join(export.read_bytes().splitlines(True)[28:])


def test_cat_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["log", "cat", str(tmp_path / "missing")]) == 2
    assert "missing: no such ledger directory" in capsys.readouterr().err


def test_tail(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["log", "tail", str(ledger)]) == 0
    assert [r["offset"] for r in rows(capsys.readouterr().out)] == list(range(20, 30))
    assert run(["log", "tail", str(ledger), "-n", "2"]) == 0
    assert [r["offset"] for r in rows(capsys.readouterr().out)] == [28, 29]
    assert run(["log", "tail", str(ledger), "-n", "100"]) == 0
    assert len(rows(capsys.readouterr().out)) == 30


def test_tail_follow(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def produce() -> None:
        # intentional: the appends come a moment after `log tail -f` starts (its progress
        # cannot be watched from here; its 1.5 s idle timeout leaves room)
        time.sleep(0.2)
        with FileLedger.open(ledger, segment_bytes=500) as w:
            for i in range(30, 40):
                w.append([env(i)])

    thread = threading.Thread(target=produce)
    thread.start()
    code = run(["log", "tail", str(ledger), "-n", "1", "-f", "--idle-timeout", "1.5"])
    thread.join()
    assert code == 0
    assert [r["offset"] for r in rows(capsys.readouterr().out)] == list(range(29, 40))


def test_verify(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["log", "verify", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "30 records (offsets 0..29)" in out
    assert out.strip().endswith("ok")

    victim = sorted(ledger.glob("*.seg"))[1]
    data = bytearray(victim.read_bytes())
    data[60] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert run(["log", "verify", str(ledger)]) == 1
    out = capsys.readouterr().out
    assert f"problem: {victim}: byte " in out
    assert "[corrupt]" in out

    # A corrupt ledger is a user-facing error for the other commands, naming the spot.
    assert run(["log", "cat", str(ledger)]) == 2
    assert f"{victim}: byte " in capsys.readouterr().err


def test_verify_reports_a_torn_tail(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    last = sorted(ledger.glob("*.seg"))[-1]
    with open(last, "ab") as f:
        f.write(b"\x10\x00\x00")
    assert run(["log", "verify", str(ledger)]) == 1
    assert "[torn_tail]" in capsys.readouterr().out
    assert run(["log", "verify", str(ledger.parent / "nope")]) == 2


def test_export_import_round_trip(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.jsonl"
    assert run(["log", "export", str(ledger), "--out", str(first)]) == 0
    copy = tmp_path / "copy"
    assert run(["log", "import", str(first), "--ledger", str(copy)]) == 0
    assert "imported 30 records" in capsys.readouterr().err
    second = tmp_path / "second.jsonl"
    assert run(["log", "export", str(copy), "--out", str(second)]) == 0
    assert second.read_bytes() == first.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))

    assert run(["log", "export", str(ledger), "--out", "-", "--from", "29"]) == 0
    assert [r["offset"] for r in rows(capsys.readouterr().out)] == [29]


def test_import_bad_line_exits_2_and_writes_nothing(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.jsonl"
    assert run(["log", "export", str(ledger), "--out", str(good)]) == 0
    lines = good.read_bytes().splitlines(keepends=True)
    lines[4] = b'{"type": "pod_started", "at": "soon", "payload": {}}\n'
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(lines))
    capsys.readouterr()

    # Into an existing ledger: nothing appended.
    before = LedgerDirReader(ledger).end_offset()
    assert run(["log", "import", str(bad), "--ledger", str(ledger)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuledger: ")
    assert f"{bad}:5" in err
    assert LedgerDirReader(ledger).end_offset() == before

    # Into a new directory: no empty ledger is left behind.
    target = tmp_path / "new"
    assert run(["log", "import", str(bad), "--ledger", str(target)]) == 2
    assert not target.exists()

    assert run(["log", "import", str(tmp_path / "missing.jsonl"), "--ledger", str(target)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["swapped", "dropped", "repeated"])
def test_import_refuses_a_damaged_export_naming_the_row(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    """Rows moved, lost or repeated (their offsets no longer consecutive) are refused,
    naming the line; nothing is appended. A range of an export (``--from``) still
    imports: its offsets start anywhere."""
    good = tmp_path / "good.jsonl"
    assert run(["log", "export", str(ledger), "--out", str(good)]) == 0
    lines = good.read_bytes().splitlines(keepends=True)
    if damage == "swapped":
        lines[5], lines[6] = lines[6], lines[5]
        why = ":6: offset 6 follows offset 4: an export's offsets are consecutive"
    elif damage == "dropped":
        del lines[5]
        why = ":6: offset 6 follows offset 4"
    else:
        lines.insert(6, lines[5])
        why = ":7: offset 5 follows offset 5"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(lines))
    capsys.readouterr()
    before = LedgerDirReader(ledger).end_offset()
    assert run(["log", "import", str(bad), "--ledger", str(ledger)]) == 2
    assert f"{bad}{why}" in capsys.readouterr().err
    assert LedgerDirReader(ledger).end_offset() == before
    part = tmp_path / "part.jsonl"
    assert run(["log", "export", str(ledger), "--from", "3", "--out", str(part)]) == 0
    assert run(["log", "import", str(part), "--ledger", str(tmp_path / "copy")]) == 0


def test_import_into_a_locked_ledger(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "x.jsonl"
    assert run(["log", "export", str(ledger), "--out", str(export)]) == 0
    with FileLedger.open(ledger):
        assert run(["log", "import", str(export), "--ledger", str(ledger)]) == 2
    assert "is locked by another writer" in capsys.readouterr().err


def test_cat_and_export_take_moments_as_well_as_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A live ledger: wall-clock stamps a minute apart from 2026-12-03T06:00:00Z.
    start = 1_796_277_600_000
    path = tmp_path / "live"
    with FileLedger.open(path) as w:
        w.append([wrap(NodeRegistered(node=f"n{i}", gpus=8), at=start + i * 60_000)
                  for i in range(10)])  # fmt: skip
    assert run(["log", "cat", str(path), "--from", "2026-12-03T06:03:00Z",
                "--until", "2026-12-03T06:05:30Z"]) == 0  # fmt: skip
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["offset"] for x in lines] == [3, 4, 5]
    assert run(["log", "cat", str(path), "--from", "8m"]) == 0  # 8 minutes into the ledger
    assert [json.loads(x)["offset"] for x in capsys.readouterr().out.splitlines()] == [8, 9]
    out = tmp_path / "part.jsonl"
    assert run(["log", "export", str(path), "--out", str(out), "--until", "2m"]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_a_simulated_ledger_refuses_an_iso_bound(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["log", "cat", str(ledger), "--from", "2026-12-03T06:00:00Z"]) == 2
    assert "simulated time" in capsys.readouterr().err
