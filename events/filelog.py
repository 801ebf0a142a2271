"""The embedded ledger: an append-only, segmented, checksummed file log of ``Envelope``s.

A ledger is a directory of segment files named by the offset of their first record
(``00000000000000000000.seg``), a ``LOCK`` file for the single writer, and nothing else.
Each segment starts with a 24-byte header and holds framed records::

    header  <8s I I Q>  magic b"GPULEDG1", format version, reserved (0), base offset
    frame   <I I Q>     word, crc32(offset bytes + payload), offset;  then the payload

The low 31 bits of ``word`` are the payload length; bit 31 says "more records of the same
append follow". A batch therefore ends at the first record with the bit clear, which lets
recovery and readers treat a batch as all-or-nothing: an append that was cut short by a
crash leaves no partial batch behind, and a reader never sees half an append.

The payload is the msgpack encoding of the ``Envelope`` (``events.codec``). See
docs/ledger.md for durability and recovery. JSON Lines export and import are in
``events.jsonl``; ``events.sources.open_reader`` opens a reader over any source.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import re
import shutil
import struct
import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from events.codec import (
    DecodeError,
    Envelope,
    UnknownEventType,
    decode_envelope,
    decode_event,
    encode_envelope,
)
from events.port import follow_polls

log = logging.getLogger(__name__)

MAGIC = b"GPULEDG1"
FORMAT_VERSION = 1
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
"""Roll to a new segment once the current one would grow past this many bytes."""

SEGMENT_SUFFIX = ".seg"
LOCK_NAME = "LOCK"

_HEADER = struct.Struct("<8sIIQ")
HEADER_SIZE = _HEADER.size
_FRAME = struct.Struct("<IIQ")
FRAME_HEADER_SIZE = _FRAME.size
_OFFSET = struct.Struct("<Q")

_OFFSET_END = 2**64
"""One past the largest offset a frame can carry."""
_LENGTH_MASK = 0x7FFFFFFF
_CONTINUES = 0x80000000
MAX_PAYLOAD = _LENGTH_MASK
"""Largest storable envelope, in bytes (the length field has 31 bits)."""

_SEGMENT_RE = re.compile(r"^(\d{20})\.seg$")

# How many offsets past a bad frame are searched for intact records: a surviving batch end
# there proves the bad frame was acknowledged data, not a torn write.
_RESYNC_WINDOW = 256

# --------------------------------------------------------------------------- errors


class LedgerError(Exception):
    """Base of the ledger's errors (missing directory, closed writer, bad format...)."""


class LedgerLocked(LedgerError):  # noqa: N818  # public API name, kept short
    """Another writer holds the ledger's lock."""


class LedgerCorrupt(LedgerError):  # noqa: N818  # as above
    """A record failed its checks somewhere a torn write cannot explain.

    ``segment`` is the segment file, ``position`` the byte position of the bad frame in it
    and ``offset`` the offset the record at that position should have had.
    """

    def __init__(self, segment: Path | str, position: int, offset: int, what: str) -> None:
        self.segment = str(segment)
        self.position = position
        self.offset = offset
        self.what = what
        super().__init__(f"{segment}: byte {position} (expected offset {offset}): {what}")


# --------------------------------------------------------------------------- layout helpers


