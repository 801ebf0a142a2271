"""Small durable-file helpers shared by the file-based runners and adapters.

The embedded scheduler loop and the Kubernetes adapters' file transport keep their
positions in JSON files beside the embedded ledgers they write; a runner's clock in ms.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec

from events.filelog import FileLedger


def wall_ms() -> int:
    """Wall-clock time in milliseconds: adapters stamp inputs with it, never the core."""
    return time.time_ns() // 1_000_000


def write_json_atomic(path: Path, data: object) -> None:
    """Replace ``path`` with ``data`` as JSON, durably (write, fsync, rename, fsync dir)."""
    tmp = path.with_name(path.name + ".tmp")
    # msgspec rather than json: the Kubernetes adapters write their positions with every
    # batch, and the json module was a large part of their time.
    encoded = msgspec.json.encode(data, order="sorted")
    with open(tmp, "wb") as f:
        f.write(encoded)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, object] | None:
    """The JSON object stored at ``path``, or None if there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def open_source(intake: str | os.PathLike[str], source: str) -> FileLedger:
    """The writer of one producer's intake ledger, ``INTAKE/<source>/`` (created if missing)."""
    root = Path(intake)
    root.mkdir(parents=True, exist_ok=True)
    return FileLedger.open(root / source)


__all__ = ["open_source", "read_json", "wall_ms", "write_json_atomic"]
