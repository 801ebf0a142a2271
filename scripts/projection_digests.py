"""Print a SHA-256 of every DuckDB projection table for every built-in example's ledger.

A change to the projector (or to the fold it reads) that must not change any projected row
is checked by running this before and after and diffing the outputs:

    python scripts/projection_digests.py > before.txt
    ... change ...
    python scripts/projection_digests.py | diff before.txt -

Each ledger is projected in one run with the default batch size and again in small batches
over several runs (resuming from the saved core state), and both must give the same rows.
``--ledger FILE`` adds a saved ledger (a msgpack list of encoded envelopes). Every table is
dumped sorted by all its columns; ``schema_version`` (when each migration ran) is left out.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import msgspec

# The tree this script sits in, ahead of any installed copy (worktrees, wheel checks).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from events.codec import decode_envelope
from events.memlog import MemoryLedger
from projections.projector import connect, project
from replay.examples import EXAMPLES, simulate
from scheduler.core import POLICIES


def table_digests(db: Path) -> dict[str, str]:
    """Each table's row count and a digest of its rows sorted by every column."""
    con = connect(db, read_only=True)
    try:
        tables = [
            str(r[0])
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                "AND table_name <> 'schema_version' ORDER BY 1"
            ).fetchall()
        ]
        out = {}
        for table in tables:
            rows = con.execute(f'SELECT * FROM "{table}" ORDER BY ALL').fetchall()
            h = hashlib.sha256()
            for row in rows:
                h.update(repr(row).encode())
            out[table] = f"{h.hexdigest()[:16]} {len(rows):>8}"
        return out
    finally:
        con.close()


def digests(ledger: MemoryLedger, *, resumed: bool) -> dict[str, str]:
    """The table digests of ``ledger`` projected in one run (and checked against a
    projection in small batches over several runs when ``resumed``)."""
    with tempfile.TemporaryDirectory(prefix="gpuledger-digest-") as tmp:
        whole = Path(tmp) / "whole.duckdb"
        project(ledger, whole)
        once = table_digests(whole)
        if resumed:
            parts = Path(tmp) / "parts.duckdb"
            records = ledger.records
            for stop in sorted({len(records) // 3, 2 * len(records) // 3, len(records)}):
                project(MemoryLedger(records[:stop]), parts, batch_size=997)
            again = table_digests(parts)
            for table, value in once.items():
                if again.get(table) != value:
                    once[table] = f"{value} (resumed in parts: {again.get(table)})"
        return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", action="append", default=[], help="a saved ledger")
    parser.add_argument("--no-resume", action="store_true", help="one run per ledger only")
    args = parser.parse_args()
    ledgers: list[tuple[str, MemoryLedger]] = []
    for file in args.ledger:
        blobs = msgspec.msgpack.decode(Path(file).read_bytes())
        ledgers.append((Path(file).stem, MemoryLedger([decode_envelope(b) for b in blobs])))
    for policy in POLICIES:
        for name in sorted(EXAMPLES):
            ledger = MemoryLedger()
            simulate(name, policy, ledger)
            ledgers.append((f"{policy}/{name}", ledger))
    for label, ledger in ledgers:
        for table, value in digests(ledger, resumed=not args.no_resume).items():
            print(f"{label:22} {table:18} {value}", flush=True)


if __name__ == "__main__":
    main()
