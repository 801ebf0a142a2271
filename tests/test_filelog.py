"""The embedded ledger: framing, segments, recovery, corruption, following, JSON Lines."""

from __future__ import annotations

import io
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.codec import DecodeError, Envelope, wrap
from events.filelog import (
    FRAME_HEADER_SIZE,
    HEADER_SIZE,
    AwaitedLedgerDir,
    FileLedger,
    LedgerCorrupt,
    LedgerDirReader,
    LedgerError,
    LedgerLocked,
    holds_segments,
    new_ledger,
    segment_name,
    verify,
    writer_active,
)
from events.jsonl import export_jsonl, import_jsonl
from events.memlog import MemoryLedger
from events.model import JobSubmitted, PodSpec, PodStarted
from events.sources import open_reader
from tests.waiting import wait_until


def env(i: int) -> Envelope:
    """A small deterministic record whose content is derived from ``i``."""
    return wrap(PodStarted(job=f"job-{i}", pod=f"pod-{i}"), at=1000 + i)


def envs(start: int, count: int) -> list[Envelope]:
    return [env(i) for i in range(start, start + count)]


def segments(path: Path) -> list[Path]:
    return sorted(path.glob("*.seg"))


def record_spans(seg: Path) -> list[tuple[int, int]]:
    """Byte spans ``[start, end)`` of the frames in a segment (parsed independently)."""
    buf = seg.read_bytes()
    spans, pos = [], HEADER_SIZE
    while pos < len(buf):
        length = int.from_bytes(buf[pos : pos + 4], "little") & 0x7FFFFFFF
        spans.append((pos, pos + FRAME_HEADER_SIZE + length))
        pos += FRAME_HEADER_SIZE + length
    return spans


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x40
    path.write_bytes(bytes(data))


def read_all(path: Path) -> list[tuple[int, Envelope]]:
    return list(LedgerDirReader(path).read())


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


# --------------------------------------------------------------------------- basics


def test_round_trip(ledger: Path) -> None:
    with FileLedger.open(ledger) as w:
        assert w.end_offset() == 0
        assert w.append(envs(0, 3)) == 0
        assert w.append(envs(3, 1)) == 3
        assert w.append([]) == 4
        assert w.end_offset() == 4
        assert w.recovered_bytes == 0
    reader = LedgerDirReader(ledger)
    assert reader.end_offset() == 4
    assert read_all(ledger) == list(enumerate(envs(0, 4)))
    assert [off for off, _ in reader.read_raw()] == [0, 1, 2, 3]
    assert [p.name for p in segments(ledger)] == [segment_name(0)]
    assert segments(ledger)[0].read_bytes()[:8] == b"GPULEDG1"


def test_offsets_contiguous_across_rolls_and_reopen(ledger: Path) -> None:
    firsts = []
    for _round in range(3):
        with FileLedger.open(ledger, segment_bytes=400) as w:
            for size in (1, 4, 2, 7):
                firsts.append(w.append(envs(w.end_offset(), size)))
    sizes = [1, 4, 2, 7] * 3
    assert firsts == [sum(sizes[:i]) for i in range(len(sizes))]
    total = sum(sizes)
    assert read_all(ledger) == list(enumerate(envs(0, total)))
    segs = segments(ledger)
    assert len(segs) > 3
    # Each segment is named by (and its header holds) the offset of its first record.
    for seg in segs:
        data = seg.read_bytes()
        first = record_spans(seg)[0][0]
        assert int.from_bytes(data[first + 8 : first + 16], "little") == int(seg.stem)
        assert int.from_bytes(data[16:24], "little") == int(seg.stem)
    assert verify(ledger).ok
    report = verify(ledger)
    assert (report.records, report.first_offset, report.last_offset) == (total, 0, total - 1)
    assert report.segments == len(segs)


def test_big_batch_stays_in_one_segment(ledger: Path) -> None:
    with FileLedger.open(ledger, segment_bytes=200) as w:
        w.append(envs(0, 1))
        w.append(envs(1, 20))  # far larger than a segment: the segment overshoots
        w.append(envs(21, 1))
    assert [int(p.stem) for p in segments(ledger)] == [0, 1, 21]
    assert read_all(ledger) == list(enumerate(envs(0, 22)))


