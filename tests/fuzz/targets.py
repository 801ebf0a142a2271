"""Fuzz targets for gpuledger's input boundaries, and their seed corpora.

Each target takes one input (``bytes``) and returns normally when the code under test
behaved as documented; anything else — an exception type the project does not document for
that entry point, a record yielded past damage, a round trip that changes bytes — raises,
and the fuzzer reports it as a crash. The targets are plain functions: the atheris runner
(``tests/fuzz/atheris_targets.py``) drives them coverage-guided, and
``tests/test_atheris.py`` replays the inputs kept in ``tests/data/fuzz-regressions/``
through them without atheris.

| target | entry points | allowed errors |
|---|---|---|
| ``codec`` | ``decode``, ``decode_envelope``/``decode_event``, ``to_json_line``/``from_json_line`` | ``DecodeError`` naming the offset or line |
| ``segment`` | ``LedgerDirReader`` (``read_raw``, ``read``, ``end_offset``, ``follow``), ``verify``, ``FileLedger.open`` recovery and ``append`` | ``LedgerCorrupt`` naming the segment file, the bad frame's byte and offset; ``DecodeError`` from envelope decoding |
| ``config`` | ``replay.config.load`` for each file kind, then the conversion to events, ``validate``, ``apply`` and a cycle | ``ConfigError`` naming the file (load) |
| ``jsonl`` | ``import_jsonl`` into memory and through ``gpuledger log import``, ``export_jsonl`` | ``DecodeError`` naming ``source:line``; nothing appended |
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from events.codec import (
    DecodeError,
    Envelope,
    UnknownEventType,
    decode,
    decode_envelope,
    decode_event,
    encode,
    encode_envelope,
    from_json_line,
    to_json_line,
)
from events.filelog import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    FileLedger,
    LedgerCorrupt,
    LedgerDirReader,
    LedgerError,
    segment_name,
    verify,
)
from events.jsonl import export_jsonl, import_jsonl, import_jsonl_into
from events.memlog import MemoryLedger
from events.model import TAGS, Event, PolicyConfigured
from replay.config import (
    Choice,
    ClusterFile,
    ConfigError,
    Exponential,
    Fixed,
    JobSpec,
    LogNormal,
    NodeGroup,
    Number,
    Periodic,
    Poisson,
    PolicyFile,
    QueuesFile,
    QueueSpec,
    Uniform,
    WorkloadFile,
    load,
    policy_event,
)
from replay.sim import Simulation
from scheduler.core import POLICIES, State, apply, cycle
from scheduler.fold.validate import validate
from tests.fuzz.scratch import SCRATCH_ENV, make_scratch

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = ROOT / "replay" / "examples"
REGRESSIONS = ROOT / "tests" / "data" / "fuzz-regressions"


_SCRATCH: Path | None = None


def scratch() -> Path:
    """The process's scratch directory (made on first use; see ``tests/fuzz/scratch.py``)."""
    global _SCRATCH  # noqa: PLW0603  # one per process, reused by every input
    if _SCRATCH is None or not _SCRATCH.is_dir():
        _SCRATCH = make_scratch()
        _SCRATCH.mkdir(parents=True, exist_ok=True)
    return _SCRATCH


def cleanup() -> None:
    """Remove the scratch directory (the runner removes its own)."""
    global _SCRATCH  # noqa: PLW0603
    if _SCRATCH is not None and not os.environ.get(SCRATCH_ENV):
        shutil.rmtree(_SCRATCH, ignore_errors=True)
    _SCRATCH = None


def _golden_envelopes() -> list[bytes]:
    return [p.read_bytes() for p in sorted(GOLDEN.glob("*.msgpack"))]


# =========================================================================== codec


