"""JSON Lines export and import for any ledger (file log, Kafka, in memory).

One JSON object per record (``events.codec.to_json_line``); the format is described in
docs/ledger.md. Export reads through the ``LedgerReader`` port and import appends through
the ``LedgerWriter`` port, so neither depends on a backend.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from events.codec import DecodeError, Envelope, from_json_row, to_json_line
from events.filelog import FileLedger, LedgerError
from events.port import LedgerReader, LedgerWriter

_IMPORT_BATCH = 4096
_EXPORT_CHUNK = 1024


def export_jsonl(
    reader: LedgerReader, out: IO[bytes], start: int = 0, end: int | None = None
) -> int:
    """Write records ``start <= offset < end`` as JSON Lines; return how many."""
    count = 0
    chunk: list[bytes] = []
    for off, env in reader.read(start, end):
        chunk.append(to_json_line(off, env))
        chunk.append(b"\n")
        count += 1
        if len(chunk) >= 2 * _EXPORT_CHUNK:
            out.write(b"".join(chunk))
            chunk.clear()
    if chunk:
        out.write(b"".join(chunk))
    return count


def iter_jsonl(lines: Iterable[bytes], *, source_name: str) -> Iterator[Envelope]:
    """Parse JSON Lines rows (blank lines skipped); errors name ``source_name:line``.

    An export numbers its rows with consecutive offsets; a row whose offset does not
    follow the one before (a row missing, repeated or moved) is refused, as the records
    around it are no longer what the ledger held. Rows without an offset are not checked.
    """
    previous = -1
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source_name}:{lineno}"
        offset, env = from_json_row(line, where)
        if offset >= 0 and previous >= 0 and offset != previous + 1:
            raise DecodeError(
                f"{where}: offset {offset} follows offset {previous}: an export's offsets "
                f"are consecutive (a row is missing, repeated or out of order)"
            )
        previous = offset
        yield env


def import_jsonl(
    in_file: IO[bytes],
    writer: LedgerWriter,
    *,
    source_name: str,
    batch_size: int = _IMPORT_BATCH,
) -> int:
    """Append every row of a JSON Lines export to ``writer``; return how many.

    All rows are validated before the first append, so a bad line (``DecodeError`` naming
    ``source_name:line``) appends nothing. A seekable input is read twice (validate, then
    append in batches) to keep memory flat; a pipe is staged in memory.
    """
    if in_file.seekable():
        origin = in_file.tell()
        total = sum(1 for _ in iter_jsonl(in_file, source_name=source_name))
        in_file.seek(origin)
        rows: Iterable[Envelope] = iter_jsonl(in_file, source_name=source_name)
    else:
        staged = list(iter_jsonl(in_file, source_name=source_name))
        total = len(staged)
        rows = staged
    count = 0
    batch: list[Envelope] = []
    for env in rows:
        batch.append(env)
        if len(batch) >= batch_size:
            writer.append(batch)
            count += len(batch)
            batch = []
    if batch:
        writer.append(batch)
        count += len(batch)
    if count != total:
        raise LedgerError(f"{source_name} changed while it was being imported")
    return count


def import_jsonl_into(
    in_file: IO[bytes], ledger: str | os.PathLike[str], *, source_name: str
) -> tuple[int, int]:
    """Append a JSON Lines export to the ledger directory ``ledger`` (created if missing);
    return how many records and the offset of the first.

    A rejected import into a directory this call created removes it again, so a bad file
    leaves no empty ledger behind; a ledger that already had records is never removed.
    """
    created = not Path(ledger).exists()
    with FileLedger.open(ledger) as writer:
        first = writer.end_offset()
        try:
            return import_jsonl(in_file, writer, source_name=source_name), first
        except BaseException:
            if created and writer.end_offset() == 0:
                writer.close()
                shutil.rmtree(ledger, ignore_errors=True)
            raise


__all__ = ["export_jsonl", "import_jsonl", "import_jsonl_into", "iter_jsonl"]