@pytest.mark.parametrize("start", [0, 1, 9, 10, 11, 25, 49, 50, 70])
def test_read_from_the_middle(ledger: Path, start: int) -> None:
    with FileLedger.open(ledger, segment_bytes=500) as w:
        for i in range(0, 50, 5):
            w.append(envs(i, 5))
    reader = LedgerDirReader(ledger)
    assert list(reader.read(start)) == list(enumerate(envs(0, 50)))[start:]
    assert list(reader.read(start, start + 3)) == list(enumerate(envs(0, 50)))[start : start + 3]


def test_writer_misuse(ledger: Path) -> None:
    w = FileLedger.open(ledger)
    with pytest.raises(TypeError):
        w.append([PodStarted(job="j", pod="p")])  # type: ignore[list-item]
    assert w.end_offset() == 0
    w.close()
    w.close()
    with pytest.raises(LedgerError, match="closed"):
        w.append(envs(0, 1))
    with pytest.raises(LedgerError, match="no such ledger"):
        FileLedger.open(ledger.parent / "missing", create=False)
    with pytest.raises(LedgerError, match="no such ledger"):
        LedgerDirReader(ledger.parent / "missing")
    (ledger.parent / "empty").mkdir()
    with pytest.raises(LedgerError, match="no segment files"):
        LedgerDirReader(ledger.parent / "empty")


def test_appends_from_threads_keep_offsets_contiguous(ledger: Path) -> None:
    with FileLedger.open(ledger, segment_bytes=2000) as w:

        def work() -> None:
            for _ in range(50):
                w.append(envs(0, 3))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [off for off, _ in read_all(ledger)] == list(range(600))


# --------------------------------------------------------------------------- the lock


def test_second_writer_is_locked_out(ledger: Path) -> None:
    with FileLedger.open(ledger) as w:
        with pytest.raises(LedgerLocked, match=re.escape(str(ledger))) as info:
            FileLedger.open(ledger)
        assert f"pid {os.getpid()}" in str(info.value)
        # Readers take no lock.
        w.append(envs(0, 1))
        assert LedgerDirReader(ledger).end_offset() == 1
    with FileLedger.open(ledger) as w:
        assert w.end_offset() == 1


CHILD_OPEN = """
import sys
from events.filelog import FileLedger, LedgerLocked
try:
    FileLedger.open(sys.argv[1])
except LedgerLocked as exc:
    print("locked:", exc)
    sys.exit(3)
print("opened")
"""

CHILD_HOLD = """
import sys
from events.filelog import FileLedger
w = FileLedger.open(sys.argv[1])
print("holding", flush=True)
sys.stdin.read()
"""