def fuzz_codec(data: bytes) -> None:
    """Arbitrary bytes as a stored record: a complete event, or ``DecodeError`` naming it."""
    try:
        record = decode(data, offset=7)
    except UnknownEventType as exc:
        assert "offset 7" in str(exc), exc
        _json_round_trip(decode_envelope(data, 7), None)  # the envelope itself was fine
        return
    except DecodeError as exc:
        assert "offset 7" in str(exc), exc
        return
    # What decodes re-encodes, and decodes to the same event.
    again = decode(encode(record.event, record.at), 7)
    assert again.event == record.event and again.at == record.at
    _json_round_trip(decode_envelope(data, 7), record.event)


def _json_round_trip(env: Envelope, event: Event | None) -> None:
    """Export to JSON and import again: same event; exporting again gives the same line."""
    try:
        line = to_json_line(7, env)
    except DecodeError as exc:
        assert "offset 7" in str(exc), exc
        return
    try:
        back = from_json_line(line, "fuzz:1")
    except DecodeError as exc:
        # Only a record this reader cannot interpret may fail to come back.
        assert event is None and "fuzz:1" in str(exc), exc
        return
    stored = encode_envelope(back)  # what import accepts can be stored
    assert (back.type, back.key, back.at, back.version) == (env.type, env.key, env.at, env.version)
    if event is not None:
        assert decode_event(back) == event
    # Import normalizes (an older payload gains the fields added since); after that, export
    # and import are exact inverses.
    line = to_json_line(7, back)
    again = from_json_line(line, "fuzz:2")
    assert encode_envelope(again) == stored and to_json_line(7, again) == line


def codec_seeds() -> Iterator[tuple[str, bytes]]:
    """Every golden envelope."""
    for path in sorted(GOLDEN.glob("*.msgpack")):
        yield path.name, path.read_bytes()


# =========================================================================== segment

_CONTINUES = 0x80000000  # bit 31 of the frame word (docs/ledger.md)
_LENGTH = 0x7FFFFFFF
_HEADER = struct.Struct("<8sIIQ")
_FRAME = struct.Struct("<IIQ")
_RESYNC_WINDOW = 256  # offsets past the damage searched for a surviving batch end
_U64 = 2**64


def frame(offset: int, payload: bytes, *, continues: bool = False) -> bytes:
    """One record as the ledger frames it."""
    body = struct.pack("<Q", offset) + payload
    word = len(payload) | (_CONTINUES if continues else 0)
    return struct.pack("<II", word, zlib.crc32(body)) + body


def segment(base: int, batches: list[list[bytes]]) -> bytes:
    """A whole segment file: header, then the batches' records from offset ``base``."""
    parts = [_HEADER.pack(MAGIC, FORMAT_VERSION, 0, base)]
    offset = base
    for batch in batches:
        for i, payload in enumerate(batch):
            parts.append(frame(offset, payload, continues=i < len(batch) - 1))
            offset += 1
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class RefScan:
    """What docs/ledger.md says a segment holds, by a deliberately naive parser.

    ``records`` are those of whole batches before the first bad frame; ``end_pos`` and
    ``end_offset`` mark the end of the last whole batch. ``kind`` says why the scan stopped
    before the end of the file (empty: it ended exactly at a batch end); ``bad_pos`` and
    ``bad_offset`` are the byte and the expected offset of the frame it stopped at.
    """

    records: list[tuple[int, bytes]]
    end_pos: int
    end_offset: int
    kind: str
    bad_pos: int
    bad_offset: int


def ref_scan(buf: bytes, base: int) -> RefScan:
    """Scan one segment file the simple way (no batching tricks, no resync)."""
    n = len(buf)
    if n < HEADER_SIZE:
        return RefScan([], 0, base, "header", 0, base)
    magic, version, _reserved, hbase = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version != FORMAT_VERSION or hbase != base:
        return RefScan([], 0, base, "header", 0, base)
    pos, expected = HEADER_SIZE, base
    committed: list[tuple[int, bytes]] = []
    pending: list[tuple[int, bytes]] = []
    end_pos, end_offset = pos, expected
    while True:
        if pos == n:
            kind = "open-batch" if pending else ""
            break
        if pos + _FRAME.size > n:
            kind = "short"
            break
        word, crc, off = _FRAME.unpack_from(buf, pos)
        end = pos + _FRAME.size + (word & _LENGTH)
        if end > n:
            kind = "short"
            break
        if zlib.crc32(buf[pos + 8 : end]) != crc:
            kind = "crc"
            break
        if off != expected:
            kind = "offset"
            break
        pending.append((off, buf[pos + _FRAME.size : end]))
        pos, expected = end, expected + 1
        if not word & _CONTINUES:
            committed += pending
            pending = []
            end_pos, end_offset = pos, expected
    return RefScan(committed, end_pos, end_offset, kind, pos, expected)