def segment_name(base: int) -> str:
    """File name of the segment whose first record has offset ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


def _list_bases(path: Path) -> list[int]:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        raise LedgerError(f"{path}: no such ledger directory") from None
    except NotADirectoryError:
        raise LedgerError(f"{path}: not a ledger directory") from None
    bases = []
    for name in names:
        m = _SEGMENT_RE.match(name)
        if m:
            bases.append(int(m.group(1)))
    bases.sort()
    return bases


def _header_problem(buf: bytes, base: int) -> str | None:
    if len(buf) < HEADER_SIZE:
        return f"segment is {len(buf)} bytes, shorter than its {HEADER_SIZE}-byte header"
    magic, version, _reserved, hbase = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        return f"bad magic {magic!r} (not a gpuledger segment)"
    if version != FORMAT_VERSION:
        return f"format version {version}, this reader understands {FORMAT_VERSION}"
    if hbase != base:
        return f"header says base offset {hbase} but the file name says {base}"
    return None


def _check_header(buf: bytes, seg: Path, base: int) -> None:
    problem = _header_problem(buf, base)
    if problem is not None:
        raise LedgerCorrupt(seg, 0, base, problem)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------- the scanner


@dataclass(slots=True)
class _Scan:
    """Where a scan of one segment buffer stands.

    ``pos``/``expected`` advance only at batch ends, so after the scan they mark the end of
    the last complete batch. ``tail`` describes what stopped the scan before the end of
    the buffer (empty when it ended exactly at a batch end).
    """

    pos: int
    expected: int
    tail: str = ""
    tail_records: int = 0


def _frame_at(buf: bytes, pos: int, n: int) -> tuple[int, int, int] | None:
    """(word, offset, end) of an intact frame at ``pos``, or None."""
    if pos + FRAME_HEADER_SIZE > n:
        return None
    word, crc, off = _FRAME.unpack_from(buf, pos)
    end = pos + FRAME_HEADER_SIZE + (word & _LENGTH_MASK)
    if end > n or zlib.crc32(memoryview(buf)[pos + 8 : end]) != crc:
        return None
    return word, off, end


def _surviving_batch_end(buf: bytes, bad: int, expected: int) -> int | None:
    """Position of an intact batch-ending record after ``bad``, or None.

    Only one append is ever in flight (each is fsynced before the next starts), and a
    process crash leaves a *prefix* of its bytes: nothing intact follows a tear, and an
    unfinished append has no batch end. So a batch end surviving past a bad frame means the
    bad frame is damaged data of a finished, almost surely acknowledged append: corruption,
    which must not be truncated away. (Only a power loss that persisted the in-flight
    append's pages out of order can fake this; refusing is then the safe mistake.)
    """
    n = len(buf)
    k = expected + 1
    # Offsets are u64: nothing can follow the last one, so the search stops there.
    limit = min(expected + 1 + _RESYNC_WINDOW, _OFFSET_END)
    while k < limit:
        needle = _OFFSET.pack(k)
        q = buf.find(needle, bad + 9)
        while q != -1:
            frame = _frame_at(buf, q - 8, n)
            if frame is not None and frame[1] == k:
                break
            q = buf.find(needle, q + 1)
        else:
            k += 1
            continue
        pos, off = q - 8, k
        while True:
            frame = _frame_at(buf, pos, n)
            if frame is None or frame[1] != off:
                break
            if not frame[0] & _CONTINUES:
                return pos
            pos, off = frame[2], off + 1
        # The chain broke where it expected ``off``; an intact record carrying ``off``
        # may still stand elsewhere, so search for it too.
        k = off
    return None


def _load_segment(seg: Path, base: int) -> tuple[bytes, _Scan]:
    """A whole segment's bytes, its header checked, and a scan at its first batch."""
    buf = _read_file(seg)
    _check_header(buf, seg, base)
    return buf, _Scan(HEADER_SIZE, base)


def _iter_committed(
    buf: bytes, scan: _Scan, *, final: bool, seg: Path, origin: int = 0
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, envelope bytes)`` for every record of every complete batch.

    ``buf`` holds segment bytes from file position ``origin``; the scan starts at
    ``scan.pos`` (relative to ``buf``). In a non-final segment every byte must belong to a
    complete batch. In the final segment an incomplete or bad tail is tolerated (it is an
    append in flight, or the torn tail of one that crashed) unless a later batch survives
    beyond it, which makes it corruption.
    """
    n = len(buf)
    mv = memoryview(buf)
    unpack = _FRAME.unpack_from
    crc32 = zlib.crc32
    pos = scan.pos
    expected = scan.expected
    pending: list[tuple[int, bytes]] = []
    what = ""
    while True:
        if pos + FRAME_HEADER_SIZE > n:
            if pos < n:
                what = f"incomplete frame header ({n - pos} of {FRAME_HEADER_SIZE} bytes)"
            break
        word, crc, off = unpack(buf, pos)
        end = pos + FRAME_HEADER_SIZE + (word & _LENGTH_MASK)
        if end > n:
            what = f"incomplete frame ({n - pos} bytes present, frame needs {end - pos})"
            break
        if crc32(mv[pos + 8 : end]) != crc:
            what = "bad checksum"
            break
        if off != expected:
            what = f"record carries offset {off}"
            break
        payload = buf[pos + FRAME_HEADER_SIZE : end]
        pos = end
        expected += 1
        if word & _CONTINUES:
            pending.append((off, payload))
            continue
        scan.pos = pos
        scan.expected = expected
        if pending:
            yield from pending
            pending.clear()
        yield off, payload
    if pos == n and not pending:
        return
    if not what:
        what = "segment ends inside a batch (the append never completed)"
    if not final:
        raise LedgerCorrupt(seg, origin + pos, expected, what)
    if what.startswith("record carries"):
        # The checksum held, so these bytes were written whole: not a torn write.
        raise LedgerCorrupt(seg, origin + pos, expected, what)
    later = _surviving_batch_end(buf, pos, expected)
    if later is not None:
        raise LedgerCorrupt(
            seg,
            origin + pos,
            expected,
            f"{what}; an acknowledged append ends intact at byte {origin + later} after it",
        )
    scan.tail = what
    scan.tail_records = len(pending)


# --------------------------------------------------------------------------- the writer


@dataclass(frozen=True, slots=True)
class TailRepair:
    """What recovery cut off the final segment when a writer opened the ledger."""

    segment: str
    position: int
    bytes: int
    records: int
    reason: str


class FileLedger:
    """The single writer of a ledger directory (implements ``LedgerWriter``).

    Open it with ``FileLedger.open``. ``append`` writes a batch with one ``write`` and one
    ``fdatasync``: when it returns, the batch is durable and *acknowledged*. A batch that
    was cut short by a crash is removed as a whole when the next writer opens the ledger;
    ``recovery`` then says what was cut (None when the ledger was clean).
    """

    def __init__(
        self,
        path: Path,
        *,
        lock_fd: int,
        seg_fd: int,
        seg_base: int,
        seg_size: int,
        next_offset: int,
        segment_bytes: int,
        recovery: TailRepair | None,
    ) -> None:
        """Use ``FileLedger.open``; this only stores already-recovered state."""
        self.path = path
        self.segment_bytes = segment_bytes
        self.recovery = recovery
        self._lock_fd: int | None = lock_fd
        self._seg_fd = seg_fd
        self._seg_base = seg_base
        self._seg_size = seg_size
        self._next = next_offset
        self._failed: str | None = None
        self._mutex = threading.Lock()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        create: bool = True,
    ) -> FileLedger:
        """Lock the ledger at ``path`` for writing, recover its tail, return the writer.

        With ``create`` a missing directory (or an empty one) becomes a new ledger.
        Raises ``LedgerLocked`` if another writer holds it and ``LedgerCorrupt`` if the
        final segment is damaged somewhere a torn write cannot explain.
        """
        if segment_bytes <= HEADER_SIZE:
            raise ValueError(f"segment_bytes must exceed the {HEADER_SIZE}-byte header")
        root = Path(path)
        if not root.is_dir():
            if not create:
                raise LedgerError(f"{root}: no such ledger directory")
            root.mkdir(parents=True, exist_ok=True)
            _fsync_dir(root.parent)
        lock_fd = _lock(root)
        try:
            return cls._recover(root, lock_fd, segment_bytes, create)
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def _recover(cls, root: Path, lock_fd: int, segment_bytes: int, create: bool) -> FileLedger:
        for name in os.listdir(root):
            # A segment is created under a temporary name and renamed once its header is
            # durable; a leftover is a roll that crashed before the rename.
            if name.endswith(SEGMENT_SUFFIX + ".tmp"):
                (root / name).unlink()
        bases = _list_bases(root)
        if not bases:
            if not create:
                raise LedgerError(f"{root}: not a ledger directory (no segment files)")
            os.close(_create_segment(root, 0))
            bases = [0]
        base = bases[-1]
        if len(bases) > 1:
            _check_sealed(root, bases[-2], base)
        seg = root / segment_name(base)
        buf, scan = _load_segment(seg, base)
        for _ in _iter_committed(buf, scan, final=True, seg=seg):
            pass
        recovery = None
        seg_fd = os.open(seg, os.O_RDWR)
        try:
            if scan.pos < len(buf):
                recovery = TailRepair(
                    segment=str(seg),
                    position=scan.pos,
                    bytes=len(buf) - scan.pos,
                    records=scan.tail_records,
                    reason=scan.tail,
                )
                os.ftruncate(seg_fd, scan.pos)
                os.fsync(seg_fd)
                log.warning(
                    "ledger %s: truncated torn tail of %s at byte %d: %d bytes "
                    "(%d whole records of the incomplete append): %s",
                    root,
                    seg.name,
                    scan.pos,
                    recovery.bytes,
                    recovery.records,
                    recovery.reason,
                )
        except BaseException:
            os.close(seg_fd)
            raise
        return cls(
            root,
            lock_fd=lock_fd,
            seg_fd=seg_fd,
            seg_base=base,
            seg_size=scan.pos,
            next_offset=scan.expected,
            segment_bytes=segment_bytes,
            recovery=recovery,
        )

    @property
    def recovered_bytes(self) -> int:
        """Bytes recovery truncated from the final segment on open (0 when clean)."""
        return 0 if self.recovery is None else self.recovery.bytes

    def append(self, envelopes: Sequence[Envelope]) -> int:
        """Append a batch durably and atomically; return the offset of its first record.

        An empty batch appends nothing and returns ``end_offset()``. After an I/O error
        the writer refuses further appends: reopen the ledger (recovery repairs it).
        """
        with self._mutex:
            if self._lock_fd is None:
                raise LedgerError(f"{self.path}: writer is closed")
            if self._failed is not None:
                raise LedgerError(f"{self.path}: writer failed earlier ({self._failed}); reopen")
            count = len(envelopes)
            first = self._next
            if count == 0:
                return first
            if first + count > _OFFSET_END:
                raise LedgerError(f"{self.path}: offsets would pass 2**64 - 1; the ledger is full")
            data = self._frame(envelopes, first)
            if self._next > self._seg_base and self._seg_size + len(data) > self.segment_bytes:
                self._roll()
            try:
                _pwrite_all(self._seg_fd, data, self._seg_size)
                os.fdatasync(self._seg_fd)
            except OSError as exc:
                self._fail(exc)
                raise
            self._seg_size += len(data)
            self._next = first + count
            return first

    def _frame(self, envelopes: Sequence[Envelope], first: int) -> bytes:
        encode = encode_envelope
        pack = _FRAME.pack
        pack_offset = _OFFSET.pack
        crc32 = zlib.crc32
        parts: list[bytes] = []
        last = len(envelopes) - 1
        for i, env in enumerate(envelopes):
            if not isinstance(env, Envelope):
                raise TypeError(f"append expects Envelopes, got {type(env).__name__}")
            payload = encode(env)
            length = len(payload)
            if length > MAX_PAYLOAD:
                raise LedgerError(f"envelope of {length} bytes exceeds {MAX_PAYLOAD}")
            off = first + i
            word = length if i == last else length | _CONTINUES
            parts.append(pack(word, crc32(payload, crc32(pack_offset(off))), off))
            parts.append(payload)
        return b"".join(parts)

    def _fail(self, exc: OSError) -> None:
        # After a failed write or fsync the page cache may not match the disk, so the only
        # safe continuation is a fresh open, whose recovery re-reads what is really there.
        self._failed = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            os.ftruncate(self._seg_fd, self._seg_size)

    def _roll(self) -> None:
        try:
            fd = _create_segment(self.path, self._next)
        except OSError as exc:
            self._fail(exc)
            raise
        os.close(self._seg_fd)
        self._seg_fd = fd
        self._seg_base = self._next
        self._seg_size = HEADER_SIZE

    def end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._next

    def close(self) -> None:
        """Close the segment and release the lock (idempotent)."""
        with self._mutex:
            if self._lock_fd is None:
                return
            os.close(self._seg_fd)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Self:
        """The writer itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the writer."""
        self.close()


def _check_sealed(root: Path, base: int, next_base: int) -> None:
    """Check the segment before the final one end to end, and that the final one follows it.

    A writer only rolls after the previous append is durable, so that segment must be
    whole: damage there is corruption, never a torn tail. Checking it (and not the whole
    ledger, which is ``verify``'s job) keeps opening cost bounded by two segments.
    """
    seg = root / segment_name(base)
    buf, scan = _load_segment(seg, base)
    for _ in _iter_committed(buf, scan, final=False, seg=seg):
        pass
    if scan.expected != next_base:
        raise LedgerCorrupt(
            root / segment_name(next_base),
            0,
            scan.expected,
            f"segment starts at offset {next_base} but the previous one ends before "
            f"offset {scan.expected}",
        )


def _lock(root: Path) -> int:
    lock_path = root / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder else ""
        raise LedgerLocked(f"ledger {root} is locked by another writer{who}") from None
    except BaseException:
        os.close(fd)
        raise
    # The pid is only a hint for the error message above; the flock is the lock.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@contextlib.contextmanager
def new_ledger(path: str | os.PathLike[str]) -> Iterator[FileLedger]:
    """The writer of a ledger that appears at ``path`` whole or not at all.

    It is written in a hidden sibling, ``.NAME.partial-PID``, and renamed to ``path`` when
    the block completes; when the block raises, the sibling is removed. So a simulation
    that fails or is interrupted leaves no half-written ledger for a reader to take for a
    result, or for the next run to trip over; the sibling of a run killed outright is
    removed by the next one into the same place. ``path`` must be absent or an empty
    directory (``LedgerError`` otherwise)."""
    final = Path(path)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise LedgerError(f"{final}: exists and is not an empty directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{final.name}.partial-"
    for other in final.parent.iterdir():
        pid = other.name[len(prefix) :]
        if other.name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(other, ignore_errors=True)
    staging = final.parent / f"{prefix}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with FileLedger.open(staging) as writer:
            yield writer
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if final.exists():
        final.rmdir()  # empty, checked above
    staging.rename(final)
    _fsync_dir(final.parent)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_segment(root: Path, base: int) -> int:
    """Create a segment durably and return a read-write fd positioned for appends."""
    final = root / segment_name(base)
    if final.exists():
        raise LedgerCorrupt(final, 0, base, "segment already exists; refusing to overwrite it")
    tmp = root / (segment_name(base) + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _pwrite_all(fd, _HEADER.pack(MAGIC, FORMAT_VERSION, 0, base), 0)
        os.fsync(fd)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pwrite_all(fd: int, data: bytes, pos: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, pos)
        view = view[written:]
        pos += written


# --------------------------------------------------------------------------- the readers


class LedgerDirReader:
    """Reads a ledger directory (implements ``LedgerReader``); takes no lock.

    A live writer may be appending: readers see whole appends only, and stop at the
    current end. A record that fails its checks is never yielded: ``LedgerCorrupt``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Open the ledger at ``path``; raises ``LedgerError`` if it is not one."""
        self.path = Path(path)
        if not _list_bases(self.path):
            raise LedgerError(f"{self.path}: not a ledger directory (no segment files)")
        self._tail: tuple[int, _Scan] | None = None

    def _bases(self) -> list[int]:
        bases = _list_bases(self.path)
        if not bases:
            raise LedgerError(f"{self.path}: segment files disappeared")
        return bases

    def read_raw(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
        """``(offset, stored msgpack envelope bytes)`` for ``start <= offset < end``."""
        if end is not None and end <= start:
            return
        bases = self._bases()
        idx = bisect.bisect_right(bases, start) - 1
        # Before the first segment, offset 0 is expected; a first segment that starts
        # later is then reported as missing records.
        expected = bases[idx] if idx >= 0 else 0
        last = len(bases) - 1
        for i in range(max(idx, 0), last + 1):
            base = bases[i]
            seg = self.path / segment_name(base)
            if base != expected:
                raise LedgerCorrupt(
                    seg, 0, expected, f"segment starts at offset {base}, records are missing"
                )
            buf, scan = _load_segment(seg, base)
            for off, payload in _iter_committed(buf, scan, final=i == last, seg=seg):
                if off < start:
                    continue
                yield off, payload
                # Stop without scanning on: the next record may be damaged or in flight.
                if end is not None and off + 1 >= end:
                    return
            expected = scan.expected

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """Records with ``start <= offset < end`` (to the current end when ``end`` is None)."""
        for off, payload in self.read_raw(start, end):
            yield off, decode_envelope(payload, off)

    def end_offset(self) -> int:
        """One past the last record of the last complete append."""
        base = self._bases()[-1]
        seg = self.path / segment_name(base)
        # Only the newly appended bytes of the final segment are scanned on each call.
        if self._tail is None or self._tail[0] != base:
            with open(seg, "rb") as f:
                _check_header(f.read(HEADER_SIZE), seg, base)
            # Only once the header checked out: a bad one must fail every call, not the
            # first only.
            self._tail = (base, _Scan(HEADER_SIZE, base))
        scan = self._tail[1]
        with open(seg, "rb") as f:
            f.seek(scan.pos)
            data = f.read()
        part = _Scan(0, scan.expected)
        for _ in _iter_committed(data, part, final=True, seg=seg, origin=scan.pos):
            pass
        scan.pos += part.pos
        scan.expected = part.expected
        return scan.expected

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.05,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """Yield records from ``start`` on, waiting for a live writer to append more.

        Returns when ``stop()`` is true (checked between polls) or when nothing new has
        arrived for ``idle_timeout_s`` seconds; otherwise it follows forever.
        """
        bases = self._bases()
        idx = max(bisect.bisect_right(bases, start) - 1, 0)
        base = bases[idx]
        seg = self.path / segment_name(base)
        if start < base:
            # As in read_raw: a first segment that starts later is missing records, which
            # following from before it must not skip silently.
            raise LedgerCorrupt(seg, 0, 0, f"segment starts at offset {base}, records are missing")
        f = open(seg, "rb")  # noqa: SIM115  # switched between segments below
        try:
            _check_header(f.read(HEADER_SIZE), seg, base)
            scan = _Scan(HEADER_SIZE, base)

            def poll() -> Generator[tuple[int, Envelope], None, bool]:
                nonlocal f, seg, base, scan
                before = scan.pos
                yield from _follow_chunk(f, scan, seg, start, final=True)
                if scan.pos != before:
                    return True
                nxt = self.path / segment_name(scan.expected)
                # An empty segment is never rolled over (and ``nxt`` would name itself).
                if scan.expected > base and nxt.exists():
                    # The writer finished this segment before creating the next one, so
                    # whatever is left here must now be whole.
                    yield from _follow_chunk(f, scan, seg, start, final=False)
                    f.close()
                    seg = nxt
                    f = open(seg, "rb")  # noqa: SIM115
                    base = scan.expected
                    _check_header(f.read(HEADER_SIZE), seg, base)
                    scan = _Scan(HEADER_SIZE, base)
                    return True
                return False

            yield from follow_polls(poll, poll_s=poll_s, stop=stop, idle_timeout_s=idle_timeout_s)
        finally:
            f.close()

    def close(self) -> None:
        """Nothing to release: every read and follow opens and closes its own files."""


def holds_segments(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory holding at least one segment: a ledger to read."""
    try:
        return bool(_list_bases(Path(path)))
    except LedgerError:
        return False


class AwaitedLedgerDir:
    """A ledger directory its writer may not have created yet (implements ``LedgerReader``):
    empty until ``path`` holds a segment, then ``LedgerDirReader``'s records. For a reader
    started before the writer, as the ingestor may be before the scheduler."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._reader: LedgerDirReader | None = None

    def _ready(self) -> LedgerDirReader | None:
        if self._reader is None and holds_segments(self.path):
            self._reader = LedgerDirReader(self.path)
        return self._reader

    def read(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, Envelope]]:
        """The records with ``start <= offset < end``; none while the ledger does not exist."""
        reader = self._ready()
        return iter(()) if reader is None else reader.read(start, end)

    def end_offset(self) -> int:
        """0 while the ledger does not exist."""
        reader = self._ready()
        return 0 if reader is None else reader.end_offset()

    def follow(
        self,
        start: int = 0,
        *,
        poll_s: float = 0.05,
        stop: Callable[[], bool] | None = None,
        idle_timeout_s: float | None = None,
    ) -> Iterator[tuple[int, Envelope]]:
        """Wait for the ledger to exist (as ``LedgerDirReader.follow`` waits for records),
        then follow it."""
        waited = time.monotonic()
        while (reader := self._ready()) is None:
            if (stop is not None and stop()) or (
                idle_timeout_s is not None and time.monotonic() - waited >= idle_timeout_s
            ):
                return
            time.sleep(poll_s)
        yield from reader.follow(start, poll_s=poll_s, stop=stop, idle_timeout_s=idle_timeout_s)

    def close(self) -> None:
        """Nothing to release."""


def _follow_chunk(
    f: IO[bytes], scan: _Scan, seg: Path, start: int, *, final: bool
) -> Iterator[tuple[int, Envelope]]:
    # Re-read from the last complete batch every time: bytes past it may be an append in
    # flight, or a torn tail that a recovering writer is about to truncate and overwrite.
    f.seek(scan.pos)
    data = f.read()
    if not data:
        return
    part = _Scan(0, scan.expected)
    origin = scan.pos
    for off, payload in _iter_committed(data, part, final=final, seg=seg, origin=origin):
        scan.pos = origin + part.pos
        scan.expected = part.expected
        if off >= start:
            yield off, decode_envelope(payload, off)
    scan.pos = origin + part.pos
    scan.expected = part.expected


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True, slots=True)
class Problem:
    """One defect found by ``verify``.

    ``kind`` is ``corrupt`` (data a reader refuses), ``torn_tail`` (an incomplete append at
    the end, which the next writer truncates) or ``undecodable`` (a record whose checksum
    holds but whose envelope or event does not decode: a writer bug).
    """

    segment: str
    position: int
    offset: int
    what: str
    kind: str = "corrupt"

    def __str__(self) -> str:
        """One line for people."""
        return (
            f"{self.segment}: byte {self.position} (offset {self.offset}): "
            f"{self.what} [{self.kind}]"
        )


@dataclass(slots=True)
class VerifyReport:
    """What ``verify`` found: totals over readable records, and every problem."""

    path: str
    segments: int = 0
    records: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def verify(path: str | os.PathLike[str]) -> VerifyReport:
    """Check every segment: headers, contiguity, checksums, offsets, envelope decoding.

    Unlike a reader, it keeps going after a bad segment and also reports a torn tail
    (which a writer would silently repair). Raises ``LedgerError`` if ``path`` is not a
    directory.
    """
    root = Path(path)
    report = VerifyReport(path=str(root))
    bases = _list_bases(root)
    if not bases:
        report.problems.append(Problem(str(root), 0, 0, "no segment files"))
        return report
    report.segments = len(bases)
    expected: int | None = 0
    for i, base in enumerate(bases):
        seg = root / segment_name(base)
        buf = _read_file(seg)
        report.bytes += len(buf)
        if expected is not None and base != expected:
            what = (
                f"segment starts at offset {base}, records are missing"
                if base > expected
                else f"segment starts at offset {base}, overlapping the previous one"
            )
            report.problems.append(Problem(str(seg), 0, expected, what))
        header = _header_problem(buf, base)
        if header is not None:
            report.problems.append(Problem(str(seg), 0, base, header))
            expected = None
            continue
        scan = _Scan(HEADER_SIZE, base)
        pos = HEADER_SIZE  # yielded records are contiguous, so positions follow from sizes
        try:
            for off, payload in _iter_committed(buf, scan, final=i == len(bases) - 1, seg=seg):
                report.records += 1
                if report.first_offset is None:
                    report.first_offset = off
                report.last_offset = off
                problem = _undecodable(payload, off)
                if problem is not None:
                    report.problems.append(Problem(str(seg), pos, off, problem, "undecodable"))
                pos += FRAME_HEADER_SIZE + len(payload)
        except LedgerCorrupt as exc:
            report.problems.append(Problem(str(seg), exc.position, exc.offset, exc.what))
            expected = None
            continue
        expected = scan.expected
        if scan.pos < len(buf):
            report.problems.append(
                Problem(
                    str(seg),
                    scan.pos,
                    scan.expected,
                    f"torn tail of {len(buf) - scan.pos} bytes: {scan.tail} "
                    "(opening a writer truncates it)",
                    "torn_tail",
                )
            )
    return report


def torn_tail(path: str | os.PathLike[str]) -> Problem | None:
    """The torn tail of a closed ledger directory's last segment — an append that did not
    complete, whose records no reader returns — or None.

    Readers pass over such a tail (on a live ledger it is an append in flight), so a tool
    that reads a ledger whole and offline (``replay``, ``project`` once) asks this after
    reading, to say that records are missing instead of passing off what it could read.
    Only the last segment is scanned (checksums, no decoding)."""
    root = Path(path)
    bases = _list_bases(root)
    if not bases:
        return None
    seg = root / segment_name(bases[-1])
    buf, scan = _load_segment(seg, bases[-1])
    for _ in _iter_committed(buf, scan, final=True, seg=seg):
        pass
    if scan.pos >= len(buf):
        return None
    return Problem(
        str(seg),
        scan.pos,
        scan.expected,
        f"torn tail of {len(buf) - scan.pos} bytes: {scan.tail}; the records of that append "
        f"(from offset {scan.expected}) are missing (opening a writer truncates it)",
        "torn_tail",
    )


def writer_active(path: str | os.PathLike[str]) -> bool:
    """True when a writer holds the ledger directory's lock right now: its last append may
    be in flight, so a torn-looking tail is not (yet) damage. Probes the lock without
    taking it for longer than the probe, and creates nothing."""
    try:
        fd = os.open(Path(path) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no writer ever opened it, or not a ledger
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases a shared lock it took
    return False


def _undecodable(payload: bytes, offset: int) -> str | None:
    try:
        decode_event(decode_envelope(payload, offset), offset)
    except UnknownEventType:
        return None  # written by a newer version: kept, not a defect
    except DecodeError as exc:
        return str(exc)
    return None


__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "FORMAT_VERSION",
    "MAGIC",
    "FileLedger",
    "LedgerCorrupt",
    "LedgerDirReader",
    "LedgerError",
    "LedgerLocked",
    "Problem",
    "TailRepair",
    "VerifyReport",
    "new_ledger",
    "segment_name",
    "torn_tail",
    "verify",
    "writer_active",
]