def test_lock_across_processes(ledger: Path) -> None:
    with FileLedger.open(ledger):
        child = subprocess.run(
            [sys.executable, "-c", CHILD_OPEN, str(ledger)],
            check=False,
            capture_output=True,
            text=True,
        )
    assert child.returncode == 3, child.stderr
    assert f"locked: ledger {ledger} is locked" in child.stdout

    holder = subprocess.Popen(
        [sys.executable, "-c", CHILD_HOLD, str(ledger)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(LedgerLocked, match=f"pid {holder.pid}"):
            FileLedger.open(ledger)
    finally:
        holder.kill()  # the kernel drops a dead process's flock
        holder.wait()
    with FileLedger.open(ledger) as w:
        assert w.end_offset() == 0


# --------------------------------------------------------------------------- torn tails


def _build(ledger: Path, batches: list[int], segment_bytes: int = 1 << 20) -> int:
    with FileLedger.open(ledger, segment_bytes=segment_bytes) as w:
        for size in batches:
            w.append(envs(w.end_offset(), size))
        return w.end_offset()


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    total = _build(pristine, [1] * 6, segment_bytes=400)
    last_seg = segments(pristine)[-1]
    start, end = record_spans(last_seg)[-1]
    for cut in range(start, end):
        ledger = tmp_path / f"cut-{cut}"
        shutil.copytree(pristine, ledger)
        seg = ledger / last_seg.name
        os.truncate(seg, cut)

        # A reader sees the acknowledged records only, and no error.
        assert read_all(ledger) == list(enumerate(envs(0, total - 1)))
        report = verify(ledger)
        if cut == start:
            assert report.ok
        else:
            assert [p.kind for p in report.problems] == ["torn_tail"]
            assert report.problems[0].position == start

        with FileLedger.open(ledger, segment_bytes=400) as w:
            assert w.recovered_bytes == cut - start
            assert seg.stat().st_size == start
            assert w.end_offset() == total - 1
            assert w.append(envs(total - 1, 2)) == total - 1
        assert read_all(ledger) == list(enumerate(envs(0, total + 1)))
        assert verify(ledger).ok
        shutil.rmtree(ledger)


def test_a_torn_batch_is_dropped_whole(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pristine = tmp_path / "pristine"
    total = _build(pristine, [2, 3])
    seg = segments(pristine)[-1]
    spans = record_spans(seg)
    batch_start, batch_end = spans[2][0], spans[4][1]
    for cut in range(batch_start + 1, batch_end):
        ledger = tmp_path / "l"
        shutil.copytree(pristine, ledger)
        os.truncate(ledger / seg.name, cut)
        # Even with whole records of the batch on disk, a reader sees none of it.
        assert read_all(ledger) == list(enumerate(envs(0, 2)))
        assert LedgerDirReader(ledger).end_offset() == 2
        with caplog.at_level("WARNING", logger="events.filelog"):
            w = FileLedger.open(ledger)
        assert w.recovery is not None
        assert w.recovery.position == batch_start
        assert w.recovery.records == sum(1 for _, e in spans[2:5] if e <= cut)
        assert "truncated torn tail" in caplog.text
        caplog.clear()
        assert w.append(envs(2, 3)) == 2
        w.close()
        assert read_all(ledger) == list(enumerate(envs(0, total)))
        shutil.rmtree(ledger)


def test_zeroed_tail_is_a_torn_tail(ledger: Path) -> None:
    # What a power loss can leave: the file grew but the new blocks never got data.
    total = _build(ledger, [1, 1, 1])
    seg = segments(ledger)[-1]
    with open(seg, "ab") as f:
        f.write(bytes(100))
    assert read_all(ledger) == list(enumerate(envs(0, total)))
    with FileLedger.open(ledger) as w:
        assert w.recovered_bytes == 100


def test_stale_segment_temp_file_is_removed(ledger: Path) -> None:
    _build(ledger, [1])
    (ledger / (segment_name(1) + ".tmp")).write_bytes(b"GPULEDG1")
    with FileLedger.open(ledger) as w:
        assert w.append(envs(1, 1)) == 1
    assert not list(ledger.glob("*.tmp"))


# --------------------------------------------------------------------------- corruption


def test_bit_flip_in_a_middle_segment(ledger: Path) -> None:
    total = _build(ledger, [2] * 20, segment_bytes=400)
    segs = segments(ledger)
    assert len(segs) >= 4
    victim = segs[1]
    start, _ = record_spans(victim)[1]
    flip(victim, start + FRAME_HEADER_SIZE + 3)
    bad_offset = int(victim.stem) + 1

    seen: list[tuple[int, Envelope]] = []
    with pytest.raises(LedgerCorrupt) as info:
        seen.extend(LedgerDirReader(ledger).read())
    # Everything before the damaged append was yielded intact; nothing of it or after it.
    assert seen == list(enumerate(envs(0, bad_offset - 1)))
    exc = info.value
    assert (exc.segment, exc.position, exc.offset) == (str(victim), start, bad_offset)
    assert victim.name in str(exc)
    assert f"byte {start}" in str(exc)
    assert "bad checksum" in str(exc)
    # Reading past the damaged segment works.
    tail_start = int(segs[2].stem)
    assert (
        list(LedgerDirReader(ledger).read(tail_start))
        == list(enumerate(envs(0, total)))[tail_start:]
    )

    report = verify(ledger)
    assert not report.ok
    [problem] = report.problems
    assert (problem.segment, problem.position, problem.offset, problem.kind) == (
        str(victim),
        start,
        bad_offset,
        "corrupt",
    )


def test_damage_to_the_segment_before_the_last_blocks_the_writer(ledger: Path) -> None:
    _build(ledger, [2] * 20, segment_bytes=400)
    victim = segments(ledger)[-2]
    flip(victim, record_spans(victim)[0][0] + FRAME_HEADER_SIZE)
    with pytest.raises(LedgerCorrupt, match=re.escape(victim.name)):
        FileLedger.open(ledger)


def test_damage_before_an_intact_append_in_the_last_segment_is_corruption(ledger: Path) -> None:
    total = _build(ledger, [1, 3, 1, 2])
    seg = segments(ledger)[-1]
    spans = record_spans(seg)
    flip(seg, spans[2][0] + FRAME_HEADER_SIZE + 1)  # inside the second append
    size = seg.stat().st_size
    with pytest.raises(LedgerCorrupt, match="acknowledged append"):
        list(LedgerDirReader(ledger).read())
    # The writer must not "repair" acknowledged data away.
    with pytest.raises(LedgerCorrupt, match=f"byte {spans[2][0]}"):
        FileLedger.open(ledger)
    assert seg.stat().st_size == size
    assert [p.kind for p in verify(ledger).problems] == ["corrupt"]
    # Everything before the damaged append is still readable, but not part of it.
    assert list(LedgerDirReader(ledger).read(0, 1)) == list(enumerate(envs(0, total)))[:1]
    with pytest.raises(LedgerCorrupt):
        list(LedgerDirReader(ledger).read(0, 2))


def test_a_whole_record_with_the_wrong_offset_is_corruption(ledger: Path) -> None:
    _build(ledger, [1, 1])
    seg = segments(ledger)[-1]
    # Re-frame the last record with a valid checksum over a wrong offset.
    start, end = record_spans(seg)[-1]
    buf = bytearray(seg.read_bytes())
    payload = bytes(buf[start + FRAME_HEADER_SIZE : end])
    off = struct.pack("<Q", 7)
    buf[start + 4 : start + 16] = struct.pack("<I", zlib.crc32(payload, zlib.crc32(off))) + off
    seg.write_bytes(bytes(buf))
    with pytest.raises(LedgerCorrupt, match="carries offset 7"):
        list(LedgerDirReader(ledger).read())
    with pytest.raises(LedgerCorrupt):
        FileLedger.open(ledger)


def test_bad_header_and_missing_segment(ledger: Path) -> None:
    _build(ledger, [3] * 6, segment_bytes=300)
    segs = segments(ledger)
    flip(segs[0], 2)
    with pytest.raises(LedgerCorrupt, match="bad magic"):
        list(LedgerDirReader(ledger).read())
    flip(segs[0], 2)
    segs[1].unlink()
    with pytest.raises(LedgerCorrupt, match="records are missing"):
        list(LedgerDirReader(ledger).read())
    assert "records are missing" in verify(ledger).problems[0].what


# --------------------------------------------------------------------------- following


def test_follow_sees_records_appended_by_a_live_writer(ledger: Path) -> None:
    writer = FileLedger.open(ledger, segment_bytes=600)
    writer.append(envs(0, 3))
    expected = envs(0, 203)

    def produce() -> None:
        for i in range(3, 203, 4):
            writer.append(expected[i : i + 4])
            # intentional: appends spread out, interleaved with the follower's polls
            time.sleep(0.001)

    thread = threading.Thread(target=produce)
    thread.start()
    got: list[tuple[int, Envelope]] = []
    try:
        for record in LedgerDirReader(ledger).follow(2, poll_s=0.005, idle_timeout_s=10):
            got.append(record)
            if record[0] == 202:
                break
    finally:
        thread.join()
        writer.close()
    assert got == list(enumerate(expected))[2:]
    assert len(segments(ledger)) > 3


def test_follow_stops_on_stop_and_idle(ledger: Path) -> None:
    _build(ledger, [2])
    reader = LedgerDirReader(ledger)
    t0 = time.monotonic()
    assert [o for o, _ in reader.follow(0, poll_s=0.01, idle_timeout_s=0.1)] == [0, 1]
    assert time.monotonic() - t0 < 5
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 3

    assert [o for o, _ in reader.follow(1, poll_s=0.01, stop=stop)] == [1]


def test_an_awaited_ledger_reads_empty_until_its_writer_creates_it(tmp_path: Path) -> None:
    """The ingestor may start before the scheduler: its ledger is awaited, not refused."""
    ledger = tmp_path / "not-yet"
    reader = AwaitedLedgerDir(ledger)
    assert not holds_segments(ledger)
    assert (reader.end_offset(), list(reader.read(0))) == (0, [])
    assert list(reader.follow(0, poll_s=0.01, idle_timeout_s=0.05)) == []
    with new_ledger(ledger) as writer:
        writer.append(envs(0, 3))
    assert holds_segments(ledger)
    assert reader.end_offset() == 3
    assert list(reader.read(1)) == list(enumerate(envs(0, 3)))[1:]
    assert list(reader.follow(2, poll_s=0.01, idle_timeout_s=0.05)) == [(2, env(2))]


def test_follow_across_a_crash_and_recovery(tmp_path: Path) -> None:
    ledger = tmp_path / "l"
    total = _build(ledger, [1, 1, 1])
    seg = segments(ledger)[-1]
    start, end = record_spans(seg)[-1]
    os.truncate(seg, end - 3)  # a torn append, which a follower must not yield
    got: list[tuple[int, Envelope]] = []

    def follow() -> None:
        for record in LedgerDirReader(ledger).follow(0, poll_s=0.005, idle_timeout_s=5):
            got.append(record)
            if record[0] == total + 1:
                return

    thread = threading.Thread(target=follow)
    thread.start()
    wait_until(lambda: len(got) >= total - 1, 10, "the follower to reach the torn append")
    with FileLedger.open(ledger) as w:  # recovery truncates, then new records overwrite
        assert w.recovered_bytes == end - 3 - start
        w.append([wrap(JobSubmitted(job="new", queue="q", pods=(PodSpec("a"),)), 5)])
        w.append(envs(total, 2))
    thread.join(10)
    assert not thread.is_alive()
    assert [o for o, _ in got] == list(range(total + 2))
    assert got[total - 1][1].type == "job_submitted"


# --------------------------------------------------------------------------- JSON Lines


def test_export_import_round_trip_is_byte_identical(tmp_path: Path) -> None:
    src = tmp_path / "src"
    with FileLedger.open(src, segment_bytes=500) as w:
        w.append(envs(0, 10))
        w.append(
            [
                wrap(JobSubmitted(job="j", queue="q", pods=(PodSpec("a", gpu_milli=500),)), 3),
                # A type from a newer writer survives the round trip untouched.
                Envelope(
                    type="from_the_future",
                    key="k",
                    at=4,
                    payload=msgspec.Raw(msgspec.msgpack.encode({"b": [1, 2], "a": "x"})),
                ),
            ]
        )
        w.append(envs(12, 10))
    first = io.BytesIO()
    assert export_jsonl(LedgerDirReader(src), first) == 22
    dst = tmp_path / "dst"
    with FileLedger.open(dst, segment_bytes=300) as w:
        first.seek(0)
        assert import_jsonl(first, w, source_name="first.jsonl", batch_size=4) == 22
    second = io.BytesIO()
    export_jsonl(LedgerDirReader(dst), second)
    assert second.getvalue() == first.getvalue()
    assert read_all(dst) == read_all(src)
    # A window of the export.
    part = io.BytesIO()
    assert export_jsonl(LedgerDirReader(src), part, 5, 8) == 3
    assert part.getvalue().splitlines() == first.getvalue().splitlines()[5:8]


def _jsonl(count: int) -> list[bytes]:
    out = io.BytesIO()
    export_jsonl(MemoryLedger(envs(0, count)), out)
    return out.getvalue().splitlines(keepends=True)


@pytest.mark.parametrize("seekable", [True, False])
def test_import_of_a_bad_line_names_it_and_writes_nothing(ledger: Path, seekable: bool) -> None:
    lines = _jsonl(6)
    lines[3] = b'{"type": "pod_started", "at": 1, "payload": {"job": 5}}\n'
    data = b"".join(lines)
    with FileLedger.open(ledger, segment_bytes=300) as w:
        w.append(envs(100, 2))
        before = [p.read_bytes() for p in segments(ledger)]
        with _input(data, seekable) as f, pytest.raises(DecodeError, match=r"in\.jsonl:4"):
            import_jsonl(f, w, source_name="in.jsonl", batch_size=2)
        assert w.end_offset() == 2
    assert [p.read_bytes() for p in segments(ledger)] == before


def _input(data: bytes, seekable: bool) -> IO[bytes]:
    if seekable:
        return io.BytesIO(data)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    return open(read_fd, "rb")


def test_import_skips_blank_lines_and_reads_pipes(ledger: Path) -> None:
    data = b"".join(_jsonl(5)) + b"\n  \n"
    with FileLedger.open(ledger) as w, _input(data, seekable=False) as f:
        assert import_jsonl(f, w, source_name="-") == 5
    assert read_all(ledger) == list(enumerate(envs(0, 5)))


def test_open_reader(tmp_path: Path) -> None:
    ledger = tmp_path / "l"
    _build(ledger, [4])
    assert isinstance(open_reader(ledger), LedgerDirReader)
    export = tmp_path / "x.jsonl"
    with open(export, "wb") as f:
        export_jsonl(LedgerDirReader(ledger), f)
    reader = open_reader(str(export))
    assert reader.end_offset() == 4
    assert list(reader.read(1, 3)) == list(LedgerDirReader(ledger).read(1, 3))
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"type": "tick", "at": 1, "payload": {"type": "tick"}}\nnope\n')
    with pytest.raises(DecodeError, match=r"bad\.json:2"):
        open_reader(bad)
    (tmp_path / "x.txt").write_bytes(b"")
    with pytest.raises(LedgerError, match="neither"):
        open_reader(tmp_path / "x.txt")
    with pytest.raises(LedgerError, match="no such"):
        open_reader(tmp_path / "missing")


# --------------------------------------------------------------------------- fuzzing


_FUZZ_TOTAL = 40


def _pristine_files() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "l"
        with FileLedger.open(path, segment_bytes=700) as w:
            for size in [1, 3, 2, 1, 5, 1, 4, 2, 1, 6, 3, 1, 2, 1, 4, 3]:
                w.append(envs(w.end_offset(), size))
            assert w.end_offset() == _FUZZ_TOTAL
        return {p.name: p.read_bytes() for p in segments(path)}


PRISTINE = _pristine_files()
NAMES = sorted(PRISTINE)
EXPECTED = list(enumerate(envs(0, _FUZZ_TOTAL + 1)))


@st.composite
def damage(draw: st.DrawFn) -> dict[str, bytes]:
    files = {name: bytearray(data) for name, data in PRISTINE.items()}
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(NAMES))
        data = files[name]
        if not data:
            continue
        kind = draw(st.sampled_from(["byte", "bit", "truncate", "garbage"]))
        pos = draw(st.integers(0, len(data) - 1))
        if kind == "byte":
            data[pos] = draw(st.integers(0, 255))
        elif kind == "bit":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=40))
    return {name: bytes(data) for name, data in files.items()}