def _intact(buf: bytes, pos: int) -> tuple[int, int, int] | None:
    if pos < 0 or pos + _FRAME.size > len(buf):
        return None
    word, crc, off = _FRAME.unpack_from(buf, pos)
    end = pos + _FRAME.size + (word & _LENGTH)
    if end > len(buf) or zlib.crc32(buf[pos + 8 : end]) != crc:
        return None
    return word, off, end


def _chain_ends_batch(buf: bytes, pos: int, off: int) -> bool:
    while True:
        got = _intact(buf, pos)
        if got is None or got[1] != off:
            return False
        if not got[0] & _CONTINUES:
            return True
        pos, off = got[2], off + 1


def survivor(buf: bytes, bad_pos: int, expected: int) -> bool | None:
    """Does an intact batch end follow the damage (docs/ledger.md: then it is corruption)?

    Per offset k in the resync window, the first intact frame carrying k after the bad
    frame is followed record by record to see whether it reaches the end of a batch.
    None when an offset is carried by more than one intact frame: no writer produces that,
    and which copy the ledger's search meets first decides, so either outcome is allowed.
    """
    found: dict[int, list[int]] = {}
    lo, hi = expected + 1, expected + _RESYNC_WINDOW
    for q in range(bad_pos + 1, len(buf) - _FRAME.size + 1):
        off = struct.unpack_from("<Q", buf, q + 8)[0]
        if lo <= off <= hi and _intact(buf, q) is not None:
            found.setdefault(off, []).append(q)
    if any(len(qs) > 1 for qs in found.values()):
        return None
    return any(_chain_ends_batch(buf, qs[0], k) for k, qs in found.items())


@dataclass(frozen=True, slots=True)
class Expected:
    """What reading a ledger directory from offset 0 must do."""

    records: list[tuple[int, bytes]]
    corrupt: tuple[str, int, int] | None
    """(segment file, byte, expected offset) of the ``LedgerCorrupt``, or None."""
    tail: bool
    """The final segment ends in a torn tail (reported by verify, cut by a writer)."""
    alt: Expected | None = None
    """Also allowed instead (see ``survivor``): the damage read as a torn tail."""

    def pick(self, raised: bool) -> Expected:
        """The outcome to hold the code to, once it showed whether it raised."""
        return self.alt if self.alt is not None and not raised else self


def expect(root: Path, segs: list[tuple[int, bytes]], expected: int = 0) -> Expected:
    """The documented outcome of reading ``segs`` (sorted by base) from offset ``expected``."""
    records: list[tuple[int, bytes]] = []
    last = len(segs) - 1
    for i, (base, buf) in enumerate(segs):
        path = str(root / segment_name(base))
        if base != expected:
            return Expected(records, (path, 0, expected), False)
        ref = ref_scan(buf, base)
        records += ref.records
        if ref.kind == "header":
            return Expected(records, (path, 0, base), False)
        if ref.kind:
            damaged = (path, ref.bad_pos, ref.bad_offset)
            if i != last or ref.kind == "offset":
                return Expected(records, damaged, False)
            verdict = survivor(buf, ref.bad_pos, ref.bad_offset)
            if verdict is None:
                return Expected(records, damaged, False, Expected(records, None, True))
            if verdict:
                return Expected(records, damaged, False)
            return Expected(records, None, True)
        expected = ref.end_offset
    return Expected(records, None, False)


