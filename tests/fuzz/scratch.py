"""Where the fuzz targets write their files: a directory on tmpfs when there is one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SCRATCH_ENV = "GPULEDGER_FUZZ_SCRATCH"
"""Set by the atheris runner, which removes the directory when the fuzzer exits."""


def shm_dir() -> str | None:
    """``/dev/shm`` when writable (fsync is free there), else None (the default temp dir)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def make_scratch() -> Path:
    """The runner's directory if it gave one, else a new temporary directory."""
    given = os.environ.get(SCRATCH_ENV)
    if given:
        return Path(given)
    return Path(tempfile.mkdtemp(prefix="gpuledger-fuzz-", dir=shm_dir()))