def _read_checked(path: Path, start: int = 0) -> Iterator[int]:
    """Yield offsets read, asserting each record is exactly what was written."""
    try:
        for off, record in LedgerDirReader(path).read(start):
            assert (off, record) == EXPECTED[off]
            yield off
    except (LedgerCorrupt, DecodeError):
        return


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=damage(), start=st.integers(0, _FUZZ_TOTAL))
def test_random_damage_never_yields_a_garbled_record(files: dict[str, bytes], start: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        for name, data in files.items():
            (path / name).write_bytes(data)
        offsets = list(_read_checked(path, start))
        assert offsets == list(range(start, start + len(offsets)))
        report = verify(path)
        if files == PRISTINE:
            assert report.ok

        try:
            writer = FileLedger.open(path)
        except LedgerCorrupt:
            return
        # A writer that opened has kept a readable prefix and appends after it.
        with writer:
            end = writer.end_offset()
            assert end <= _FUZZ_TOTAL
            if writer.recovered_bytes == 0:
                return
            writer.append([env(end)])
        offsets = list(_read_checked(path, end))
        assert offsets == [end]


def test_a_new_ledger_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    """``new_ledger`` writes beside the target and renames when the block completes: a run
    that fails leaves neither the ledger nor its partial sibling, and the sibling of a
    writer that was killed (its pid gone) is removed by the next run into the place."""
    target = tmp_path / "run" / "ledger"

    def failing_run() -> None:
        with new_ledger(target) as writer:
            writer.append(envs(0, 10))
            assert not target.exists()  # in the sibling until complete
            raise RuntimeError("the simulation failed")

    with pytest.raises(RuntimeError):
        failing_run()
    assert not target.exists() and not list(target.parent.iterdir())

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    stale = target.parent / f".ledger.partial-{dead}"
    stale.mkdir()
    with new_ledger(target) as writer:
        writer.append(envs(0, 10))
    assert [p.name for p in target.parent.iterdir()] == ["ledger"]
    assert [e for _, e in LedgerDirReader(target).read(0)] == envs(0, 10)
    with pytest.raises(LedgerError, match="not an empty directory"), new_ledger(target):
        pass


def test_writer_active_sees_the_lock_of_a_writer(tmp_path: Path) -> None:
    """A reader's torn-tail check must not call an append in flight damage: it asks
    whether a writer holds the ledger, without taking the lock from it."""
    assert not writer_active(tmp_path / "absent")
    with FileLedger.open(tmp_path / "l") as writer:
        assert writer_active(tmp_path / "l")
        writer.append(envs(0, 1))
    assert not writer_active(tmp_path / "l")