def _check_corrupt(exc: LedgerCorrupt, want: tuple[str, int, int] | None) -> None:
    assert want is not None, f"unexpected LedgerCorrupt: {exc}"
    assert (exc.segment, exc.position, exc.offset) == want, (str(exc), want)
    assert str(exc).startswith(f"{want[0]}: byte {want[1]} (expected offset {want[2]}): ")


_PAYLOAD = encode_envelope(decode_envelope(next(iter(_golden_envelopes()))))


def _layout(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """Segment files from an input, and the index of the fuzzed one.

    The first byte picks a layout: bit 0 puts an intact sealed segment before the fuzzed
    one, bit 1 names the fuzzed segment by the base its own header claims, bit 2 puts a
    one-record segment after it (so the fuzzed one is sealed and must be whole).
    """
    mode, body = data[0], data[1:]
    segs: list[tuple[int, bytes]] = []
    base = 0
    if mode & 1:
        head = segment(0, [[_PAYLOAD], [_PAYLOAD, _PAYLOAD]])
        segs.append((0, head))
        base = 3
    if mode & 2 and len(body) >= HEADER_SIZE:
        claimed = _HEADER.unpack_from(body, 0)[3]
        if claimed != base and claimed < 10**20 and all(b != claimed for b, _ in segs):
            base = claimed
    segs.append((base, body))
    fuzzed = len(segs) - 1
    if mode & 4:
        nxt = ref_scan(body, base).end_offset
        if nxt != base and nxt < _U64 - 1:  # an empty segment is never rolled over
            segs.append((nxt, segment(nxt, [[_PAYLOAD]])))
    return sorted(segs), fuzzed


def fuzz_segment(data: bytes) -> None:
    """Mutated segment files: readers yield exactly the intact whole batches, then stop.

    Either every record read is one whose frame checked out, in offset order, with no gap
    and nothing past damage, or ``LedgerCorrupt`` names the file, the bad frame's byte and
    the offset expected there. ``verify`` agrees, and a writer recovers to the same end.
    """
    if not data:
        return
    segs, _ = _layout(data)
    root = scratch() / "ledger"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for base, buf in segs:
        (root / segment_name(base)).write_bytes(buf)
    want = expect(root, segs)
    last_base, last_buf = segs[-1]

    # read_raw from the start
    reader = LedgerDirReader(root)
    got: list[tuple[int, bytes]] = []
    try:
        got.extend(reader.read_raw())
    except LedgerCorrupt as exc:
        want = want.pick(raised=True)
        _check_corrupt(exc, want.corrupt)
    else:
        want = want.pick(raised=False)
        assert want.corrupt is None, f"no LedgerCorrupt, expected {want.corrupt}"
    assert got == want.records, "records differ from the intact whole batches"

    # end_offset (final segment only, incremental) and a range read from the middle
    final = expect(root, segs[-1:], last_base)
    for _ in range(2):
        try:
            end = reader.end_offset()
        except LedgerCorrupt as exc:
            final = final.pick(raised=True)
            _check_corrupt(exc, final.corrupt)
        else:
            final = final.pick(raised=False)
            assert final.corrupt is None
            assert end == (final.records[-1][0] + 1 if final.records else last_base)
    if want.corrupt is None and got:
        mid = got[len(got) // 2][0]
        assert list(reader.read_raw(mid, mid + 2)) == [r for r in got if mid <= r[0] < mid + 2]

    # follow: the same records, decoded. Before a missing segment it waits for the writer
    # (it cannot tell a gap from a roll in progress), so there it may stop short.
    followed: list[int] = []
    try:
        followed.extend(off for off, _ in reader.follow(0, poll_s=0, idle_timeout_s=0))
    except LedgerCorrupt as exc:
        _check_corrupt(exc, want.corrupt)
    except DecodeError as exc:
        assert "offset" in str(exc)
    else:
        if want.corrupt is None:
            assert followed == [off for off, _ in got]
    assert followed == [off for off, _ in got][: len(followed)], "follow skipped records"

    # verify: never raises; its problems agree with the reader
    report = verify(root)
    kinds = [p.kind for p in report.problems]
    if want.corrupt is None:
        assert "corrupt" not in kinds, report.problems
        assert ("torn_tail" in kinds) == want.tail, report.problems
        assert report.records == len(got)
    else:
        assert "corrupt" in kinds, report.problems

    # a writer: recovery checks the last two segments and cuts a torn tail
    opened = expect(root, segs[-2:], segs[-2][0]) if len(segs) > 1 else final
    opened = opened.pick(raised=final.corrupt is not None)  # the final segment decided it
    try:
        writer = FileLedger.open(root, create=False)
    except LedgerCorrupt as exc:
        _check_corrupt(exc, opened.corrupt)
        return
    with writer:
        assert opened.corrupt is None, f"writer opened over {opened.corrupt}"
        ref = ref_scan(last_buf, last_base)
        assert writer.end_offset() == ref.end_offset
        assert (writer.recovery is None) == (ref.kind == ""), writer.recovery
        if writer.recovery is not None:
            assert writer.recovery.position == ref.end_pos
        env = decode_envelope(_PAYLOAD)
        if ref.end_offset >= _U64:  # the offset space is used up
            with contextlib.suppress(LedgerError):
                writer.append([env])
                raise AssertionError("appended past the largest offset")
            return
        first = writer.append([env])
        assert first == ref.end_offset
    written = (root / segment_name(last_base)).read_bytes()
    assert written == last_buf[: ref.end_pos] + frame(first, _PAYLOAD)


def segment_seeds() -> Iterator[tuple[str, bytes]]:
    """Segments of golden envelopes in batches of several sizes, under each layout."""
    payloads = _golden_envelopes()
    batches: list[list[bytes]] = []
    size = 1
    rest = payloads[:12]
    while rest:
        batches.append(rest[:size])
        rest = rest[size:]
        size = size % 3 + 1
    whole = segment(0, batches)
    yield "whole", b"\x00" + whole
    yield "small", b"\x00" + segment(0, [[payloads[0]], [payloads[1], payloads[2]]])
    yield "torn", b"\x00" + whole[:-5]
    yield "after-sealed", b"\x01" + segment(3, batches[:3])
    yield "named-by-header", b"\x02" + segment(7, batches[:2])
    yield "sealed", b"\x04" + segment(0, batches[:4])
    flipped = bytearray(whole)
    flipped[len(flipped) // 2] ^= 0x40
    yield "flipped", b"\x00" + bytes(flipped)
    yield "empty", b"\x00" + whole[:HEADER_SIZE]


# =========================================================================== config

KINDS: list[type[Any]] = [ClusterFile, QueuesFile, WorkloadFile, PolicyFile]
_LIMIT = 2000  # bigger inputs are valid, just slow: jobs, nodes, pods per gang


def _upper(value: Number) -> float:
    """A generous upper bound of what a distribution draws (for skipping huge inputs)."""
    match value:
        case float() | int():
            return float(value)
        case Fixed(value=v):
            return v
        case Choice(values=values):
            return max(values, default=0.0)
        case Uniform(min=lo, max=hi):
            return max(lo, hi)
        case Exponential(mean=mean):
            return mean * 50
        case LogNormal(median=median, sigma=sigma, max=cap):
            return cap if cap is not None else median * math.exp(10 * sigma)
    return math.inf  # pragma: no cover


def _too_big(cfg: object) -> bool:
    if isinstance(cfg, ClusterFile):
        return sum(g.count for g in cfg.nodes) > _LIMIT
    if isinstance(cfg, WorkloadFile):
        total = float(len(cfg.jobs))
        for job in cfg.jobs:
            if job.pods > _LIMIT:
                return True
        for gen in cfg.generators:
            end = min(gen.end_s if gen.end_s is not None else cfg.horizon_s, cfg.horizon_s)
            span = max(0.0, end - gen.start_s)
            match gen.arrival:
                case Poisson(rate_per_h=rate):
                    count = rate * span / 3600 * 2 + 20
                case Periodic(every_s=every, burst=burst):
                    count = (span / every + 1) * burst
            if gen.count is not None:
                count = min(count, gen.count)
            total += count
            if _upper(gen.gang_size) > _LIMIT:
                return True
        return not total <= _LIMIT
    return False


_CLUSTER = ClusterFile(
    nodes=[
        NodeGroup(name="a", count=1, gpus=8, cpu=64, memory_gib=512, labels={"pool": "a"}),
        NodeGroup(name="b", count=1, gpus=4),
    ]
)
_SMALL_RUN = 40  # jobs: small inputs are also simulated to the end


def _queues_for(names: list[str]) -> QueuesFile:
    return QueuesFile(queues=[QueueSpec(name=n) for n in sorted(set(names))])


def _workload_for(queues: list[str]) -> WorkloadFile:
    return WorkloadFile(
        jobs=[
            JobSpec(name=f"j{i}", queue=q, at_s=i, runtime_s=60, pods=2, gpus_per_pod=0.5)
            for i, q in enumerate(queues)
        ]
    )


def _simulation(cfg: Any, policy_byte: int) -> Simulation:
    """``gpuledger simulate`` on the file, with small files of the other kinds."""
    policy: str | PolicyConfigured = "gpuledger"
    cluster, queues, workload = _CLUSTER, _queues_for(["q"]), _workload_for(["q"])
    match cfg:
        case ClusterFile():
            cluster = cfg
        case QueuesFile():
            queues = cfg
            parents = {q.parent for q in cfg.queues}
            workload = _workload_for([q.name for q in cfg.queues if q.name not in parents])
        case WorkloadFile():
            workload = cfg
            queues = _queues_for([j.queue for j in cfg.jobs] + [g.queue for g in cfg.generators])
        case PolicyFile():
            name = POLICIES[policy_byte // len(KINDS) % len(POLICIES)]
            policy = policy_event(name, cfg)
    return Simulation(cluster, queues, workload, policy)


def fuzz_config(data: bytes) -> None:
    """YAML inputs: a ``ConfigError`` naming the file, or events that intake accepts.

    What a loader accepts, the live path's validation must accept too, every event must
    encode for the ledger, and the core must fold it and run a cycle without raising; a
    small input is simulated to the end.
    """
    if not data:
        return
    kind = KINDS[data[0] % len(KINDS)]
    path = scratch() / f"fuzz-{kind.__name__}.yaml"
    path.write_bytes(data[1:])
    try:
        cfg = load(path, kind)
    except ConfigError as exc:
        assert str(exc).startswith(f"{path}: "), exc
        return
    if _too_big(cfg):
        return
    try:
        sim = _simulation(cfg, data[0])
    except ConfigError as exc:
        assert str(exc), exc
        return
    events = [sim.config, *(e for _, e in sim.world), *(j.submitted for j in sim.jobs)]
    state = State()
    for event in events:
        reason = validate(state, event)
        assert reason is None, f"the loader accepted what intake rejects: {reason}: {event}"
        encode(event, 0)
        apply(state, event, 0)
    for now in (0, 3_600_000):
        for decision in cycle(state, now):
            encode(decision, now)
    if len(sim.jobs) <= _SMALL_RUN:
        _simulation(cfg, data[0]).run()


def config_seeds() -> Iterator[tuple[str, bytes]]:
    """Every example file, and a policy file with the recommended knobs."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for index, kind in enumerate(("-cluster", "-queues", "-workload")):
            if kind in path.stem:
                yield path.name, bytes([index]) + path.read_bytes()
    policy = msgspec.yaml.encode(PolicyFile(half_life_s=3600, consolidation=True))
    for i in range(len(POLICIES)):
        yield f"policy-{POLICIES[i]}", bytes([3 + 4 * i]) + policy


# =========================================================================== jsonl


class _Pipe(io.RawIOBase):
    """A non-seekable byte stream (stdin), so import stages the rows in memory."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def fuzz_jsonl(data: bytes) -> None:
    """JSON Lines import: every row valid and stored, or ``DecodeError`` and nothing appended.

    What was imported exports, re-imports and exports again byte for byte. Into a new
    directory (``import_jsonl_into``, as ``gpuledger log import`` does) a rejected import leaves no ledger directory behind.
    """
    if not data:
        return
    mode, body = data[0], data[1:]
    src: Any = io.BytesIO(body) if mode & 1 else io.BufferedReader(_Pipe(body))
    if mode & 2:
        ledger = scratch() / "imported"
        shutil.rmtree(ledger, ignore_errors=True)
        try:
            count, first = import_jsonl_into(src, ledger, source_name="fuzz.jsonl")
        except DecodeError as exc:
            assert "fuzz.jsonl:" in str(exc), exc
            assert not ledger.exists(), "a rejected import left a ledger behind"
            return
        assert first == 0
        reader: Any = LedgerDirReader(ledger)
    else:
        reader = MemoryLedger()
        try:
            count = import_jsonl(src, reader, source_name="fuzz.jsonl")
        except DecodeError as exc:
            assert "fuzz.jsonl:" in str(exc), exc
            assert reader.records == [], "a rejected import appended records"
            return
    assert count == sum(1 for line in io.BytesIO(body) if line.strip())
    stored = [encode_envelope(env) for _, env in reader.read()]
    assert len(stored) == count
    once = io.BytesIO()
    assert export_jsonl(reader, once) == count
    again = MemoryLedger()
    import_jsonl(io.BytesIO(once.getvalue()), again, source_name="export")
    assert again.blob() == b"".join(stored), "export/import changed the stored records"
    twice = io.BytesIO()
    export_jsonl(again, twice)
    assert twice.getvalue() == once.getvalue(), "export, import, export is not identical"


def jsonl_seeds() -> Iterator[tuple[str, bytes]]:
    """Exports of the golden envelopes, plus an unknown type, under each mode."""
    lines = [to_json_line(i, decode_envelope(raw)) for i, raw in enumerate(_golden_envelopes())]
    lines.append(b'{"offset":99,"type":"job_teleported","key":"j","at":5,"payload":{"x":[1,2.5]}}')
    body = b"\n".join(lines) + b"\n"
    for mode in range(4):
        yield f"golden-{mode}", bytes([mode]) + body
        yield f"one-{mode}", bytes([mode]) + lines[mode] + b"\n\n"


# =========================================================================== registry

Target = Callable[[bytes], None]
TARGETS: dict[str, Target] = {
    "codec": fuzz_codec,
    "segment": fuzz_segment,
    "config": fuzz_config,
    "jsonl": fuzz_jsonl,
}
SEEDS: dict[str, Callable[[], Iterator[tuple[str, bytes]]]] = {
    "codec": codec_seeds,
    "segment": segment_seeds,
    "config": config_seeds,
    "jsonl": jsonl_seeds,
}


def dictionary(target: str) -> list[bytes]:
    """libFuzzer dictionary tokens: field names and tags the inputs are made of."""
    tokens: set[str] = set()
    if target == "config":
        for kind in (*KINDS, Fixed, Choice, Uniform, Exponential, LogNormal, Poisson, Periodic):
            tokens.update(kind.__struct_fields__)
            tag = kind.__struct_config__.tag
            if isinstance(tag, str):
                tokens.add(tag)
        tokens.update(("- ", ": ", ".inf", "-.inf", ".nan", "1e400", "{", "[", "null", "~"))
        tokens.update(POLICIES)
    else:
        for tag, cls in TAGS.items():
            tokens.add(tag)
            tokens.update(cls.__struct_fields__)
        tokens.update(("type", "key", "at", "payload", "version", "offset"))
    return sorted(t.encode() for t in tokens)


__all__ = [
    "REGRESSIONS",
    "SEEDS",
    "TARGETS",
    "cleanup",
    "dictionary",
    "expect",
    "frame",
    "ref_scan",
    "segment",
]
